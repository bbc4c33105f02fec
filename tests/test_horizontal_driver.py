"""HorizontalFL (keras_fedpriv/federated/horizontal/driver.py): FedAvg, SignDS, Gaussian and MagRR rounds,
callbacks, BatchNormalization."""

import warnings

import keras
import numpy as np
import pytest

from keras_fedpriv.callbacks import MagRR
from keras_fedpriv.federated import (
    GaussianUpload,
    HorizontalFL,
    SignDSUpload,
    partition,
    )
from keras_fedpriv.optimizers import SignDSEncoder
from digits_stubs import digits, digits_model

pytestmark = [pytest.mark.jax]


# -------------------------------------------------------------- HorizontalFL
def test_fedavg_round_is_the_size_weighted_mean_of_independent_client_updates():
    """One FedAvg round == weighted mean of what model.fit would do on each client."""
    x, y = digits()
    clients = [(x[:40], y[:40]), (x[40:100], y[40:100])]
    model = digits_model()
    start = [w.copy() for w in model.get_weights()]
    fl = HorizontalFL(model, clients, upload="fedavg", batch_size=128, seed=0)
    fl.fit(rounds=1, clients_per_round=2, local_epochs=3, verbose=0)
    got = model.get_weights()

    deltas = []
    for cx, cy in clients:
        ref = digits_model()
        ref.set_weights(start)
        ref.fit(cx, cy, epochs=3, batch_size=128, verbose=0, shuffle=False)
        deltas.append([a - b for a, b in zip(ref.get_weights(), start)])
    want = [s + (40 * d0 + 60 * d1) / 100 for s, d0, d1 in zip(start, *deltas)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=2e-6)
    assert not np.allclose(got[0], start[0])


def test_fedavg_learns_digits_and_logs_a_keras_history():
    x, y = digits()
    clients = partition(x[:1400], y[:1400], 20, seed=0)
    fl = HorizontalFL(digits_model(lr=0.3), clients, seed=0)
    hist = fl.fit(rounds=8, clients_per_round=5, local_epochs=5,
                  validation_data=(x[1400:], y[1400:]), verbose=0)
    h = hist.history
    assert len(h["val_accuracy"]) == 8
    assert h["val_accuracy"][-1] > 0.85
    assert h["val_accuracy"][-1] > h["val_accuracy"][0]
    assert h["upload_bytes_per_client"][0] == 4 * (64 * 16 + 16 + 16 * 10 + 10)
    assert h["upload_bytes"][0] == 5 * h["upload_bytes_per_client"][0]
    assert fl.participation.sum() == 8 * 5
    assert h["replies"] == [5.0] * 8 and h["dropped"] == [0.0] * 8
    assert {len(v) for v in h.values()} == {8}  # one entry per round for every key


def test_client_data_already_float32_is_not_copied():
    x, y = digits()
    x32, x64 = x[:40].astype(np.float32), x[40:80].astype(np.float64)
    y32 = y[:40].astype(np.float32)
    fl = HorizontalFL(digits_model(), [(x32, y[:40]), (x64, y[40:80]), (x32, y32)])
    assert np.shares_memory(fl.clients[0][0], x32)
    assert np.shares_memory(fl.clients[2][1], y32)
    assert fl.clients[1][0].dtype == np.float32 and not np.shares_memory(fl.clients[1][0], x64)


def test_signds_round_moves_only_the_uploaded_coordinates_by_the_server_step():
    x, y = digits()
    clients = partition(x[:600], y[:600], 10, seed=0)
    model = digits_model()
    start = np.concatenate([w.ravel() for w in model.get_weights()])
    messages = []

    class Spy(SignDSUpload):
        def client_message(self, delta, num_examples):
            up = super().client_message(delta, num_examples)
            messages.append(up.message)
            return up

    upload = Spy(SignDSEncoder(k=0.2, eps=10.0, seed=1), global_lr=0.3)
    hist = HorizontalFL(model, clients, upload=upload, seed=0).fit(
        rounds=1, clients_per_round=4, verbose=0)
    step = np.concatenate([w.ravel() for w in model.get_weights()]) - start
    want = np.zeros_like(step)
    for m in messages:
        want[m.indices] += m.sign * 0.3 / 4
    np.testing.assert_allclose(step, want, atol=1e-6)
    assert len(messages) == 4
    assert hist.history["upload_bytes_per_client"][0] == np.mean([m.nbytes for m in messages])
    assert hist.history["upload_bytes_per_client"][0] < 0.02 * 4 * start.size


