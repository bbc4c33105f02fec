"""The messages that cross party boundaries and the callbacks that observe them
(keras_fedpriv/federated/messages.py).

What MessageRecorder records is the protocol: the cut gradients equal an independent
computation, the bytes in the history equal hand-computed totals."""

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.federated import (
    MessageCallback,
    MessageRecorder,
    VerticalModel,
    with_example_ids,
)
from vertical_stubs import bottom, compile_model, is_zero_one, top, two_party_data

pytestmark = [pytest.mark.jax]


@pytest.fixture(scope="module")
def data():
    return two_party_data()


@pytest.mark.tensorflow_only("the independent gradient is a tf.GradientTape's")
def test_messages_are_the_protocol_gradients(data):
    """g_p = d loss / d e_p computed independently, and the bottom's SGD update comes from g_p
    (plus the party's own regularization loss) alone."""
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    lr, n = 0.5, 64
    bottom_a = bottom(15, 12, "bottom_a", kernel_regularizer=keras.regularizers.L2(0.05))
    bottom_b = bottom(15, 8, "bottom_b")
    model = VerticalModel({"party_a": bottom_a, "party_b": bottom_b}, top(20), leader="party_b",
                          embedding_dp=kf.EmbeddingDPLayer(eps=None))  # deterministic bits
    model.compile(keras.optimizers.SGD(lr), "binary_crossentropy")
    x = {k: v[:n] for k, v in data["train"].items()}
    y = data["y"][:n]
    before = [v.numpy() for v in bottom_a.trainable_variables]
    sent_a = tf.constant(model.party_embeddings("party_a", x, training=True))
    own_b = tf.constant(model.party_embeddings("party_b", x))
    with tf.GradientTape() as tape:
        tape.watch(sent_a)
        pred = model.top(tf.concat([sent_a, own_b], axis=-1), training=True)  # sorted order
        loss = keras.losses.BinaryCrossentropy()(y, pred)
    expected_g = tape.gradient(loss, sent_a).numpy()

    seen = []

    class Capture(MessageCallback):
        def on_messages(self, step, messages):
            seen.append((step, messages))

    model.fit(x, y, epochs=1, batch_size=n, shuffle=False, verbose=0, callbacks=[Capture()])
    assert len(seen) == 1
    step, messages = seen[0]
    assert step == 0 and messages.epoch == 0 and set(messages.parties) == {"party_a"}
    got = messages["party_a"]
    np.testing.assert_array_equal(got.embeddings, sent_a.numpy())
    assert got.embeddings.shape == (n, 12) and is_zero_one(got.embeddings)
    np.testing.assert_allclose(got.gradients, expected_g, rtol=1e-5, atol=1e-8)
    assert np.abs(got.gradients).max() > 1e-4
    np.testing.assert_array_equal(messages.evaluation.labels, y)
    np.testing.assert_array_equal(messages.evaluation.noisy_labels, y)  # no label DP
    assert messages.evaluation.example_ids is None

    # The party's update from g_p alone: tape.gradient(e_p, vars, output_gradients=g_p) + its L2,
    # evaluated at the weights before the step.
    after = [v.numpy() for v in bottom_a.trainable_variables]
    for v, value in zip(bottom_a.trainable_variables, before):
        v.assign(value)
    with tf.GradientTape() as tape:
        sent = model.protections["party_a"](bottom_a(x["party_a"], training=True), training=True)
        reg = tf.add_n(bottom_a.losses)
    party_grads = tape.gradient([sent, reg], bottom_a.trainable_variables,
                                output_gradients=[tf.constant(got.gradients), tf.ones_like(reg)])
    for got_w, b, g in zip(after, before, party_grads):
        np.testing.assert_allclose(got_w, b - lr * g.numpy(), rtol=1e-5, atol=1e-6)
        assert np.abs(got_w - b).max() > 1e-5


def test_bytes_in_history_equal_hand_computed_totals(data):
    """Three parties, dict-input top: 1-bit packed bits up for EmbeddingDP, float32 otherwise."""
    keras.utils.set_random_seed(4)
    xa, xb = data["train"]["party_a"], data["train"]["party_b"]
    x = {"party_a": xa, "party_b": xb[:, :8], "party_c": xb[:, 8:]}
    ins = {p: keras.Input((d,), name=p) for p, d in (("party_a", 12), ("party_b", 6),
                                                     ("party_c", 5))}
    out = keras.layers.Dense(1, activation="sigmoid")(
        keras.layers.Concatenate()([ins["party_a"], ins["party_b"], ins["party_c"]]))
    top = keras.Model(ins, out)
    model = VerticalModel({"party_a": bottom(15, 12, "a"), "party_b": bottom(8, 6, "b"),
                           "party_c": bottom(7, 5, "c")}, top, leader="party_b",
                          embedding_dp={"party_a": kf.EmbeddingDPLayer(eps=2.0), "party_c": None})
    assert model.wire_format["party_a"]["up"] == "1-bit packed"
    assert model.wire_format["party_a"]["up_bytes_per_example"] == 2      # ceil(12 / 8)
    assert model.wire_format["party_c"]["up_bytes_per_example"] == 20     # 5 * 4
    compile_model(model)
    n_train, n_val = 300, 98
    val = ({k: v[n_train:] for k, v in x.items()}, data["y"][n_train:])
    recorder = MessageRecorder(epochs=None)
    history = model.fit({k: v[:n_train] for k, v in x.items()}, data["y"][:n_train], epochs=2,
                        batch_size=64, validation_data=val, verbose=0, callbacks=[recorder]).history
    up = {"party_a": 2, "party_c": 20}
    down = {"party_a": 12 * 4, "party_c": 5 * 4}
    assert history["bytes_up"] == [n_train * 22] * 2
    assert history["bytes_down"] == [n_train * 68] * 2
    for p in ("party_a", "party_c"):
        assert history[f"bytes_up_{p}"] == [n_train * up[p]] * 2
        assert history[f"bytes_down_{p}"] == [n_train * down[p]] * 2
        assert recorder.bytes_up(p, epoch=1) == n_train * up[p]
    assert "bytes_up_party_b" not in history  # the leader sends nothing
    assert history["val_bytes_up"] == [n_val * 22] * 2  # inference messages go up too
    assert history["val_bytes_down"] == [0.0, 0.0]
    assert all(isinstance(v, float) for values in history.values() for v in values)
    assert recorder.embeddings("party_c").shape == (2 * n_train, 5)
    assert set(model.protections) == {"party_a", "party_c"} and model.protections["party_c"] is None


