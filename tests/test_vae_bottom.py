"""VAEBottom: reparameterized samples from the secret RNG, KL loss, Keras machinery.

The weights are set by hand where a closed form is needed (``hidden_units=()``
makes mu and logvar affine in x).
"""

import math
import os

import keras
import numpy as np
import pytest
from scipy import stats as scipy_stats

import keras_fedpriv as kf
from keras_fedpriv.layers.vae_bottom import VAEBottom

pytestmark = [pytest.mark.jax]

SIGMAS = 5.0
X2 = np.array([[0.5, -1.0], [2.0, 0.25], [-1.5, 1.0]], "float32")
# mu = x @ WM + BM, logvar = x @ WV + BV (latent_dim 3, input_dim 2).
WM = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0]], "float32")
BM = np.array([0.25, 0.0, -1.0], "float32")
WV = np.array([[0.4, 0.0, -0.6], [0.2, -0.8, 0.0]], "float32")
BV = np.array([0.3, -0.5, 1.2], "float32")


def _affine_bottom(beta=1.0, seed=None, **kwargs):
    layer = VAEBottom(3, hidden_units=(), beta=beta, seed=seed, **kwargs)
    layer.build((None, 2))
    layer.z_mean.set_weights([WM, BM])
    layer.z_log_var.set_weights([WV, BV])
    return layer


def _closed_form(x):
    x = np.asarray(x, np.float64)
    return x @ WM + BM, x @ WV + BV


# --- the sample --------------------------------------------------------------------------

@pytest.mark.parametrize("training", [True, False])
def test_samples_have_mean_mu_and_std_exp_half_logvar(training):
    layer = _affine_bottom(seed=31)  # seeded: the bands and KS tests below are deterministic
    n = 25_000
    row = X2[:1]
    mu, logvar = (a[0] for a in _closed_form(row))
    sigma = np.exp(0.5 * logvar)
    z = np.asarray(layer(np.repeat(row, n, axis=0), training=training)).astype(np.float64)
    assert z.shape == (n, 3)
    mean, std = z.mean(axis=0), z.std(axis=0, ddof=1)
    se_mean, se_std = sigma / math.sqrt(n), sigma / math.sqrt(2 * (n - 1))
    np.testing.assert_array_less(np.abs(mean - mu), SIGMAS * se_mean)
    np.testing.assert_array_less(np.abs(std - sigma), SIGMAS * se_std)
    # The check has the power to reject exp(logvar) (the classic bug) and sqrt-free mistakes.
    for wrong in (np.exp(logvar), np.exp(0.25 * logvar)):
        assert np.all(np.abs(std - wrong) > SIGMAS * se_std)
    # Gaussian and independent across coordinates.
    for k in range(3):
        assert scipy_stats.kstest((z[:, k] - mu[k]) / sigma[k], "norm").pvalue > 1e-4
    corr = np.corrcoef(z.T)[np.triu_indices(3, 1)]
    np.testing.assert_array_less(np.abs(corr), SIGMAS / math.sqrt(n))


def test_each_row_gets_its_own_mu_and_sigma():
    layer = _affine_bottom(seed=32)  # seeded: the bands below are deterministic
    n = 20_000
    x = np.tile(X2, (n, 1))  # rows 0, 1, 2, 0, 1, 2, ...
    z = np.asarray(layer(x)).astype(np.float64).reshape(n, 3, 3)
    mu, logvar = _closed_form(X2)
    sigma = np.exp(0.5 * logvar)
    np.testing.assert_array_less(np.abs(z.mean(axis=0) - mu), SIGMAS * sigma / math.sqrt(n))
    np.testing.assert_array_less(np.abs(z.std(axis=0) - sigma),
                                 SIGMAS * sigma / math.sqrt(2 * n))
    # encode / sigma give the closed form, without sampling.
    enc_mu, enc_logvar = layer.encode(X2)
    np.testing.assert_allclose(np.asarray(enc_mu), mu, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(enc_logvar), logvar, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(layer.sigma(X2)), sigma, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(layer.encode(X2)[0]), np.asarray(enc_mu))


