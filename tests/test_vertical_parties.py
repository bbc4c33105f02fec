"""The halves of vertical FL (follower, leader) and their in-process driver.

The driver of the halves and `VerticalModel.fit` run the same pieces: given the same seeds,
data and batch order they train the same model and record the same releases.
"""

import logging
import os
import re

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.datasets import breast_cancer_vertical
from keras_fedpriv.federated import VerticalModel, with_example_ids
from keras_fedpriv.federated.vertical_driver import (
    FeatureTable,
    FollowerRequest,
    VerticalDriver,
    epoch_order,
    serve_request,
)
from keras_fedpriv.federated.vertical_parties import (
    EmbeddingSpec,
    MalformedMessage,
    VerticalFollower,
    VerticalLeader,
    decode_embedding,
    decode_gradient,
    encode_embedding,
    split_parties,
)
from keras_fedpriv.privacy import privacy_report

COLUMNS = {"f1": slice(0, 8), "f2": slice(8, 15)}  # the two followers' share of the 15


@pytest.fixture(scope="module")
def data():
    xa, xb, y, xa_t, xb_t, y_t = breast_cancer_vertical()
    n = len(y)
    return {"features": np.concatenate([xa, xa_t]),  # followers hold every row, train and test
            "xb": xb, "y": y, "ids": np.arange(n), "xb_t": xb_t, "y_t": y_t,
            "ids_t": np.arange(n, n + len(y_t))}


def model_fn(embedding_dp="bits", label_dp=True, f2=None):
    """Leader 'lead' with a bottom of its own, followers f1 and f2, LabelDP + EmbeddingDP."""
    keras.utils.set_random_seed(0)

    def bottom(k, name):
        return keras.Sequential([keras.Input((k,)), keras.layers.Dense(8, activation="relu"),
                                 keras.layers.Dense(4)], name=name)

    top = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                            keras.layers.Dense(1, activation="sigmoid")])
    protection = {"bits": kf.EmbeddingDPLayer(eps=4.0, seed=3), None: None}[embedding_dp]
    model = VerticalModel({"f1": bottom(8, "b1"), "f2": f2 or bottom(7, "b2"),
                           "lead": bottom(15, "b3")}, top, leader="lead",
                          embedding_dp=protection,
                          label_dp=kf.LabelDPLayer(eps=2.0, seed=4) if label_dp else None)
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
    return model


def _follower_data(data):
    return {p: data["features"][:, c] for p, c in COLUMNS.items()}


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
    driver = VerticalDriver(parties, _follower_data(data))
    result = driver.fit(data["y"], example_ids=data["ids"], x=data["xb"], epochs=epochs,
                        batch_size=batch_size, seed=seed,
                        validation_data=((data["ids_t"], data["y_t"], data["xb_t"])
                                         if validation else None))
    return driver, result


def test_split_parties_share_the_layers_and_send_packed_bits(data):
    model = model_fn()
    parties = model.split_parties()
    f1, leader = parties.followers["f1"], parties.leader
    assert f1.bottom is model.bottoms["f1"] and f1.protection is model.protections["f1"]
    assert leader.top is model.top and leader.label_dp is model.label_dp
    assert leader.own.bottom is model.bottoms["lead"] and set(parties.followers) == {"f1", "f2"}
    assert f1.optimizer is not model.optimizer  # each party its own optimizer, same settings
    assert f1.optimizer.get_config()["learning_rate"] == pytest.approx(0.01)
    assert f1.spec == EmbeddingSpec((4,), "float32", True)
    assert f1.wire_format == model.wire_format["f1"]

    ids = np.arange(10, 30)
    message = f1.embed(data["features"][ids, COLUMNS["f1"]], example_ids=ids)
    # bits only: one uint8 array, ceil(4 / 8) = 1 byte per example
    assert set(message) == {"bits"}
    assert message["bits"].dtype == np.uint8 and message["bits"].shape == (20, 1)
    assert not np.any(message["bits"] & 0x0F)  # the 4 padding bits of every row are zero
    received = leader.receive("f1", message, rows=20)
    assert received.dtype == np.float32 and set(np.unique(received)) <= {0.0, 1.0}

    # unprotected: the float embedding, nothing else
    plain = split_parties(model_fn(embedding_dp=None)).followers["f1"]
    message = plain.embed(data["features"][ids, COLUMNS["f1"]], example_ids=ids)
    assert set(message) == {"embedding"} and message["embedding"].dtype == np.float32
    assert message["embedding"].shape == (20, 4)


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


