"""Adversarial tests of the release ledger: the report counts what the run spent.

Each numbered test is a case of issue 11 ("a report that does not count what
happened", and the prior that reused its noise) that failed on the code
before the ledger. The ``test_by_hand_*`` tests run one configuration,
compose the eps by hand with dp-accounting from what the test knows happened,
and check that every way of asking the report gives that number.
"""

import math

import dp_accounting
import keras
import keras_tuner as kt
import numpy as np
import pytest
from sklearn.datasets import load_digits

import keras_fedpriv as kf
from keras_fedpriv.backend import impl
from keras_fedpriv.callbacks import LaplaceEvaluation, MagRR
from keras_fedpriv.federated import GaussianUpload, HorizontalFL, VerticalModel, partition
from keras_fedpriv.layers.local_state import load_local_state, local_state
from keras_fedpriv.mechanisms import randomized_response_dp_event
from keras_fedpriv.mechanisms.events import pure_dp_event
from keras_fedpriv.mechanisms.gaussian import gaussian_dp_event
from keras_fedpriv.mechanisms.quantize import quantize_rr_dp_event
from keras_fedpriv.optimizers import SignDS, SignDSEncoder, SignDSRounds
from keras_fedpriv.privacy import (
    EpsilonLogger,
    plan_epsilon,
    plan_noise_multiplier,
    privacy_ledger,
    privacy_report,
)
from keras_fedpriv.tuning import search_epsilon, trial_epsilon
from ledger_cases import DELTA, REL, by_hand, vertical_model

pytestmark = [pytest.mark.jax]


# ------------------------------------------------------------------ by hand
def _close(a, b):
    assert a == pytest.approx(b, rel=2e-3, abs=2e-3)


def _digits(n=300):
    x, y = load_digits(return_X_y=True)
    return (x[:n] / 16).astype("float32"), y[:n].astype("int64")


