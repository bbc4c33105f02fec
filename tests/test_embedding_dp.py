"""EmbeddingDPLayer (keras_fedpriv/layers/embedding_dp.py): behaviour, and output frequencies
against the formula, on every Keras backend."""

import os
import zipfile

import dp_accounting
import h5py
import keras
import numpy as np
import pytest
from dp_accounting import pld
from keras import ops

import keras_fedpriv as kf
from keras_fedpriv import mechanisms as M
from stats import N, UNSEEDED_SIGMAS, assert_rate

pytestmark = [pytest.mark.jax]

BACKEND = keras.backend.backend()


def input_gradient(layer, x, upstream):
    """d sum(layer(x, training=True) * upstream) / dx, with the backend's autodiff."""
    x, upstream = np.asarray(x, "float32"), np.asarray(upstream, "float32")
    layer.build(x.shape)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, training=True) * upstream)
        return tape.gradient(loss, x).numpy()
    import jax

    state = [v.value for v in layer.non_trainable_variables]

    def loss(inputs):
        out, _ = layer.stateless_call([], state, inputs, training=True)
        return (out * upstream).sum()

    return np.asarray(jax.grad(loss)(x))


@pytest.mark.parametrize("eps", [None, 0.0, 2.0])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_embedding_output_is_exactly_zero_or_one(eps, dtype):
    if dtype == "float64" and keras.backend.standardize_dtype(ops.ones(1, dtype).dtype) != dtype:
        pytest.skip("this backend has no float64 (JAX without jax_enable_x64)")
    x = np.random.default_rng(0).normal(size=(64, 32)).astype(dtype)
    out = np.asarray(kf.EmbeddingDPLayer(eps, seed=1)(x, training=True))
    assert out.dtype == np.dtype(dtype) and out.shape == x.shape
    bits = out.view({"float32": np.uint32, "float16": np.uint16, "float64": np.uint64}[dtype])
    allowed = {0, np.asarray(1.0, dtype).view(bits.dtype).item()}
    assert set(np.unique(bits).tolist()) <= allowed  # bit for bit, not just close


def test_naive_ste_idiom_is_not_exact():
    """Why the layer does not use x + stop_gradient(dp(x) - x): that leaks low bits."""
    x = ops.convert_to_tensor(np.random.default_rng(1).normal(size=(1000,)).astype("float32"))
    dp = M.quantize_rr(x, 0.0, seed=1)  # half the bits flipped: x < 0 -> 1 is inexact
    naive = ops.convert_to_numpy(x + ops.stop_gradient(dp - x))
    assert np.any((naive != 0.0) & (naive != 1.0))
    ours = ops.convert_to_numpy(kf.EmbeddingDPLayer(0.0)(x[None], training=True))
    assert np.all((ours == 0.0) | (ours == 1.0))


def test_embedding_identity_ste_gradient():
    x = np.random.default_rng(2).normal(scale=2.0, size=(8, 6)).astype("float32")
    upstream = np.random.default_rng(3).normal(size=(8, 6)).astype("float32")
    grad = input_gradient(kf.EmbeddingDPLayer(eps=1.0, seed=4), x, upstream)
    np.testing.assert_array_equal(grad, upstream)


def test_embedding_hardtanh_ste_gradient():
    x = [[-3.0, -1.0, -0.5, 0.0, 0.7, 1.0, 1.5, 10.0]]
    upstream = [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]]
    grad = input_gradient(kf.EmbeddingDPLayer(eps=1.0, seed=4, ste="hardtanh"), x, upstream)
    np.testing.assert_array_equal(grad, [[0.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0]])


def test_embedding_does_not_modify_input_and_quantize_only_is_sign():
    x = np.random.default_rng(5).normal(size=(16, 4)).astype("float32")
    copy = x.copy()
    out = np.asarray(kf.EmbeddingDPLayer(None)(x, training=True))
    np.testing.assert_array_equal(x, copy)
    np.testing.assert_array_equal(out, (x > 0).astype("float32"))


