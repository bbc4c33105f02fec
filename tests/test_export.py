"""Export round trips of every layer, model, optimizer wrapper and callback (issue 6).

What the other test files already cover is not repeated here (see docs/export.md,
"What the tests check"). This file adds, per object:

* `.keras` save/load: the layer's config is identical and holds no secret (no
  ``seed`` unless one was given, no key bytes in ``config.json``), the
  deterministic parts give the same values, and the randomized outputs of the
  reloaded object have the mechanism's distribution (within 6.5 standard
  deviations, with a check that a wrong formula would be rejected) and are
  independent of the original's (a fresh key).

The randomized outputs come from fresh OS-entropy keys, so these checks are not
deterministic: each fails by chance with probability below 1e-10 (6.5 standard
deviations: 8.0e-11; a KS test at p > 1e-10), on samples 1.7 to 2.4 times as large
as at 5 standard deviations and p > 1e-4, so no band is wider than it was there.
* `model.export()` + `tf.saved_model.load(...).serve`: the same checks on the
  served outputs; two loads of one SavedModel do not replay each other's noise
  unless ``seed=`` was given.
* `VerticalModel`, the `SignDS` optimizer wrapper, `MagRR` and `LaplaceEvaluation`.
"""

import json
import math
import os
import warnings
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats as scipy_stats
from stats import UNSEEDED_SIGMAS as SIGMAS
from stats import assert_rate, assert_rejects

import keras_fedpriv as kf
from keras_fedpriv.callbacks import LaplaceEvaluation, MagRR
from keras_fedpriv.federated import VerticalModel, with_example_ids
from keras_fedpriv.mechanisms import (
    flip_probability,
    keep_probability,
    quantize_turn_on_probability,
)
from keras_fedpriv.optimizers import SignDS, SignDSEncoder, SignDSRounds
from crosspath import assert_bits_are_the_sign  # noqa: E402

RNG = np.random.default_rng(20240606)
EPS_EMB = 2.0  # EmbeddingDPLayer: flip probability q = 1 / (e + 1) = 0.269
EPS_LAB = 1.0  # LabelDPLayer: binary flip probability 1 / (1 + e) = 0.269
X_EMB = RNG.normal(size=(1700, 6)).astype("float32")  # x 64 coordinates = 108,800 bits
X_VAE = RNG.normal(size=(9600, 6)).astype("float32")  # x 3 latent dims = 28,800 draws
N_LAB = 34_000
KS_PVALUE = 1e-10  # a KS test of a true distribution fails with this probability


# --- helpers --------------------------------------------------------------------------------

def _save_load(model, tmp_path, name="model.keras"):
    path = os.path.join(tmp_path, name)
    model.save(path)
    return keras.models.load_model(path), path


def _config_text(path):
    with zipfile.ZipFile(path) as zf:
        return zf.read("config.json").decode()


def _assert_config_holds_no_key(path, layers):
    """No key variable and no key word (as JSON would write it) in the `.keras` config."""
    text = _config_text(path)
    assert "rng_key" not in text and "rng_counter" not in text
    for layer in layers:
        assert layer.get_config()["seed"] is None
        for word in layer.rng_key.numpy()[:2]:
            assert str(int(word)) not in text


def _assert_fresh_key(old, new):
    assert not np.array_equal(old.rng_key.numpy()[:2], new.rng_key.numpy()[:2])
    assert new.rng_key.numpy()[2] == 1  # a real key, not the "no key" flag


def _check_bits(out, sign, eps, what):
    """``out`` is quantize + RR of ``sign``: each bit flipped with q = 1 / (e^(eps/2) + 1)."""
    out = np.asarray(out)
    assert out.shape == sign.shape and out.dtype == np.float32
    assert np.all((out == 0) | (out == 1)), what
    flips, n = int(np.sum(out != sign)), out.size
    assert_rate(flips, n, quantize_turn_on_probability(eps), what, SIGMAS)
    # The eps vs eps/2 confusion (binary RR at eps) would be caught.
    assert_rejects(flips, n, flip_probability(eps), what, SIGMAS)


def _check_independent_flips(a, b, p, what):
    """Two independent RR releases of the same input differ with probability 2 p (1 - p).

    Replayed noise (the same key and counter) would differ nowhere.
    """
    a, b = np.asarray(a), np.asarray(b)
    assert_rate(int(np.sum(a != b)), a.size, 2 * p * (1 - p), what, SIGMAS)


def _check_posterior_sample(z, mu, logvar, what):
    """``(z - mu) / exp(0.5 logvar)`` is standard normal: mean, std and a KS test."""
    r = ((np.asarray(z, np.float64) - mu) / np.exp(0.5 * np.asarray(logvar, np.float64))).ravel()
    n = r.size
    assert abs(r.mean()) < SIGMAS / math.sqrt(n), (what, r.mean())
    assert abs(r.std() - 1.0) < SIGMAS / math.sqrt(2 * n), (what, r.std())
    assert scipy_stats.kstest(r, "norm").pvalue > KS_PVALUE, what
    return r