def test_fresh_noise_per_call_per_layer_and_at_inference():
    keras.utils.set_random_seed(1)  # must not make the secret keys predictable or equal
    a, b = _affine_bottom(), _affine_bottom()
    x = np.repeat(X2, 100, axis=0)
    mu = np.asarray(a.encode(x)[0])
    draws = a.noise_draws
    first = np.asarray(a(x, training=True))
    assert a.noise_draws == draws + 1  # drawn from the secret-keyed counter
    second = np.asarray(a(x, training=True))
    inference = [np.asarray(a(x, training=False)), np.asarray(a(x))]
    other = np.asarray(b(x, training=True))
    outputs = [first, second, *inference, other]
    for i, u in enumerate(outputs):
        assert np.mean(u != mu) > 0.99  # a sample, not mu
        for v in outputs[i + 1:]:
            assert np.mean(u != v) > 0.99
    keras.utils.set_random_seed(1)
    c = _affine_bottom()
    assert np.mean(np.asarray(c(x, training=True)) != first) > 0.99


def test_explicit_seed_reproduces_the_noise():
    x = np.repeat(X2, 10, axis=0)
    a, b, c = _affine_bottom(seed=1234), _affine_bottom(seed=1234), _affine_bottom(seed=1235)
    za, zb, zc = np.asarray(a(x)), np.asarray(b(x)), np.asarray(c(x))
    np.testing.assert_array_equal(za, zb)
    assert np.mean(za != zc) > 0.99
    np.testing.assert_array_equal(np.asarray(a(x)), np.asarray(b(x)))  # second draws match too
    assert np.mean(np.asarray(a(x)) != za) > 0.99


def test_output_shape_and_dtype():
    layer = VAEBottom(4, hidden_units=(8, 6))
    x = np.zeros((5, 7, 3), "float32")
    assert layer(x).shape == (5, 7, 4)
    assert layer.compute_output_shape((None, 7, 3)) == (None, 7, 4)
    assert len(layer.losses) == 1
    assert [w.shape for w in layer.trainable_weights] == [
        (3, 8), (8,), (8, 6), (6,), (6, 4), (4,), (6, 4), (4,)]


# --- the KL loss -------------------------------------------------------------------------

def _kl_closed_form(x):
    mu, logvar = _closed_form(x)
    per_row = [-0.5 * sum(1 + lv - m * m - math.exp(lv) for m, lv in zip(mr, lr))
               for mr, lr in zip(mu, logvar)]
    return sum(per_row) / len(per_row)


@pytest.mark.parametrize("beta", [1.0, 2.5, 0.1])
def test_kl_loss_is_the_closed_form_times_beta(beta):
    layer = _affine_bottom(beta=beta)
    layer(X2)
    assert len(layer.losses) == 1
    expected = beta * _kl_closed_form(X2)
    assert expected > 0.5  # a non-trivial value
    np.testing.assert_allclose(float(layer.losses[0]), expected, rtol=1e-5)
    layer(X2[:1])  # losses are replaced, not accumulated, at each call
    assert len(layer.losses) == 1
    np.testing.assert_allclose(float(layer.losses[0]), beta * _kl_closed_form(X2[:1]),
                               rtol=1e-5)


def test_kl_loss_is_zero_at_the_prior_and_absent_for_beta_zero():
    layer = VAEBottom(3, hidden_units=(), beta=1.0)
    layer.build((None, 2))
    for dense in (layer.z_mean, layer.z_log_var):
        dense.set_weights([np.zeros((2, 3), "float32"), np.zeros(3, "float32")])
    layer(X2)
    assert float(layer.losses[0]) == 0.0  # mu = 0, logvar = 0: the posterior is the prior
    zero = _affine_bottom(beta=0.0)
    zero(X2)
    assert sum(float(v) for v in zero.losses) == 0.0 and zero.losses == []


def test_kl_loss_reaches_the_model_loss():
    inp = keras.Input((2,))
    model = keras.Model(inp, _affine_bottom(beta=2.0, name="vae")(inp))
    model(X2)
    assert len(model.losses) == 1
    np.testing.assert_allclose(float(model.losses[0]), 2.0 * _kl_closed_form(X2), rtol=1e-5)


# --- Keras machinery ---------------------------------------------------------------------

def _regression_task(n=512):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x[:, :1] - 0.5 * x[:, 1:2] + 0.25 * x[:, 2:3]).astype("float32")
    return x, y