def test_magrr_sets_the_server_step_and_logs_its_state():
    x, y = digits()
    clients = partition(x[:600], y[:600], 10, seed=0)
    magrr = MagRR(seed=0)
    hist = HorizontalFL(digits_model(), clients, upload=SignDSEncoder(k=0.2, eps=10.0, seed=0),
                        seed=0).fit(rounds=4, clients_per_round=5, callbacks=[magrr], verbose=0)
    h = hist.history
    for key in ("r_est", "global_lr", "magrr_phase", "magrr_debiased_ones"):
        assert len(h[key]) == 4
    assert "lr_global" not in h  # one name for the server step
    assert h["global_lr"][-1] == magrr.last_lr_global
    np.testing.assert_allclose(h["global_lr"], [2 * r * 5 for r in h["r_est"]], rtol=1e-6)
    # growth phase from r_init=1e-5: real updates are far larger, so r_est grows
    assert h["r_est"][-1] > 1e-5


def test_magrrs_reports_are_one_vectorized_call_per_round_with_the_rounds_clients():
    """In one process the round's clients report in one `client_reports` call, each from its
    own stream (the bits and the ledger are those of one call per client)."""
    x, y = digits()
    clients = partition(x[:300], y[:300], 6, seed=0)
    calls, alone = [], MagRR(eps_rr=1.0, seed=4)
    magrr = MagRR(eps_rr=1.0, seed=4)
    real = magrr.client_reports

    def spy(magnitudes, client_ids=None, cut=None):
        reports = real(magnitudes, client_ids, cut=cut)
        calls.append(list(client_ids))
        for m, c, bit in zip(magnitudes, client_ids, reports):  # the same bit, one at a time
            assert alone.client_reports([m], [c], cut=cut)[0] == bit
        return reports

    magrr.client_reports = spy
    fl = HorizontalFL(digits_model(), clients, upload=SignDSEncoder(k=0.2, eps=10.0, seed=0),
                      seed=0)
    fl.fit(rounds=3, clients_per_round=4, callbacks=[magrr], verbose=0)
    assert len(calls) == 3 and all(len(ids) == 4 and ids == sorted(ids) for ids in calls)
    ledger = magrr.privacy_ledger()
    kind, = ledger.kinds
    assert ledger.total(kind) == max(fl.participation) and ledger.units_seen(kind) == \
        np.count_nonzero(fl.participation)
    assert fl.participation.sum() == 12


def test_gaussian_upload_adds_noise_of_the_configured_scale():
    x, y = digits()
    clients = [(x[:50], y[:50])] * 4
    model = digits_model(lr=1e-9)  # local update ~0: the aggregate is the mean of 4 noise vectors
    start = np.concatenate([w.ravel() for w in model.get_weights()])
    HorizontalFL(model, clients, upload=GaussianUpload(clip_norm=0.5, noise_multiplier=2.0, seed=0),
                 seed=0).fit(rounds=1, clients_per_round=4, verbose=0)
    step = np.concatenate([w.ravel() for w in model.get_weights()]) - start
    want_std = 0.5 * 2.0 / np.sqrt(4)
    n = step.size
    assert abs(step.std() / want_std - 1) < 5 * np.sqrt(1 / (2 * n)) + 0.01