def test_a_follower_state_moves_to_another_process(data):
    """What a follower keeps between messages (Flower's node state) is enough to apply the
    gradient in a fresh copy: the same update as the original."""
    ids = np.arange(40, 72)
    x = data["features"][ids, COLUMNS["f1"]]
    first = model_fn().split_parties().followers["f1"]
    first.embed(x, example_ids=ids)
    state = first.state_dict()
    gradient = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)

    copy = model_fn().split_parties().followers["f1"]  # "another process": built the same way
    copy.load_state_dict({k: np.array(v) for k, v in state.items()})
    assert copy.pending
    copy.apply_gradients(gradient)
    first.apply_gradients(gradient)
    for a, b in zip(first.trainable_variables, copy.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(first.protection.release_totals.numpy(),
                                  copy.protection.release_totals.numpy())
    # applying did not count a second release, nor draw new noise
    assert int(first.protection.release_totals.numpy()[0]) == 1
    np.testing.assert_array_equal(first.protection.rng_counter.numpy(),
                                  copy.protection.rng_counter.numpy())


# --------------------------------------------------------------- malformed messages are refused
SPEC_BITS = EmbeddingSpec((12,), "float32", True)
SPEC_FLOAT = EmbeddingSpec((3,), "float32", False)


@pytest.mark.parametrize("arrays, spec, match", [
    ({"bits": np.zeros((5, 2), np.uint8), "x": np.zeros(1)}, SPEC_BITS, "exactly the array"),
    ({"embedding": np.zeros((5, 12), np.float32)}, SPEC_BITS, "exactly the array 'bits'"),
    ({"bits": np.zeros((5, 2), np.int8)}, SPEC_BITS, "uint8 of shape"),
    ({"bits": np.zeros((5, 3), np.uint8)}, SPEC_BITS, r"shape \(5, 2\)"),
    ({"bits": np.zeros((4, 2), np.uint8)}, SPEC_BITS, r"shape \(5, 2\)"),
    ({"bits": np.full((5, 2), 1, np.uint8)}, SPEC_BITS, "padding bits"),
    ({"bits": [[0, 0]] * 5}, SPEC_BITS, "numpy array"),
    ({"embedding": np.zeros((5, 3), np.float64)}, SPEC_FLOAT, "float32 of shape"),
    ({"embedding": np.zeros((5, 4), np.float32)}, SPEC_FLOAT, r"shape \(5, 3\)"),
    ({"embedding": np.full((5, 3), np.nan, np.float32)}, SPEC_FLOAT, "non-finite"),
    ({"embedding": np.full((5, 3), np.inf, np.float32)}, SPEC_FLOAT, "non-finite"),
])
def test_the_leader_refuses_a_malformed_embedding(arrays, spec, match):
    with pytest.raises(MalformedMessage, match=match):
        decode_embedding(arrays, spec, rows=5)


def test_packed_bits_round_trip_and_what_is_refused():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, size=(7, 12)).astype(np.float32)
    np.testing.assert_array_equal(decode_embedding(encode_embedding(bits, SPEC_BITS), SPEC_BITS,
                                                   7), bits)
    with pytest.raises(ValueError, match="other than 0.0 and 1.0"):
        encode_embedding(bits * 0.5, SPEC_BITS)  # never sends a raw embedding as "bits"
    for bad, match in [({"gradient": np.zeros((7, 12), np.float64)}, "float32"),
                       ({"gradient": np.zeros((6, 12), np.float32)}, "shape"),
                       ({"gradient": np.full((7, 12), np.nan, np.float32)}, "non-finite"),
                       ({"grad": np.zeros((7, 12), np.float32)}, "exactly the array")]:
        with pytest.raises(MalformedMessage, match=match):
            decode_gradient(bad, SPEC_BITS, 7)


def test_a_follower_refuses_a_malformed_gradient_and_updates_nothing(data):
    follower = model_fn().split_parties().followers["f1"]
    with pytest.raises(MalformedMessage, match="no batch awaits"):
        follower.apply_gradients(np.zeros((4, 4), np.float32))
    ids = np.arange(4)
    follower.embed(data["features"][ids, COLUMNS["f1"]], example_ids=ids)
    before = [v.numpy().copy() for v in follower.trainable_variables]
    for bad in (np.zeros((3, 4), np.float32), np.zeros((4, 4), np.float64),
                np.full((4, 4), np.inf, np.float32)):
        with pytest.raises(MalformedMessage):
            follower.apply_gradients(bad)
    assert follower.pending  # still waiting for a good one
    for a, b in zip(before, follower.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())
    table = FeatureTable(data["features"][:, COLUMNS["f1"]])
    with pytest.raises(MalformedMessage, match="unknown to this party"):
        serve_request(follower, FollowerRequest(example_ids=np.array([0, 10 ** 6])), table)
    with pytest.raises(MalformedMessage, match="integer"):
        table.rows(np.array([0.5]))


def test_malformed_replies_are_logged_and_never_used(data, caplog):
    epochs, batch_size, seed = 1, 64, 3
    hows = {1: lambda m: {"bits": m["bits"].astype(np.int16)},
            3: lambda m: {"bits": m["bits"][:-1]},
            4: lambda m: {"embedding": m["bits"].astype(np.float32)}}
    parties = model_fn().split_parties()
    f2 = parties.followers["f2"]
    inner = f2.embed
    calls = {"n": 0}

    def embed(x, example_ids=None, training=True):
        message = inner(x, example_ids, training)
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


