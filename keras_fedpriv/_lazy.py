"""The package's one import mechanism: names are imported on first use, Keras objects when Keras is.

Why: ``import keras`` imports its backend (TensorFlow: 4-9 s, JAX: 2-6 s on a 2-core machine),
and every module of the package that defines a layer, an optimizer or a callback subclasses a
Keras class, so Keras cannot wait inside functions. Were the packages' ``__init__`` files
plain imports, every command that runs ``import keras_fedpriv`` would pay for it:
``python -m keras_fedpriv --help`` took 13.6 s on TensorFlow and 6.4-8.1 s on JAX (a busy
2-core machine), against 0.14 s with this mechanism. So the command line, the Flower relay
ClientApp and any light tool start fast, and ``tests/test_cli.py`` checks that ``--help``
imports neither TensorFlow nor Keras.

The mechanism has two halves, both set up by one call, `lazy_exports`, in a package's
``__init__.py``:

1. Exports (PEP 562). The package names what it exports (name -> defining module); the
   package's ``__getattr__`` imports a name's module on first use, as an eager import would
   have, and binds the name in the package. A submodule is reachable as an attribute, imported
   on first use. One wrinkle kept from eager imports: where a submodule and an exported
   function share a name (``federated.partition``), the function wins, also after the
   submodule is imported later (`_LazyPackage.__setattr__`).
2. Keras registration (the root package only, ``keras_objects``). Keras finds a saved
   model's custom layers, optimizers and callbacks only by their registered names, which
   exist once their modules are imported. So ``import keras_fedpriv`` then
   ``keras.models.load_model(...)`` in a fresh process must work without the user touching an
   export: as soon as Keras is loaded and none of the package's modules is half-way through
   its own import, the registering modules are imported (once). A ``sys.meta_path`` finder
   watches the imports of ``keras`` and of the package's modules to find that moment, and
   removes itself afterwards (if Keras is already loaded, they are imported at once).

This module imports no module of the package (the callers' tables name them, so the import
graph that ``docs/architecture.py`` draws shows each arrow where it is written).
``keras_fedpriv.logs.quiet_tensorflow`` has an import finder of its own, for another goal:
hiding TensorFlow's start-up lines.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Iterable, Mapping


class _LazyPackage(types.ModuleType):
    """A package whose exported names win over same-named submodules, as with eager imports.

    Importing submodule ``pkg.partition`` makes Python set ``pkg.partition`` to
    the module; when ``partition`` is also an exported function of that module
    (as ``from pkg.partition import partition`` would have bound it), the
    function is bound instead.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        exports = self.__dict__.get("_EXPORTS", {})
        if isinstance(value, types.ModuleType) and exports.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


def lazy_exports(package: str, exports: Mapping[str, str], submodules: Iterable[str],
                 keras_objects: Iterable[str] = ()) -> None:
    """Give package ``package`` a ``__getattr__`` / ``__dir__`` that import names on first use.

    Args:
        package: the package's ``__name__`` (already in ``sys.modules``).
        exports: exported name -> the module that defines it (the name is read
            from that module; add one entry per new export).
        submodules: names of the package's submodules to list in ``__dir__``
            (any submodule is reachable as an attribute, imported on first use).
        keras_objects: the modules that call ``keras.saving.register_keras_serializable``
            (the root package passes them): imported as soon as Keras is loaded, so Keras
            finds the package's objects in a saved model (``tests/test_architecture.py``
            checks that the list names every such module).

    Returns:
        None; the package module gets ``_EXPORTS``, ``__getattr__`` and ``__dir__``.

    Example (a package's ``__init__.py``)::

        from keras_fedpriv._lazy import lazy_exports

        _EXPORTS = {"partition": "keras_fedpriv.federated.partition"}
        lazy_exports(__name__, _EXPORTS, ())
        __all__ = sorted(_EXPORTS)
    """
    module = sys.modules[package]
    subs = frozenset(submodules)
    namespace = module.__dict__

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        elif name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        else:  # a submodule, as after an eager import that loaded it
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as err:
                if err.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports) | subs)

    namespace.update(_EXPORTS=dict(exports), __getattr__=__getattr__, __dir__=__dir__)
    module.__class__ = _LazyPackage
    if keras_objects:
        _KERAS["modules"] = tuple(keras_objects)
        _KERAS["root"] = package
        if "keras" in sys.modules:
            _register_if_ready()
        elif not any(isinstance(f, _Watcher) for f in sys.meta_path):
            sys.meta_path.insert(0, _Watcher())


# ---------------------------------------------------------------- half 2: Keras registration

_KERAS: dict[str, Any] = {"modules": (), "root": "", "done": False}
_executing: set[str] = set()  # the watched modules whose code is running now


def _register_if_ready() -> None:
    if _KERAS["done"] or "keras" not in sys.modules or _executing:
        return
    _KERAS["done"] = True
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Watcher)]
    for name in _KERAS["modules"]:
        importlib.import_module(name)


class _Loader(importlib.abc.Loader):
    """The module's own loader; then, if the moment has come, the registering imports."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:  # get_code, is_package, ... (runpy, pkgutil)
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        _executing.add(module.__name__)
        try:
            self._loader.exec_module(module)
        finally:
            _executing.discard(module.__name__)
        _register_if_ready()


class _Watcher(importlib.abc.MetaPathFinder):
    """Wraps the loaders of ``keras`` and of the package's modules."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "keras" and not fullname.startswith(f"{_KERAS['root']}."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec
