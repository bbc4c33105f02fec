"""VerticalModel on every Keras backend (TensorFlow and JAX): the protocol's arithmetic.

Backend-neutral: this module runs again under ``KERAS_BACKEND=jax``. The
models here have plain bottoms (no protection layers), so the protocol's
gradients must be exactly those of one Keras model of the same architecture.
"""

import os

import keras
import numpy as np
import pytest

from keras_fedpriv.backend import BackendNotSupportedError
from keras_fedpriv.federated import MessageRecorder, VerticalModel

pytestmark = [pytest.mark.jax]

ROWS, BATCH = 96, 32
PARTIES = {"fa": 5, "fb": 3, "lead": 4}  # party -> number of features
EMBED = {"fa": 4, "fb": 2, "lead": 3}


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = {p: rng.normal(size=(ROWS, k)).astype("float32") for p, k in PARTIES.items()}
    y = (x["fa"][:, 0] + x["lead"][:, 1] > 0).astype("float32")[:, None]
    return x, y


def _bottom(party):
    inputs = keras.Input((PARTIES[party],), name=party)
    return keras.Model(inputs, keras.layers.Dense(EMBED[party], activation="tanh")(inputs))


def _top():
    inputs = keras.Input((sum(EMBED.values()),))
    h = keras.layers.Dense(6, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))


def _pair(leader="lead"):
    """A VerticalModel and one plain Keras model with the same layers' weights."""
    keras.utils.set_random_seed(1)
    bottoms = {p: _bottom(p) for p in PARTIES}
    top = _top()
    inputs = {p: keras.Input((k,), name=p) for p, k in PARTIES.items()}
    merged = keras.layers.Concatenate()([bottoms[p](inputs[p]) for p in sorted(PARTIES)])
    plain = keras.Model(inputs, top(merged))
    weights = plain.get_weights()
    keras.utils.set_random_seed(2)
    vertical = VerticalModel({p: _bottom(p) for p in PARTIES}, _top(), leader=leader)
    for p in sorted(PARTIES):
        vertical.bottoms[p].set_weights(bottoms[p].get_weights())
    vertical.top.set_weights(top.get_weights())
    for model in (plain, vertical):
        model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy")
    assert len(weights) == len(plain.get_weights())
    plain.party_layers = [bottoms[p] for p in sorted(PARTIES)] + [top]
    return vertical, plain


def _party_weights(model):
    return [w for p in sorted(PARTIES) for w in model.bottoms[p].get_weights()] + \
        model.top.get_weights()


@pytest.mark.parametrize("leader", ["lead", None])
def test_fit_takes_the_steps_of_one_keras_model(leader):
    """Cut gradients, each party's gradients from its cut gradient alone, one optimizer step:
    the same weights as plain Keras training of the same architecture."""
    vertical, plain = _pair(leader)
    x, y = _data()
    hv = vertical.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    hp = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    expected = [w for layer in plain.party_layers for w in layer.get_weights()]
    for got, want in zip(_party_weights(vertical), expected):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(hv.history["loss"], hp.history["loss"], rtol=1e-4)
    np.testing.assert_allclose(vertical.predict(x, verbose=0), plain.predict(x, verbose=0),
                               rtol=1e-4, atol=1e-5)
    assert vertical.evaluate(x, y, verbose=0, return_dict=True)["loss"] == pytest.approx(
        plain.evaluate(x, y, verbose=0), rel=1e-4)


def test_traffic_is_counted_per_follower_and_direction():
    vertical, _ = _pair()
    x, y = _data()
    history = vertical.fit(x, y, batch_size=BATCH, epochs=2, verbose=0).history
    for p in ("fa", "fb"):  # float32 embeddings: 4 bytes per coordinate, both ways
        assert history[f"bytes_up_{p}"] == [ROWS * EMBED[p] * 4] * 2
        assert history[f"bytes_down_{p}"] == [ROWS * EMBED[p] * 4] * 2
    assert history["bytes_up"] == [ROWS * (EMBED["fa"] + EMBED["fb"]) * 4] * 2
    logs = vertical.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    assert logs["bytes_up_fa"] == ROWS * EMBED["fa"] * 4 and logs["bytes_down"] == 0


def test_releases_without_dp_are_counted_and_never_saved_as_weights(tmp_path):
    vertical, _ = _pair()
    x, y = _data()
    vertical.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    steps = 2 * ROWS // BATCH
    np.testing.assert_array_equal(vertical.unprotected_releases.numpy(), [steps, steps, steps])
    vertical.predict(x, batch_size=BATCH, verbose=0)  # followers send again; no labels used
    counts = [steps + ROWS // BATCH] * 2 + [steps]
    np.testing.assert_array_equal(vertical.unprotected_releases.numpy(), counts)
    ledger = vertical.privacy_ledger()
    assert sorted(ledger.total(kind) for kind in ledger.kinds) == sorted(counts)
    assert not any("unprotected" in v.path for v in vertical.weights)
    path = os.path.join(tmp_path, "m.weights.h5")
    vertical.save_weights(path)
    vertical.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    vertical.load_weights(path)  # restoring never rewinds the counts
    np.testing.assert_array_equal(vertical.unprotected_releases.numpy(),
                                  [c + ROWS // BATCH for c in counts])


def test_message_callbacks_get_every_steps_messages():
    vertical, _ = _pair()
    x, y = _data()
    recorder = MessageRecorder(epochs=(0,))
    before = vertical.party_embeddings("fb", x["fb"][:BATCH])
    vertical.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                 callbacks=[recorder])
    assert recorder.cut_gradients("fa").shape == (ROWS, EMBED["fa"])
    np.testing.assert_array_equal(recorder.labels().reshape(-1), y.reshape(-1))
    sent = recorder.embeddings("fb")
    np.testing.assert_allclose(sent[:BATCH], before, rtol=1e-5, atol=1e-6)  # the first step
    assert recorder.bytes_up("fa") == ROWS * EMBED["fa"] * 4


def test_features_of_the_wrong_shape_are_refused_before_tracing():
    vertical, _ = _pair()
    x, y = _data()
    x["fa"], x["fb"] = x["fb"], x["fa"]
    with pytest.raises(ValueError, match=r"party 'fa' must have shape \(batch, 5\).*swapped"):
        vertical.fit(x, y, verbose=0)


@pytest.mark.skipif(keras.backend.backend() == "tensorflow", reason="JAX: no SavedModel")
def test_savedmodel_export_names_the_jax_way(tmp_path):
    vertical, _ = _pair()
    with pytest.raises(BackendNotSupportedError, match="TensorFlow backend.*On JAX"):
        vertical.export_party("fa", os.path.join(tmp_path, "fa"))
