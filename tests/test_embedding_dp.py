"""EmbeddingDPLayer (keras_fedpriv/layers/embedding_dp.py): behaviour, and output frequencies
against the formula."""

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from dp_accounting import pld

import keras_fedpriv as kf
from keras_fedpriv import mechanisms as M
from stats import N, assert_rate


ONE_BITS = np.float32(1.0).view(np.uint32)


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


@pytest.mark.parametrize("eps", [0.0, 1.0, 6.0])
def test_embedding_layer_rates(eps):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(N // 16, 16)).astype("float32")
    layer = kf.EmbeddingDPLayer(eps=eps, seed=24)
    out = layer(x, training=True).numpy()
    ones = x > 0
    assert_rate(int(out[ones].sum()), int(ones.sum()), M.quantize_keep_probability(eps), "keep 1")
    assert_rate(int(out[~ones].sum()), int((~ones).sum()), M.quantize_turn_on_probability(eps),
                "turn 0 into 1")
    # Per coordinate the turn-on rate is the same (no position bias).
    col_counts = ((out == 1) & ~ones).sum(axis=0)
    col_n = (~ones).sum(axis=0)
    for c, n in zip(col_counts, col_n):
        assert_rate(int(c), int(n), M.quantize_turn_on_probability(eps), "per-coordinate 0 -> 1")
