"""Calling layers inside a traced, compiled function on either Keras backend."""

import keras
import numpy as np


def traced_call(layer, labels, jit_compile=True, **named):
    """``layer(labels, training=True, **named)`` in a traced function, as a NumPy array.

    TensorFlow: a ``tf.function`` (XLA-compiled unless ``jit_compile=False``, where the
    graph's asserts run). JAX: ``jax.jit`` of the layer's ``stateless_call`` (always
    compiled; ``jit_compile`` is unused), whose new state is written back to the layer's
    variables, as Keras' ``fit`` does.
    """
    return traced_calls([layer], [labels], jit_compile=jit_compile, **named)[0]


def traced_calls(layers, labels, jit_compile=True, **named):
    """``[layer(y, training=True, **named) for layer, y in zip(layers, labels)]`` in one
    traced function, as NumPy arrays: each layer is called as by `traced_call` (on its own
    variables), for the price of one trace and one compile.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        run = tf.function(lambda ys, kw: [layer(y, training=True, **kw)
                                          for layer, y in zip(layers, ys)],
                          jit_compile=jit_compile)
        return [np.asarray(out) for out in run(list(labels), named)]
    import jax

    for layer, y in zip(layers, labels):
        if not layer.built:
            layer.build(np.shape(y))
    variables = [layer.non_trainable_variables for layer in layers]

    def call(states, ys, kw):
        return [layer.stateless_call([], state, y, training=True, **kw)
                for layer, state, y in zip(layers, states, ys)]

    results = jax.jit(call)([[v.value for v in vs] for vs in variables], list(labels), named)
    for vs, (_, state) in zip(variables, results):
        for variable, value in zip(vs, state):
            variable.assign(value)
    return [np.asarray(out) for out, _ in results]
