"""Leader-driven vertical FL over the party halves (keras_fedpriv/federated/vertical/driver.py).

The driver of the halves and `VerticalModel.fit` run the same pieces: given the same seeds,
data and batch order they train the same model and record the same releases."""

import logging
import os
import re
import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.federated import with_example_ids
from keras_fedpriv.federated.vertical.driver import FeatureTable, VerticalDriver, epoch_order
from keras_fedpriv.privacy import privacy_report
from vertical_stubs import COLUMNS, follower_data, model_fn, vertical_data

pytestmark = [pytest.mark.jax]


@pytest.fixture(scope="module")
def data():
    return vertical_data()


def _fit_model_like_driver(model, data, epochs, batch_size, seed, validation=True):
    """VerticalModel.fit on the driver's batch order, predicting the validation rows after
    every epoch as the driver does (inference embeddings are releases and draw noise)."""
    n = len(data["y"])
    x = with_example_ids({"f1": data["features"][:n, COLUMNS["f1"]],
                          "f2": data["features"][:n, COLUMNS["f2"]], "lead": data["xb"]})
    xt = with_example_ids({"f1": data["features"][n:, COLUMNS["f1"]],
                           "f2": data["features"][n:, COLUMNS["f2"]], "lead": data["xb_t"]},
                          start=n)
    history = {}
    for epoch in range(epochs):
        order = epoch_order(seed, epoch, n)
        h = model.fit({k: v[order] for k, v in x.items()}, data["y"][order], epochs=1,
                      batch_size=batch_size, shuffle=False, verbose=0)
        for k, v in h.history.items():
            history.setdefault(k, []).extend(v)
        if validation:
            model.predict(xt, batch_size=256, verbose=0)
    return history


def _driver_fit(parties, data, epochs, batch_size, seed, validation=True):
    driver = VerticalDriver(parties, follower_data(data))
    result = driver.fit(data["y"], example_ids=data["ids"], x=data["xb"], epochs=epochs,
                        batch_size=batch_size, seed=seed,
                        validation_data=((data["ids_t"], data["y_t"], data["xb_t"])
                                         if validation else None))
    return driver, result


def test_driver_matches_vertical_model_fit_with_label_dp_and_embedding_dp(data):
    """Same seeds, data and batch order: the same model, the same releases."""
    epochs, batch_size, seed = 3, 32, 1
    model = model_fn()
    history = _fit_model_like_driver(model, data, epochs, batch_size, seed)

    halves_model = model_fn()
    driver, result = _driver_fit(halves_model.split_parties(), data, epochs, batch_size, seed)
    assert result.rejected == [] and result.history["skipped"] == [0.0] * epochs
    # Different execution paths (one traced Keras train_step vs one traced function per half
    # and round trip): compared to float tolerance (in practice they agree bit for bit).
    for a, b in zip(model.get_weights(), halves_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(model_fn().get_weights()[0], model.get_weights()[0])
    # the protected bits and noisy labels were the same: the protection layers drew the same
    # noise (their counters agree) and the label layer keys its noise by example id
    for p in ("f1", "f2"):
        np.testing.assert_array_equal(model.protections[p].rng_counter.numpy(),
                                      halves_model.protections[p].rng_counter.numpy())
        assert history[f"bytes_up_{p}"] == result.history[f"bytes_up_{p}"]
        assert history[f"bytes_down_{p}"] == result.history[f"bytes_down_{p}"]
    ids = data["ids"][:50]
    y = data["y"][:50]
    np.testing.assert_array_equal(model.label_dp(y, example_ids=ids, training=True),
                                  halves_model.label_dp(y, example_ids=ids, training=True))
    # every party recorded its own releases; together they make the model's report
    by_driver = privacy_report(driver, delta=1e-5)
    by_model = privacy_report(model, delta=1e-5)
    assert by_driver.epsilon == pytest.approx(by_model.epsilon, rel=1e-9)
    assert np.isfinite(by_driver.epsilon)
    assert privacy_report(halves_model, delta=1e-5).epsilon == pytest.approx(by_model.epsilon,
                                                                             rel=1e-9)
    # the leader's and one follower's own reports: labels only, features only
    assert privacy_report(result.leader, delta=1e-5).epsilon == pytest.approx(
        privacy_report(model.label_dp, delta=1e-5).epsilon)
    assert privacy_report(driver.parties.followers["f1"], delta=1e-5).epsilon == pytest.approx(
        privacy_report(model.protections["f1"], delta=1e-5).epsilon)


def test_driver_matches_vertical_model_fit_without_protections(data):
    """Plain bottoms (every backend): the halves' steps and VerticalModel's train_step are
    the same computation; the counts of releases without DP agree."""
    epochs, batch_size, seed = 2, 32, 1
    model = model_fn(embedding_dp=None, label_dp=False)
    history = _fit_model_like_driver(model, data, epochs, batch_size, seed)
    halves_model = model_fn(embedding_dp=None, label_dp=False)
    _, result = _driver_fit(halves_model.split_parties(), data, epochs, batch_size, seed)
    assert result.rejected == [] and result.history["skipped"] == [0.0] * epochs
    for a, b in zip(model.get_weights(), halves_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["loss"], result.history["loss"], rtol=1e-5)
    for p in ("f1", "f2"):
        assert history[f"bytes_up_{p}"] == result.history[f"bytes_up_{p}"]
    np.testing.assert_array_equal(model.unprotected_releases.numpy(),
                                  halves_model.unprotected_releases.numpy())


def test_driver_trains_on_breast_cancer(data):
    model = model_fn()
    parties = model.split_parties(metrics=[keras.metrics.AUC(name="auc")])
    _, result = _driver_fit(parties, data, epochs=4, batch_size=32, seed=7)
    loss, auc = result.history["loss"], result.history["val_auc"]
    assert loss[-1] < loss[0] - 0.05
    assert auc[-1] > 0.95 and auc[-1] > auc[0] - 0.01
    assert result.wire == {p: {"keys": ["bits"], "dtype": "uint8", "bytes_per_example": 1}
                           for p in ("f1", "f2")}
    # bytes of the epoch's training messages: 1 byte up and 4 float32 down per example
    assert result.history["bytes_up_f1"] == [398.0] * 4
    assert result.history["bytes_down_f1"] == [398.0 * 16] * 4


def test_a_vae_bottom_follower_matches_vertical_model_fit(data):
    """A bottom that samples (VAEBottom: its own secret noise, its own KL loss): the replayed
    forward pass draws the same sample, so the follower's gradient is VerticalModel's."""
    def with_vae():
        keras.utils.set_random_seed(5)  # the VAE's initial weights
        vae = kf.VAEBottom(latent_dim=4, hidden_units=(8,), beta=0.1, seed=11)
        return model_fn(embedding_dp=None, f2=keras.Sequential([keras.Input((7,)), vae]))

    model = with_vae()
    _fit_model_like_driver(model, data, 1, 64, 2, validation=False)
    halves_model = with_vae()
    _, result = _driver_fit(halves_model.split_parties(), data, 1, 64, 2, validation=False)
    assert result.wire["f2"] == {"keys": ["embedding"], "dtype": "float32",
                                 "bytes_per_example": 16}
    for a, b in zip(model.get_weights(), halves_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_malformed_replies_are_logged_and_never_used(data, caplog):
    epochs, batch_size, seed = 1, 64, 3
    hows = {1: lambda m: {"bits": m["bits"].astype(np.int16)},
            3: lambda m: {"bits": m["bits"][:-1]},
            4: lambda m: {"embedding": m["bits"].astype(np.float32)}}
    parties = model_fn().split_parties()
    f2 = parties.followers["f2"]
    inner = f2.embed
    calls = {"n": 0}

    def embed(x, example_ids=None, training=True, **kwargs):
        message = inner(x, example_ids, training, **kwargs)
        step = calls["n"]
        calls["n"] += 1
        return hows[step](message) if training and step in hows else message

    f2.embed = embed
    logger = logging.getLogger("keras_fedpriv.vertical")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="keras_fedpriv.vertical"):
            driver, result = _driver_fit(parties, data, epochs, batch_size, seed,
                                         validation=False)
    finally:
        logger.removeHandler(caplog.handler)
    reasons = {step: reason for _, step, party, reason in result.rejected if party == "f2"}
    assert sorted(reasons) == [1, 3, 4] and {p for _, _, p, _ in result.rejected} == {"f2"}
    assert "uint8" in reasons[1] and "shape" in reasons[3] and "exactly the array" in reasons[4]
    assert result.history["skipped"] == [3.0] and result.history["steps"] == [4.0]
    assert "the reply of follower 'f2' was not used" in caplog.text
    # what was refused never reached a model
    assert all(np.isfinite(v.numpy()).all() for v in parties.leader.trainable_variables)
    # f1 sent its embedding of the skipped batches (recorded releases) but got no gradient
    totals = parties.followers["f1"].protection.release_totals.numpy()
    assert int(totals[0]) == 7  # 7 batches embedded, all recorded


def test_vertical_guide_party_halves_example_runs():
    """docs/vertical.md: the party-halves example runs as written, after the quick start."""
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "vertical.md")
    text = open(path, encoding="utf-8").read()
    quick = re.findall(r"<!-- quick-start -->\s*```python\n(.*?)```", text, flags=re.S)
    halves = re.findall(r"<!-- party-halves -->\s*```python\n(.*?)```", text, flags=re.S)
    assert len(quick) == len(halves) == 1
    namespace = {}
    exec(compile(quick[0], "docs/vertical.md", "exec"), namespace)  # noqa: S102
    exec(compile(halves[0], "docs/vertical.md", "exec"), namespace)  # noqa: S102
    message, result = namespace["message"], namespace["result"]
    assert set(message) == {"bits"} and message["bits"].dtype == np.uint8
    assert message["bits"].shape == (32, 1)  # 8 coordinates: one byte per example
    assert len(result.history["loss"]) == 2 and result.rejected == []


def test_bad_arguments_raise_clear_errors(data):
    parties = model_fn().split_parties()
    with pytest.raises(TypeError, match="`parties` must be a VerticalParties"):
        VerticalDriver(parties.leader, {})
    with pytest.raises(ValueError, match=r"exactly the followers \['f1', 'f2'\]"):
        VerticalDriver(parties, {"f1": data["features"]})
    driver = VerticalDriver(parties, follower_data(data))
    with pytest.raises(ValueError, match="`epochs`"):
        driver.fit(data["y"], x=data["xb"], epochs=0)
    with pytest.raises(ValueError, match="`example_ids` must be 398 integers"):
        driver.fit(data["y"], example_ids=np.arange(3), x=data["xb"])
    with pytest.raises(ValueError, match="unique"):
        FeatureTable(np.zeros((3, 2)), example_ids=[1, 1, 2])


def _k_fit(data, k, epochs=2, batch_size=32, seed=5, parties=None):
    parties = parties or model_fn().split_parties(metrics=[keras.metrics.AUC(name="auc")])
    driver = VerticalDriver(parties, follower_data(data))
    result = driver.fit(data["y"], example_ids=data["ids"], x=data["xb"], epochs=epochs,
                        batch_size=batch_size, batches_per_message=k, seed=seed,
                        validation_data=(data["ids_t"], data["y_t"], data["xb_t"]))
    return driver, result


@pytest.fixture(scope="module")
def k_runs(data):
    return {k: _k_fit(data, k) for k in (1, 4)}


def test_k_batches_per_message_record_the_same_releases_as_one(k_runs):
    """K = 4 (13 steps an epoch: messages of 4, 4, 4 and 1 batches) releases exactly what
    K = 1 releases: the same ledgers, reports and payload bytes; only the model differs."""
    from keras_fedpriv.privacy.report import privacy_ledger

    (d1, r1), (d4, r4) = k_runs[1], k_runs[4]
    assert r1.rejected == r4.rejected == []
    assert r1.history["steps"] == r4.history["steps"] == [13.0, 13.0]
    for key in ("bytes_up", "bytes_down", "bytes_up_f1", "bytes_down_f2"):
        assert r1.history[key] == r4.history[key], key
    assert r1.privacy_ledger().to_dict() == r4.privacy_ledger().to_dict()
    for p in ("f1", "f2"):
        f1, f4 = d1.parties.followers[p], d4.parties.followers[p]
        counts1, counts4 = (privacy_ledger(f).to_dict() for f in (f1, f4))
        assert counts1["kinds"] and [k["units"] for k in counts1["kinds"]] == [
            k["units"] for k in counts4["kinds"]]
        np.testing.assert_array_equal(f1.protection.release_totals.numpy()[:2],
                                      f4.protection.release_totals.numpy()[:2])
    assert privacy_report(d1, delta=1e-5).epsilon == privacy_report(d4, delta=1e-5).epsilon
    assert np.isfinite(privacy_report(d4, delta=1e-5).epsilon)
    # K changed the computation (stale embeddings), not only the message count
    w1 = d1.parties.followers["f1"].trainable_variables[0].numpy()
    w4 = d4.parties.followers["f1"].trainable_variables[0].numpy()
    assert not np.allclose(w1, w4)


