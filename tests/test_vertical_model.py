"""VerticalModel: the split-learning protocol in one process (keras_fedpriv.federated).

Two- and three-party models on scikit-learn's breast cancer data (features
split between parties): training quality, the messages that cross party
boundaries (shape, values, gradients equal to an independent computation),
bytes accounting, XLA, MirroredStrategy, `.keras` round trips, callbacks,
per-party SavedModel export, argument validation and label-DP example ids; and, with plain
bottoms, the protocol's arithmetic against one Keras model of the same architecture.

Backend-neutral: the module runs again under ``KERAS_BACKEND=jax`` (tf.data,
MirroredStrategy and SavedModel export are TensorFlow's).
"""

import os
import re

import keras
import numpy as np
import pytest

from crosspath import assert_bits_are_the_sign
from vertical_stubs import bottom, compile_model, is_zero_one, top, two_party, two_party_data

import keras_fedpriv as kf
from keras_fedpriv.federated import (
    MessageRecorder,
    VerticalModel,
    derive_party_seed,
    with_example_ids,
)
from keras_fedpriv.backend import BackendNotSupportedError

pytestmark = [pytest.mark.jax]


@pytest.fixture(scope="module")
def data():
    return two_party_data()


def _accuracy(model, data):
    p = model.predict(data["test"], verbose=0, batch_size=256)
    return float(np.mean((p > 0.5) == (data["y_test"] > 0.5)))


# --- training ------------------------------------------------------------------------

def test_unprotected_two_party_model_trains(data):
    keras.utils.set_random_seed(1)
    model = compile_model(two_party())
    assert model.parties == ("party_a", "party_b") and model.followers == ("party_a",)
    assert model.leader == "party_b"
    history = model.fit(data["train"], data["y"], epochs=15, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] - 0.3
    assert _accuracy(model, data) > 0.9
    # evaluate uses the true labels and the deployed (inference) path.
    result = model.evaluate(data["test"], data["y_test"], verbose=0, return_dict=True)
    assert result["accuracy"] > 0.9


def test_protected_model_still_trains(data):
    keras.utils.set_random_seed(2)
    # seeded protection: the losses and the accuracy below are deterministic
    model = compile_model(two_party(embedding_dp=kf.EmbeddingDPLayer(eps=8.0, seed=21),
                                label_dp=kf.LabelDPLayer(4.0, seed=22)))
    recorder = MessageRecorder(epochs=(0,), max_steps=2)
    history = model.fit(with_example_ids(data["train"]), data["y"], epochs=15, batch_size=32,
                        verbose=0, callbacks=[recorder])
    assert history.history["loss"][-1] < history.history["loss"][0] - 0.2
    assert _accuracy(model, data) > 0.85
    emb = recorder.embeddings("party_a")
    assert emb.shape == (64, 8) and is_zero_one(emb)
    assert len(recorder.steps()) == 2 and recorder.recorded_epochs == [0]
    # The follower's copy of the protection is its own layer (own secret key).
    layer = model.protections["party_a"]
    assert isinstance(layer, kf.EmbeddingDPLayer) and layer.eps == 8.0
    assert model.protections.keys() == {"party_a"}  # the leader's embedding is never protected
    # A later fit without message callbacks drops the message outputs again.
    history = model.fit(with_example_ids(data["train"]), data["y"], epochs=1, batch_size=64,
                        verbose=0)
    assert set(history.history) == {"loss", "accuracy", "bytes_up", "bytes_down",
                                    "bytes_up_party_a", "bytes_down_party_a"}


# --- XLA, MirroredStrategy ----------------------------------------------------------------

def test_jit_compile_fit_with_recorder(data):
    keras.utils.set_random_seed(5)
    model = compile_model(two_party(embedding_dp=kf.EmbeddingDPLayer(eps=4.0, seed=23),
                                label_dp=kf.LabelDPLayer(2.0, seed=24)), jit_compile=True)
    assert model.jit_compile is True
    n = 384  # 3 full batches: one XLA compilation
    x = with_example_ids({k: v[:n] for k, v in data["train"].items()})
    recorder = MessageRecorder(epochs=(1,))
    history = model.fit(x, data["y"][:n], epochs=2, batch_size=128, verbose=0,
                        callbacks=[recorder])
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert recorder.recorded_epochs == [1]
    emb = recorder.embeddings("party_a")
    assert emb.shape == (n, 8) and is_zero_one(emb)
    assert recorder.cut_gradients("party_a").shape == (n, 8)
    assert np.abs(recorder.cut_gradients("party_a")).max() > 0
    assert sorted(recorder.example_ids()) == list(range(n))
    assert history.history["bytes_up"] == [float(n)] * 2