@pytest.mark.tensorflow_only("tf.data")
def test_with_example_ids_for_arrays_tuples_and_datasets(data):
    import tensorflow as tf

    x = with_example_ids(data["train"])
    np.testing.assert_array_equal(x["example_ids"], np.arange(len(data["y"])))
    assert x["example_ids"].dtype == np.int64 and "example_ids" not in data["train"]
    xt, yt = with_example_ids((data["train"], data["y"]), start=10)
    assert xt["example_ids"][0] == 10 and yt is data["y"]
    ds = with_example_ids(tf.data.Dataset.from_tensor_slices((data["train"], data["y"])))
    ids = [int(e[0]["example_ids"]) for e in ds.take(3)]
    assert ids == [0, 1, 2]
    with pytest.raises(ValueError, match="before .shuffle"):
        with_example_ids(tf.data.Dataset.from_tensor_slices((data["train"], data["y"])).batch(8))
    with pytest.raises(ValueError, match="already"):
        with_example_ids(x)


def _three_party():
    model = VerticalModel({"party_a": bottom(8, 4, "a"), "party_c": bottom(7, 4, "c"),
                           "party_b": bottom(15, 4, "b")}, top(12), leader="party_b",
                          embedding_dp=kf.EmbeddingDPLayer(2.0, seed=1))
    return compile_model(model)


def _x(data, n=64):
    xa = data["train"]["party_a"][:n]
    return {"party_a": xa[:, :8], "party_c": xa[:, 8:], "party_b": data["train"]["party_b"][:n]}


def test_the_recorder_keeps_the_chosen_epochs_steps_and_parties_of_its_latest_fit(data):
    model, x, y = _three_party(), _x(data), data["y"][:64]
    recorder = MessageRecorder(epochs=(1, 2), max_steps=1, parties="party_c")
    model.fit(x, y, epochs=3, batch_size=16, shuffle=False, verbose=0, callbacks=[recorder])
    assert recorder.recorded_epochs == [1, 2] and len(recorder.steps()) == 2
    assert [s.epoch for s in recorder.steps()] == [1, 2] and recorder.steps(2)[0].step == 0
    assert recorder.embeddings("party_c").shape == (32, 4)
    assert recorder.bytes_up() == recorder.bytes_up("party_c") == 2 * 16 * 1  # 4 bits: 1 byte
    assert recorder.bytes_down("party_c") == 2 * 16 * 4 * 4
    np.testing.assert_array_equal(recorder.labels(1), y[:16])
    with pytest.raises(ValueError, match=r"no messages of party 'party_a'.*\['party_c'\]"):
        recorder.cut_gradients("party_a")
    with pytest.raises(ValueError, match=r"epoch 0 was not recorded; recorded epochs: \[1, 2\]"):
        recorder.steps(0)
    with pytest.raises(ValueError, match="no 'example_ids'"):
        recorder.example_ids()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[recorder])
    with pytest.raises(ValueError, match=r"nothing recorded yet.*recording epochs \[1, 2\]"):
        recorder.steps()  # cleared at the start of every fit: epoch 0 only, not recorded


def test_a_recorder_for_an_unknown_party_fails_at_the_start_of_fit(data):
    with pytest.raises(ValueError, match=r"\['party_z'\] are not followers.*party_a"):
        _three_party().fit(_x(data), data["y"][:64], epochs=1, verbose=0,
                           callbacks=[MessageRecorder(parties=["party_z"])])


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(max_steps=0), ValueError, "`max_steps` must be None or an integer >= 1; got 0"),
    (dict(max_steps=True), ValueError, "`max_steps`"),
    (dict(parties=[1]), TypeError, "`parties` must be None or party names"),
    (dict(epochs=(-1,)), ValueError, "`epochs`"),
])
def test_recorder_arguments_are_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        MessageRecorder(**kwargs)


def test_a_message_callback_observes_only_a_vertical_model():
    with pytest.raises(TypeError, match="observes the messages of a.*VerticalModel; it was "
                                        "given a Sequential"):
        MessageCallback().set_model(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]))
