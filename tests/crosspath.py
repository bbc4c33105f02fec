"""Comparing outputs of two execution paths (eager, graph, XLA, SavedModel) without exact floats.

oneDNN and XLA may compute the same float a few ulp apart on another path, so a
quantized output (a 0/1 bit from the sign of a pre-activation) can differ where
the pre-activation is within rounding of 0. Those coordinates are not compared;
everything else must match bit for bit.
"""

import numpy as np

NEAR_ZERO = 1e-5


def assert_bits_are_the_sign(bits, pre_activation, near_zero=NEAR_ZERO):
    """``bits`` (0/1, from any path) equal ``pre_activation > 0`` where it is not near 0."""
    bits, z = np.asarray(bits), np.asarray(pre_activation)
    assert bits.shape == z.shape
    clear = np.abs(z) > near_zero * max(1.0, float(np.max(np.abs(z))))
    assert clear.mean() > 0.9, "too few coordinates away from 0 to compare"
    np.testing.assert_array_equal(bits[clear], (z[clear] > 0).astype(bits.dtype))


def compiled(fn):
    """``fn`` on the backend's compiled path: ``tf.function(jit_compile=True)`` (XLA) on
    TensorFlow, ``jax.jit`` on JAX."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)