def test_jit_compiled_fit_reduces_the_loss():
    x, y = _regression_task()
    keras.utils.set_random_seed(7)  # seeded weights and noise: the losses are deterministic
    inp = keras.Input((6,))
    vae = VAEBottom(4, hidden_units=(16,), beta=0.01, seed=8, name="vae")
    model = keras.Model(inp, keras.layers.Dense(1)(vae(inp)))
    model.compile(keras.optimizers.Adam(0.02), "mse", jit_compile=True)
    draws = vae.noise_draws
    history = model.fit(x, y, epochs=8, batch_size=64, verbose=0).history["loss"]
    assert vae.noise_draws - draws == 8 * 8  # one keyed draw per step, under XLA
    assert history[-1] < 0.5 * history[0], history
    # The trained model still samples at inference.
    a, b = np.asarray(model(x[:32], training=False)), np.asarray(model(x[:32], training=False))
    assert np.mean(a != b) > 0.9


def test_keras_round_trip(tmp_path):
    x, _ = _regression_task(128)
    inp = keras.Input((6,))
    vae = VAEBottom(3, hidden_units=[8, 4], beta=0.5, with_decoder=True, name="vae")
    model = keras.Model(inp, keras.layers.Dense(1, name="top")(vae(inp)))
    vae.pretrain(x, epochs=1, batch_size=64, verbose=0)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    back = keras.models.load_model(path)
    layer = back.get_layer("vae")
    assert type(layer) is VAEBottom
    assert (layer.latent_dim, layer.hidden_units, layer.beta, layer.with_decoder, layer.seed) == \
        (3, (8, 4), 0.5, True, None)
    assert len(vae.weights) == len(layer.weights) == 14  # encoder 8 + decoder 6
    for a, b in zip(model.weights, back.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # bit for bit, decoder included
    np.testing.assert_array_equal(np.asarray(layer.encode(x)[0]), np.asarray(vae.encode(x)[0]))
    np.testing.assert_array_equal(np.asarray(layer.decode(x[:, :3])),
                                  np.asarray(vae.decode(x[:, :3])))
    # The secret key is not saved: the reloaded layer has a fresh one and fresh noise.
    assert not np.array_equal(np.asarray(layer.rng_key), np.asarray(vae.rng_key))
    assert np.mean(np.asarray(layer(x)) != np.asarray(vae(x))) > 0.99


def test_keras_round_trip_with_explicit_seed_replays(tmp_path):
    inp = keras.Input((2,))
    model = keras.Model(inp, _affine_bottom(seed=99, name="vae")(inp))
    model(X2)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    back = keras.models.load_model(path)
    assert back.get_layer("vae").seed == 99
    np.testing.assert_array_equal(np.asarray(back(X2)), np.asarray(model(X2)))


def test_get_config_round_trip():
    layer = VAEBottom(5, hidden_units=(7,), beta=0.0, with_decoder=True, seed=3, name="v")
    config = layer.get_config()
    assert {k: config[k] for k in ("latent_dim", "hidden_units", "beta", "with_decoder",
                                   "seed")} == {"latent_dim": 5, "hidden_units": [7],
                                                "beta": 0.0, "with_decoder": True, "seed": 3}
    again = VAEBottom.from_config(config)
    assert (again.latent_dim, again.hidden_units, again.beta, again.with_decoder, again.seed) \
        == (5, (7,), 0.0, True, 3)
    assert VAEBottom(2).get_config()["seed"] is None


@pytest.mark.tensorflow_only("SavedModel export")
def test_exported_saved_model_samples(tmp_path):
    import tensorflow as tf

    inp = keras.Input((2,))
    # seeded (the key is saved with the export): the bands below are deterministic
    model = keras.Model(inp, _affine_bottom(seed=33, name="vae")(inp))
    path = os.path.join(tmp_path, "sm")
    model.export(path, verbose=False)
    served = tf.saved_model.load(path)
    x = np.repeat(X2[:1], 4000, axis=0)
    a, b = np.asarray(served.serve(x)), np.asarray(served.serve(x))
    assert a.shape == (4000, 3)
    assert np.mean(a != b) > 0.99  # two serve calls differ
    mu, logvar = (v[0] for v in _closed_form(X2[:1]))
    sigma = np.exp(0.5 * logvar)
    np.testing.assert_array_less(np.abs(a.mean(axis=0) - mu), SIGMAS * sigma / math.sqrt(4000))
    np.testing.assert_array_less(np.abs(a.std(axis=0) - sigma),
                                 SIGMAS * sigma / math.sqrt(2 * 4000))


def test_pretrain_reduces_reconstruction_loss():
    rng = np.random.default_rng(5)
    codes = rng.normal(size=(512, 2))
    x = (codes @ rng.normal(size=(2, 8)) + 0.05 * rng.normal(size=(512, 8))).astype("float32")
    keras.utils.set_random_seed(9)  # seeded weights and noise: the losses are deterministic
    vae = VAEBottom(2, hidden_units=(16,), beta=0.01, with_decoder=True, seed=10)
    history = vae.pretrain(x, epochs=25, batch_size=64, optimizer=keras.optimizers.Adam(0.01),
                           verbose=0)
    assert set(history) == {"loss", "reconstruction", "kl"}
    assert len(history["reconstruction"]) == 25
    recon = history["reconstruction"]
    assert recon[-1] < 0.4 * recon[0], recon
    np.testing.assert_allclose(np.array(history["loss"]),
                               np.array(recon) + np.array(history["kl"]), rtol=1e-4)
    # The trained decoder reconstructs from mu far better than the data's variance.
    err = np.mean((np.asarray(vae.decode(vae.encode(x)[0])) - x) ** 2)
    assert err < 0.3 * np.mean((x - x.mean(axis=0)) ** 2)


def test_pretrain_needs_a_decoder():
    with pytest.raises(ValueError, match="with_decoder=True"):
        VAEBottom(2).pretrain(np.zeros((4, 3), "float32"))
    with pytest.raises(ValueError, match="with_decoder=True"):
        VAEBottom(2).decode(np.zeros((4, 2), "float32"))


# --- bad arguments -----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, name", [
    ({"latent_dim": 0}, ValueError, "latent_dim"),
    ({"latent_dim": -3}, ValueError, "latent_dim"),
    ({"latent_dim": 2.5}, TypeError, "latent_dim"),
    ({"latent_dim": True}, TypeError, "latent_dim"),
    ({"latent_dim": "4"}, TypeError, "latent_dim"),
    ({"latent_dim": None}, TypeError, "latent_dim"),
    ({"latent_dim": 2, "hidden_units": 64}, TypeError, "hidden_units"),
    ({"latent_dim": 2, "hidden_units": "64"}, TypeError, "hidden_units"),
    ({"latent_dim": 2, "hidden_units": None}, TypeError, "hidden_units"),
    ({"latent_dim": 2, "hidden_units": (8, 0)}, ValueError, "hidden_units"),
    ({"latent_dim": 2, "hidden_units": [-1]}, ValueError, "hidden_units"),
    ({"latent_dim": 2, "hidden_units": (8.0,)}, TypeError, "hidden_units"),
    ({"latent_dim": 2, "hidden_units": (True,)}, TypeError, "hidden_units"),
    ({"latent_dim": 2, "beta": -0.5}, ValueError, "beta"),
    ({"latent_dim": 2, "beta": float("nan")}, ValueError, "beta"),
    ({"latent_dim": 2, "beta": float("inf")}, ValueError, "beta"),
    ({"latent_dim": 2, "beta": "1"}, TypeError, "beta"),
    ({"latent_dim": 2, "beta": None}, TypeError, "beta"),
    ({"latent_dim": 2, "beta": True}, TypeError, "beta"),
    ({"latent_dim": 2, "with_decoder": 1}, TypeError, "with_decoder"),
    ({"latent_dim": 2, "with_decoder": "yes"}, TypeError, "with_decoder"),
    ({"latent_dim": 2, "with_decoder": None}, TypeError, "with_decoder"),
    ({"latent_dim": 2, "seed": -1}, ValueError, "seed"),
    ({"latent_dim": 2, "seed": "7"}, TypeError, "seed"),
])
def test_bad_arguments_name_the_argument_and_value(kwargs, error, name):
    with pytest.raises(error) as info:
        VAEBottom(**kwargs)
    message = str(info.value)
    assert f"`{name}" in message
    assert repr(kwargs[name]) in message or repr(kwargs[name][-1]) in message


