"""The package's counter-based RNG (keras_fedpriv/mechanisms/random.py): Philox bit for bit on
both backends (against a pure-Python reference with Random123's known answers, and TensorFlow's
kernel), under XLA / jit, thresholds, the refusal of a fresh secret inside a trace."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_fedpriv import backend
from keras_fedpriv import mechanisms as M
from keras_fedpriv.mechanisms import random as R
from crosspath import compiled

pytestmark = [pytest.mark.jax]

_MASK = 0xFFFFFFFF


def _philox_reference(counter, key, rounds=10):
    """Philox-4x32 in Python integers (Salmon et al. 2011), one block."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & _MASK, (p0 >> 32) ^ c3 ^ k1, p0 & _MASK)
        k0, k1 = (k0 + 0x9E3779B9) & _MASK, (k1 + 0xBB67AE85) & _MASK
    return [c0, c1, c2, c3]


def _stateless_reference(size, seed):
    """TensorFlow's ``stateless_uniform(dtype=uint32)`` in Python: the seed scrambled by one
    Philox block into a key and the high counter words, then Philox on a counter."""
    words = [seed[0] & _MASK, seed[0] >> 32, seed[1] & _MASK, seed[1] >> 32]
    mix = _philox_reference(words, (0x3EC8F720, 0x02461E29))
    out = []
    for i in range(-(-size // 4)):
        out += _philox_reference((i, 0, mix[2], mix[3]), (mix[0], mix[1]))
    return out[:size]


def _hex(words):
    return [f"{int(w):08x}" for w in words]


KNOWN_ANSWERS = [  # Random123's kat_vectors for philox4x32_10
    ((0, 0, 0, 0), (0, 0), "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
    ((_MASK,) * 4, (_MASK,) * 2, "408f276d 41c83b0e a20bc7c6 6d5451fd"),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     "d16cfe09 94fdcceb 5001e420 24126ea1"),
]


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_philox_known_answers(counter, key, expected):
    assert " ".join(_hex(_philox_reference(counter, key))) == expected
    words = R.philox4x32([np.uint32(c) for c in counter], [np.uint32(k) for k in key])
    assert " ".join(_hex(ops.convert_to_numpy(w) for w in words)) == expected


def test_philox_matches_the_reference_on_many_counters():
    rng = np.random.default_rng(11)
    counters = rng.integers(0, 2**32, size=(4, 300), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2**32, size=2, dtype=np.uint64).astype(np.uint32)
    got = np.stack([ops.convert_to_numpy(w) for w in R.philox4x32(
        [ops.convert_to_tensor(c) for c in counters], [ops.convert_to_tensor(k) for k in key])])
    want = np.array([_philox_reference([int(c) for c in counters[:, i]], [int(k) for k in key])
                     for i in range(300)], np.uint32).T
    np.testing.assert_array_equal(got, want)


@pytest.mark.tensorflow_only("compares with TensorFlow's Philox kernel")
def test_philox_matches_tensorflow_kernel_bit_for_bit():
    import tensorflow as tf

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
        np.testing.assert_array_equal(
            ref, _philox_reference((c0 & _MASK, c0 >> 32, c1 & _MASK, c1 >> 32),
                                   (key & _MASK, key >> 32)))


def _ids(values):
    """Example ids as the backend's layers hold them (int64 on TensorFlow, int32 on JAX)."""
    return ops.convert_to_tensor(values, "int32" if backend.name() == "jax" else "int64")


def _key(seed):
    words = R.seed_to_key_words(seed)
    return ops.convert_to_tensor(words.astype(np.uint32) if backend.name() == "jax" else words)


def test_words_from_ids_is_philox_of_id_and_salt():
    seed = 0x0123456789ABCDEF
    ids = [0, 1, 7919, 2**31 - 1]
    got = np.stack([ops.convert_to_numpy(w) for w in R.words_from_ids(_key(seed), _ids(ids), 5)])
    want = np.array([_philox_reference((i, 0, 0, 5), (seed & _MASK, seed >> 32)) for i in ids],
                    np.uint32).T
    np.testing.assert_array_equal(got, want)
    # the key as int32 words (their bit patterns), in a Keras variable as a layer keeps it
    signed = keras.Variable(R.seed_to_key_words(seed).astype(np.uint32).view(np.int32),
                            dtype="int32", trainable=False)
    again = np.stack([ops.convert_to_numpy(w) for w in R.words_from_ids(signed, _ids(ids), 5)])
    np.testing.assert_array_equal(again, want)
    # 64-bit host ids: the high word enters the counter
    host = np.array([2**40 + 3], np.int64)
    got = [int(ops.convert_to_numpy(w)[0]) for w in R.words_from_ids(
        R.seed_to_key_words(seed), host, 9)]
    assert got == _philox_reference((3, 2**8, 0, 9), (seed & _MASK, seed >> 32))


def test_philox_compiled_matches_eager():
    ids = _ids(np.arange(1000) * 7919)
    key = _key(R.draw_secret())
    eager = [ops.convert_to_numpy(w) for w in R.words_from_ids(key, ids, 5)]
    xla = compiled(lambda k, i: R.words_from_ids(k, i, 5))(key, ids)
    for a, b in zip(eager, xla):
        np.testing.assert_array_equal(a, ops.convert_to_numpy(b))


def test_uniform_words_are_tensorflows_stateless_stream_on_every_backend():
    words = ops.convert_to_numpy(R.uniform_words([3, 5], seed=2**40 + 17))
    assert words.dtype == np.uint32 and words.shape == (3, 5)
    want = _stateless_reference(15, (2**40 + 17, 0))
    np.testing.assert_array_equal(words.reshape(-1), np.array(want, np.uint32))
    fresh = [ops.convert_to_numpy(R.uniform_words([64])) for _ in range(2)]
    assert not np.array_equal(*fresh)  # two fresh secrets: equal with probability 2**-2048


def test_uniform_index_and_words_below():
    words = ops.convert_to_tensor(np.array([0, 2**31 - 1, 2**31, _MASK, 123456789], np.uint32))
    for n in [1, 3, 10, 2**31 - 1]:
        got = ops.convert_to_numpy(R.uniform_index(words, n))
        want = [(int(w) * n) >> 32 for w in ops.convert_to_numpy(words)]
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ops.convert_to_numpy(R.below(words, 0.5)),
                                  [True, True, False, False, True])
    np.testing.assert_array_equal(ops.convert_to_numpy(R.words_below(words, _MASK)),
                                  [True, True, True, False, True])


def test_probability_threshold():
    assert R.probability_threshold(0.5) == 2**31
    assert R.probability_threshold(0.0) == 0
    with pytest.raises(ValueError):
        R.probability_threshold(1.0)


def test_mechanism_with_unseeded_noise_inside_a_trace_is_refused():
    fn = compiled(lambda b: M.binary_randomized_response(b, 1.0))
    with pytest.raises(ValueError, match="freeze one secret into the graph"):
        fn(ops.convert_to_tensor([0, 1]))
    seeded = compiled(lambda b: M.binary_randomized_response(b, 1.0, seed=3))
    assert tuple(seeded(ops.convert_to_tensor([0, 1])).shape) == (2,)


class _UnseededNoise(keras.layers.Layer):
    """A layer that (wrongly) calls a mechanism with a fresh secret in its compiled call."""

    def call(self, x):
        return M.binary_randomized_response(ops.cast(ops.greater(x, 0), "int32"), 1.0)

    def compute_output_shape(self, input_shape):
        return input_shape


def test_a_fresh_secret_inside_a_compiled_predict_is_refused():
    model = keras.Sequential([keras.Input((3,)), _UnseededNoise()])
    with pytest.raises(ValueError, match="freeze one secret into the graph"):
        model.predict(np.ones((2, 3), "float32"), verbose=0)
    # eagerly, each call draws a fresh secret
    assert tuple(model(np.ones((2, 3), "float32")).shape) == (2, 3)
