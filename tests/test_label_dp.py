"""LabelDPLayer (keras_fedpriv/layers/label_dp.py): behaviour, and output frequencies against the
formula."""

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from dp_accounting import pld

import keras_fedpriv as kf
from keras_fedpriv import mechanisms as M
from stats import N, assert_rate, assert_rejects, assert_uniform


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
    # Every call with a prior is fresh noise: E epochs are E releases, as the ledger counts.
    event = layer.dp_event(num_epochs=3)
    assert isinstance(event, dp_accounting.ComposedDpEvent) and len(event.events) == 3
    assert set(event.events) == {layer.dp_event()}
    fresh = kf.LabelDPLayer(1.0, num_classes=k)
    assert fresh.dp_event(num_epochs=3, prior=True) == event  # planned before the first call
    assert fresh.dp_event(num_epochs=3) == M.randomized_response_dp_event(1.0, k)
    with pytest.raises(TypeError, match="`prior` must be a bool.*got a ndarray") as info:
        fresh.dp_event(prior=prior)
    assert "0.91" not in str(info.value)


def test_binary_prior_as_probability_of_one():
    y = np.array([0, 1] * 5000, "float32")
    confident = np.where(y == 1, 0.99, 0.01).astype("float32")
    out = kf.privatize_labels(y, 0.5, prior=confident, seed=1)
    # k* = 1 here: the top class of the prior is output, so labels survive.
    assert np.mean(out == y) == 1.0


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


@pytest.mark.parametrize("eps", [0.0, 1.0, 8.0])
def test_label_layer_binary_rates(eps):
    y = np.zeros((N, 1), "float32")
    y[: N // 2] = 1
    out = kf.privatize_labels(y, eps, seed=21)
    assert out.shape == y.shape and out.dtype == y.dtype
    assert_rate(int(np.sum(out != y)), N, M.flip_probability(eps), f"LabelDP binary eps={eps}")
    if eps > 0:
        assert_rejects(int(np.sum(out != y)), N, M.flip_probability(2 * eps), "LabelDP binary")


@pytest.mark.parametrize("eps", [0.0, 1.0, 4.0])
def test_label_layer_onehot_rates(eps):
    k = 5
    cls = np.arange(N) % k
    y = np.eye(k, dtype="float32")[cls]
    out = kf.privatize_labels(y, eps, seed=22)
    assert out.shape == y.shape and out.dtype == y.dtype
    assert np.all(out.sum(axis=1) == 1)
    got = out.argmax(axis=1)
    assert_rate(int(np.sum(got == cls)), N, M.keep_probability(eps, k), f"one-hot keep eps={eps}")
    counts = np.bincount((got[got != cls] - cls[got != cls]) % k, minlength=k)[1:]
    assert_uniform(counts, f"one-hot other classes eps={eps}")


def test_label_layer_sparse_rates_per_true_class():
    k, eps = 4, 1.5
    cls = np.arange(N, dtype="int64") % k
    out = kf.privatize_labels(cls, eps, mode="sparse", num_classes=k, seed=23)
    assert out.dtype == np.int64
    for c in range(k):
        rows = out[cls == c]
        assert_rate(int(np.sum(rows == c)), rows.size, M.keep_probability(eps, k), f"class {c}")
        assert_uniform(np.bincount(rows[rows != c], minlength=k)[[j for j in range(k) if j != c]],
                       f"sparse other classes of {c}")


def test_label_layer_ids_and_per_batch_rates():
    """Both noise sources (id-keyed Philox, per-call stateless) have the right rate."""
    eps = 1.0
    y = np.zeros(N, "float32")
    layer = kf.LabelDPLayer(eps, seed=25)
    by_id = layer(y, example_ids=np.arange(N), training=True).numpy()
    assert_rate(int(by_id.sum()), N, M.flip_probability(eps), "id-keyed")
    per_batch = kf.LabelDPLayer(eps, seed=25, per_batch=True)
    a = per_batch(y, training=True).numpy()
    b = per_batch(y, training=True).numpy()
    assert_rate(int(a.sum()), N, M.flip_probability(eps), "per-batch")
    # Consecutive calls are independent: agreement rate p^2 + (1-p)^2.
    p = M.flip_probability(eps)
    assert_rate(int(np.sum(a == b)), N, p * p + (1 - p) ** 2, "per-batch independence")