@pytest.mark.tensorflow_only("MirroredStrategy")
def test_mirrored_strategy_fit_messages_and_bytes(data, strategy):
    keras.utils.set_random_seed(6)
    n = 202  # batches of 64: the last one (10 rows) splits 5 / 5 over the replicas
    x = with_example_ids({k: v[:n] for k, v in data["train"].items()})
    with strategy.scope():
        # labels keyed by id with a seed: the flip rate below is deterministic
        model = compile_model(two_party(embedding_dp=kf.EmbeddingDPLayer(eps=4.0, seed=11),
                                    label_dp=kf.LabelDPLayer(1.0, seed=25)))
    recorder = MessageRecorder(epochs=None)
    history = model.fit(x, data["y"][:n], epochs=2, batch_size=64, verbose=0,
                        callbacks=[recorder]).history
    # Each replica counts its own rows; the Sum metric adds the replicas: counted once.
    assert history["bytes_up"] == [float(n)] * 2
    assert history["bytes_down"] == [float(n * 8 * 4)] * 2
    for epoch in (0, 1):
        ids = recorder.example_ids(epoch)
        assert sorted(ids) == list(range(n))  # every example once: the whole global batch
        np.testing.assert_array_equal(recorder.labels(epoch), data["y"][:n][ids])
        assert recorder.cut_gradients("party_a", epoch).shape == (n, 8)
        assert is_zero_one(recorder.embeddings("party_a", epoch))
    # Randomize-once under replicas too: same noisy label for an id in both epochs.
    noisy = [recorder.noisy_labels(e)[np.argsort(recorder.example_ids(e))] for e in (0, 1)]
    np.testing.assert_array_equal(noisy[0], noisy[1])
    assert np.mean(noisy[0] != data["y"][:n]) > 0.1


# --- saving, callbacks ----------------------------------------------------------------------