def _check_uncorrelated(r1, r2, what):
    """Standardized residuals of two independent samples are uncorrelated (replay: r = 1)."""
    corr = float(np.corrcoef(r1, r2)[0, 1])
    assert abs(corr) < SIGMAS / math.sqrt(r1.size), (what, corr)


def _as_json(config):
    return json.loads(json.dumps(config))


def _dense_bottom(n_in, d, name):
    inp = keras.Input((n_in,), name=f"{name}_in")
    return keras.Model(inp, keras.layers.Dense(d, name=f"{name}_emb")(inp), name=name)


# --- EmbeddingDPLayer -----------------------------------------------------------------------

def _emb_model(kind, at_inference=True):
    if kind == "sequential":
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(64, name="bottom"),
                                 kf.EmbeddingDPLayer(EPS_EMB, at_inference=at_inference,
                                                     name="edp")], name="seq")
    inp = keras.Input((6,), name="x")
    h = keras.layers.Dense(64, name="bottom")(inp)
    out = kf.EmbeddingDPLayer(EPS_EMB, at_inference=at_inference, ste="hardtanh", name="edp")(h)
    return keras.Model(inp, out, name="func")


@pytest.mark.parametrize("kind", ["sequential", "functional"])
def test_embedding_layer_keras_round_trip(kind, tmp_path):
    model = _emb_model(kind)
    layer = model.get_layer("edp")
    model(X_EMB[:4])  # one release at inference: counter 0 -> 1
    back, path = _save_load(model, tmp_path)
    new = back.get_layer("edp")
    assert type(new) is kf.EmbeddingDPLayer
    assert new.get_config() == layer.get_config()
    _assert_config_holds_no_key(path, [layer])
    _assert_fresh_key(layer, new)
    assert new.noise_draws == layer.noise_draws == 1  # the counter is saved

    # Deterministic part: the bottom, bit for bit.
    z = model.get_layer("bottom")(X_EMB).numpy()
    np.testing.assert_array_equal(back.get_layer("bottom")(X_EMB).numpy(), z)
    sign = (z > 0).astype("float32")
    # Randomized part: RR at eps at inference (at_inference=True) and in training.
    q = quantize_turn_on_probability(EPS_EMB)
    reloaded = back(X_EMB, training=False).numpy()
    _check_bits(reloaded, sign, EPS_EMB, f"{kind} reloaded, inference")
    _check_bits(back(X_EMB, training=True).numpy(), sign, EPS_EMB, f"{kind} reloaded, training")
    # Original and reloaded release at the same counter: independent (a fresh key).
    _check_independent_flips(model(X_EMB).numpy(), reloaded, q, f"{kind} original vs reloaded")


def test_embedding_layer_export_served_distribution(tmp_path):
    model = _emb_model("functional")
    path = os.path.join(tmp_path, "sm")
    model.export(path, verbose=False)
    first, second = tf.saved_model.load(path), tf.saved_model.load(path)
    sign = (model.get_layer("bottom")(X_EMB).numpy() > 0).astype("float32")
    q = quantize_turn_on_probability(EPS_EMB)
    a, b = first.serve(X_EMB).numpy(), second.serve(X_EMB).numpy()
    _check_bits(a, sign, EPS_EMB, "served, first load")
    _check_bits(b, sign, EPS_EMB, "served, second load")
    # Two loads of one SavedModel (same stored counter) do not replay each other's noise,
    # and neither do two calls of one load.
    _check_independent_flips(a, b, q, "two loads")
    _check_independent_flips(a, first.serve(X_EMB).numpy(), q, "two calls")

    # at_inference=False: serving only quantizes, the same bits from every load.
    det = _emb_model("sequential", at_inference=False)
    path = os.path.join(tmp_path, "det")
    det.export(path, verbose=False)
    first, second = tf.saved_model.load(path), tf.saved_model.load(path)
    z = det.get_layer("bottom")(X_EMB).numpy()
    assert_bits_are_the_sign(first.serve(X_EMB).numpy(), z)  # graph vs eager: no exact floats
    assert_bits_are_the_sign(second.serve(X_EMB).numpy(), z)


# --- LabelDPLayer -----------------------------------------------------------------------------

def _label_model(seed=None, **kwargs):
    labels = keras.Input((1,), name="labels")
    ids = keras.Input((), dtype="int64", name="example_ids")
    out = kf.LabelDPLayer(EPS_LAB, seed=seed, name="ldp", **kwargs)(labels, example_ids=ids)
    return keras.Model([labels, ids], out)