def _mlp(optimizer=None):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile(optimizer or keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


# ---------------------------------------------------------- numbered cases
def test_case3_a_prior_that_changes_is_fresh_noise_and_a_counted_release():
    """Case 3: LabelDPLayer(prior=...) keyed by id reused its coins when the prior changed
    (two outputs could rule labels out) while dp_event said one release. Now a call with a
    prior draws fresh noise and every call is a counted release."""
    eps = 2.0
    layer = kf.LabelDPLayer(eps=eps, mode="sparse", num_classes=3, seed=1)
    y = np.zeros(4000, "int32")
    ids = np.arange(4000)
    prior = np.full((4000, 3), 1 / 3, "float32")
    first = np.asarray(layer(y, example_ids=ids, prior=prior, training=True))
    second = np.asarray(layer(y, example_ids=ids, prior=prior * 1.0, training=True))
    # A uniform prior keeps all 3 classes (k* = 3): 3-ary RR. Independent coins give
    # different outputs with probability 1 - p_keep^2 - 2 p_other^2 (0.358); the same
    # coins never do.
    t = math.exp(-eps)
    keep, other = 1 / (1 + 2 * t), t / (1 + 2 * t)
    differ = 1 - keep ** 2 - 2 * other ** 2
    sd = math.sqrt(differ * (1 - differ) / 4000)
    assert abs(np.mean(first != second) - differ) < 5 * sd
    report = privacy_report(layer)
    assert report.rows()[0]["releases"] == 2
    event = layer.dp_event()
    _close(report.epsilon, by_hand([(event, 2)]))


def test_case10_horizontal_history_holds_no_client_loss():
    """Case 10: HorizontalFL logged the mean of the clients' exact local losses (with one
    client per round: that client's own loss, never released by the protocol)."""
    x, y = _digits(100)
    fl = HorizontalFL(_mlp(), partition(x, y, 4, seed=0), seed=0)
    history = fl.fit(rounds=2, clients_per_round=1, validation_data=(x, y), verbose=0)
    assert "loss" not in history.history and "sim_client_loss" not in history.history
    assert "val_loss" in history.history  # the server's own evaluation
    fl2 = HorizontalFL(_mlp(), partition(x, y, 4, seed=0), seed=0, log_client_loss=True)
    h2 = fl2.fit(rounds=1, clients_per_round=1, verbose=0)
    assert "sim_client_loss" in h2.history and "loss" not in h2.history


def test_case12_signds_optimizer_wrapper_is_counted_everywhere():
    """Case 12: a model trained with the SignDS wrapper (5 uploads at eps=10) reported eps 0
    on the model and its History, and EpsilonLogger too; on the optimizer it raised."""
    x, y = _digits()
    model = _mlp(SignDS(keras.optimizers.SGD(0.1), SignDSEncoder(k=0.2, eps=10.0, seed=0)))
    logger = EpsilonLogger(delta=DELTA)
    history = model.fit(x, y, epochs=5, batch_size=64, verbose=0,
                        callbacks=[SignDSRounds(epochs_per_round=1), logger])
    assert len(model.optimizer.messages) == 5
    expected = by_hand([(pure_dp_event(10.0), 5)])
    for obj in (model, history, model.optimizer, model.optimizer.encoder, [model, history]):
        _close(privacy_report(obj, delta=DELTA).epsilon, expected)
    _close(history.history["epsilon"][-1], expected)
    assert history.history["epsilon"][0] < history.history["epsilon"][-1]


def test_case13_history_of_a_horizontal_run_reports_the_run():
    """Case 13: privacy_report(history) of a HorizontalFL run said 0.0 while the run said 50."""
    x, y = _digits()
    fl = HorizontalFL(_mlp(), partition(x, y, 6, seed=0),
                      upload=SignDSEncoder(k=0.2, eps=5.0, seed=0), seed=0)
    history = fl.fit(rounds=5, clients_per_round=2, verbose=0)
    busiest = int(fl.participation.max())
    expected = by_hand([(pure_dp_event(5.0), busiest)])
    for obj in (fl, history, fl.model, fl.upload):
        _close(privacy_report(obj).epsilon, expected)
    assert privacy_report(history).rows()[0]["releases"] == busiest


@pytest.mark.tensorflow_only("slow on JAX (30 s on the shared CPU); nothing in it is JAX-specific")
def test_case14_second_fit_shared_layer_inference_and_unprotected_inference():
    """Case 14: a second fit was not added; a layer applied to two embeddings per pass was
    counted once; inference passes needed extra_releases; at_inference=False inference
    (no DP) was counted as an eps-DP release."""
    model, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=2.0, seed=0),
                            label_dp=kf.LabelDPLayer(eps=1.0, seed=0))
    model.fit(x, y, epochs=2, batch_size=64, verbose=0)
    model.fit(x, y, epochs=3, batch_size=64, verbose=0)
    model.predict(x, verbose=0)
    rows = {r["mechanism"].split()[0]: r for r in privacy_report(model).rows()}
    assert rows["EmbeddingDPLayer"]["releases"] == 2 + 3 + 1
    assert rows["LabelDPLayer"]["releases"] == 1

    shared = kf.EmbeddingDPLayer(eps=2.0, seed=0)
    a, b = keras.Input((4,)), keras.Input((4,))
    out = keras.layers.Concatenate()([shared(keras.layers.Dense(3)(a)),
                                      shared(keras.layers.Dense(3)(b))])
    two = keras.Model([a, b], keras.layers.Dense(1)(out))
    two.compile("adam", "mse")
    xs = np.zeros((32, 4), "float32")
    two.fit([xs, xs], np.zeros(32), epochs=1, batch_size=32, verbose=0)
    (row,) = privacy_report(two).rows()
    assert row["releases"] == 2  # one call per embedding, per example

    quiet, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=2.0, at_inference=False),
                            label_dp=kf.LabelDPLayer(eps=1.0, seed=0))
    quiet.fit(x, y, epochs=1, batch_size=64, verbose=0)
    assert math.isfinite(privacy_report(quiet).epsilon)
    quiet.evaluate(x, y, verbose=0)
    assert math.isinf(privacy_report(quiet).epsilon)


def test_case15_laplace_evaluation_counts_the_clients_it_evaluated():
    """Case 15: LaplaceEvaluation counted one release per round for every client, while the
    busiest client took part in fewer rounds. Then (issue 20) it counted one release per
    evaluation about the client, while each evaluation releases every row of the client's data:
    n rows are n releases about the client."""
    x, y = _digits()
    clients = partition(x, y, 10, seed=0)
    fl = HorizontalFL(_mlp(), clients, seed=0)
    cb = LaplaceEvaluation(eps=10.0, seed=0, from_logits=True)
    fl.fit(rounds=6, clients_per_round=2, callbacks=[cb], verbose=0)
    busiest = int(fl.participation.max())
    assert busiest < 6
    rows = {r["mechanism"].split()[0]: r for r in privacy_report(fl).rows()}
    most = max(int(n) * len(c[0]) for n, c in zip(fl.participation, clients))
    assert most > busiest
    assert rows["LaplaceEvaluation"]["releases"] == most