def test_keras_round_trip_predicts_the_same_and_keeps_training(data, tmp_path):
    keras.utils.set_random_seed(7)
    model = compile_model(two_party(embedding_dp=kf.EmbeddingDPLayer(eps=None, ste="hardtanh"),
                                label_dp=kf.LabelDPLayer(3.0, seed=5)))
    n = len(data["y"]) // 64 * 64  # full batches: one trace per fit
    x = with_example_ids({k: v[:n] for k, v in data["train"].items()})
    model.fit(x, data["y"][:n], epochs=1, batch_size=64, verbose=0)
    path = os.path.join(tmp_path, "vertical.keras")
    model.save(path)
    back = keras.models.load_model(path)
    assert type(back) is VerticalModel
    assert (back.parties, back.followers) == (model.parties, model.followers)
    assert back.leader == "party_b"
    layer = back.protections["party_a"]
    assert type(layer) is kf.EmbeddingDPLayer and (layer.eps, layer.ste) == (None, "hardtanh")
    assert type(back.label_dp) is kf.LabelDPLayer
    assert (back.label_dp.eps, back.label_dp.seed) == (3.0, 5)
    rows = len(data["y_test"])  # one batch: one trace per predict
    np.testing.assert_array_equal(back.predict(data["test"], batch_size=rows, verbose=0),
                                  model.predict(data["test"], batch_size=rows, verbose=0))
    # Training goes on where it stopped (optimizer state restored).
    assert int(back.optimizer.iterations) == int(model.optimizer.iterations) > 0
    before = [w.copy() for w in back.get_weights()]
    history = back.fit(x, data["y"][:n], epochs=1, batch_size=64, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert any(np.abs(a - b).max() > 0 for a, b in zip(back.get_weights(), before))


@pytest.mark.tensorflow_only("SavedModel export")
def test_seeded_protection_gets_distinct_derived_seeds_per_party(tmp_path):
    import tensorflow as tf

    bottoms = {p: bottom(3, 4, p) for p in ("p1", "p2", "p3")}
    ins = {p: keras.Input((4,), name=p) for p in ("p1", "p2", "p3")}
    top = keras.Model(ins, keras.layers.Dense(1)(keras.layers.Concatenate()(list(ins.values()))))
    model = VerticalModel(bottoms, top, embedding_dp=kf.EmbeddingDPLayer(eps=1.0, seed=123))
    assert model.leader is None and model.followers == ("p1", "p2", "p3")
    seeds = {p: model.protections[p].seed for p in model.followers}
    assert seeds == {p: derive_party_seed(123, p) for p in model.followers}
    assert len(set(seeds.values())) == 3 and 123 not in seeds.values()
    keys = {tuple(model.protections[p].rng_key.numpy()) for p in model.followers}
    assert len(keys) == 3  # three different secret keys
    path = os.path.join(tmp_path, "seeded.keras")
    model.save(path)
    back = keras.models.load_model(path)
    assert {p: back.protections[p].seed for p in back.followers} == seeds
    # A leader without features of its own: its SavedModel takes only the followers' messages.
    x = {p: np.random.default_rng(0).normal(size=(5, 3)).astype("float32") for p in bottoms}
    msgs = {p: tf.constant(model.party_embeddings(p, x)) for p in model.followers}
    model.export_leader(os.path.join(tmp_path, "leader"))
    leader = tf.saved_model.load(os.path.join(tmp_path, "leader"))
    np.testing.assert_allclose(leader.serve(msgs).numpy(), model.top(msgs).numpy(), rtol=1e-6)


def test_callbacks_validation_early_stopping_checkpoint(data, tmp_path):
    keras.utils.set_random_seed(8)
    model = compile_model(two_party(embedding_dp=kf.EmbeddingDPLayer(eps=None)))
    ckpt = os.path.join(tmp_path, "best.keras")
    weights = os.path.join(tmp_path, "last.weights.h5")
    callbacks = [keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0),
                 keras.callbacks.ModelCheckpoint(ckpt, monitor="val_loss", save_best_only=True),
                 keras.callbacks.ModelCheckpoint(weights, save_weights_only=True),
                 MessageRecorder(epochs=None)]
    history = model.fit(data["train"], data["y"], epochs=10, batch_size=64, verbose=0,
                        validation_data=(data["test"], data["y_test"]), callbacks=callbacks)
    assert len(history.history["loss"]) == 2  # no val_loss improvement of 10: stopped
    assert set(history.history) >= {"val_loss", "val_accuracy", "val_bytes_up"}
    assert callbacks[3].recorded_epochs == [0, 1]
    best = keras.models.load_model(ckpt)
    assert type(best) is VerticalModel
    assert best.evaluate(data["test"], data["y_test"], verbose=0, return_dict=True)["loss"] == \
        pytest.approx(min(history.history["val_loss"]), rel=1e-5)
    fresh = compile_model(two_party(embedding_dp=kf.EmbeddingDPLayer(eps=None)))
    fresh.optimizer.build(fresh.trainable_variables)
    fresh.load_weights(weights)
    np.testing.assert_array_equal(fresh.predict(data["test"], verbose=0),
                                  model.predict(data["test"], verbose=0))


# --- export -----------------------------------------------------------------------------------

def _three_party_for_export():
    keras.utils.set_random_seed(9)
    bottoms = {"party_a": bottom(15, 8, "a"), "party_b": bottom(8, 6, "b"),
               "party_c": bottom(7, 5, "c")}
    return VerticalModel(bottoms, top(19), leader="party_b",
                         embedding_dp={"party_a": kf.EmbeddingDPLayer(eps=None)})