def test_callbacks_can_stop_training():
    x, y = digits()
    clients = partition(x[:300], y[:300], 5, seed=0)

    class StopAfterTwo(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                self.model.stop_training = True

    hist = HorizontalFL(digits_model(), clients, seed=0).fit(
        rounds=10, clients_per_round=2, callbacks=[StopAfterTwo()], verbose=0)
    assert len(hist.history["upload_bytes"]) == 2


def test_bad_arguments_raise_clear_errors():
    x, y = digits()
    clients = partition(x[:100], y[:100], 5, seed=0)
    raw = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    with pytest.raises(ValueError, match="compiled"):
        HorizontalFL(raw, clients)
    with pytest.raises(ValueError, match="upload"):
        HorizontalFL(digits_model(), clients, upload="adam")
    with pytest.raises(ValueError, match="clients"):
        HorizontalFL(digits_model(), [])
    fl = HorizontalFL(digits_model(), clients)
    with pytest.raises(ValueError, match="clients_per_round"):
        fl.fit(rounds=1, clients_per_round=6, verbose=0)
    with pytest.raises(ValueError, match="MagRR"):
        fl.fit(rounds=1, clients_per_round=2, callbacks=[MagRR()], verbose=0)
    with pytest.raises((TypeError, ValueError), match="rounds"):
        fl.fit(rounds=0, verbose=0)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss")
    with pytest.raises(ValueError, match=r"lists the same EarlyStopping twice \(positions \[0, 2\]"):
        fl.fit(rounds=1, clients_per_round=2, callbacks=[stop, MagRR(), stop], verbose=0)
    assert fl.privacy_ledger().kinds == []  # refused before any client was asked


def test_client_optimizer_state_is_reset_for_every_client():
    """Adam's moments and step count restart per client: same start, same data -> same update."""
    x, y = digits()
    clients = [(x[:64], y[:64]), (x[64:128], y[64:128])]
    model = digits_model(optimizer=keras.optimizers.Adam(0.01))
    fl = HorizontalFL(model, clients, batch_size=128, seed=0)  # full batch: order-free
    start = [v.numpy() for v in model.trainable_variables]
    first, _ = fl.train_client(0, start, local_epochs=3)
    fl.train_client(1, start, local_epochs=3)                 # moves Adam's state
    again, _ = fl.train_client(0, start, local_epochs=3)
    np.testing.assert_allclose(first, again, atol=1e-7)
    assert int(model.optimizer.iterations.numpy()) == 3
    assert np.abs(first).max() > 1e-3


def test_keras_early_stopping_and_checkpoint_work_per_round(tmp_path):
    x, y = digits()
    clients = partition(x[:300], y[:300], 5, seed=0)
    path = str(tmp_path / "best.keras")
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0)
    ckpt = keras.callbacks.ModelCheckpoint(path, monitor="val_accuracy", save_best_only=True)
    model = digits_model()
    hist = HorizontalFL(model, clients, seed=0).fit(
        rounds=10, clients_per_round=2, validation_data=(x[300:400], y[300:400]),
        callbacks=[stop, ckpt], verbose=0)
    # min_delta=10 makes every round "no improvement": stops after patience + 1 rounds
    assert len(hist.history["val_loss"]) == 2
    back = keras.models.load_model(path)
    acc = back.evaluate(x[300:400], y[300:400], verbose=0, return_dict=True)["accuracy"]
    assert acc == pytest.approx(max(hist.history["val_accuracy"]), abs=1e-6)


# ------------------------------------------------------- BatchNormalization
def _bn_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16),
                              keras.layers.BatchNormalization(momentum=0.5),
                              keras.layers.ReLU(), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _bn_stats(model):
    bn = model.layers[1]
    return [bn.moving_mean.numpy(), bn.moving_variance.numpy()]


def test_batch_norm_average_sets_the_size_weighted_mean_of_client_statistics():
    x, y = digits()
    clients = [(x[:40], y[:40]), (x[40:100] * 2.0, y[40:100])]
    model = _bn_model()
    start = [w.copy() for w in model.get_weights()]
    fl = HorizontalFL(model, clients, batch_size=128, seed=0, batch_norm="average")
    fl.fit(rounds=1, clients_per_round=2, local_epochs=3, verbose=0)

    refs = []
    for cx, cy in clients:
        ref = _bn_model()
        ref.set_weights(start)
        ref.fit(cx, cy, epochs=3, batch_size=128, verbose=0, shuffle=False)
        refs.append(_bn_stats(ref))
    want = [(40 * a + 60 * b) / 100 for a, b in zip(*refs)]
    for got, w, init in zip(_bn_stats(model), want, _bn_stats(_bn_model())):
        # two execution paths (on a GPU, float32 matrix products round differently in each);
        # weights 50/50 instead of 40/60 would be off by several percent
        np.testing.assert_allclose(got, w, rtol=1e-3, atol=1e-4)
        assert not np.allclose(got, init)
    # the statistics reach the server in the clear: recorded, not private, for both clients
    kind, = [k for k in fl.privacy_ledger().kinds if "BatchNormalization" in k.mechanism]
    assert fl.privacy_ledger().units_seen(kind) == 2


