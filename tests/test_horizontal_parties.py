"""The party halves of horizontal FL, and the per-client noise streams that let them run apart."""

import json

import keras
import numpy as np
import pytest

from keras_fedpriv.callbacks import MagRR
from keras_fedpriv.federated.horizontal.parties import HorizontalServer, LocalTrainer, shuffle_order
from keras_fedpriv.federated.uploads import GaussianUpload, MalformedUpload
from keras_fedpriv.mechanisms.random import secret_generator
from keras_fedpriv.optimizers import SignDSEncoder
from keras_fedpriv.optimizers.signds import flatten_update
from digits_stubs import digits
from tests.test_backend import _Flip

pytestmark = [pytest.mark.jax]

DELTA = np.random.default_rng(0).normal(size=400).astype(np.float32)


def test_a_clients_signds_messages_do_not_depend_on_who_else_the_encoder_served():
    shared = SignDSEncoder(k=0.2, eps=10.0, seed=9)
    alone = SignDSEncoder(k=0.2, eps=10.0, seed=9)
    got = []
    for rnd in range(3):
        for client in (0, 1, 2):  # one object serving three clients
            m = shared.encode(DELTA * (rnd + 1), client_id=client)
            if client == 1:
                got.append(m)
    # client 1 alone, on its own machine, with the same seed: the same three messages
    want = [alone.encode(DELTA * (rnd + 1), client_id=1) for rnd in range(3)]
    assert got == want
    # and a different client draws from a different stream
    other = SignDSEncoder(k=0.2, eps=10.0, seed=9)
    assert other.encode(DELTA, client_id=2) != want[0]


def test_per_client_streams_continue_after_a_state_round_trip_and_never_replay():
    enc = SignDSEncoder(k=0.2, eps=10.0, seed=4)
    first = [enc.encode(DELTA, client_id=7) for _ in range(2)]
    state = json.loads(json.dumps(enc.state_dict()))
    assert state["releases_by_unit"] == {"7": 2}
    restored = SignDSEncoder.from_config(enc.get_config())
    restored.load_state_dict(state)
    nxt = restored.encode(DELTA, client_id=7)
    assert nxt == enc.encode(DELTA, client_id=7)  # the original's next release
    assert nxt not in first
    with pytest.raises(ValueError, match="releases_by_unit"):
        restored.load_state_dict({**state, "releases_by_unit": {"seven": 1}})


def test_unit_streams_are_distinct_from_the_objects_own_stream():
    a = secret_generator(5, stream=0).integers(0, 2**63, size=4)
    b = secret_generator(5, stream=0, unit=0).integers(0, 2**63, size=4)
    c = secret_generator(5, stream=0, unit=1).integers(0, 2**63, size=4)
    assert len({tuple(a), tuple(b), tuple(c)}) == 3


def test_gaussian_and_magrr_draw_a_clients_noise_from_its_own_stream():
    shared, alone = GaussianUpload(1.0, 1.0, seed=2), GaussianUpload(1.0, 1.0, seed=2)
    shared.client_message(DELTA, 10, client_id=0)
    np.testing.assert_array_equal(shared.client_message(DELTA, 10, client_id=3).message,
                                  alone.client_message(DELTA, 10, client_id=3).message)
    server, client = MagRR(eps_rr=1.0, seed=8), MagRR(eps_rr=1.0, seed=8)
    magnitudes = np.linspace(0, 2e-5, 40)
    both = server.client_reports(magnitudes, client_ids=np.arange(40))
    # each client computes its own bit with the announced cut
    own = [int(client.client_reports([m], [i], cut=server.cut)[0])
           for i, m in enumerate(magnitudes)]
    np.testing.assert_array_equal(both, own)
    with pytest.raises(ValueError, match="`cut`"):
        client.client_reports([1e-5], [0], cut=float("nan"))


def test_shuffle_order_is_keyed_by_seed_client_and_round():
    a = shuffle_order(1, 2, 3, 50, 2)
    assert a.dtype == np.int32 and a.shape == (100,)
    assert sorted(a[:50]) == list(range(50)) and sorted(a[50:]) == list(range(50))
    np.testing.assert_array_equal(a, shuffle_order(1, 2, 3, 50, 2))
    assert not np.array_equal(a, shuffle_order(1, 2, 4, 50, 2))
    assert not np.array_equal(a, shuffle_order(1, 3, 3, 50, 2))


def _bn_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    return model


def test_server_sampling_depends_on_the_set_of_ids_not_their_order():
    model = _bn_model()
    s1 = HorizontalServer(model, "fedavg", seed=3)
    s2 = HorizontalServer(model, "fedavg", seed=3)
    assert s1.sample([5, 1, 9, 4], 2) == s2.sample([9, 4, 1, 5], 2)
    with pytest.raises(ValueError, match="clients_per_round"):
        s1.sample([1, 2], 3)


