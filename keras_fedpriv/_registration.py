"""Register the package's Keras objects once Keras is loaded, without importing Keras first.

The package's exports are lazy (``import keras_fedpriv`` imports no
TensorFlow), but Keras finds a saved model's custom layers, optimizers and
callbacks only by their registered names, which exist once their modules are
imported. So ``import keras_fedpriv`` then ``keras.models.load_model(...)`` in
a fresh process must still work, whatever is imported first.

The rule: as soon as Keras is loaded and none of the package's modules is
half-way through its own import, the modules that register Keras objects are
imported (once). An import finder watches the imports of ``keras`` and of the
package's modules to find that moment, and removes itself afterwards.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import Any, Sequence

#: the modules that call ``keras.saving.register_keras_serializable``
SERIALIZABLE_MODULES = (
    "keras_fedpriv.layers",
    "keras_fedpriv.optimizers",
    "keras_fedpriv.federated.magrr",
    "keras_fedpriv.federated.laplace_eval",
    "keras_fedpriv.federated.vertical.model",
    "keras_fedpriv.wide_deep",
)

_executing: set[str] = set()  # the watched modules whose code is running now
_state = {"done": False}


def _register_if_ready() -> None:
    if _state["done"] or "keras" not in sys.modules or _executing:
        return
    _state["done"] = True
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Watcher)]
    for name in SERIALIZABLE_MODULES:
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
    """Wraps the loaders of ``keras`` and of ``keras_fedpriv.*`` modules."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "keras" and not fullname.startswith("keras_fedpriv."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def register_when_keras_loads() -> None:
    """Import the registering modules now if Keras is loaded, else when it is.

    Returns:
        None.
    """
    if "keras" in sys.modules:
        _register_if_ready()
    elif not any(isinstance(f, _Watcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())
