"""Calling a layer inside a traced, compiled function on either Keras backend."""

import keras
import numpy as np


def traced_call(layer, labels, jit_compile=True, **named):
    """``layer(labels, training=True, **named)`` in a traced function, as a NumPy array.

    TensorFlow: a ``tf.function`` (XLA-compiled unless ``jit_compile=False``, where the
    graph's asserts run). JAX: ``jax.jit`` of the layer's ``stateless_call`` (always
    compiled; ``jit_compile`` is unused), whose new state is written back to the layer's
    variables, as Keras' ``fit`` does.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        run = tf.function(lambda y, kw: layer(y, training=True, **kw), jit_compile=jit_compile)
        return np.asarray(run(labels, named))
    import jax

    if not layer.built:
        layer.build(np.shape(labels))
    variables = layer.non_trainable_variables
    run = jax.jit(lambda state, y, kw: layer.stateless_call([], state, y, training=True, **kw))
    out, state = run([v.value for v in variables], labels, named)
    for variable, value in zip(variables, state):
        variable.assign(value)
    return np.asarray(out)