@pytest.mark.parametrize("mode, k", [("binary", 2), ("sparse", 3)])
def test_label_layer_keras_round_trip_flip_rate(mode, k, tmp_path):
    model = _label_model(mode=mode, num_classes=k if mode == "sparse" else None)
    layer = model.get_layer("ldp")
    y = RNG.integers(0, k, size=(N_LAB, 1)).astype("float32")
    ids = np.arange(N_LAB, dtype="int64")
    before = model([y, ids], training=True).numpy()
    back, path = _save_load(model, tmp_path)
    new = back.get_layer("ldp")
    assert type(new) is kf.LabelDPLayer and new.get_config() == layer.get_config()
    _assert_config_holds_no_key(path, [layer])
    _assert_fresh_key(layer, new)

    after = back([y, ids], training=True).numpy()
    assert set(np.unique(after)) <= set(range(k))
    changed = int(np.sum(after != y))
    p = 1.0 - keep_probability(EPS_LAB, k)  # binary: 1 / (1 + e^eps)
    if mode == "binary":
        assert p == pytest.approx(flip_probability(EPS_LAB))
    assert_rate(changed, N_LAB, p, f"{mode} reloaded", SIGMAS)
    wrong = quantize_turn_on_probability(EPS_LAB) if mode == "binary" else flip_probability(EPS_LAB)
    assert_rejects(changed, N_LAB, wrong, f"{mode} reloaded", SIGMAS)
    # Once per example: the reloaded layer gives an id the same noisy label at every call ...
    np.testing.assert_array_equal(back([y, ids], training=True).numpy(), after)
    # ... but not the original's (fresh key). Two independent K-ary releases agree with
    # probability keep^2 + (1 - keep)^2 / (K - 1).
    keep = 1.0 - p
    agree = keep ** 2 + (1.0 - keep) ** 2 / (k - 1)
    assert_rate(int(np.sum(after != before)), N_LAB, 1.0 - agree, f"{mode} original vs reloaded",
                SIGMAS)
    # Inference: labels pass unchanged.
    np.testing.assert_array_equal(back([y, ids], training=False).numpy(), y)


@pytest.mark.parametrize("seed", [None, 1234], ids=["secret", "seeded"])
def test_label_layer_export(seed, tmp_path):
    model = _label_model(seed=seed)
    layer = model.get_layer("ldp")
    y = RNG.integers(0, 2, size=(N_LAB, 1)).astype("float32")
    ids = np.arange(N_LAB, dtype="int64")
    # model.export(): `serve` runs at inference, where the layer passes labels through.
    path = os.path.join(tmp_path, "serve")
    model.export(path, verbose=False)
    loaded = tf.saved_model.load(path)
    np.testing.assert_array_equal(loaded.serve([y, ids]).numpy(), y)

    # A randomizing endpoint (training=True) written with keras.export.ExportArchive.
    archive = keras.export.ExportArchive()
    archive.track(layer)
    archive.add_endpoint(
        "privatize", lambda labels, example_ids: layer(labels, example_ids=example_ids,
                                                       training=True),
        input_signature=[tf.TensorSpec((None, 1), tf.float32), tf.TensorSpec((None,), tf.int64)])
    path = os.path.join(tmp_path, "privatize")
    archive.write_out(path, verbose=False)
    first, second = tf.saved_model.load(path), tf.saved_model.load(path)
    a, a_again, b = (first.privatize(y, ids).numpy(), first.privatize(y, ids).numpy(),
                     second.privatize(y, ids).numpy())
    p = flip_probability(EPS_LAB)
    for out, what in ((a, "first load"), (b, "second load")):
        assert_rate(int(np.sum(out != y)), N_LAB, p, what, SIGMAS)
        assert_rejects(int(np.sum(out != y)), N_LAB, quantize_turn_on_probability(EPS_LAB), what,
                       SIGMAS)
    if seed is None:
        # No key in the SavedModel: each load draws its own key, so one load gives an id
        # the same noisy label in every call, and two loads are independent.
        np.testing.assert_array_equal(a, a_again)
        _check_independent_flips(a, b, p, "two loads")
    else:
        # The seeded key is saved: every call and every load gives the original's labels.
        want = layer(y, example_ids=ids, training=True).numpy()
        for out in (a, a_again, b):
            np.testing.assert_array_equal(out, want)


# --- VAEBottom --------------------------------------------------------------------------------

def _vae_model(seed=None):
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((6,)),
                              kf.VAEBottom(3, hidden_units=(8,), beta=0.5, seed=seed, name="vae")],
                             name="vae_model")
    vae = model.get_layer("vae")
    # sigma = exp(-0.6) ~ 0.55, mean offset 1: a sample with the wrong sigma or mu is caught.
    vae.z_log_var.bias.assign(np.full(3, -1.2, "float32"))
    vae.z_mean.bias.assign(np.ones(3, "float32"))
    return model


