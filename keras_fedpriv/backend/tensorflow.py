"""The TensorFlow implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==



# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==



# == end of input checks ==


# == Philox and mechanisms (mechanisms/) ==

_MASK32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # Philox-4x32 round multipliers
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # Philox-4x32 key increments (Weyl sequence)


def _u32(x):
    return tf.cast(x, tf.uint32)


def mulhilo32(a, b):
    """``(hi, lo)``: the high and low 32 bits of the 64-bit product of uint32 tensors."""
    product = tf.cast(a, tf.uint64) * tf.cast(b, tf.uint64)
    hi = tf.cast(tf.bitwise.right_shift(product, tf.constant(32, tf.uint64)), tf.uint32)
    lo = tf.cast(tf.bitwise.bitwise_and(product, tf.constant(_MASK32, tf.uint64)), tf.uint32)
    return hi, lo


def philox4x32(counter, key, rounds=10):
    """Philox-4x32 on broadcastable uint32 tensors (see `keras_fedpriv.mechanisms.random`).

    Plain TensorFlow integer ops: eager, graphs, XLA and ``tf.data``. Equal
    bit for bit to TensorFlow's own Philox kernel.
    """
    c0, c1, c2, c3 = (_u32(c) for c in counter)
    k0, k1 = (_u32(k) for k in key)
    m0, m1 = (tf.constant(m, tf.uint32) for m in _PHILOX_M)
    w0, w1 = (tf.constant(w, tf.uint32) for w in _PHILOX_W)
    for _ in range(rounds):
        hi0, lo0 = mulhilo32(m0, c0)
        hi1, lo1 = mulhilo32(m1, c2)
        c0, c1, c2, c3 = (
            tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi1, c1), k0),
            lo1,
            tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi0, c3), k1),
            lo0,
        )
        k0 = k0 + w0
        k1 = k1 + w1
    return c0, c1, c2, c3


def _split64(x):
    x = tf.cast(x, tf.int64)
    lo = tf.bitwise.bitwise_and(x, tf.constant(_MASK32, tf.int64))
    hi = tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, tf.constant(32, tf.int64)),
                                tf.constant(_MASK32, tf.int64))
    return _u32(lo), _u32(hi)


def words_from_ids(key_words, ids, salt):
    """Philox of ``(id low, id high, 0, salt)`` under ``key_words`` (int64, shape (2,))."""
    lo, hi = _split64(ids)
    key_words = tf.cast(key_words, tf.int64)
    zeros = tf.zeros_like(lo)
    return philox4x32((lo, hi, zeros, zeros + _u32(salt)), (key_words[0], key_words[1]))


def random_words(shape, seed):
    """Uniform uint32 words of ``shape`` from TensorFlow's stateless Philox kernel.

    ``seed``: two 64-bit integers (an int64 tensor or array of shape (2,)).
    """
    return tf.random.stateless_uniform(shape, seed=seed, minval=None, maxval=None, dtype=tf.uint32)


def seed_from_key(key):
    """The ``seed`` of `random_words` for a 64-bit key: ``[key, 0]`` as int64."""
    key64 = np.array([key], np.uint64).view(np.int64)[0]
    return tf.constant([key64, 0], tf.int64)


def inside_trace():
    """Whether the caller runs inside a traced function (``tf.function``, ``model.fit``,
    ``tf.data``), where a value drawn in Python would be frozen into the graph."""
    return tf.inside_function()


# == end of Philox ==


# == training steps (federated/: VerticalModel, LocalTrainer) ==



# == end of training steps ==


# == attacks (attacks/gradient_inversion.py) ==


def value_and_grad(fn):
    """``fn``'s value and its gradients with respect to all its (tensor) arguments, as a
    function of the same arguments; differentiable again (nested tapes)."""
    def value_and_grads(*args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            value = fn(*args)
        return value, tape.gradient(value, args, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return value_and_grads


def compiled(fn):
    """``fn`` as a TensorFlow graph function (``tf.function``)."""
    return tf.function(fn)


# == end of attacks ==
