"""VAEBottom: reparameterized samples from the secret RNG, KL loss, Keras machinery.

The weights are set by hand where a closed form is needed (``hidden_units=()``
makes mu and logvar affine in x).
"""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats as scipy_stats

import keras_fedpriv as kf
from keras_fedpriv.layers.vae_bottom import VAEBottom

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
    z = layer(np.repeat(row, n, axis=0), training=training).numpy().astype(np.float64)
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
    z = layer(x).numpy().astype(np.float64).reshape(n, 3, 3)
    mu, logvar = _closed_form(X2)
    sigma = np.exp(0.5 * logvar)
    np.testing.assert_array_less(np.abs(z.mean(axis=0) - mu), SIGMAS * sigma / math.sqrt(n))
    np.testing.assert_array_less(np.abs(z.std(axis=0) - sigma),
                                 SIGMAS * sigma / math.sqrt(2 * n))
    # encode / sigma give the closed form, without sampling.
    enc_mu, enc_logvar = layer.encode(X2)
    np.testing.assert_allclose(enc_mu.numpy(), mu, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(enc_logvar.numpy(), logvar, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(layer.sigma(X2).numpy(), sigma, rtol=1e-6)
    np.testing.assert_array_equal(layer.encode(X2)[0].numpy(), enc_mu.numpy())


def test_fresh_noise_per_call_per_layer_and_at_inference():
    keras.utils.set_random_seed(1)  # must not make the secret keys predictable or equal
    a, b = _affine_bottom(), _affine_bottom()
    x = np.repeat(X2, 100, axis=0)
    mu = a.encode(x)[0].numpy()
    draws = a.noise_draws
    first = a(x, training=True).numpy()
    assert a.noise_draws == draws + 1  # drawn from the secret-keyed counter
    second = a(x, training=True).numpy()
    inference = [a(x, training=False).numpy(), a(x).numpy()]
    other = b(x, training=True).numpy()
    outputs = [first, second, *inference, other]
    for i, u in enumerate(outputs):
        assert np.mean(u != mu) > 0.99  # a sample, not mu
        for v in outputs[i + 1:]:
            assert np.mean(u != v) > 0.99
    keras.utils.set_random_seed(1)
    c = _affine_bottom()
    assert np.mean(c(x, training=True).numpy() != first) > 0.99


def test_explicit_seed_reproduces_the_noise():
    x = np.repeat(X2, 10, axis=0)
    a, b, c = _affine_bottom(seed=1234), _affine_bottom(seed=1234), _affine_bottom(seed=1235)
    za, zb, zc = a(x).numpy(), b(x).numpy(), c(x).numpy()
    np.testing.assert_array_equal(za, zb)
    assert np.mean(za != zc) > 0.99
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())  # second draws match too
    assert np.mean(a(x).numpy() != za) > 0.99


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
    a, b = model(x[:32], training=False).numpy(), model(x[:32], training=False).numpy()
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
    np.testing.assert_array_equal(layer.encode(x)[0].numpy(), vae.encode(x)[0].numpy())
    np.testing.assert_array_equal(layer.decode(x[:, :3]).numpy(), vae.decode(x[:, :3]).numpy())
    # The secret key is not saved: the reloaded layer has a fresh one and fresh noise.
    assert not np.array_equal(layer.rng_key.numpy(), vae.rng_key.numpy())
    assert np.mean(layer(x).numpy() != vae(x).numpy()) > 0.99


def test_keras_round_trip_with_explicit_seed_replays(tmp_path):
    inp = keras.Input((2,))
    model = keras.Model(inp, _affine_bottom(seed=99, name="vae")(inp))
    model(X2)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    back = keras.models.load_model(path)
    assert back.get_layer("vae").seed == 99
    np.testing.assert_array_equal(back(X2).numpy(), model(X2).numpy())


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


def test_exported_saved_model_samples(tmp_path):
    inp = keras.Input((2,))
    # seeded (the key is saved with the export): the bands below are deterministic
    model = keras.Model(inp, _affine_bottom(seed=33, name="vae")(inp))
    path = os.path.join(tmp_path, "sm")
    model.export(path, verbose=False)
    served = tf.saved_model.load(path)
    x = np.repeat(X2[:1], 4000, axis=0)
    a, b = served.serve(x).numpy(), served.serve(x).numpy()
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
    err = np.mean((vae.decode(vae.encode(x)[0]).numpy() - x) ** 2)
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
