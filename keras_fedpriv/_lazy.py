"""Lazy package exports (PEP 562): a package names what it exports; nothing is imported until used.

``import keras_fedpriv`` then costs no TensorFlow import, so light tools (the
command line's ``--help``, the Flower relay ClientApp) start fast; the first
use of an exported name imports its module, as an eager import would have.
"""

from __future__ import annotations

import importlib
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


def lazy_exports(package: str, exports: Mapping[str, str], submodules: Iterable[str]) -> None:
    """Give package ``package`` a ``__getattr__`` / ``__dir__`` that import names on first use.

    Args:
        package: the package's ``__name__`` (already in ``sys.modules``).
        exports: exported name -> the module that defines it (the name is read
            from that module; add one entry per new export).
        submodules: names of the package's submodules to list in ``__dir__``
            (any submodule is reachable as an attribute, imported on first use).

    Returns:
        None; the package module gets ``_EXPORTS``, ``__getattr__`` and ``__dir__``.
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
