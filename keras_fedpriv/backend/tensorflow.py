"""The TensorFlow implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

from typing import Any

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==

# Stand-ins (jax-labels) for the lead's local-variable helpers, until "secret_rng/release_counter
# on JAX" lands; same names and signatures: take main's section on merge.
def local_variable(owner: Any, value: Any, name: str, monotone: bool = False,
                   cls: type | None = None):
    """A variable that is not a Keras weight, shared by all replicas."""
    import numpy as np

    from keras_fedpriv.layers.secret_rng import _LocalVariable

    return (cls or _LocalVariable)(np.asarray(value), trainable=False, name=name)


def to_numpy(variable: Any) -> Any:
    import numpy as np

    return np.asarray(variable.numpy())


def assign(variable: Any, value: Any) -> Any:
    import tensorflow as tf

    return variable.assign(tf.cast(value, variable.dtype))


def assign_add(variable: Any, delta: Any) -> Any:
    import tensorflow as tf

    return variable.assign_add(tf.cast(delta, variable.dtype))




# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==


# -- label DP and example ids (layers/input_checks.py, layers/label_formats.py) --

#: The integer dtype example ids are compared in inside a call: 64-bit on TensorFlow.
EXAMPLE_ID_DTYPE = "int64"


def is_traced(x: Any) -> bool:
    """Whether ``x`` is symbolic: the layer runs inside a traced function (a
    ``tf.function``, Keras' train step), not eagerly on concrete values."""
    import tensorflow as tf

    return not tf.executing_eagerly()


def graph_assert(condition: Any, data: list, summarize: int | None = None) -> Any:
    """A `tf.debugging.Assert` op: when the graph runs and ``condition`` is False
    it raises ``InvalidArgumentError`` with ``data`` (XLA compiles it away, so the
    caller also makes its output safe and counts the event)."""
    import tensorflow as tf

    return tf.debugging.Assert(condition, data, summarize=summarize)


def run_after(deps: list) -> Any:
    """A context whose operations run only after ``deps`` (the graph's asserts), so a
    failed assert stops the draws and counts of the call (`tf.control_dependencies`: in a
    ``tf.function`` an assert and a variable update are otherwise unordered)."""
    import tensorflow as tf

    return tf.control_dependencies([d for d in deps if d is not None])


def non_dense_kind(value: Any) -> str | None:
    """What ``value`` is if it is one of TensorFlow's non-dense tensors, else None."""
    import tensorflow as tf

    if isinstance(value, tf.RaggedTensor):
        return "a tf.RaggedTensor (rows of different lengths)"
    if isinstance(value, tf.SparseTensor):
        return "a tf.SparseTensor (densify it with tf.sparse.to_dense)"
    return None


def signed_example_ids(ids: Any) -> Any:
    """Integer ids as `EXAMPLE_ID_DTYPE`; uint64 ids are reinterpreted (a bijection, so
    distinct ids stay distinct), narrower ones keep their value."""
    import tensorflow as tf

    if ids.dtype == tf.uint64:
        ids = tf.bitcast(ids, tf.int64)
    return tf.cast(ids, tf.int64)



# == end of input checks ==


# == Philox and mechanisms (mechanisms/) ==



# == end of Philox ==


# == training steps (federated/: VerticalModel, LocalTrainer) ==



# == end of training steps ==