@pytest.mark.tensorflow_only("SavedModel export")
def test_export_each_party_reproduces_its_embeddings(data, tmp_path):
    import tensorflow as tf

    model = _three_party_for_export()
    compile_model(model)
    xa, xb = data["test"]["party_a"], data["test"]["party_b"]
    x = {"party_a": xa, "party_b": xb[:, :8], "party_c": xb[:, 8:]}
    model.fit(x, data["y_test"], epochs=1, batch_size=64, verbose=0)
    messages = {}
    for party in model.parties:
        path = os.path.join(tmp_path, party)
        model.export_party(party, path)
        loaded = tf.saved_model.load(path)
        if party == model.leader:
            leader = loaded
            continue
        served = loaded.serve(tf.constant(x[party])).numpy()
        want = model.party_embeddings(party, x)
        assert served.shape == want.shape
        if party == "party_a":  # quantization only: 0/1, the sign of the bottom's output
            assert is_zero_one(served)
            # SavedModel vs eager: bit for bit except where the bottom's output is within
            # rounding of 0
            assert_bits_are_the_sign(served, model.bottoms[party](x[party]).numpy())
            assert_bits_are_the_sign(want, model.bottoms[party](x[party]).numpy())
        else:  # unprotected float embedding
            np.testing.assert_allclose(served, want, rtol=1e-5, atol=1e-6)
        messages[party] = served
    # The leader's SavedModel: its own features + the followers' messages -> prediction.
    pred = leader.serve({"party_a": tf.constant(messages["party_a"]),
                         "party_b": tf.constant(x["party_b"]),
                         "party_c": tf.constant(messages["party_c"])}).numpy()
    np.testing.assert_allclose(pred, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


@pytest.mark.tensorflow_only("SavedModel export")
def test_export_randomized_party_keeps_randomizing_without_its_key(data, tmp_path):
    import tensorflow as tf

    model = two_party(embedding_dp=kf.EmbeddingDPLayer(eps=0.5))
    path = os.path.join(tmp_path, "party_a")
    model.export_party("party_a", path)
    served = tf.saved_model.load(path)
    x = tf.constant(data["test"]["party_a"][:64])
    a, b = served.serve(x).numpy(), served.serve(x).numpy()
    assert a.shape == (64, 8) and is_zero_one(a) and is_zero_one(b)
    assert np.mean(a != b) > 0.3  # fresh noise every call
    key = model.protections["party_a"].rng_key.numpy()
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if isinstance(value, np.ndarray) and value.shape == key.shape:
            assert not np.array_equal(value, key), name  # the secret key is not in the file


# --- validation, example ids --------------------------------------------------------------------

def test_bad_arguments_raise_clear_errors():
    a, b = bottom(3, 4, "a"), bottom(3, 4, "b")
    head = top(8)
    with pytest.raises(TypeError, match="`bottoms`"):
        VerticalModel([a, b], head)
    with pytest.raises(TypeError, match=r"`bottoms\['party_b'\]` must be a Keras"):
        VerticalModel({"party_a": a, "party_b": lambda x: x}, head)
    with pytest.raises(ValueError, match="reserved"):
        VerticalModel({"party_a": a, "example_ids": b}, head)
    with pytest.raises(ValueError, match="identifiers"):
        VerticalModel({"party a": a, "party_b": b}, head)
    with pytest.raises(ValueError, match="own bottom"):
        VerticalModel({"party_a": a, "party_b": a}, head)
    with pytest.raises(ValueError, match="`leader`.*'party_z'"):
        VerticalModel({"party_a": a, "party_b": b}, head, leader="party_z")
    with pytest.raises(TypeError, match="`top`"):
        VerticalModel({"party_a": a, "party_b": b}, "dense")
    with pytest.raises(TypeError, match="`label_dp`.*LabelDPLayer"):
        VerticalModel({"party_a": a, "party_b": b}, head, label_dp=kf.EmbeddingDPLayer(1.0))
    with pytest.raises(ValueError, match=r"`embedding_dp` names unknown parties \['party_x'\]"):
        VerticalModel({"party_a": a, "party_b": b}, head, embedding_dp={"party_x": None})
    with pytest.raises(ValueError, match="leader, whose embedding never leaves"):
        VerticalModel({"party_a": a, "party_b": b}, head, leader="party_b",
                      embedding_dp={"party_b": kf.EmbeddingDPLayer(1.0)})
    shared = kf.EmbeddingDPLayer(1.0)
    with pytest.raises(ValueError, match="same layer object"):
        VerticalModel({"party_a": a, "party_b": b}, head,
                      embedding_dp={"party_a": shared, "party_b": shared})
    with pytest.raises(TypeError, match="`embedding_dp`"):
        VerticalModel({"party_a": a, "party_b": b}, head, embedding_dp="edp")
    with pytest.raises(ValueError, match="at least one follower"):
        VerticalModel({"party_a": a}, head, leader="party_a")
    with pytest.raises(ValueError, match="not built"):
        VerticalModel({"party_a": a, "party_b": keras.Sequential([keras.layers.Dense(2)])}, head)
    # The top's input rule, checked at construction.
    with pytest.raises(ValueError, match=r"last dimension 9.*have 8"):
        VerticalModel({"party_a": a, "party_b": b}, top(9))
    two = [keras.Input((4,), name="x1"), keras.Input((4,), name="x2")]
    with pytest.raises(ValueError, match=r"inputs named \['x1', 'x2'\]"):
        VerticalModel({"party_a": a, "party_b": b},
                      keras.Model(two, keras.layers.Concatenate()(two)))
    model = VerticalModel({"party_a": a, "party_b": b}, head, leader="party_b")
    with pytest.raises(ValueError, match=r"missing \['party_b'\], unknown \['party_c'\]"):
        model({"party_a": np.zeros((2, 3)), "party_c": np.zeros((2, 3))})
    with pytest.raises(TypeError, match=r"takes its inputs as a dict \{party name: array\} "
                                        r"with the keys \['party_a', 'party_b'\].*got a tensor of "
                                        r"shape \(2, 3\)"):
        model(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="unknown party 'party_q'"):
        model.party_embeddings("party_q", np.zeros((2, 3)))
    model.compile("sgd", "binary_crossentropy", steps_per_execution=2)
    with pytest.raises(ValueError, match="steps_per_execution=1"):
        model.fit({"party_a": np.zeros((4, 3)), "party_b": np.zeros((4, 3))}, np.zeros((4, 1)),
                  verbose=0, callbacks=[MessageRecorder()])
    with pytest.raises(TypeError, match="observes the messages of a .*VerticalModel"):
        MessageRecorder().set_model(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]))
    with pytest.raises(ValueError, match="`epochs`"):
        MessageRecorder(epochs=(-1,))
    with pytest.raises(ValueError, match="`max_steps`"):
        MessageRecorder(max_steps=0)


