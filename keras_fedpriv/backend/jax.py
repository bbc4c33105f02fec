"""The JAX implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

from typing import Any

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==



# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==


# -- embedding / VAE (layers/embedding_dp.py, layers/vae_bottom.py) --

def is_traced(x: Any) -> bool:
    """Whether ``x`` is a JAX tracer: the layer runs inside ``jax.jit`` /
    ``jax.grad`` (Keras' train step), not eagerly on concrete values."""
    import jax

    return isinstance(x, jax.core.Tracer)


def assert_all_finite(x: Any, message: str) -> Any:
    """``x`` unchanged: a traced JAX function has no run-time assert (as under
    XLA on TensorFlow), so the caller makes its output safe where ``x`` is not
    finite and counts the event for the host (``message`` is unused)."""
    del message
    return x


# == end of input checks ==


# == Philox and mechanisms (mechanisms/) ==



# == end of Philox ==


# == training steps (federated/: VerticalModel, LocalTrainer) ==



# == end of training steps ==
