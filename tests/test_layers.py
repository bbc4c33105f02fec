"""Unit behaviour of LabelDPLayer and EmbeddingDPLayer."""

import dp_accounting
import keras
import numpy as np
import pytest
import tensorflow as tf
from dp_accounting import pld

import keras_fedpriv as kf
from keras_fedpriv import mechanisms as M
from keras_fedpriv.mechanisms import random as R

ONE_BITS = np.float32(1.0).view(np.uint32)


# --- EmbeddingDPLayer ---------------------------------------------------------

@pytest.mark.parametrize("eps", [None, 0.0, 2.0])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_embedding_output_is_exactly_zero_or_one(eps, dtype):
    x = np.random.default_rng(0).normal(size=(64, 32)).astype(dtype)
    out = np.asarray(kf.EmbeddingDPLayer(eps, seed=1)(x, training=True))
    assert out.dtype == np.dtype(dtype) and out.shape == x.shape
    bits = out.view({"float32": np.uint32, "float16": np.uint16, "float64": np.uint64}[dtype])
    allowed = {0, np.asarray(1.0, dtype).view(bits.dtype).item()}
    assert set(np.unique(bits).tolist()) <= allowed  # bit for bit, not just close


def test_naive_ste_idiom_is_not_exact():
    """Why the layer does not use x + stop_gradient(dp(x) - x): that leaks low bits."""
    x = tf.constant(np.random.default_rng(1).normal(size=(1000,)).astype("float32"))
    dp = M.quantize_rr(x, 0.0, seed=1)  # half the bits flipped: x < 0 -> 1 is inexact
    naive = (x + tf.stop_gradient(dp - x)).numpy()
    assert np.any((naive != 0.0) & (naive != 1.0))
    ours = kf.EmbeddingDPLayer(0.0)(x[None], training=True).numpy()
    assert np.all((ours == 0.0) | (ours == 1.0))


def test_embedding_identity_ste_gradient():
    x = tf.constant(np.random.default_rng(2).normal(scale=2.0, size=(8, 6)).astype("float32"))
    upstream = tf.constant(np.random.default_rng(3).normal(size=(8, 6)).astype("float32"))
    layer = kf.EmbeddingDPLayer(eps=1.0, seed=4)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(layer(x, training=True) * upstream)
    np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), upstream.numpy())


def test_embedding_hardtanh_ste_gradient():
    x = tf.constant([[-3.0, -1.0, -0.5, 0.0, 0.7, 1.0, 1.5, 10.0]])
    upstream = tf.constant([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]])
    layer = kf.EmbeddingDPLayer(eps=1.0, seed=4, ste="hardtanh")
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(layer(x, training=True) * upstream)
    grad = tape.gradient(loss, x).numpy()
    np.testing.assert_array_equal(grad, [[0.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0]])


def test_embedding_does_not_modify_input_and_quantize_only_is_sign():
    x = np.random.default_rng(5).normal(size=(16, 4)).astype("float32")
    copy = x.copy()
    out = kf.EmbeddingDPLayer(None)(x, training=True).numpy()
    np.testing.assert_array_equal(x, copy)
    np.testing.assert_array_equal(out, (x > 0).astype("float32"))


def test_embedding_inference_behaviour():
    x = np.random.default_rng(6).normal(size=(512, 16)).astype("float32")
    sign = (x > 0).astype("float32")
    protected = kf.EmbeddingDPLayer(eps=1.0, seed=7)
    a, b = protected(x, training=False).numpy(), protected(x, training=False).numpy()
    assert np.mean(a != sign) > 0.2 and np.mean(a != b) > 0.2  # randomized, fresh per call
    off = kf.EmbeddingDPLayer(eps=1.0, seed=7, at_inference=False)
    np.testing.assert_array_equal(off(x, training=False).numpy(), sign)
    assert np.mean(off(x, training=True).numpy() != sign) > 0.2