def test_case16_a_trial_spent_its_last_epoch_not_its_best():
    """Case 16: keras-tuner records a trial's best epoch; the eps it spent is its last.

    Since issue 18 (case 7) a trial's logged metrics are not trusted at all (they are also
    averaged over executions): only a search recorded by `track_search` has a figure
    (tests/test_adversarial_tuning.py)."""
    trial = kt.engine.trial.Trial(kt.HyperParameters())
    trial.metrics.register("epsilon", direction="min")
    for step, eps in enumerate([4.0, 9.0, 16.9, 19.0]):
        trial.metrics.update("epsilon", eps, step=step)
    assert trial.metrics.get_best_value("epsilon") == 4.0  # what the tuner would keep
    with pytest.raises(ValueError, match="track_search"):
        trial_epsilon(trial)
    with pytest.raises(ValueError, match="track_search"):
        search_epsilon([trial, trial])


def test_case17_rdp_is_dp_accountings_rdp_accountant():
    """Case 17: accountant='rdp' turned pure eps into zCDP: 4.7 for one binary RR at eps=1
    where dp-accounting's RDP accountant gives 1.003."""
    layer = kf.LabelDPLayer(eps=1.0, seed=0)
    layer(np.array([0.0, 1.0]), example_ids=np.arange(2), training=True)
    eps = privacy_report(layer, accountant="rdp").epsilon
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=REL)
    acc.compose(layer.dp_event())
    assert eps == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
    assert eps < 1.1


# ------------------------------------------------------------------ by hand
def test_by_hand_label_dp_once_per_batch_and_prior():
    once = kf.LabelDPLayer(eps=1.0, seed=0)
    y = np.array([0.0, 1.0, 1.0, 0.0])
    for _ in range(3):
        once(y, example_ids=np.arange(4), training=True)
    _close(privacy_report(once).epsilon, by_hand([(randomized_response_dp_event(1.0, 2), 1)]))

    per_batch = kf.LabelDPLayer(eps=1.0, per_batch=True, seed=0)
    for _ in range(3):
        per_batch(y, training=True)
    _close(privacy_report(per_batch).epsilon,
           by_hand([(randomized_response_dp_event(1.0, 2), 3)]))

    prior = kf.LabelDPLayer(eps=2.0, mode="sparse", num_classes=4, seed=0)
    p = np.tile([[0.4, 0.3, 0.2, 0.1]], (4, 1)).astype("float32")
    prior(np.array([0, 1, 2, 3]), example_ids=np.arange(4), prior=p, training=True)
    prior(np.array([0, 1]), example_ids=np.arange(2), prior=p[:2], training=True)
    _close(privacy_report(prior).epsilon, by_hand([(prior.dp_event(), 2)]))  # ids 0, 1


def test_by_hand_embedding_dp_training_inference_and_vertical_model():
    model, x, y = vertical_model(label_dp=kf.LabelDPLayer(eps=1.0, seed=0),
                            embedding_dp=kf.EmbeddingDPLayer(eps=2.0, seed=0))
    logger = EpsilonLogger()
    history = model.fit(x, y, epochs=3, batch_size=64, verbose=0, callbacks=[logger])
    model.evaluate(x, y, verbose=0)  # the embeddings are sent at inference too
    expected = by_hand([(quantize_rr_dp_event(2.0, 8), 4),
                        (randomized_response_dp_event(1.0, 2), 1)])
    _close(privacy_report(model).epsilon, expected)
    _close(privacy_report(history).epsilon, expected)
    _close(privacy_report([history, model]).epsilon, expected)
    # per secret: the labels alone, the follower's features alone
    _close(privacy_report(model, protects="labels").epsilon,
           by_hand([(randomized_response_dp_event(1.0, 2), 1)]))
    _close(privacy_report(model.protections["party_a"]).epsilon,
           by_hand([(quantize_rr_dp_event(2.0, 8), 4)]))
    # the logger saw the training epochs only (its last figure: 3 passes)
    _close(history.history["epsilon"][-1], by_hand([(quantize_rr_dp_event(2.0, 8), 3),
                                                    (randomized_response_dp_event(1.0, 2), 1)]))