def test_ids_just_below_an_id_capacity_are_counted_exactly_by_a_compiled_fit(data):
    """Protections built with ``id_capacity`` count the ids just below it exactly in ``fit``
    (XLA on TensorFlow, jit on JAX): no fold, no bound in the report."""
    n = len(data["y"]) // 64 * 64  # full batches of 64: one XLA compilation
    capacity = 5000 + n
    embedding = kf.EmbeddingDPLayer(2.0, seed=1, id_capacity=capacity)
    labels = kf.LabelDPLayer(1.0, seed=2, per_batch=True, id_capacity=capacity)
    model = compile_model(two_party(embedding_dp=embedding, label_dp=labels), jit_compile=True)
    x = {k: v[:n] for k, v in data["train"].items()}
    model.fit(with_example_ids(x, start=capacity - n), data["y"][:n], epochs=1, batch_size=64,
              verbose=0)
    for layer in (model.protections["party_a"], model.label_dp):
        assert layer.id_capacity == capacity
        ids, counts = layer._release_id_counts_nonzero()
        assert ids.tolist() == list(range(capacity - n, capacity)) and set(counts.tolist()) == {1}
    rows = kf.privacy.privacy_report(model).rows()
    assert {r["releases"] for r in rows} == {1} and not any("upper" in r["note"] for r in rows)


def test_missing_example_ids_with_randomize_once_label_dp_raises(data):
    model = compile_model(two_party(label_dp=kf.LabelDPLayer(1.0)))
    with pytest.raises(ValueError, match=re.escape("with_example_ids")):
        model.fit(data["train"], data["y"], epochs=1, batch_size=64, verbose=0)
    # per_batch=True needs no ids (and composes over epochs, as its docs say).
    model = compile_model(two_party(label_dp=kf.LabelDPLayer(1.0, per_batch=True)))
    model.fit(data["train"], data["y"], epochs=1, batch_size=64, verbose=0)


@pytest.mark.tensorflow_only("tf.data")
def test_example_ids_give_the_same_noisy_labels_every_epoch(data):
    import tensorflow as tf

    keras.utils.set_random_seed(10)
    model = compile_model(two_party(label_dp=kf.LabelDPLayer(0.5, seed=26)))  # a fixed band
    n = len(data["y"])
    dataset = with_example_ids(tf.data.Dataset.from_tensor_slices((data["train"], data["y"])))
    dataset = dataset.shuffle(n, reshuffle_each_iteration=True).batch(64)
    recorder = MessageRecorder(epochs=(0, 1, 2))
    model.fit(dataset, epochs=3, verbose=0, shuffle=False, callbacks=[recorder])
    orders = [recorder.example_ids(e) for e in (0, 1, 2)]
    assert not np.array_equal(orders[0], orders[1])  # reshuffled between epochs
    assert sorted(orders[0]) == list(range(n))
    noisy = [recorder.noisy_labels(e)[np.argsort(ids)] for e, ids in zip((0, 1, 2), orders)]
    np.testing.assert_array_equal(noisy[0], noisy[1])
    np.testing.assert_array_equal(noisy[0], noisy[2])
    # eps = 0.5 flips with probability 1 / (1 + e^0.5) ~ 0.38.
    assert 0.28 < np.mean(noisy[0] != data["y"]) < 0.48
    for e, ids in zip((0, 1, 2), orders):
        np.testing.assert_array_equal(recorder.labels(e), data["y"][ids])  # true labels kept apart
    assert recorder.embeddings("party_a").shape == (3 * n, 8)