def test_bad_pretrain_arguments():
    vae = VAEBottom(2, hidden_units=(), with_decoder=True)
    x = np.zeros((8, 3), "float32")
    with pytest.raises(ValueError, match="`epochs`"):
        vae.pretrain(x, epochs=0)
    with pytest.raises(TypeError, match="`batch_size`"):
        vae.pretrain(x, batch_size=2.0)
    vae.pretrain(x, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="4 features"):
        vae.pretrain(np.zeros((8, 4), "float32"), verbose=0)


def test_exported_from_the_package():
    assert kf.VAEBottom is VAEBottom
    assert kf.layers.VAEBottom is VAEBottom
    assert keras.saving.get_registered_object("keras_fedpriv>VAEBottom") is VAEBottom


def _vertical(bottom_a, n=64, embedding_dp=None, bottom_b=None, ids=True):
    from keras_fedpriv.federated import VerticalModel, with_example_ids

    rng = np.random.default_rng(0)
    xa = rng.normal(size=(n, 6)).astype("float32")
    xb = rng.normal(size=(n, 4)).astype("float32")
    y = (xa[:, 0] + xb[:, 0] > 0).astype("float32")
    if bottom_b is None:
        bottom_b = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
    width = bottom_a.compute_output_shape((None, 6))[-1] + bottom_b.compute_output_shape(
        (None, 4))[-1]
    top = keras.Sequential([keras.Input((width,)), keras.layers.Dense(1, activation="sigmoid")])
    model = VerticalModel({"party_a": bottom_a, "party_b": bottom_b}, top, leader="party_b",
                          embedding_dp=embedding_dp)
    model.compile("adam", "binary_crossentropy")
    x = {"party_a": xa, "party_b": xb}
    return model, (with_example_ids(x) if ids else x), y


