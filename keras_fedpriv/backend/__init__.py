"""What differs between Keras' TensorFlow and JAX backends, behind one small interface.

Everything else in the package is written once, with `keras.ops`, numpy on the
host, or this interface. The implementation is chosen once, from
``keras.backend.backend()`` (``KERAS_BACKEND``), the first time `impl` is
called:

* `keras_fedpriv.backend.tensorflow`: the secret random stream as TensorFlow
  resource variables outside Keras' weights (a key left out of every
  checkpoint, a counter advanced atomically by ``RngReadAndSkip``, a fresh
  key drawn when a SavedModel is loaded), Philox in TensorFlow integer ops,
  graph-mode input checks, ``tf.data``, ``MirroredStrategy``, SavedModel export.
* `keras_fedpriv.backend.jax`: the same stream as Keras variables kept out of
  the model's weights (the way Keras keeps a ``SeedGenerator``'s state), so
  JAX's functional ``fit`` carries them through ``jit`` as state; Philox in
  32-bit integer ops (no ``jax_enable_x64`` needed).

Both implementations provide the same names (see `keras_fedpriv.backend.tensorflow`
for the list and their contracts). What exists only on TensorFlow raises
`BackendNotSupportedError` on JAX (`require_tensorflow`), naming the JAX way
where there is one.

Every Keras or TensorFlow private API the package reaches is in
`keras_fedpriv.backend.private`, so a Keras upgrade breaks one file.
"""

from __future__ import annotations

import importlib
import types

__all__ = ["BackendNotSupportedError", "SUPPORTED", "impl", "name", "require_tensorflow"]

#: The Keras backends this package supports.
SUPPORTED = ("tensorflow", "jax")

_IMPL: types.ModuleType | None = None


class BackendNotSupportedError(RuntimeError):
    """A feature that exists only on another Keras backend was used on this one."""


def name() -> str:
    """The Keras backend in use (``keras.backend.backend()``)."""
    import keras

    return keras.backend.backend()


def impl() -> types.ModuleType:
    """The backend implementation module, chosen once per process.

    Raises:
        BackendNotSupportedError: Keras runs on a backend other than
            TensorFlow or JAX (e.g. PyTorch or NumPy).
    """
    global _IMPL
    if _IMPL is None:
        backend = name()
        if backend not in SUPPORTED:
            raise BackendNotSupportedError(
                f"keras-fedpriv runs on the Keras backends {', '.join(SUPPORTED)}; "
                f"KERAS_BACKEND is {backend!r}. Set KERAS_BACKEND=tensorflow or "
                f"KERAS_BACKEND=jax before importing keras.")
        _IMPL = importlib.import_module(f"keras_fedpriv.backend.{backend}")
    return _IMPL


def is_tensorflow() -> bool:
    """Whether Keras runs on TensorFlow."""
    return name() == "tensorflow"


def require_tensorflow(feature: str, jax_way: str | None = None) -> None:
    """Raise `BackendNotSupportedError` unless Keras runs on TensorFlow.

    Args:
        feature: what needs TensorFlow, for the message (``"privatize_dataset
            (tf.data)"``).
        jax_way: the way to do the same on JAX, if there is one.
    """
    backend = name()
    if backend == "tensorflow":
        return
    message = (f"{feature} needs Keras' TensorFlow backend; KERAS_BACKEND is {backend!r}.")
    if jax_way:
        message += f" On JAX: {jax_way}"
    raise BackendNotSupportedError(message)