def test_k_batches_per_message_learn_about_as_well_as_one(k_runs):
    auc1, auc4 = (k_runs[k][1].history["val_auc"][-1] for k in (1, 4))
    loss4 = k_runs[4][1].history["loss"]
    assert auc4 > 0.95 and auc4 > auc1 - 0.02
    assert loss4[-1] < loss4[0]


def test_a_malformed_batch_skips_its_whole_message(data):
    """K = 4, batch 64 (7 steps: messages of steps 0-3 and 4-6): f2 answers the batch holding
    example 5 with int16 bits, and one reply of f1 lacks a batch: their messages' steps are
    skipped, the rest train, nothing malformed is used, and every embedding stays recorded."""
    parties = model_fn().split_parties(metrics=[keras.metrics.AUC(name="auc")])
    f2 = parties.followers["f2"]
    inner = f2.embed

    def embed(x, example_ids=None, training=True, **kwargs):
        message = inner(x, example_ids, training, **kwargs)
        return {"bits": message["bits"].astype(np.int16)} if training and 5 in example_ids \
            else message

    f2.embed = embed
    driver = VerticalDriver(parties, follower_data(data))
    exchange, calls = driver.exchange, {"n": 0}

    def short(requests):
        replies = exchange(requests)
        calls["n"] += 1
        if calls["n"] == 5:  # epoch 1, the message of steps 4-6: f1's third batch is missing
            replies["f1"] = {k: v for k, v in replies["f1"].items() if not k.startswith("2/")}
        return replies

    driver.exchange = short
    result = driver.fit(data["y"], example_ids=data["ids"], x=data["xb"], epochs=2,
                        batch_size=64, batches_per_message=4, seed=3, shuffle=False,
                        validation_data=(data["ids_t"], data["y_t"], data["xb_t"]))
    reasons = {(e, s, p): r for e, s, p, r in result.rejected}
    assert sorted(reasons) == [(0, 0, "f2"), (1, 0, "f2"), (1, 4, "f1")]
    assert "uint8" in reasons[(0, 0, "f2")] and "holds 2 batches; 3 were expected" in \
        reasons[(1, 4, "f1")]
    assert result.history["skipped"] == [4.0, 7.0] and result.history["steps"] == [3.0, 0.0]
    assert all(np.isfinite(v.numpy()).all() for v in parties.leader.trainable_variables)
    # epoch 2 trained nothing: it is not scored (no release spent on an unchanged model)
    assert np.isfinite(result.history["val_auc"][0]) and np.isnan(result.history["val_auc"][1])
    # f1 embedded every training batch (14) and the validation set once: all recorded
    assert int(parties.followers["f1"].protection.release_totals.numpy()[0]) == 15


def test_k_arguments_are_checked(data):
    parties = model_fn().split_parties()
    with pytest.raises(ValueError, match="`max_batches_per_message` must be an integer >= 1"):
        VerticalDriver(parties, follower_data(data), max_batches_per_message=0)
    driver = VerticalDriver(parties, follower_data(data), max_batches_per_message=8)
    with pytest.raises(ValueError, match=r"`batches_per_message` must be an integer in \[1, 8\]"):
        driver.fit(data["y"], x=data["xb"], batches_per_message=9)
    with pytest.raises(TypeError, match="`batches_per_message` must be an integer"):
        driver.fit(data["y"], x=data["xb"], batches_per_message="4")