def test_vae_bottom_keras_round_trip_sequential(tmp_path):
    model = _vae_model()
    vae = model.get_layer("vae")
    before = model(X_VAE).numpy()
    back, path = _save_load(model, tmp_path)
    new = back.get_layer("vae")
    assert type(new) is kf.VAEBottom and new.get_config() == vae.get_config()
    _assert_config_holds_no_key(path, [vae])
    _assert_fresh_key(vae, new)
    # Deterministic parts: the encoder's mean and log-variance, the KL loss.
    mu, logvar = (t.numpy() for t in vae.encode(X_VAE))
    mu2, logvar2 = (t.numpy() for t in new.encode(X_VAE))
    np.testing.assert_array_equal(mu2, mu)
    np.testing.assert_array_equal(logvar2, logvar)
    after = back(X_VAE, training=False).numpy()
    assert len(back.losses) == 1
    np.testing.assert_allclose(float(back.losses[0]), float(model.losses[0]), rtol=1e-6)
    # Randomized part: a posterior sample, independent of the original's.
    r_before = _check_posterior_sample(before, mu, logvar, "original")
    r_after = _check_posterior_sample(after, mu, logvar, "reloaded")
    _check_uncorrelated(r_before, r_after, "original vs reloaded")


@pytest.mark.parametrize("seed", [None, 77], ids=["secret", "seeded"])
def test_vae_bottom_export(seed, tmp_path):
    model = _vae_model(seed)
    vae = model.get_layer("vae")
    path = os.path.join(tmp_path, "sm")
    model.export(path, verbose=False)
    first, second = tf.saved_model.load(path), tf.saved_model.load(path)
    mu, logvar = (t.numpy() for t in vae.encode(X_VAE))
    a, a_again, b = (first.serve(X_VAE).numpy(), first.serve(X_VAE).numpy(),
                     second.serve(X_VAE).numpy())
    r_a = _check_posterior_sample(a, mu, logvar, "served, first load")
    r_b = _check_posterior_sample(b, mu, logvar, "served, second load")
    if seed is None:
        _check_uncorrelated(r_a, r_b, "two loads")
        _check_uncorrelated(r_a, (a_again - mu).ravel(), "two calls")
    else:  # the seeded key and the counter are saved: every load replays the same release
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, model(X_VAE).numpy())  # the original, same counter
        assert not np.array_equal(a_again, a)  # the counter advances

    # The deterministic part served: an `encode` endpoint gives mu and logvar.
    archive = keras.export.ExportArchive()
    archive.track(vae)
    archive.add_endpoint("encode", lambda x: vae.encode(x),
                         input_signature=[tf.TensorSpec((None, 6), tf.float32)])
    path = os.path.join(tmp_path, "encode")
    archive.write_out(path, verbose=False)
    loaded = tf.saved_model.load(path)  # keep a reference: it owns the variables
    served_mu, served_logvar = (t.numpy() for t in loaded.encode(X_VAE))
    np.testing.assert_allclose(served_mu, mu, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(served_logvar, logvar, rtol=1e-6, atol=1e-6)


# --- VerticalModel ----------------------------------------------------------------------------

def _vertical_data(n):
    rng = np.random.default_rng(n)
    x = {"party_a": rng.normal(size=(n, 5)).astype("float32"),
         "party_b": rng.normal(size=(n, 4)).astype("float32"),
         "party_c": rng.normal(size=(n, 3)).astype("float32")}
    y = (x["party_a"][:, 0] + x["party_b"][:, 0] - x["party_c"][:, 0] > 0).astype("float32")
    return x, y


def _vertical():
    """party_a: a VAEBottom follower; party_b: the leader; party_c: an EmbeddingDPLayer follower."""
    keras.utils.set_random_seed(3)
    a_in = keras.Input((5,), name="a_in")
    bottom_a = keras.Model(a_in, kf.VAEBottom(4, hidden_units=(8,), beta=0.1, name="vae")(a_in),
                           name="bottom_a")
    top = keras.Sequential([keras.Input((4 + 6 + 16,)),
                            keras.layers.Dense(1, activation="sigmoid")], name="top")
    return VerticalModel({"party_a": bottom_a, "party_b": _dense_bottom(4, 6, "bottom_b"),
                          "party_c": _dense_bottom(3, 16, "bottom_c")},
                         top, leader="party_b",
                         embedding_dp={"party_c": kf.EmbeddingDPLayer(EPS_EMB, name="edp")},
                         label_dp=kf.LabelDPLayer(EPS_LAB, name="ldp"))


def test_vertical_keras_round_trip_with_vae_and_randomized_protection(tmp_path):
    model = _vertical()
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
    x, y = _vertical_data(256)
    model.fit(with_example_ids(x), y, epochs=1, batch_size=64, verbose=0)
    back, path = _save_load(model, tmp_path, "vertical.keras")
    assert type(back) is VerticalModel
    assert _as_json(back.get_config()) == _as_json(model.get_config())  # tuples become lists
    secret = [model.bottoms["party_a"].get_layer("vae"), model.protections["party_c"],
              model.label_dp]
    reloaded = [back.bottoms["party_a"].get_layer("vae"), back.protections["party_c"],
                back.label_dp]
    _assert_config_holds_no_key(path, secret)
    for old, new in zip(secret, reloaded):
        assert type(new) is type(old)
        _assert_fresh_key(old, new)
    assert len(model.weights) == len(back.weights) == 12
    for a, b in zip(model.weights, back.weights):
        # (Keras drops a Sequential's name from its weights' paths on reload: 'top/dense/kernel'
        # comes back as 'dense/kernel'; the layer and variable names are kept.)
        assert a.path.split("/")[-2:] == b.path.split("/")[-2:]
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    x, _ = _vertical_data(4800)  # 2.4 x 2000: the KS band at p > 1e-10
    # Deterministic parts: the leader's own embedding, the VAE's encoder, party_c's bottom.
    np.testing.assert_array_equal(back.party_embeddings("party_b", x),
                                  model.party_embeddings("party_b", x))
    vae, new_vae = secret[0], reloaded[0]
    mu, logvar = (t.numpy() for t in vae.encode(x["party_a"]))
    np.testing.assert_array_equal(new_vae.encode(x["party_a"])[0].numpy(), mu)
    z_c = model.bottoms["party_c"](x["party_c"]).numpy()
    np.testing.assert_array_equal(back.bottoms["party_c"](x["party_c"]).numpy(), z_c)
    # Randomized parts: what the reloaded followers send.
    _check_bits(back.party_embeddings("party_c", x), (z_c > 0).astype("float32"), EPS_EMB,
                "reloaded party_c message")
    _check_independent_flips(back.party_embeddings("party_c", x),
                             model.party_embeddings("party_c", x),
                             quantize_turn_on_probability(EPS_EMB), "party_c original vs reloaded")
    r_new = _check_posterior_sample(back.party_embeddings("party_a", x), mu, logvar,
                                    "reloaded party_a message")
    r_old = _check_posterior_sample(model.party_embeddings("party_a", x), mu, logvar,
                                    "original party_a message")
    _check_uncorrelated(r_new, r_old, "party_a original vs reloaded")


def test_vertical_export_party_served_outputs(tmp_path):
    model = _vertical()
    x, _ = _vertical_data(4800)  # 2.4 x 2000: the KS band at p > 1e-10
    served = {}
    for party in model.followers:
        path = os.path.join(tmp_path, party)
        model.export_party(party, path)
        loads = [tf.saved_model.load(path) for _ in range(2)]  # kept: they own the variables
        served[party] = [loaded.serve(tf.constant(x[party])).numpy() for loaded in loads]
    # party_c: quantize + RR of its bottom's sign; two loads are independent.
    sign = (model.bottoms["party_c"](x["party_c"]).numpy() > 0).astype("float32")
    for i, out in enumerate(served["party_c"]):
        _check_bits(out, sign, EPS_EMB, f"party_c load {i}")
    _check_independent_flips(*served["party_c"], quantize_turn_on_probability(EPS_EMB),
                             "party_c two loads")
    # party_a: a posterior sample; two loads are independent.
    mu, logvar = (t.numpy() for t in model.bottoms["party_a"].get_layer("vae").encode(x["party_a"]))
    r = [_check_posterior_sample(out, mu, logvar, f"party_a load {i}")
         for i, out in enumerate(served["party_a"])]
    _check_uncorrelated(*r, "party_a two loads")
    # The leader's SavedModel on those messages: the top on [a, b, c] in sorted party order.
    path = os.path.join(tmp_path, "leader")
    model.export_leader(path)
    messages = {"party_a": served["party_a"][0], "party_c": served["party_c"][0]}
    leader = tf.saved_model.load(path)
    pred = leader.serve(
        {**{p: tf.constant(m) for p, m in messages.items()}, "party_b": tf.constant(x["party_b"])})
    want = model.top(np.concatenate([messages["party_a"], model.party_embeddings("party_b", x),
                                     messages["party_c"]], axis=-1))
    np.testing.assert_allclose(pred.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def _deterministic_vertical():
    keras.utils.set_random_seed(4)
    top = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")],
                           name="top")
    return VerticalModel({"party_a": _dense_bottom(5, 4, "bottom_a"),
                          "party_b": _dense_bottom(4, 4, "bottom_b")}, top, leader="party_b",
                         embedding_dp=kf.EmbeddingDPLayer(None, name="edp"))


def _two_party_inputs(n):
    x, _ = _vertical_data(n)
    return {"party_a": x["party_a"], "party_b": x["party_b"]}


def test_vertical_model_export_without_input_signature(tmp_path):
    model = _deterministic_vertical()
    x = _two_party_inputs(32)
    model.predict(x, verbose=0)  # called, as Keras asks
    path = os.path.join(tmp_path, "vm")
    model.export(path, verbose=False)
    loaded = tf.saved_model.load(path)
    np.testing.assert_allclose(loaded.serve(x).numpy(), model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_vertical_model_export_with_input_signature(tmp_path):
    model = _deterministic_vertical()
    x = _two_party_inputs(64)
    signature = [{p: tf.TensorSpec((None, x[p].shape[1]), tf.float32, name=p) for p in x}]
    path = os.path.join(tmp_path, "vm")
    model.export(path, verbose=False, input_signature=signature)
    first, second = tf.saved_model.load(path), tf.saved_model.load(path)
    want = model.predict(x, verbose=0)
    # Quantization only (eps=None): the whole protocol at inference is deterministic.
    np.testing.assert_allclose(first.serve(x).numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(second.serve(x).numpy(), first.serve(x).numpy())


# --- SignDS optimizer wrapper -------------------------------------------------------------------

def _signds_model(encoder, rounds):
    keras.utils.set_random_seed(6)
    rng = np.random.default_rng(6)
    x = rng.normal(size=(256, 10)).astype("float32")
    y = (x[:, 0] > x[:, 1]).astype("int64") + (x[:, 2] > 1).astype("int64")
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    opt = SignDS(keras.optimizers.Adam(0.01), encoder)
    model.compile(opt, "sparse_categorical_crossentropy")
    callbacks = [SignDSRounds(epochs_per_round=1)] if rounds else []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="SignDS: k")  # tiny top-k set warning
        model.fit(x, y, epochs=2, batch_size=64, verbose=0, callbacks=callbacks)
    return model, opt, x, y


def test_signds_keras_round_trip_keeps_encoder_and_inner_state(tmp_path):
    encoder = SignDSEncoder(k=0.1, eps=4.0, thr_ratio=0.7, max_dim_out=20, seed=31)
    model, opt, x, y = _signds_model(encoder, rounds=True)
    assert len(opt.messages) == 2
    back, _ = _save_load(model, tmp_path)
    new = back.optimizer
    assert type(new) is SignDS and type(new.inner_optimizer) is keras.optimizers.Adam
    assert new.get_config() == opt.get_config()  # inner Adam config and encoder config
    assert new.encoder.get_config() == encoder.get_config() and new.encoder.seed == 31
    # The inner optimizer's state (step count, moments) is restored bit for bit ...
    assert int(new.iterations) == int(opt.iterations) == 8
    assert len(new.inner_optimizer.variables) == len(opt.inner_optimizer.variables) == 10
    for a, b in zip(opt.inner_optimizer.variables, new.inner_optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # ... so training goes on identically.
    model.fit(x, y, epochs=1, batch_size=64, shuffle=False, verbose=0)
    back.fit(x, y, epochs=1, batch_size=64, shuffle=False, verbose=0)
    for a, b in zip(model.weights, back.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # Serving does not involve the optimizer: model.export() serves the model's predictions.
    path = os.path.join(tmp_path, "sm")
    model.export(path, verbose=False)
    loaded = tf.saved_model.load(path)
    np.testing.assert_allclose(loaded.serve(x).numpy(), model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


def _one_round(model, opt, x, y):
    """One SignDS round on the whole data, the weights back at the round's start after it."""
    opt.begin_round(model.trainable_variables)
    model.fit(x, y, epochs=1, batch_size=64, shuffle=False, verbose=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="SignDS: k")
        return opt.end_round()


def test_a_reloaded_seeded_signds_refuses_to_encode_until_its_state_is_loaded(tmp_path):
    """docs/export.md: `.keras` keeps the seed but not the encoder's stream position, so the
    reloaded seeded encoder would replay the original's noise: it refuses until the saved
    `state_dict` is loaded, then continues the original's stream (no replay)."""
    encoder = SignDSEncoder(k=0.1, eps=4.0, thr_ratio=0.7, max_dim_out=20, seed=31)
    model, opt, x, y = _signds_model(encoder, rounds=True)
    state = json.loads(json.dumps(opt.encoder.state_dict()))  # saved beside the .keras file
    back, _ = _save_load(model, tmp_path)
    new = back.optimizer
    new.begin_round(back.trainable_variables)
    with pytest.raises(RuntimeError, match=r"load_state_dict\(original.state_dict\(\)\)"):
        new.end_round()
    assert not new.messages and new.in_round  # nothing released; the round is still open
    new.discard_round()
    new.encoder.load_state_dict(state)
    ours, theirs = _one_round(back, new, x, y), _one_round(model, opt, x, y)
    assert ours.sign == theirs.sign  # the original's third message, continued
    np.testing.assert_array_equal(ours.indices, theirs.indices)
    assert len(new.messages) == 1 and len(opt.messages) == 3


def test_signds_after_rounds_saves_only_optimizer_variables(tmp_path):
    model, opt, _, _ = _signds_model(SignDSEncoder(k=0.1, eps=4.0), rounds=True)
    model_paths = {v.path for v in model.weights}
    assert not [v.path for v in opt.variables if v.path in model_paths]
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keras.models.load_model(path)
    assert not [w for w in caught if "Skipping variable loading" in str(w.message)]


# --- callbacks --------------------------------------------------------------------------------

def test_magrr_checkpoint_resumes_the_same_trajectory():
    magrr = MagRR(eps_rr=3.0, r_init=1e-4, switch_after=2)
    ones, zeros = np.ones(40, int), np.zeros(40, int)
    for reports in (zeros, zeros, ones):  # grow twice, then one round in range
        magrr.server_update(reports, num_clients=50)
    magrr.client_reports(np.full(40, 1e-3))  # one release (randomized, not fed back)
    # A checkpoint as JSON: the config and the server state.
    config = json.loads(json.dumps(keras.saving.serialize_keras_object(magrr)))
    state = json.loads(json.dumps(magrr.state_dict()))
    ledger = state.pop("ledger")  # the release ledger travels with the state (JSON-safe)
    assert state == {"r_est": pytest.approx(25e-4), "phase": "growth", "rounds_in_range": 1,
                     "num_releases": 1, "releases_by_unit": {}}
    assert [k["everyone"] for k in ledger["kinds"]] == [1]
    state["ledger"] = ledger
    restored = keras.saving.deserialize_keras_object(config)
    assert type(restored) is MagRR and restored.get_config() == magrr.get_config()
    fresh = keras.saving.deserialize_keras_object(config)  # control: config only, no state
    restored.load_state_dict(state)
    assert restored.state_dict() == magrr.state_dict()

    phases, lrs = [], []
    for reports in (ones, ones, zeros, ones):  # switch to contraction, then shrink
        lrs.append(magrr.server_update(reports, num_clients=50))
        assert restored.server_update(reports, num_clients=50) == lrs[-1]
        assert restored.state_dict() == magrr.state_dict()
        assert restored.log_values() == magrr.log_values()
        phases.append(magrr.phase)
    assert phases == ["contraction"] * 4
    assert lrs[0] == pytest.approx(2.0 * 25e-4 * 50)
    assert magrr.r_est == pytest.approx(25e-4 / 4)
    # Without the state, the same reports give another trajectory.
    assert fresh.server_update(ones, num_clients=50) != pytest.approx(lrs[0])
    assert fresh.phase == "growth"


def test_seeded_callbacks_rebuilt_from_json_release_only_after_their_state_is_loaded():
    """docs/export.md: a seeded MagRR / LaplaceEvaluation rebuilt from its config refuses to
    release (its stream would restart and repeat the original's noise) until the original's
    `state_dict` is loaded; then it continues the original's stream."""
    r = np.full(10, 1e-3)
    magrr = MagRR(seed=3)
    magrr.client_reports(r)
    config = json.loads(json.dumps(keras.saving.serialize_keras_object(magrr)))
    state = json.loads(json.dumps(magrr.state_dict()))
    restored = keras.saving.deserialize_keras_object(config)
    with pytest.raises(RuntimeError, match="rebuilt from its config without its state"):
        restored.client_reports(r)
    assert restored.server_update(np.ones(10, int), num_clients=10) > 0  # no release: allowed
    restored = keras.saving.deserialize_keras_object(config)
    restored.load_state_dict(state)
    np.testing.assert_array_equal(restored.client_reports(r), magrr.client_reports(r))

    probs = np.random.default_rng(8).dirichlet(np.full(4, 0.5), size=40).astype("float32")
    laplace = LaplaceEvaluation(probs, eps=2.0, seed=11)
    laplace.client_report(probs)
    config = json.loads(json.dumps(keras.saving.serialize_keras_object(laplace)))
    state = laplace.state_dict()
    with pytest.raises(RuntimeError, match="rebuilt from its config without its state"):
        keras.saving.deserialize_keras_object(config).client_report(probs)
    revived = LaplaceEvaluation(probs, **config["config"])  # data re-attached, then the state
    revived.load_state_dict(state)
    np.testing.assert_array_equal(revived.client_report(probs), laplace.client_report(probs))


def test_laplace_evaluation_config_round_trip_and_reattached_data():
    probs = np.random.default_rng(8).dirichlet(np.full(4, 0.5), size=400).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Identity()])
    cb = LaplaceEvaluation(probs, eps=2.0, metrics=["silhouette", "davies_bouldin"],
                           num_eval_clients=4, cluster_client_num=8, log_clean=True, seed=11)
    config = json.loads(json.dumps(keras.saving.serialize_keras_object(cb)))
    again = keras.saving.deserialize_keras_object(config)
    assert type(again) is LaplaceEvaluation and again.get_config() == cb.get_config()
    assert "eval_data" not in again.get_config() and again.get_config()["seed"] == 11
    # The data is not part of the config: without it, model.fit stops at once, saying so.
    again.set_model(model)
    with pytest.raises(ValueError, match="eval_data"):
        again.on_train_begin()
    # Re-attached to the data, the seeded callback releases exactly what the original did.
    revived = LaplaceEvaluation(probs, **again.get_config())
    logs = []
    for callback in (cb, revived):
        callback.set_model(model)
        callback.on_train_begin()
        out = {}
        callback.on_epoch_end(0, out)
        out.pop("laplace_eval_time_s")
        logs.append(out)
    assert set(logs[0]) == {"laplace_silhouette", "laplace_davies_bouldin", "clean_silhouette",
                            "clean_davies_bouldin"}
    assert logs[0] == logs[1]
    np.testing.assert_array_equal(revived.last_server_view[0], cb.last_server_view[0])
    # Unseeded after a round trip: Laplace noise of scale sensitivity / eps = 1 (E|noise| = b).
    plain = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(LaplaceEvaluation(eps=2.0)))
    rows = np.random.default_rng(9).dirichlet(np.full(4, 0.5), size=5000)
    noise = plain.client_report(rows) - rows / rows.sum(axis=1, keepdims=True)
    b = plain.noise_scale
    assert b == 1.0
    assert abs(np.abs(noise).mean() - b) < SIGMAS * b / math.sqrt(noise.size)
    assert abs(np.abs(noise).mean() - 0.5 * b) > SIGMAS * b / math.sqrt(noise.size)  # power


def test_vertical_exports_name_their_inputs_after_the_parties(tmp_path):
    """serving_default of the whole model, the leader and a follower: inputs keyed by party
    name (not args_0 / inputs / features), and callable with those keywords."""
    model = _deterministic_vertical()
    x = _two_party_inputs(16)
    model.predict(x, verbose=0)
    paths = {name: os.path.join(tmp_path, name) for name in ("all", "leader", "party_a")}
    model.export(paths["all"], verbose=False)
    model.export_leader(paths["leader"])
    model.export_party("party_a", paths["party_a"])
    inputs = {}
    for name, path in paths.items():
        loaded = tf.saved_model.load(path)
        _, kwargs = loaded.signatures["serving_default"].structured_input_signature
        inputs[name] = {k: (spec.name, tuple(spec.shape)) for k, spec in kwargs.items()}
    assert inputs["all"] == {"party_a": ("party_a", (None, 5)), "party_b": ("party_b", (None, 4))}
    assert inputs["leader"] == {"party_a": ("party_a", (None, 4)),
                                "party_b": ("party_b", (None, 4))}
    assert inputs["party_a"] == {"party_a": ("party_a", (None, 5))}
    served = tf.saved_model.load(paths["all"]).signatures["serving_default"](
        **{p: tf.constant(v) for p, v in x.items()})
    np.testing.assert_allclose(next(iter(served.values())).numpy(), model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


_FRESH_LOAD = """
import sys
import keras_fedpriv  # lazy: no TensorFlow yet
assert "keras" not in sys.modules
import keras_fedpriv.mechanisms.quantize  # a package module first (imports Keras half-way)
import keras
model = keras.models.load_model(sys.argv[1])
print(sorted(type(layer).__name__ for layer in model.layers), type(model.optimizer).__name__)
"""


def test_a_fresh_process_that_only_imports_the_package_loads_a_saved_model(tmp_path):
    """The exports are lazy, yet Keras finds the package's layers and optimizer by name."""
    import subprocess
    import sys

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              kf.EmbeddingDPLayer(eps=2.0, seed=1)])
    model.compile(SignDS(keras.optimizers.SGD(0.1), SignDSEncoder(k=0.2, eps=4.0, seed=3)), "mse")
    path = tmp_path / "model.keras"
    model.save(path)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", _FRESH_LOAD, str(path)], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "SignDS"
    assert "['Dense', 'EmbeddingDPLayer']" in out.stdout