def _report_rows(model):
    from keras_fedpriv.privacy import privacy_report

    report = privacy_report(model, protects="features")
    return report, {r.mechanism: r.count for r in report.releases}


def test_a_follower_vae_bottom_counts_its_releases_per_example_id():
    """A follower whose bottom is a VAEBottom, given example ids: 3 epochs of 4 batches are 3
    releases of each example (as an EmbeddingDPLayer follower counts), not 12 (one per
    batch, each counted for every example); without DP, so the features are not private."""
    from keras_fedpriv.privacy import privacy_report

    keras.utils.set_random_seed(0)
    vae = VAEBottom(4, hidden_units=(8,), beta=0.1, seed=3, name="vae")
    vae.build((None, 6))
    model, x, y = _vertical(vae)
    model.fit(x, y, epochs=3, batch_size=16, shuffle=False, verbose=0)
    report = privacy_report(model, protects="features")
    assert {r.mechanism: r.count for r in report.releases} == {"VAEBottom 'vae'": 3}
    assert math.isinf(report.epsilon)
    ids, counts = vae._release_id_counts_nonzero()
    assert ids.tolist() == list(range(64)) and set(counts.tolist()) == {3}
    assert vae.release_calls()["fresh_with_ids"] == 12


def test_a_vae_bottom_inside_a_larger_bottom_records_each_message_once():
    """Inside a Sequential the ids cannot reach the VAEBottom: it records each message (one
    per batch, for every example) and the follower's own counter records nothing, so the
    12 messages are counted once (before: by the follower alone, the layer recorded none)."""
    keras.utils.set_random_seed(0)
    vae = VAEBottom(4, hidden_units=(8,), beta=0.1, seed=3, name="vae")
    model, x, y = _vertical(keras.Sequential([keras.Input((6,)), vae]))
    model.fit(x, y, epochs=3, batch_size=16, shuffle=False, verbose=0)
    report, rows = _report_rows(model)
    assert rows == {"VAEBottom 'vae'": 12}
    assert math.isinf(report.epsilon)
    assert vae.release_calls()["fresh_without_ids"] == 12


def test_a_vae_bottom_as_protection_without_ids_records_every_message():
    """`embedding_dp=VAEBottom` fitted without example ids: each of the 4 messages is a
    release without DP of every example (before: nothing was recorded, eps 0)."""
    keras.utils.set_random_seed(0)
    vae = VAEBottom(4, hidden_units=(4,), seed=1, name="vae")
    model, x, y = _vertical(keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)]),
                            n=16, embedding_dp={"party_a": vae}, ids=False)
    model.fit(x, y, epochs=1, batch_size=4, shuffle=False, verbose=0)
    report, rows = _report_rows(model)
    assert rows == {"VAEBottom 'vae'": 4}
    assert math.isinf(report.epsilon)