def test_embedding_dp_event_composes_coordinates():
    layer = kf.EmbeddingDPLayer(eps=2.0)
    layer.build((None, 8))
    event = layer.dp_event()
    assert isinstance(event, dp_accounting.ComposedDpEvent) and len(event.events) == 8
    accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(event)
    # 8 coordinates at eps/2 = 1 each: at most 8 by basic composition, and
    # more than a single coordinate.
    eps_total = accountant.get_epsilon(1e-9)
    assert 1.0 < eps_total <= 8.0 + 1e-6
    assert isinstance(kf.EmbeddingDPLayer(None).dp_event(4), dp_accounting.NonPrivateDpEvent)
    with pytest.raises(ValueError, match="not built"):
        kf.EmbeddingDPLayer(1.0).dp_event()


# --- LabelDPLayer ---------------------------------------------------------------

@pytest.mark.parametrize("labels,kwargs", [
    (np.array([0, 1, 1, 0], "float32"), {}),
    (np.array([[0], [1], [1], [0]], "int32"), {}),
    (np.array([0, 1, 1, 0], "int64"), {"mode": "binary"}),
    (np.eye(3, dtype="float32")[[0, 1, 2, 1]], {}),
    (np.eye(3, dtype="int32")[[0, 1, 2, 1]], {"mode": "onehot"}),
    (np.array([0, 4, 2, 3], "int64"), {"num_classes": 5}),
    (np.array([[0], [4], [2], [3]], "int32"), {"mode": "sparse", "num_classes": 5}),
])
def test_label_formats_are_preserved(labels, kwargs):
    layer = kf.LabelDPLayer(0.0, **kwargs)
    out = np.asarray(layer(labels, example_ids=np.arange(4), training=True))
    assert out.shape == labels.shape and out.dtype == labels.dtype
    if labels.ndim == 2 and labels.shape[1] > 1:
        assert np.all(out.sum(axis=1) == 1) and set(np.unique(out)) <= {0, 1}
    else:
        assert set(np.unique(out)) <= set(range(kwargs.get("num_classes", 2)))
    # At inference the labels pass through untouched (the same object).
    assert layer(labels, example_ids=np.arange(4), training=False) is labels


def test_label_noise_is_a_function_of_id():
    layer = kf.LabelDPLayer(0.5, seed=9)
    y = np.zeros(1000, "float32")
    ids = np.arange(1000)
    a = layer(y, example_ids=ids, training=True).numpy()
    b = layer(y, example_ids=ids, training=True).numpy()
    np.testing.assert_array_equal(a, b)  # every epoch the same noisy labels
    perm = np.random.default_rng(0).permutation(1000)
    c = layer(y[perm], example_ids=ids[perm], training=True).numpy()
    np.testing.assert_array_equal(c, a[perm])  # follows the id, not the position
    d = layer(y, example_ids=ids + 1000, training=True).numpy()
    assert np.mean(a != d) > 0.3  # other ids, independent noise


def test_per_batch_rerandomizes_and_composes():
    layer = kf.LabelDPLayer(0.5, per_batch=True, seed=3)
    y = np.zeros(1000, "float32")
    assert np.mean(layer(y, training=True).numpy() != layer(y, training=True).numpy()) > 0.3
    once = kf.LabelDPLayer(0.5)
    assert once.dp_event(num_epochs=10) == M.randomized_response_dp_event(0.5, 2)
    event = layer.dp_event(num_epochs=10)
    assert isinstance(event, dp_accounting.ComposedDpEvent) and len(event.events) == 10


def test_label_dp_event_matches_rr_probabilities():
    for k, eps in [(2, 1.0), (10, 2.0), (4, 0.0)]:
        event = M.randomized_response_dp_event(eps, k)
        a = event.noise_parameter
        assert 1 - a + a / k == pytest.approx(M.keep_probability(eps, k))
    accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(kf.LabelDPLayer(1.0).dp_event())
    assert accountant.get_epsilon(1e-12) == pytest.approx(1.0, abs=0.02)
    layer = kf.LabelDPLayer(1.0, mode="onehot")
    layer(np.eye(10, dtype="float32"), example_ids=np.arange(10), training=True)
    assert layer.dp_event().num_buckets == 10


