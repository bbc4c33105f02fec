"""The TensorFlow implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

from typing import Any

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==



# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==


# -- embedding / VAE (layers/embedding_dp.py, layers/vae_bottom.py) --

def is_traced(x: Any) -> bool:
    """Whether ``x`` is symbolic: the layer runs inside a traced function (a
    ``tf.function``, Keras' train step), not eagerly on concrete values."""
    import tensorflow as tf

    return not tf.executing_eagerly()


def assert_all_finite(x: Any, message: str) -> Any:
    """``x``, checked in the graph to hold no NaN or inf (an error at run time,
    naming ``message`` only). XLA compiles the check away; the caller must also
    make the output safe where ``x`` is not finite."""
    import tensorflow as tf

    return tf.debugging.assert_all_finite(x, message)


# == end of input checks ==


# == Philox and mechanisms (mechanisms/) ==



# == end of Philox ==


# == training steps (federated/: VerticalModel, LocalTrainer) ==



# == end of training steps ==