def test_batch_norm_local_keeps_client_statistics_and_the_global_models_own():
    x, y = digits()
    clients = [(x[:50], y[:50]), (x[50:100] * 3.0, y[50:100])]
    model = _bn_model()
    fl = HorizontalFL(model, clients, batch_size=128, seed=0, batch_norm="local")
    init = _bn_stats(model)
    start = [v.numpy() for v in model.trainable_variables]
    # one full-batch step per call from the same weights: the batch statistics repeat
    fl.train_client(0, start)
    first = _bn_stats(model)
    fl.train_client(1, start)
    fl.train_client(0, start)
    second = _bn_stats(model)
    for i, f, s in zip(init, first, second):
        batch = (f - 0.5 * i) / 0.5              # momentum 0.5: f = 0.5 init + 0.5 batch
        np.testing.assert_allclose(s, 0.5 * f + 0.5 * batch, rtol=1e-4, atol=1e-5)

    model.layers[1].moving_mean.assign(init[0])   # the global model's own statistics
    model.layers[1].moving_variance.assign(init[1])
    before = model.get_weights()
    fl.fit(rounds=2, clients_per_round=2, verbose=0)
    for got, i in zip(_bn_stats(model), init):
        np.testing.assert_array_equal(got, i)
    assert not np.allclose(model.get_weights()[0], before[0])   # the weights were federated


def test_batch_norm_argument_warns_when_unset_and_rejects_unknown_values():
    x, y = digits()
    clients = partition(x[:100], y[:100], 2, seed=0)
    with pytest.warns(UserWarning, match="batch_norm"):
        fl = HorizontalFL(_bn_model(), clients)
    assert fl.batch_norm == "average"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HorizontalFL(_bn_model(), clients, batch_norm="local")
        HorizontalFL(digits_model(), clients)                  # no BatchNormalization: no warning
    with pytest.raises(ValueError, match="batch_norm.*'fedbn'"):
        HorizontalFL(_bn_model(), clients, batch_norm="fedbn")


def test_the_progress_bar_shows_each_rounds_own_values(capsys):
    x, y = digits()
    clients = partition(x[:300], y[:300], 5, seed=0)
    hist = HorizontalFL(digits_model(), clients, seed=0).fit(
        rounds=3, clients_per_round=2, validation_data=(x[300:400], y[300:400]), verbose=1)
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    for key in ("val_accuracy", "val_loss"):
        values = hist.history[key]
        assert f"{key}: {values[-1]:.4f}" in last, (key, values, last)
        assert np.mean(values) != pytest.approx(values[-1], abs=1e-4)  # an average would differ
    assert "round_time_s" in last


def test_the_progress_bar_shows_magrrs_estimate_and_the_server_step(capsys):
    x, y = digits()
    clients = partition(x[:300], y[:300], 5, seed=0)
    hist = HorizontalFL(digits_model(), clients, upload=SignDSEncoder(k=0.2, eps=10.0, seed=0),
                        seed=0).fit(rounds=2, clients_per_round=3, callbacks=[MagRR(seed=0)],
                                    verbose=1)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    for key in ("r_est", "global_lr", "magrr_phase"):
        value = hist.history[key][-1]
        shown = f"{value:.4f}" if abs(value) > 1e-3 else f"{value:.4e}"  # keras' Progbar format
        assert f"{key}: {shown}" in last, (key, value, last)
    assert "lr_global" not in last