def test_a_vae_bottom_as_protection_with_ids_counts_fit_per_id_and_predict_for_all():
    """With example ids, 2 epochs are 2 releases of each example; a prediction without ids
    (one message of 16 rows) is one more release of every example (before: uncounted)."""
    from keras_fedpriv.federated import with_example_ids

    keras.utils.set_random_seed(0)
    vae = VAEBottom(4, hidden_units=(4,), seed=1, name="vae")
    model, x, y = _vertical(keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)]),
                            n=16, embedding_dp={"party_a": vae})
    model.fit(x, y, epochs=2, batch_size=4, shuffle=False, verbose=0)
    assert _report_rows(model)[1] == {"VAEBottom 'vae'": 2}
    plain = {k: v for k, v in x.items() if k in ("party_a", "party_b")}
    assert set(with_example_ids(plain)) == set(x)  # the ids were the only other input
    with pytest.warns(UserWarning, match="without example ids"):
        model.predict(plain, batch_size=16, verbose=0)
    assert vae.release_calls()["fresh_with_ids"] == 8
    assert vae.release_calls()["fresh_without_ids"] == 1
    assert _report_rows(model)[1] == {"VAEBottom 'vae'": 3}


def test_a_vae_bottom_whose_output_is_not_sent_records_nothing():
    """A follower's VAEBottom under an EmbeddingDPLayer, and the leader's VAEBottom: their
    samples never leave as computed, so only the DP layer's releases are in the report."""
    from keras_fedpriv.layers import EmbeddingDPLayer

    keras.utils.set_random_seed(0)
    follower_vae = VAEBottom(4, hidden_units=(4,), seed=1, name="follower_vae")
    leader_vae = VAEBottom(4, hidden_units=(4,), seed=2, name="leader_vae")
    dp = EmbeddingDPLayer(eps=2.0, seed=5, name="dp")
    model, x, y = _vertical(keras.Sequential([keras.Input((6,)), follower_vae]), n=16,
                            embedding_dp={"party_a": dp},
                            bottom_b=keras.Sequential([keras.Input((4,)), leader_vae]))
    model.fit(x, y, epochs=1, batch_size=4, shuffle=False, verbose=0)
    report, rows = _report_rows(model)
    assert rows == {"EmbeddingDPLayer 'dp'": 1}
    assert not any(follower_vae.release_calls().values())
    assert not any(leader_vae.release_calls().values())
    assert math.isfinite(report.epsilon)


def test_a_vae_bottom_in_a_plain_model_records_its_calls():
    """In a plain Keras model each call is a release without DP of every example: the report
    is not private, with 2 calls counted (before: the layer's empty ledger gave eps 0)."""
    from keras_fedpriv.privacy import privacy_report

    keras.utils.set_random_seed(0)
    vae = VAEBottom(4, hidden_units=(4,), seed=1, name="vae")
    model = keras.Sequential([keras.Input((3,)), vae, keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.random((8, 3)), rng.random((8, 1)), batch_size=4, verbose=0)
    report = privacy_report(model, protects="features")
    assert math.isinf(report.epsilon)
    assert {r.mechanism: r.count for r in report.releases} == {"VAEBottom 'vae'": 2}


def test_mixed_precision_samples_in_the_compute_dtype_and_pretrains():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        vae = VAEBottom(3, hidden_units=(8,), beta=0.1, with_decoder=True, seed=6)
    finally:
        keras.config.set_dtype_policy("float32")
    x = np.random.default_rng(11).normal(size=(256, 4)).astype("float32")
    history = vae.pretrain(x, epochs=2, batch_size=64, verbose=0)
    assert np.all(np.isfinite(history["loss"]))
    z = vae(x)
    assert keras.backend.standardize_dtype(z.dtype) == "float16"
    assert [w.dtype for w in vae.trainable_weights] == ["float32"] * len(vae.trainable_weights)
    mu, logvar = (np.asarray(t, np.float64) for t in vae.encode(x))
    r = ((np.asarray(z, np.float64) - mu) / np.exp(0.5 * logvar)).ravel()  # standard normal
    slack = 1e-2  # float16 rounding of z, mu and logvar
    assert abs(r.mean()) < SIGMAS / math.sqrt(r.size) + slack
    assert abs(r.std() - 1.0) < SIGMAS / math.sqrt(2 * r.size) + slack
