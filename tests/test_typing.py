"""The public API carries type hints, all of it (issue 13): a missing hint cannot come back."""

import importlib
import inspect
import pathlib
import pkgutil

import pytest

import keras_fedpriv
from keras_fedpriv import LabelDPLayer, SignDSEncoder
from keras_fedpriv.mechanisms.ledger import ReleaseLedger
from keras_fedpriv.privacy import plan_epsilon, privacy_report

KEY_CALLABLES = [privacy_report, plan_epsilon, LabelDPLayer.__init__, ReleaseLedger.record,
                 SignDSEncoder.encode]


def _missing(func):
    sig = inspect.signature(func)
    out = [name for name, p in sig.parameters.items()
           if name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        out.append("return")
    return out


@pytest.mark.parametrize("func", KEY_CALLABLES, ids=lambda f: f.__qualname__)
def test_every_parameter_is_annotated(func):
    params = [p for name, p in inspect.signature(func).parameters.items() if name != "self"]
    assert params
    assert not _missing(func), f"{func.__qualname__}: no annotation for {_missing(func)}"


def _public_callables():
    """Every function in a module's ``__all__`` and every public method (and ``__init__``)
    of every class there, defined in the package."""
    seen = set()
    for info in pkgutil.walk_packages(keras_fedpriv.__path__, prefix="keras_fedpriv."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra (Flower) that is not installed
            continue
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and obj.__module__.startswith("keras_fedpriv"):
                for attr, value in vars(obj).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    if isinstance(value, (staticmethod, classmethod)):
                        value = value.__func__
                    if isinstance(value, property):
                        value = value.fget
                    if inspect.isfunction(value):
                        key = (value.__module__, value.__qualname__)
                        if key not in seen:
                            seen.add(key)
                            yield value
            elif inspect.isfunction(obj) and obj.__module__.startswith("keras_fedpriv"):
                key = (obj.__module__, obj.__qualname__)
                if key not in seen:
                    seen.add(key)
                    yield obj


def test_the_whole_public_api_is_annotated():
    funcs = list(_public_callables())
    assert len(funcs) > 300  # the walk reached the whole package
    missing = {f"{f.__module__}.{f.__qualname__}": _missing(f) for f in funcs if _missing(f)}
    assert missing == {}


def test_the_package_says_it_is_typed():
    assert (pathlib.Path(keras_fedpriv.__file__).parent / "py.typed").exists()