# ------------------------------------------------------------------------------ clear errors
def test_bad_arguments_raise_clear_errors(data):
    model = model_fn()
    parties = model.split_parties()
    f1, leader = parties.followers["f1"], parties.leader
    with pytest.raises(TypeError, match="`model` must be a VerticalModel"):
        split_parties(keras.Sequential([keras.Input((2,))]))
    with pytest.raises(TypeError, match="`optimizer`"):
        split_parties(model, optimizer=3)
    with pytest.raises(ValueError, match="not compiled; pass `optimizer=`"):
        uncompiled = VerticalModel(dict(model.bottoms), model.top, leader="lead")
        split_parties(uncompiled)
    with pytest.raises(ValueError, match="identifiers"):
        VerticalFollower("a b", model.bottoms["f1"])
    with pytest.raises(TypeError, match=r"`bottoms\['f9'\]` must be a Keras"):
        VerticalFollower("f9", "dense")
    with pytest.raises(TypeError, match="`training` must be a bool"):
        f1.embed(data["features"][:2, COLUMNS["f1"]], training="yes")
    with pytest.raises(ValueError, match="`example_ids` has 3 entries for 2 rows"):
        f1.embed(data["features"][:2, COLUMNS["f1"]], example_ids=[0, 1, 2])
    with pytest.raises(TypeError, match="`example_ids` must be integers"):
        f1.embed(data["features"][:2, COLUMNS["f1"]], example_ids=[0.0, 1.0])
    with pytest.raises(TypeError, match="`followers` must be a non-empty dict"):
        VerticalLeader(model.top, {}, loss="mse")
    with pytest.raises(TypeError, match=r"`followers\['f1'\]` must be an EmbeddingSpec"):
        VerticalLeader(model.top, {"f1": (4,)}, loss="mse")
    with pytest.raises(ValueError, match="`loss` is required"):
        VerticalLeader(model.top, {"f1": f1.spec, "f2": f1.spec}, bottom=model.bottoms["lead"],
                       name="lead")
    with pytest.raises(ValueError, match="`name`"):
        VerticalLeader(model.top, {"f1": f1.spec}, bottom=model.bottoms["lead"], loss="mse")
    with pytest.raises(TypeError, match="`metrics` must hold keras.metrics.Metric"):
        split_parties(model, metrics=[lambda y, p: y])
    with pytest.raises(ValueError, match="last dimension 12"):
        VerticalLeader(model.top, {"f1": f1.spec}, loss="mse")
    received = {"f1": np.zeros((2, 4), np.float32), "f2": np.zeros((2, 4), np.float32)}
    with pytest.raises(ValueError, match=r"missing \['f2'\]"):
        leader.step({"f1": received["f1"]}, np.zeros((2, 1), np.float32), [0, 1],
                    x=data["xb"][:2])
    with pytest.raises(ValueError, match="`x` .* is required"):
        leader.step(received, np.zeros((2, 1), np.float32), [0, 1])
    with pytest.raises(ValueError, match=r"`received\['f1'\]` must be float32"):
        leader.step({**received, "f1": np.zeros((2, 4))}, np.zeros((2, 1), np.float32),
                    [0, 1], x=data["xb"][:2])
    with pytest.raises(ValueError, match="needs example ids"):
        leader.step(received, np.zeros((2, 1), np.float32), x=data["xb"][:2])
    with pytest.raises(ValueError, match="row 1 has value 2"):
        leader.step(received, np.array([[0.0], [2.0]], np.float32), [0, 1], x=data["xb"][:2])
    with pytest.raises(ValueError, match="`sample_weight` with label_dp"):
        leader.step(received, np.zeros((2, 1), np.float32), [0, 1], x=data["xb"][:2],
                    sample_weight=np.ones(2))
    with pytest.raises(MalformedMessage, match="not a follower"):
        leader.receive("lead", {"bits": np.zeros((2, 1), np.uint8)}, rows=2)
    with pytest.raises(TypeError, match="`parties` must be a VerticalParties"):
        VerticalDriver(leader, {})
    with pytest.raises(ValueError, match=r"exactly the followers \['f1', 'f2'\]"):
        VerticalDriver(parties, {"f1": data["features"]})
    driver = VerticalDriver(parties, _follower_data(data))
    with pytest.raises(ValueError, match="`epochs`"):
        driver.fit(data["y"], x=data["xb"], epochs=0)
    with pytest.raises(ValueError, match="`example_ids` must be 398 integers"):
        driver.fit(data["y"], example_ids=np.arange(3), x=data["xb"])
    with pytest.raises(ValueError, match="unique"):
        FeatureTable(np.zeros((3, 2)), example_ids=[1, 1, 2])


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