def test_server_refuses_malformed_batch_norm_statistics():
    server = HorizontalServer(_bn_model(), "fedavg")
    good = [np.zeros(3, np.float32), np.ones(3, np.float32)]
    assert len(server.check_batch_norm(good)) == 2
    with pytest.raises(MalformedUpload, match="expected 2"):
        server.check_batch_norm(good[:1])
    with pytest.raises(MalformedUpload, match="shape"):
        server.check_batch_norm([np.zeros(4, np.float32), good[1]])
    with pytest.raises(MalformedUpload, match="variance"):
        server.check_batch_norm([good[0], -good[1]])
    with pytest.raises(MalformedUpload, match="finite"):
        server.check_batch_norm([np.full(3, np.nan, np.float32), good[1]])


# ------------------------------------------------------------------ LocalTrainer
def _regularized_model(dropout=0.0):
    """A seeded MLP with weight and activity regularizers, momentum and a scaled loss."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-2),
                           activity_regularizer=keras.regularizers.L2(1e-3)),
        keras.layers.Dropout(dropout),
        keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9, loss_scale_factor=8.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_local_training_makes_model_fits_steps_and_starts_every_call_afresh():
    """Short last batches, regularizer and add_loss terms, a scaled loss and momentum: the
    update is what model.fit makes over the same batches, and the optimizer's state is
    reset for every call (the same call twice gives the same update)."""
    x, y = digits()
    x, y = x[:40], y[:40]
    model = _regularized_model()
    start = [w.copy() for w in model.get_weights()]
    trainer = LocalTrainer(model, 16, (x.shape[1:], x.dtype), (y.shape[1:], y.dtype))
    order = np.tile(np.arange(40, dtype=np.int32), 2)  # two epochs in order, as shuffle=False
    first, loss, bn_end = trainer.train(start, x, y, order, [])
    assert np.isfinite(loss) and loss > 0 and bn_end == []
    trained = [np.array(w) for w in model.get_weights()]
    again, loss_again, _ = trainer.train(start, x, y, order, [])
    np.testing.assert_allclose(again, first, atol=1e-6)
    np.testing.assert_allclose(loss_again, loss, rtol=1e-5)

    ref = _regularized_model()
    ref.set_weights(start)
    ref.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
    want, _ = flatten_update([a - b for a, b in zip(ref.get_weights(), start)])
    np.testing.assert_allclose(first, want, atol=2e-5)
    for got, kept in zip(trained, ref.get_weights()):  # the model keeps the trained weights
        np.testing.assert_allclose(got, kept, atol=2e-5)


def test_local_training_carries_the_models_random_state_from_call_to_call():
    """Dropout draws new masks in every call: the generator's state advances, never replays."""
    x, y = digits()
    model = _regularized_model(dropout=0.5)
    start = [w.copy() for w in model.get_weights()]
    trainer = LocalTrainer(model, 16, (x.shape[1:], x.dtype), (y.shape[1:], y.dtype))
    order = np.arange(32, dtype=np.int32)
    first, _, _ = trainer.train(start, x[:32], y[:32], order, [])
    second, _, _ = trainer.train(start, x[:32], y[:32], order, [])
    assert not np.allclose(first, second)


def test_local_training_advances_a_layers_secret_stream_and_counts_every_step():
    """A protection layer inside the client's model: its counter moves once per step and its
    release counts grow, across calls (the stream is never rewound or replayed)."""
    x, y = digits()
    keras.utils.set_random_seed(1)
    flip = _Flip(name="flip")
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(8), flip,
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = [w.copy() for w in model.get_weights()]
    trainer = LocalTrainer(model, 16, (x.shape[1:], x.dtype), (y.shape[1:], y.dtype))
    order = np.arange(40, dtype=np.int32)  # batches of 16, 16 and 8
    first, _, _ = trainer.train(start, x[:40], y[:40], order, [])
    assert flip.noise_draws == 3 and flip.release_calls()["fresh_without_ids"] == 3
    second, _, _ = trainer.train(start, x[:40], y[:40], order, [])
    assert flip.noise_draws == 6 and flip.release_calls()["fresh_without_ids"] == 6
    assert not np.allclose(first, second)  # fresh signs, not the first call's again
    assert len(model.get_weights()) == len(start)  # the stream is no weight


def test_local_training_raises_what_a_protection_layer_flagged_in_the_compiled_step():
    """Non-finite features reach an EmbeddingDPLayer inside the client's model: on JAX the
    compiled step makes the output safe and counts the event, and `train` raises it on the
    host; on TensorFlow the layer's graph check stops the step, and `train` raises its short
    text instead of TensorFlow's graph error (which names no value either way)."""
    import keras_fedpriv as kf

    x, y = digits()
    x = x[:32].astype("float32").copy()
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(8),
                              kf.EmbeddingDPLayer(eps=2.0, seed=3), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    trainer = LocalTrainer(model, 16, (x.shape[1:], x.dtype), (y.shape[1:], y.dtype))
    start = [w.copy() for w in model.get_weights()]
    order = np.arange(32, dtype=np.int32)
    trainer.train(start, x, y[:32], order, [])  # finite: no error
    x[5, 3] = np.nan
    with pytest.raises(ValueError, match="finite|NaN or inf") as info:
        trainer.train(start, x, y[:32], order, [])
    assert "Traceback" not in str(info.value) and len(str(info.value).splitlines()) == 1