def test_by_hand_vertical_model_without_protection_is_not_private():
    model, x, y = vertical_model()
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    report = privacy_report(model)
    assert math.isinf(report.epsilon)
    assert {r["protects"] for r in report.rows()} == {"labels", "features"}


def test_by_hand_embedding_ids_count_each_example():
    layer = kf.EmbeddingDPLayer(eps=2.0, seed=0)
    z = np.ones((4, 3), "float32")
    layer(z, training=True, example_ids=np.array([0, 1, 2, 3]))
    layer(z[:2], training=True, example_ids=np.array([0, 1]))
    layer(z[:2], training=True, example_ids=np.array([0, 5]))
    (row,) = privacy_report(layer).rows()
    assert row["releases"] == 3  # example 0
    _close(privacy_report(layer).epsilon, by_hand([(quantize_rr_dp_event(2.0, 3), 3)]))


@pytest.mark.tensorflow_only("slow on JAX (32 s on the shared CPU); nothing in it is JAX-specific")
def test_by_hand_horizontal_signds_magrr_laplace_evaluation():
    x, y = _digits()
    magrr = MagRR(eps_rr=2.0, seed=0)
    evaluation = LaplaceEvaluation(eps=4.0, seed=0, from_logits=True)
    logger = EpsilonLogger()
    clients = partition(x, y, 8, seed=0)
    fl = HorizontalFL(_mlp(), clients, upload=SignDSEncoder(k=0.2, eps=5.0, seed=0), seed=0)
    history = fl.fit(rounds=5, clients_per_round=3, verbose=0,
                     callbacks=[magrr, evaluation, logger])
    # each client: SignDS + MagRR + its evaluation (one release per row of its data), once
    # per round it took part; the worst client is the report's
    busiest = int(fl.participation.max())
    # (clients with the same participation and number of rows have the same eps: each
    # such pair is composed once)
    expected = max(by_hand([(pure_dp_event(5.0), n),
                            (randomized_response_dp_event(2.0, 2), n),
                            (evaluation.dp_event(), n * rows)])
                   for n, rows in {(int(n), len(c[0]))
                                   for n, c in zip(fl.participation, clients) if n})
    report = privacy_report(fl)
    assert sorted(r["releases"] for r in report.rows()) == [
        busiest, busiest, max(int(n) * len(c[0]) for n, c in zip(fl.participation, clients))]
    for obj in (fl, history, fl.model, [fl, magrr, evaluation]):
        _close(privacy_report(obj).epsilon, expected)
    _close(history.history["epsilon"][-1], expected)


def test_by_hand_gaussian_upload():
    x, y = _digits()
    fl = HorizontalFL(_mlp(), partition(x, y, 5, seed=0),
                      upload=GaussianUpload(clip_norm=1.0, noise_multiplier=3.0, seed=0), seed=0)
    history = fl.fit(rounds=4, clients_per_round=2, verbose=0)
    busiest = int(fl.participation.max())
    expected = by_hand([(gaussian_dp_event(3.0), busiest)])
    for obj in (fl, history, fl.upload):
        _close(privacy_report(obj).epsilon, expected)


def test_fedavg_is_not_private_and_ledgers_merge_once():
    x, y = _digits(100)
    fl = HorizontalFL(_mlp(), partition(x, y, 3, seed=0), seed=0)
    fl.fit(rounds=1, clients_per_round=2, verbose=0)
    assert math.isinf(privacy_report(fl).epsilon)
    # the same protection reached by several paths is merged once
    ledger = privacy_ledger([fl, fl.model, fl.model.history, fl.upload])
    (kind,) = ledger.kinds
    assert ledger.total(kind) == 1


@pytest.mark.tensorflow_only("slow on JAX (12 s on the shared CPU); nothing in it is JAX-specific")
def test_plan_then_run_meets_the_target():
    eps = plan_epsilon(6.0, DELTA, releases=3, mechanism="embedding_dp", num_coordinates=8)
    model, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=eps, seed=0),
                            label_dp=kf.LabelDPLayer(eps=1.0, seed=0))
    model.fit(x, y, epochs=3, batch_size=64, verbose=0)
    spent = privacy_report(model, protects="features").epsilon
    assert 5.9 <= spent <= 6.0 + 1e-9
    z = plan_noise_multiplier(4.0, DELTA, releases=10)
    assert by_hand([(gaussian_dp_event(z), 10)]) <= 4.0 + 1e-3
    assert by_hand([(gaussian_dp_event(z * 0.95), 10)]) > 4.0
    with pytest.raises(ValueError, match="cannot be met"):
        plan_epsilon(1e-9, DELTA, releases=1000)