def test_prior_mode_uses_the_prior_and_reports_a_dominating_event():
    n, k = 20_000, 10
    y = np.arange(n) % k
    prior = np.full((n, k), 0.01, "float32")
    prior[np.arange(n), y] = 0.91  # a good first-stage model
    plain = kf.privatize_labels(y, 1.0, num_classes=k, seed=5)
    with_prior = kf.privatize_labels(y, 1.0, num_classes=k, prior=prior, seed=5)
    assert np.mean(with_prior == y) > np.mean(plain == y) + 0.3
    layer = kf.LabelDPLayer(1.0, num_classes=k)
    layer(y, example_ids=np.arange(n), prior=prior, training=True)
    assert layer.dp_event().num_buckets == 2  # binary RR at eps dominates every eps-DP mechanism


def test_binary_prior_as_probability_of_one():
    y = np.array([0, 1] * 5000, "float32")
    confident = np.where(y == 1, 0.99, 0.01).astype("float32")
    out = kf.privatize_labels(y, 0.5, prior=confident, seed=1)
    # k* = 1 here: the top class of the prior is output, so labels survive.
    assert np.mean(out == y) == 1.0


def test_get_config_round_trip():
    layer = kf.LabelDPLayer(0.7, mode="sparse", num_classes=4, per_batch=True, name="ldp")
    clone = kf.LabelDPLayer.from_config(layer.get_config())
    assert (clone.eps, clone.mode, clone.num_classes, clone.per_batch, clone.seed) == \
        (0.7, "sparse", 4, True, None)
    e = kf.EmbeddingDPLayer(3.0, seed=5, at_inference=False, ste="hardtanh")
    c = kf.EmbeddingDPLayer.from_config(e.get_config())
    assert (c.eps, c.seed, c.at_inference, c.ste) == (3.0, 5, False, "hardtanh")
    assert "rng_key" not in str(layer.get_config())


def test_layers_are_registered_for_deserialization():
    for layer in [kf.LabelDPLayer(1.0), kf.EmbeddingDPLayer(1.0)]:
        restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
        assert type(restored) is type(layer) and restored.eps == 1.0


def test_privatize_labels_keeps_dtype_and_is_reproducible_with_seed():
    y = np.array([0, 1] * 500, "int8")
    a = kf.privatize_labels(y, 0.3, seed=8)
    b = kf.privatize_labels(y, 0.3, seed=8)
    c = kf.privatize_labels(y, 0.3)
    assert a.dtype == np.int8 and np.array_equal(a, b)
    assert not np.array_equal(a, c)


# --- The RNG --------------------------------------------------------------------

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


def test_dp_accounting_self_composed_rr_bug_is_avoided():
    """Canary: dp-accounting's PLD accountant drops the count of self-composed RR.

    If this starts failing, dp-accounting fixed the bug and `repeat_event`
    may use SelfComposedDpEvent again.
    """
    rr = M.randomized_response_dp_event(1.0, 2)

    def eps_of(event):
        accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(event)
        return accountant.get_epsilon(1e-9)

    assert eps_of(dp_accounting.SelfComposedDpEvent(rr, 5)) == pytest.approx(1.0, abs=0.01)
    assert eps_of(M.repeat_event(rr, 5)) == pytest.approx(5.0, abs=0.05)


@pytest.mark.parametrize("mode, labels", [
    ("binary", np.zeros((0, 1), "float32")),
    ("onehot", np.zeros((0, 3), "float32")),
    ("sparse", np.zeros((0,), "int32")),
])
def test_label_layer_accepts_an_empty_batch_in_a_graph(mode, labels):
    # Under MirroredStrategy a replica can get 0 rows of the last global batch.
    layer = kf.LabelDPLayer(1.0, mode=mode, num_classes=3 if mode == "sparse" else None, seed=1)
    ids = tf.zeros((0,), tf.int64)
    out = tf.function(lambda y, i: layer(y, example_ids=i, training=True))(tf.constant(labels), ids)
    assert out.shape == labels.shape and out.dtype == labels.dtype