def test_vertical_guide_quick_start_runs():
    """The quick start in docs/vertical.md, executed as written."""
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "vertical.md")
    text = open(path, encoding="utf-8").read()
    blocks = re.findall(r"<!-- quick-start -->\s*```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    assert len(blocks[0].strip().splitlines()) <= 15
    namespace = {}
    exec(compile(blocks[0], "docs/vertical.md", "exec"), namespace)  # noqa: S102
    history, recorder = namespace["history"], namespace["recorder"]
    assert history.history["bytes_up"][0] > 0
    assert recorder.cut_gradients("party_a").shape[1] == 8


def test_vertical_guide_evaluation_charges_only_the_test_rows():
    """docs/vertical.md's evaluation snippet (after the quick start): test ids from a fresh
    range charge the test rows once and leave the training rows' count as it was; without
    ids the same evaluate warns once and is recorded for every example."""
    import warnings

    from keras_fedpriv.privacy import privacy_report

    path = os.path.join(os.path.dirname(__file__), "..", "docs", "vertical.md")
    text = open(path, encoding="utf-8").read()
    quick = re.findall(r"<!-- quick-start -->\s*```python\n(.*?)```", text, flags=re.S)
    evaluation = re.findall(r"<!-- evaluation -->\s*```python\n(.*?)```", text, flags=re.S)
    assert len(quick) == 1 and len(evaluation) == 1 and "start=n_train" in evaluation[0]
    namespace = {}
    exec(compile(quick[0], "docs/vertical.md", "exec"), namespace)  # noqa: S102
    model = namespace["model"]
    protection = model.protections["party_a"]

    def count():
        ledger = protection.privacy_ledger()
        (kind,) = ledger.kinds
        return ledger.units_seen(kind), ledger.total(kind)

    assert count() == (256, 3)  # 3 epochs, ids 0 .. 255
    eps = privacy_report(model, protects="features").epsilon
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning with ids
        exec(compile(evaluation[0], "docs/vertical.md", "exec"), namespace)  # noqa: S102
    assert count() == (256 + 64, 3)  # the 64 test rows are charged once; nobody else
    assert privacy_report(model, protects="features").epsilon == pytest.approx(eps)
    # Without ids (the honest over-count): one warning per call, every example charged.
    features = {"party_a": namespace["xa_test"], "party_b": namespace["xb_test"]}
    with pytest.warns(UserWarning, match=r"evaluate ran without example ids, so each of its 2 "
                                         r"batch\(es\).*EVERY example.*start=N") as caught:
        model.evaluate(features, namespace["y_test"], batch_size=32, verbose=0)
    assert len(caught) == 1
    assert count() == (320, 3 + 2)
    assert privacy_report(model, protects="features").epsilon > eps + 1.0
    with pytest.warns(UserWarning, match="predict ran without example ids, so each of its 1 "):
        model.predict(features, batch_size=64, verbose=0)
    assert count() == (320, 3 + 2 + 1)


# --- the protocol's arithmetic, plain bottoms (every backend) ----------------------------------

ROWS, BATCH = 96, 32
PARTIES = {"fa": 5, "fb": 3, "lead": 4}  # party -> number of features
EMBED = {"fa": 4, "fb": 2, "lead": 3}


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = {p: rng.normal(size=(ROWS, k)).astype("float32") for p, k in PARTIES.items()}
    y = (x["fa"][:, 0] + x["lead"][:, 1] > 0).astype("float32")[:, None]
    return x, y


def _bottom(party):
    """Dense + tanh; the parties' own losses: a weight regularizer (fa), an activity
    regularizer, i.e. ``add_loss`` in ``call`` (fb)."""
    inputs = keras.Input((PARTIES[party],), name=party)
    regularizers = {"fa": dict(kernel_regularizer=keras.regularizers.L2(0.05)),
                    "fb": dict(activity_regularizer=keras.regularizers.L2(0.02))}
    dense = keras.layers.Dense(EMBED[party], activation="tanh", **regularizers.get(party, {}))
    return keras.Model(inputs, dense(inputs))


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
    """Cut gradients, each party's gradients from its cut gradient alone (plus its own
    losses), one optimizer step: the same weights as plain Keras training of the same
    architecture."""
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