def test_a_restored_host_protection_keeps_counting_what_the_original_released():
    """A run resumed from a checkpoint must not forget the releases before it: the host-side
    protections carry their ledger in state_dict (JSON-safe)."""
    import json

    magrr = MagRR(eps_rr=2.0, seed=0)
    for _ in range(3):
        magrr.round(np.full(4, 0.1), client_ids=[0, 1, 2, 3])
    enc = SignDSEncoder(k=0.2, eps=5.0, seed=0)
    for c in (0, 0, 1):
        enc.encode(np.linspace(-1, 1, 50), client_id=c)
    gauss = GaussianUpload(1.0, 2.0, seed=0)
    gauss.client_message(np.ones(5, "float32"), 3, client_id=7)
    copies = [MagRR.from_config(magrr.get_config()), SignDSEncoder.from_config(enc.get_config()),
              GaussianUpload(1.0, 2.0, seed=0)]
    for original, copy in zip((magrr, enc, gauss), copies):
        state = json.loads(json.dumps(original.state_dict()))
        copy.load_state_dict(state)
        _close(privacy_report(copy).epsilon, privacy_report(original).epsilon)
        assert privacy_report(copy).epsilon > 0


def test_labels_privatized_before_training_are_counted_through_their_layer():
    """privatize_labels + VerticalModel(label_dp=None): the model cannot know the labels were
    randomized, so by default it records the true labels as released (inf); with
    labels_privatized=True and the privatizing layer in the report, the figure is the layer's."""
    model, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=2.0, seed=0))
    privatizer = kf.LabelDPLayer(eps=1.0, seed=0)
    y_private = kf.privatize_labels(y, layer=privatizer)
    model.fit(x, y_private, epochs=1, batch_size=64, verbose=0)
    assert math.isinf(privacy_report(model, protects="labels").epsilon)

    trusted, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=2.0, seed=0))
    trusted = VerticalModel(trusted.bottoms, trusted.top, leader="party_b",
                            embedding_dp=kf.EmbeddingDPLayer(eps=2.0, seed=0),
                            labels_privatized=True)
    trusted.compile("adam", "binary_crossentropy")
    trusted.fit(x, y_private, epochs=2, batch_size=64, verbose=0)
    _close(privacy_report([trusted, privatizer], protects="labels").epsilon,
           by_hand([(randomized_response_dp_event(1.0, 2), 1)]))
    with pytest.raises(ValueError, match="labels_privatized"):
        VerticalModel(trusted.bottoms, trusted.top, leader="party_b", labels_privatized=True,
                      label_dp=kf.LabelDPLayer(eps=1.0))
    with pytest.raises(TypeError, match="eps"):
        kf.privatize_labels(y)


def test_example_ids_that_do_not_name_every_row_count_for_every_example():
    """EmbeddingDPLayer takes ids only for counting: ids of the wrong length (one id for a
    batch of 8) must not make the release count for that one example only."""
    layer = kf.EmbeddingDPLayer(eps=2.0, seed=0)
    layer(np.ones((8, 3), "float32"), training=True, example_ids=np.array([0]))
    layer(np.ones((2, 3), "float32"), training=True, example_ids=np.array([5, 6]))
    (row,) = privacy_report(layer).rows()
    assert row["releases"] == 2  # examples 5 and 6: the anonymous call + their own


# ------------------------------------------------------------------ example ids at scale
def _release(layer, ids, dtype="int64"):
    """One fresh release by ``layer`` about ``ids`` (one row each)."""
    ids = np.asarray(ids, dtype)
    if isinstance(layer, kf.LabelDPLayer):
        return layer(np.zeros(ids.size, "float32"), example_ids=ids, training=True)
    return layer(np.ones((ids.size, 3), "float32"), example_ids=ids, training=True)