def test_embedding_inference_behaviour():
    x = np.random.default_rng(6).normal(size=(512, 16)).astype("float32")
    sign = (x > 0).astype("float32")
    protected = kf.EmbeddingDPLayer(eps=1.0, seed=7)
    a, b = (np.asarray(protected(x, training=False)) for _ in range(2))
    assert np.mean(a != sign) > 0.2 and np.mean(a != b) > 0.2  # randomized, fresh per call
    off = kf.EmbeddingDPLayer(eps=1.0, seed=7, at_inference=False)
    np.testing.assert_array_equal(np.asarray(off(x, training=False)), sign)
    assert np.mean(np.asarray(off(x, training=True)) != sign) > 0.2


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
    out = np.asarray(layer(x, training=True))
    ones = x > 0
    assert_rate(int(out[ones].sum()), int(ones.sum()), M.quantize_keep_probability(eps), "keep 1")
    assert_rate(int(out[~ones].sum()), int((~ones).sum()), M.quantize_turn_on_probability(eps),
                "turn 0 into 1")
    # Per coordinate the turn-on rate is the same (no position bias).
    col_counts = ((out == 1) & ~ones).sum(axis=0)
    col_n = (~ones).sum(axis=0)
    for c, n in zip(col_counts, col_n):
        assert_rate(int(c), int(n), M.quantize_turn_on_probability(eps), "per-coordinate 0 -> 1")


# --- in a model: XLA-compiled fit, the ledger, saving, mixed precision -------------------------

def _bottom_model(layer, d_in=6, d=16):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((d_in,)), keras.layers.Dense(d, name="bottom"), layer,
                             keras.layers.Dense(1, name="top")])


def test_jit_compiled_fit_draws_fresh_noise_each_step_and_records_every_release():
    from keras_fedpriv.privacy import privacy_report

    layer = kf.EmbeddingDPLayer(2.0, seed=3, name="edp")
    model = _bottom_model(layer)
    model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=True)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 6)).astype("float32"), rng.normal(size=(128, 1))
    before = [w.copy() for w in model.get_layer("bottom").get_weights()]
    draws = layer.noise_draws
    history = model.fit(x, y, epochs=3, batch_size=32, shuffle=False, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))
    assert layer.noise_draws - draws == 12  # one fresh draw per step, under XLA
    assert layer.release_calls()["fresh_without_ids"] == 12
    # The straight-through gradient reaches the bottom.
    after = model.get_layer("bottom").get_weights()
    assert all(np.any(a != b) for a, b in zip(after, before))
    report = privacy_report(model, protects="features")
    assert {r.mechanism: r.count for r in report.releases} == {"EmbeddingDPLayer 'edp'": 12}
    assert np.isfinite(report.epsilon)


