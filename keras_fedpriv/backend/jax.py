"""The JAX implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

from typing import Any

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==



# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==


# -- label DP and example ids (layers/input_checks.py, layers/label_formats.py) --

#: The integer dtype example ids are compared in inside a call: JAX without
#: ``jax_enable_x64`` has no 64-bit integers.
EXAMPLE_ID_DTYPE = "int32"


def is_traced(x: Any) -> bool:
    """Whether ``x`` is a JAX tracer: the layer runs inside ``jax.jit`` /
    ``jax.grad`` (Keras' train step), not eagerly on concrete values."""
    import jax

    return isinstance(x, jax.core.Tracer)


def graph_assert(condition: Any, data: list, summarize: int | None = None) -> None:
    """None: traced JAX code has no run-time assert (as under XLA on TensorFlow), so
    the caller makes its output safe where ``condition`` fails and counts the event
    for the host (`InputErrorFlagMixin.check_input_errors`)."""
    del condition, data, summarize


def run_after(deps: list) -> Any:
    """A context that changes nothing: JAX runs a traced function's operations in data
    order and has no asserts to wait for (``deps`` is empty or None entries)."""
    import contextlib

    del deps
    return contextlib.nullcontext()


def non_dense_kind(value: Any) -> str | None:
    """What ``value`` is if it is a JAX sparse array, else None."""
    from jax.experimental import sparse

    if isinstance(value, sparse.JAXSparse):
        return f"a {type(value).__name__} sparse array (densify it with .todense())"
    return None


def signed_example_ids(ids: Any) -> Any:
    """Integer ids as `EXAMPLE_ID_DTYPE`; uint32 ids are reinterpreted (a bijection, so
    distinct ids stay distinct), narrower ones keep their value."""
    import jax
    import jax.numpy as jnp

    if ids.dtype == jnp.uint32:
        return jax.lax.bitcast_convert_type(ids, jnp.int32)
    return ids.astype(jnp.int32)



# == end of input checks ==


# == Philox and mechanisms (mechanisms/) ==



# == end of Philox ==


# == training steps (federated/: VerticalModel, LocalTrainer) ==



# == end of training steps ==