def test_an_id_folded_by_one_layer_is_not_under_counted_beside_another_layer():
    """Example 13 is released 3 times by a layer counting ids below 8 (13 folds onto slot 5)
    and 3 times by one counting ids below 2**20: 6 releases of one example. Recorded per slot,
    the report saw unit 5 (3 releases) and unit 13 (3 releases) apart: never 6."""
    small = kf.EmbeddingDPLayer(eps=2.0, seed=0, id_capacity=8)
    large = kf.EmbeddingDPLayer(eps=2.0, seed=1)
    for _ in range(3):
        _release(small, [13, 1])
        _release(large, [13, 2])
    report = privacy_report([small, large])
    _close(report.epsilon, by_hand([(quantize_rr_dp_event(2.0, 3), 6)]))
    assert any("upper bounds" in row["note"] for row in report.rows())


_CAPACITY = 16
_OUTSIDE = {  # ids outside [0, 16), each call's ids distinct; some fold onto 0 .. 3
    "at and past the capacity": ([15, 16, 17, 31, 3], "int64"),
    "negative": ([-1, -16, -(2**40), 3, 0], "int64"),
    "past int32": ([2**31, 2**31 + 1, 2**31 - 1, 4, 2], "int64"),
    "past uint32": ([2**32, 2**32 + 16 + 3, 3, 2**63 - 1, 1], "int64"),
    "past int64 (uint64)": ([2**64 - 1, 2**63, 5, 0, 1], "uint64"),
}


@pytest.mark.parametrize("case", sorted(_OUTSIDE))
@pytest.mark.parametrize("make", [
    lambda: kf.EmbeddingDPLayer(eps=2.0, seed=0, id_capacity=_CAPACITY),
    lambda: kf.LabelDPLayer(eps=2.0, seed=0, per_batch=True, id_capacity=_CAPACITY),
    lambda: kf.VAEBottom(2, hidden_units=(), seed=0, id_capacity=_CAPACITY)],
    ids=["EmbeddingDPLayer", "LabelDPLayer", "VAEBottom"])
def test_ids_outside_the_capacity_only_ever_over_count(make, case):
    """Every id a caller may pass outside [0, id_capacity): each example's releases stay
    below what the report counts for it, and the report says it is a bound. On JAX, ids
    that int32 cannot hold are refused (they would wrap onto other ids unflagged)."""
    layer = make()
    ids, dtype = _OUTSIDE[case]
    info = np.iinfo(impl().EXAMPLE_ID_DTYPE)  # int64 (TensorFlow: uint64 reinterpreted), int32
    if info.bits == 32 and any(not info.min <= i <= info.max for i in ids):
        with pytest.raises(ValueError, match="example_ids"):
            _release(layer, ids, dtype)
        assert not any(layer.release_calls().values())
        return
    true = {}
    for batch in (ids, [0, 1, 2, 3], ids[::-1]):
        _release(layer, batch, dtype)
        for i in batch:
            true[i] = true.get(i, 0) + 1
    ledger = layer.privacy_ledger()
    (kind,) = ledger.kinds
    assert ledger.is_approximate(kind)
    _, profiles = ledger.unit_profiles(kind.unit)
    assert min(max(p) for p in profiles) >= max(true.values())  # every unit, every example
    assert max(r["releases"] for r in privacy_report(layer).rows()) >= max(true.values())


@pytest.mark.parametrize("path", ["load_own_variables", "load_local_state"])
def test_counts_restored_into_a_smaller_capacity_fold_and_never_under_count(path):
    """Counts saved by a layer counting ids below 1000, restored into one counting below 100
    (an old file or another party's state): ids 900 and 400 share slot 0; the report bounds
    each example by the busiest slot, also after more releases."""
    big = kf.EmbeddingDPLayer(eps=2.0, seed=0, id_capacity=1000)
    _release(big, [900, 5, 400])
    _release(big, [900, 6])
    small = kf.EmbeddingDPLayer(eps=2.0, seed=0, id_capacity=100)
    small.build((None, 3))
    if path == "load_own_variables":
        store = {}
        big.save_own_variables(store)
        small.load_own_variables(store)
    else:
        load_local_state([small], local_state([big]))
    _release(small, [900, 7])  # example 900: 3 releases in all
    ledger = small.privacy_ledger()
    (kind,) = ledger.kinds
    assert ledger.is_approximate(kind) and ledger.total(kind) >= 3
    _, profiles = ledger.unit_profiles(kind.unit)
    assert min(max(p) for p in profiles) >= 3