@pytest.mark.parametrize("eps", [0.5, 4.0])
def test_jit_compiled_predict_flips_at_the_formula_rate(eps):
    layer = kf.EmbeddingDPLayer(eps, seed=25)
    model = keras.Sequential([keras.Input((16,)), layer])
    model.compile(jit_compile=True)
    x = np.random.default_rng(4).normal(size=(N // 16, 16)).astype("float32")
    out = model.predict(x, batch_size=1024, verbose=0)
    assert np.all((out == 0.0) | (out == 1.0))
    ones = x > 0
    assert_rate(int(out[ones].sum()), int(ones.sum()), M.quantize_keep_probability(eps), "keep 1")
    assert_rate(int(out[~ones].sum()), int((~ones).sum()), M.quantize_turn_on_probability(eps),
                "turn 0 into 1")
    assert layer.noise_draws == -(-len(x) // 1024)  # one draw per batch: fresh noise


def test_per_example_ids_count_each_example_once_per_call():
    layer = kf.EmbeddingDPLayer(1.0, seed=2, name="edp")
    x = np.ones((4, 3), "float32")
    layer(x, example_ids=np.array([0, 1, 2, 3]), training=True)
    layer(x, example_ids=np.array([2, 3, 4, 5]), training=True)
    ids, counts = layer._release_id_counts_nonzero()
    assert dict(zip(ids.tolist(), counts.tolist())) == {0: 1, 1: 1, 2: 2, 3: 2, 4: 1, 5: 1}
    assert layer.release_calls()["fresh_with_ids"] == 2
    ledger = layer.privacy_ledger()
    (kind,) = ledger.kinds
    assert ledger.total(kind) == 2 and ledger.units_seen(kind) == 6  # the busiest example: 2


def test_inference_without_randomization_is_recorded_as_not_private():
    layer = kf.EmbeddingDPLayer(1.0, seed=2, at_inference=False, name="edp")
    layer(np.ones((4, 3), "float32"), training=False)
    assert layer.release_calls()["non_private"] == 1
    (kind,) = layer.privacy_ledger().kinds
    assert isinstance(kind.event, dp_accounting.NonPrivateDpEvent)


def _h5_datasets(path):
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.update({name: obj[()]})
                     if isinstance(obj, h5py.Dataset) else None)
    return found


def test_keras_file_and_weights_never_hold_the_key_and_a_reload_draws_a_fresh_one(tmp_path):
    layer = kf.EmbeddingDPLayer(2.0, name="edp")
    model = _bottom_model(layer)
    x = np.random.default_rng(7).normal(size=(4000, 6)).astype("float32")
    model(x[:4], training=True)  # one release
    key_words = [int(w) for w in np.asarray(layer.rng_key.numpy())[:2]]
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    weights = os.path.join(tmp_path, "m.weights.h5")
    model.save_weights(weights)
    with zipfile.ZipFile(path) as zf:
        config = zf.read("config.json").decode()
        zf.extract("model.weights.h5", tmp_path)
    assert "rng_key" not in config
    for h5 in (weights, os.path.join(tmp_path, "model.weights.h5")):
        for name, value in _h5_datasets(h5).items():
            assert "rng_key" not in name
            assert not set(np.asarray(value).ravel().tolist()) & set(key_words), name
    back = keras.models.load_model(path)
    new = back.get_layer("edp")
    assert new.noise_draws == layer.noise_draws == 1  # the counter is saved, never rewound
    assert not np.array_equal(np.asarray(new.rng_key.numpy())[:2], key_words)
    # The same bottom, a fresh key: the two releases of the same input are independent.
    q = M.quantize_turn_on_probability(2.0)
    emb = keras.Sequential([model.get_layer("bottom"), layer])
    emb_back = keras.Sequential([back.get_layer("bottom"), new])
    a, b = np.asarray(emb(x, training=True)), np.asarray(emb_back(x, training=True))
    assert_rate(int(np.sum(a != b)), a.size, 2 * q * (1 - q), "original vs reloaded",
                UNSEEDED_SIGMAS)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_keeps_exact_bits_and_trains(policy):
    keras.config.set_dtype_policy(policy)
    try:
        layer = kf.EmbeddingDPLayer(2.0, seed=5, name="edp")
        model = _bottom_model(layer)
    finally:
        keras.config.set_dtype_policy("float32")
    half = policy.split("_")[1]
    x = np.random.default_rng(8).normal(size=(64, 6)).astype("float32")
    emb = keras.Sequential([model.get_layer("bottom"), layer])
    out = emb(x, training=True)
    assert keras.backend.standardize_dtype(out.dtype) == half
    bits = np.asarray(ops.cast(out, "float32"))
    assert np.all((bits == 0.0) | (bits == 1.0))
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=True)
    loss = model.fit(x, x[:, :1], epochs=2, batch_size=32, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss)) and layer.noise_draws == 1 + 4


def test_non_finite_embedding_under_xla_gives_exact_bits_and_is_reported_on_the_host():
    layer = kf.EmbeddingDPLayer(2.0, seed=4)
    model = keras.Sequential([keras.Input((6,)), layer])
    model.compile(loss="mse", jit_compile=True)
    x = np.random.default_rng(9).normal(size=(8, 6)).astype("float32")
    x[1, 2], x[4, 0], x[6, 5] = np.nan, np.inf, -np.inf
    out = model.predict(x, verbose=0)
    assert np.all((out == 0.0) | (out == 1.0))
    with pytest.raises(ValueError, match="non-finite"):
        layer.check_input_errors()
    layer.check_input_errors()  # reset by the first check
