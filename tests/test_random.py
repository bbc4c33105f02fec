"""The package's counter-based RNG (keras_fedpriv/mechanisms/random.py): Philox bit for bit, under
XLA, thresholds."""

import numpy as np
import pytest
import tensorflow as tf

from keras_fedpriv.mechanisms import random as R


def test_philox_matches_tensorflow_kernel_bit_for_bit():
    rng = np.random.default_rng(11)
    for _ in range(20):
        key = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
        c0, c1 = (int(rng.integers(0, 2**63)) * 2 + 1 for _ in range(2))
        ref = tf.raw_ops.StatelessRandomUniformFullIntV2(
            shape=[4], key=tf.constant([key], tf.uint64), counter=tf.constant([c0, c1], tf.uint64),
            alg=1, dtype=tf.uint32).numpy()
        mine = np.array([w.numpy() for w in R.philox4x32(
            (c0 & 0xFFFFFFFF, c0 >> 32, c1 & 0xFFFFFFFF, c1 >> 32), (key & 0xFFFFFFFF, key >> 32))])
        np.testing.assert_array_equal(mine, ref)
    # Random123 known-answer vector for philox4x32-10, counter 0, key 0.
    zero = [w.numpy() for w in R.philox4x32((0, 0, 0, 0), (0, 0))]
    assert [hex(int(w)) for w in zero] == ["0x6627e8d5", "0xe169c58d", "0xbc57ac4c", "0x9b00dbd8"]


def test_philox_under_xla_matches_eager():
    ids = tf.range(1000, dtype=tf.int64) * 7919
    key = tf.constant(R.seed_to_key_words(R.draw_secret()))
    eager = [w.numpy() for w in R.words_from_ids(key, ids, 5)]
    xla = tf.function(lambda k, i: R.words_from_ids(k, i, 5), jit_compile=True)(key, ids)
    for a, b in zip(eager, xla):
        np.testing.assert_array_equal(a, b.numpy())


def test_probability_threshold():
    assert R.probability_threshold(0.5) == 2**31
    assert R.probability_threshold(0.0) == 0
    with pytest.raises(ValueError):
        R.probability_threshold(1.0)
