"""LabelDPLayer (keras_fedpriv/layers/label_dp.py): behaviour, and output frequencies against the
formula, on every Keras backend."""

import os

import dp_accounting
import keras
import numpy as np
import pytest
from dp_accounting import pld

import keras_fedpriv as kf
from keras_fedpriv import mechanisms as M
from stats import N, assert_rate, assert_rejects, assert_uniform
from traced import traced_call

pytestmark = [pytest.mark.jax]


def test_label_noise_is_a_function_of_id():
    layer = kf.LabelDPLayer(0.5, seed=9)
    y = np.zeros(1000, "float32")
    ids = np.arange(1000)
    a = np.asarray(layer(y, example_ids=ids, training=True))
    b = np.asarray(layer(y, example_ids=ids, training=True))
    np.testing.assert_array_equal(a, b)  # every epoch the same noisy labels
    perm = np.random.default_rng(0).permutation(1000)
    c = np.asarray(layer(y[perm], example_ids=ids[perm], training=True))
    np.testing.assert_array_equal(c, a[perm])  # follows the id, not the position
    d = np.asarray(layer(y, example_ids=ids + 1000, training=True))
    assert np.mean(a != d) > 0.3  # other ids, independent noise


def test_per_batch_rerandomizes_and_composes():
    layer = kf.LabelDPLayer(0.5, per_batch=True, seed=3)
    y = np.zeros(1000, "float32")
    assert np.mean(np.asarray(layer(y, training=True)) != np.asarray(layer(y, training=True))) > 0.3
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
    out = traced_call(layer, labels, jit_compile=False, example_ids=np.zeros((0,), "int32"))
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
    by_id = np.asarray(layer(y, example_ids=np.arange(N), training=True))
    assert_rate(int(by_id.sum()), N, M.flip_probability(eps), "id-keyed")
    per_batch = kf.LabelDPLayer(eps, seed=25, per_batch=True)
    a = np.asarray(per_batch(y, training=True))
    b = np.asarray(per_batch(y, training=True))
    assert_rate(int(a.sum()), N, M.flip_probability(eps), "per-batch")
    # Consecutive calls are independent: agreement rate p^2 + (1-p)^2.
    p = M.flip_probability(eps)
    assert_rate(int(np.sum(a == b)), N, p * p + (1 - p) ** 2, "per-batch independence")


def test_a_traced_call_keys_the_noise_by_id_as_an_eager_call_does():
    y = (np.arange(500) % 2).astype("float32")
    ids = np.arange(500, dtype="int32")
    layer = kf.LabelDPLayer(1.0, seed=4)
    eager = np.asarray(layer(y, example_ids=ids, training=True))
    np.testing.assert_array_equal(traced_call(layer, y, example_ids=ids), eager)
    assert layer.release_calls()["keyed_once"] == 2 and layer.noise_draws == 0
    fresh = kf.LabelDPLayer(1.0, seed=4, per_batch=True)
    a, b = traced_call(fresh, y), traced_call(fresh, y)
    assert np.mean(a != b) > 0.1 and fresh.noise_draws == 2  # a new draw at every call


def test_invalid_inputs_in_a_traced_call_give_label_independent_noise_and_are_counted():
    """Where no assert runs (XLA on TensorFlow, every traced JAX call) the batch gets noise that
    does not depend on its labels, and check_input_errors raises on the host, once."""
    ids = np.arange(64, dtype="int32")
    layer = kf.LabelDPLayer(4.0, seed=2)
    bad_a = (np.arange(64) % 2).astype("float32")
    bad_a[5] = 2.0
    bad_b = 1.0 - bad_a
    bad_b[5] = 7.0
    out_a = traced_call(layer, bad_a, example_ids=ids)
    out_b = traced_call(layer, bad_b, example_ids=ids)
    np.testing.assert_array_equal(out_a, out_b)
    assert set(np.unique(out_a)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match=r"invalid labels or prior \(2 call\(s\)\)") as info:
        layer.check_input_errors()
    assert "7.0" not in str(info.value) and "2.0" not in str(info.value)
    layer.check_input_errors()  # reset
    repeated = ids.copy()
    repeated[9] = repeated[3]
    traced_call(layer, (np.arange(64) % 2).astype("float32"), example_ids=repeated)
    with pytest.raises(ValueError, match=r"invalid example_ids \(wrong count or repeated\) "
                                         r"\(1 call\(s\)\)"):
        layer.check_input_errors()


def _label_model(layer, dims=4):
    """Features, labels and ids in; the prediction and the randomized labels out (side by
    side, so a loss compares them): the layer runs in the model's traced train step."""
    x = keras.Input((dims,), name="x")
    y = keras.Input((1,), name="y")
    ids = keras.Input((), dtype="int32", name="ids")
    noisy = layer(y, example_ids=ids, training=True)
    pred = keras.layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model([x, y, ids], keras.layers.Concatenate()([pred, noisy]))

    def loss(_, out):
        return keras.losses.binary_crossentropy(out[:, 1:], out[:, :1])

    model.compile(optimizer="sgd", loss=loss, jit_compile=True)
    return model


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_jit_compiled_fit_randomizes_once_per_example_and_records_the_releases(policy):
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        n = 256
        rng = np.random.default_rng(0)
        x = rng.normal(size=(n, 4)).astype("float32")
        y = (x[:, :1] > 0).astype("float32")
        ids = np.arange(n, dtype="int32")
        layer = kf.LabelDPLayer(1.0, seed=6, name="ldp")
        model = _label_model(layer)
        model.fit([x, y, ids], y, epochs=2, batch_size=64, shuffle=True, verbose=0)
        layer.check_input_errors()
        assert layer.release_calls()["keyed_once"] == 8 and layer.noise_draws == 0
        ledger = layer.privacy_ledger()
        assert len(ledger) == 1
        # Once per example: the fit's labels are the layer's keyed labels, the same every epoch.
        out = np.asarray(model([x, y, ids], training=True))
        np.testing.assert_array_equal(np.asarray(model.predict([x, y, ids], verbose=0))[:, 1:], y)
        keyed = np.asarray(layer(y, example_ids=ids, training=True))
        np.testing.assert_array_equal(out[:, 1:], keyed)
    finally:
        keras.mixed_precision.set_global_policy(before)


def test_a_reloaded_unseeded_layer_has_a_fresh_key_that_no_file_holds(tmp_path):
    layer = kf.LabelDPLayer(0.0, name="ldp")
    model = _label_model(layer)
    y = np.zeros((1000, 1), "float32")
    ids = np.arange(1000, dtype="int32")
    before = np.asarray(layer(y, example_ids=ids, training=True))
    words = [int(w) for w in np.asarray(layer._key_words())]
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    model.save_weights(os.path.join(tmp_path, "model.weights.h5"))
    import h5py

    with h5py.File(os.path.join(tmp_path, "model.weights.h5"), "r") as f:
        stored = []
        f.visititems(lambda name, item: stored.append(np.asarray(item)) if isinstance(item, h5py.Dataset) else None)
    assert not any(np.isin(words, value.astype("int64", copy=False)).any() for value in stored
                   if value.dtype.kind in "iu")
    loaded = keras.models.load_model(path, custom_objects={"loss": lambda a, b: a}, compile=False)
    again = loaded.get_layer("ldp")
    after = np.asarray(again(y, example_ids=ids, training=True))
    assert 0.4 < np.mean(before == after) < 0.6  # eps = 0: two independent keys agree half the time
