"""LaplaceEvaluation: Laplace-protected clustering evaluation (ALGORITHMS.md section 6)."""

import contextlib
import math
import warnings

import keras
import numpy as np
import pytest
from dp_accounting import pld
from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score, silhouette_score

from keras_fedpriv.callbacks import LaplaceEvaluation
from keras_fedpriv.federated import laplace_eval as laplace_eval_module
from keras_fedpriv.federated import HorizontalFL, partition
from stats import SIGMAS
from digits_stubs import digits

pytestmark = [pytest.mark.jax]

SKLEARN = {"silhouette": silhouette_score, "calinski_harabasz": calinski_harabasz_score,
           "davies_bouldin": davies_bouldin_score}
K = 4


def _table(n, seed=0, k=K):
    """Fixed probability vectors (float32, rows sum to 1) with a clear argmax."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(k, 0.5), size=n).astype(np.float32)


def _identity_model(k=K):
    """A fake model whose outputs are its inputs: feed it probability vectors."""
    return keras.Sequential([keras.Input((k,)), keras.layers.Identity()])


def _run_once(cb, model):
    """One epoch end of a plain training loop; return the logs."""
    cb.set_model(model)
    cb.on_train_begin()
    logs = {}
    cb.on_epoch_end(0, logs)
    return logs


def _sklearn_scores(x, labels):
    x = np.asarray(x, np.float64)
    return {m: f(x, labels) for m, f in SKLEARN.items()}


# ------------------------------------------------------------------ scores
@pytest.mark.parametrize("sampler", ["discrete", "continuous"])
def test_scores_equal_sklearn_on_the_clean_vectors_at_huge_eps(sampler):
    p = _table(400)
    cb = LaplaceEvaluation(p, eps=500000.0, num_eval_clients=5, log_clean=True,
                           sampler=sampler, seed=1)
    logs = _run_once(cb, _identity_model())
    labels = p.argmax(axis=1)
    want = _sklearn_scores(p, labels)
    noisy, server_labels = cb.last_server_view
    np.testing.assert_array_equal(server_labels, labels)  # noise ~1e-5 flips no argmax
    for m, value in want.items():
        assert logs[f"clean_{m}"] == value  # same vectors, same labels: exactly sklearn
        assert logs[f"laplace_{m}"] == pytest.approx(value, rel=1e-3)
        assert logs[f"laplace_{m}"] != value  # noise was added, just tiny
    assert np.abs(noisy - p).max() < 2e-4
    assert logs["laplace_eval_time_s"] > 0
    assert cb.num_evaluations == 1 and cb.num_classes == K


def test_noise_is_added_per_client_with_scale_sensitivity_over_eps(monkeypatch):
    calls = []
    real = laplace_eval_module.laplace

    def spy(values, eps, sensitivity, rng, sampler):
        calls.append((np.array(values), eps, sensitivity, sampler))
        return real(values, eps, sensitivity=sensitivity, rng=rng, sampler=sampler)

    monkeypatch.setattr(laplace_eval_module, "laplace", spy)
    p = _table(2000, seed=2)
    for sensitivity in (2.0, 1.0):
        calls.clear()
        with pytest.warns(UserWarning) if sensitivity < 2 else _no_warning():
            cb = LaplaceEvaluation(p, eps=1.0, sensitivity=sensitivity, num_eval_clients=8,
                                   log_clean=True, seed=3)
        logs = _run_once(cb, _identity_model())
        # One release per client, of exactly that client's rows.
        assert [len(c[0]) for c in calls] == [250] * 8
        np.testing.assert_allclose(np.concatenate([c[0] for c in calls]), p, atol=1e-6)
        assert all(c[1:] == (1.0, sensitivity, "discrete") for c in calls)
        noisy, labels = cb.last_server_view
        np.testing.assert_array_equal(labels, noisy.argmax(axis=1))
        noise = np.abs(noisy - p.astype(np.float64))
        b = sensitivity / 1.0
        # |Laplace(b)| is exponential: mean b, sd b. The discrete sampler's
        # scale is b (1 + K gamma / sensitivity), within 0.1% of b.
        se = b / math.sqrt(noise.size)
        assert abs(noise.mean() - b) <= SIGMAS * se, (noise.mean(), b, se)
        assert abs(noise.mean() - b / 2) > SIGMAS * se  # the check tells 1 from 2
        assert abs(logs["laplace_silhouette"] - logs["clean_silhouette"]) > 0.05
        assert not np.array_equal(labels, p.argmax(axis=1))


@contextlib.contextmanager
def _no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_rolling_buffer_scores_exactly_the_last_clients():
    clients = [_table(n, seed=10 + i) for i, n in enumerate((30, 40, 50, 60, 70))]
    cb = LaplaceEvaluation(clients, eps=500000.0, cluster_client_num=3, log_clean=True,
                           seed=0)
    logs = _run_once(cb, _identity_model())
    assert cb.last_client_ids == [2, 3, 4]
    last3 = np.concatenate(clients[2:])
    noisy, _ = cb.last_server_view
    assert noisy.shape == (180, K)
    np.testing.assert_allclose(noisy, last3, atol=1e-4)
    want = _sklearn_scores(last3, last3.argmax(axis=1))
    for m in SKLEARN:
        assert logs[f"clean_{m}"] == want[m]
    all5 = np.concatenate(clients)
    assert logs["clean_silhouette"] != silhouette_score(all5.astype(np.float64),
                                                        all5.argmax(axis=1))
    # A client that reports again replaces its old report at the newest end.
    cb.evaluate([clients[1], clients[3]], [1, 3])
    assert cb.last_client_ids == [4, 1, 3]
    assert len(cb.last_server_view[0]) == 70 + 40 + 60
    assert cb.client_releases == {0: 1, 1: 2, 2: 1, 3: 2, 4: 1}
    # cluster_client_num=None: only the current evaluation's clients.
    cb = LaplaceEvaluation(clients, eps=500000.0, seed=0)
    _run_once(cb, _identity_model())
    assert cb.last_client_ids == [0, 1, 2, 3, 4]
    cb.evaluate([clients[4]], [4])
    assert cb.last_client_ids == [4] and len(cb.last_server_view[0]) == 70


def test_fewer_than_two_clusters_scores_zero_with_a_warning():
    p = np.tile(np.array([[0.7, 0.1, 0.1, 0.1]], np.float32), (50, 1))
    cb = LaplaceEvaluation(p, eps=500000.0, num_eval_clients=2, log_clean=True, seed=0)
    with pytest.warns(UserWarning, match="1 distinct argmax label"):
        logs = _run_once(cb, _identity_model())
    assert all(logs[f"{w}_{m}"] == 0.0 for w in ("laplace", "clean") for m in SKLEARN)
    # As many labels as vectors: sklearn would raise; 0.0 and a warning.
    two = np.array([[0.9, 0.1, 0, 0], [0.1, 0.9, 0, 0]], np.float32)
    cb = LaplaceEvaluation([two], eps=500000.0, metrics="calinski_harabasz", seed=0)
    with pytest.warns(UserWarning, match="2 distinct argmax label"):
        assert _run_once(cb, _identity_model())["laplace_calinski_harabasz"] == 0.0


def test_silhouette_sample_size_is_sklearns_sampling():
    p = _table(600, seed=4)
    cb = LaplaceEvaluation(p, eps=500000.0, metrics="silhouette", silhouette_sample_size=100,
                           log_clean=True, seed=5)
    logs = _run_once(cb, _identity_model())
    full = silhouette_score(p.astype(np.float64), p.argmax(axis=1))
    assert logs["clean_silhouette"] != full
    assert abs(logs["clean_silhouette"] - full) < 0.1
    assert list(logs) == ["laplace_silhouette", "clean_silhouette", "laplace_eval_time_s"]


# -------------------------------------------------------------- validation
@pytest.mark.parametrize("eps", [0, 0.0, -1, 500001, 1e9, float("nan"), float("inf"), True,
                                 "1", None])
def test_eps_outside_its_domain_is_rejected(eps):
    with pytest.raises((TypeError, ValueError), match="eps.*500000"):
        LaplaceEvaluation(_table(20), eps=eps)


def test_eps_is_required_and_the_domain_bounds_are_accepted():
    with pytest.raises(TypeError, match="eps"):
        LaplaceEvaluation(_table(20))
    assert LaplaceEvaluation(_table(20), eps=500000).eps == 500000.0
    assert LaplaceEvaluation(_table(20), eps=1e-6).eps == 1e-6


@pytest.mark.parametrize("kwargs, match", [
    (dict(sensitivity=0.0), "sensitivity"),
    (dict(sensitivity=float("inf")), "sensitivity"),
    (dict(metrics=("silhouette", "accuracy")), "calinski_harabasz"),
    (dict(metrics=()), "metrics"),
    (dict(cluster_client_num=0), "cluster_client_num"),
    (dict(every_n_epochs=0), "every_n_epochs"),
    (dict(num_eval_clients=21), "num_eval_clients"),
    (dict(sampler="gaussian"), "sampler"),
    (dict(from_logits=1), "from_logits"),
    (dict(silhouette_sample_size=1), "silhouette_sample_size"),
    (dict(seed=-1), "seed"),
])
def test_bad_arguments_are_rejected_by_name(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        LaplaceEvaluation(_table(20), eps=1.0, **kwargs)


def test_eval_data_tuple_is_rejected():
    with pytest.raises(TypeError, match="x_eval, not"):
        LaplaceEvaluation((_table(20), np.zeros(20)), eps=1.0)


def test_logits_need_from_logits():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(K)])
    x = np.random.default_rng(0).normal(size=(60, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="from_logits=True"):
        _run_once(LaplaceEvaluation(x, eps=1.0, num_eval_clients=3), model)
    cb = LaplaceEvaluation(x, eps=500000.0, num_eval_clients=3, from_logits=True,
                           log_clean=True, seed=0)
    logs = _run_once(cb, model)
    z = model.predict(x, verbose=0).astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert logs["clean_silhouette"] == pytest.approx(
        silhouette_score(p, p.argmax(axis=1)), rel=1e-6)
    # Non-negative outputs that do not sum to 1 (sigmoid) are not probability vectors.
    sigmoid = keras.Sequential([keras.Input((8,)), keras.layers.Dense(K, activation="sigmoid")])
    with pytest.raises(ValueError, match="sum to 1.*from_logits=True"):
        _run_once(LaplaceEvaluation(x, eps=1.0, num_eval_clients=3), sigmoid)
    # A 3-D output is not a batch of probability vectors.
    model3 = keras.Sequential([keras.Input((8,)), keras.layers.Reshape((2, 4)),
                               keras.layers.Softmax()])
    with pytest.raises(ValueError, match="2-D"):
        _run_once(LaplaceEvaluation(x, eps=1.0, num_eval_clients=3), model3)


# ------------------------------------------------------------ training loops
def _softmax_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def test_model_fit_logs_every_n_epochs_and_nan_between():
    x, y = digits()
    cb = LaplaceEvaluation(x[1500:], eps=10.0, every_n_epochs=2, log_clean=True, seed=0)
    hist = _softmax_model().fit(x[:1500], y[:1500], epochs=4, batch_size=64, verbose=0,
                                callbacks=[cb])
    for key in cb.log_keys():
        values = np.array(hist.history[key])
        assert len(values) == 4
        assert np.isnan(values[[0, 2]]).all() and np.isfinite(values[[1, 3]]).all(), key
    assert cb.num_evaluations == 2 and cb.num_classes == 10
    assert cb.client_releases == {i: 2 for i in range(10)}


def test_model_fit_without_eval_data_fails_before_training():
    x, y = digits()
    model = _softmax_model()
    before = model.get_weights()
    with pytest.raises(ValueError, match="HorizontalFL"):
        model.fit(x[:100], y[:100], epochs=1, verbose=0,
                  callbacks=[LaplaceEvaluation(eps=10.0)])
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


class _RoundSpy(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rounds = []

    def on_federated_round(self, fl, round, client_ids, logs):  # noqa: A002
        self.rounds.append([int(i) for i in client_ids])


def test_horizontal_fl_round_clients_evaluate_their_own_data():
    x, y = digits()
    clients = partition(x, y, 10, seed=0)
    fl = HorizontalFL(_softmax_model(), clients, batch_size=32, seed=0)
    spy = _RoundSpy()
    cb = LaplaceEvaluation(eps=10.0, cluster_client_num=6, log_clean=True, seed=0)
    hist = fl.fit(rounds=3, clients_per_round=4, callbacks=[spy, cb], verbose=0)
    assert len(hist.history["laplace_silhouette"]) == 3
    assert np.isfinite(hist.history["laplace_silhouette"]).all()
    assert np.isfinite(hist.history["clean_calinski_harabasz"]).all()
    expected = []  # the newest report of the 6 most recent distinct clients
    for chosen in spy.rounds:
        for c in chosen:
            if c in expected:
                expected.remove(c)
            expected.append(c)
    expected = expected[-6:]
    assert cb.last_client_ids == expected
    assert len(cb.last_server_view[0]) == sum(len(clients[c][0]) for c in expected)
    assert cb.num_evaluations == 3
    assert cb.client_releases == {i: int(n) for i, n in enumerate(fl.participation) if n}
    # The last round's own clients' rows were noised from the final model.
    last = spy.rounds[-1]
    clean, _ = cb.last_clean_view
    own = np.concatenate([fl.model.predict(clients[c][0], verbose=0) for c in last])
    np.testing.assert_allclose(clean[-len(own):], own, atol=1e-5)

    # With eval_data the fixed eval clients are used, once per round (not twice).
    cb2 = LaplaceEvaluation(x[:200], eps=10.0, num_eval_clients=5, seed=0)
    fl.fit(rounds=2, clients_per_round=4, callbacks=[cb2], verbose=0)
    assert cb2.num_evaluations == 2 and cb2.last_client_ids == [0, 1, 2, 3, 4]
    assert len(cb2.last_server_view[0]) == 200


# ----------------------------------------------------------- accounting
@pytest.mark.parametrize("sampler", ["discrete", "continuous"])
@pytest.mark.parametrize("eps", [0.5, 2.0, 10.0])
def test_dp_event_accounts_to_the_callbacks_epsilon(eps, sampler):
    cb = LaplaceEvaluation(_table(20), eps=eps, sampler=sampler)
    with pytest.raises(ValueError, match="num_classes"):
        cb.dp_event()
    acc = pld.PLDAccountant()
    acc.compose(cb.dp_event(num_classes=10))
    assert cb.epsilon == eps
    assert acc.get_epsilon(1e-9) == pytest.approx(eps, rel=0.05)
    acc3 = pld.PLDAccountant()
    acc3.compose(cb.dp_event(evaluations=3, num_classes=10))
    assert 2.5 * eps < acc3.get_epsilon(1e-9) <= 3.0 * eps * 1.05


@pytest.mark.parametrize("sampler", ["discrete", "continuous"])
def test_the_original_designs_sensitivity_one_reports_twice_eps(sampler):
    with pytest.warns(UserWarning, match="2-LDP"):
        cb = LaplaceEvaluation(_table(20), eps=1.0, sensitivity=1.0, sampler=sampler)
    assert cb.epsilon == 2.0 and cb.noise_scale == 1.0
    acc = pld.PLDAccountant()
    acc.compose(cb.dp_event(num_classes=K))
    assert acc.get_epsilon(1e-9) == pytest.approx(2.0, rel=0.05)
    _run_once(cb, _identity_model())
    with pytest.raises(ValueError, match="num_classes"):
        cb.dp_event(num_classes=K + 1)


# ------------------------------------------------------- config and seeds
def test_config_round_trip_keeps_the_seed_only_if_given():
    cb = LaplaceEvaluation(_table(20), eps=3.0, metrics=["silhouette"], cluster_client_num=7,
                           every_n_epochs=2, log_clean=True, sampler="continuous")
    config = cb.get_config()
    assert "seed" not in config and "eval_data" not in config
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(cb))
    assert isinstance(again, LaplaceEvaluation) and again.get_config() == config
    seeded = LaplaceEvaluation(_table(20), eps=3.0, seed=7)
    assert seeded.get_config()["seed"] == 7


def test_seed_reproduces_the_noise_and_no_seed_does_not():
    p = _table(100)
    views = []
    for seed in (7, 7, None, None):
        cb = LaplaceEvaluation(p, eps=1.0, num_eval_clients=4, seed=seed)
        _run_once(cb, _identity_model())
        views.append(cb.last_server_view[0])
    np.testing.assert_array_equal(views[0], views[1])
    assert not np.array_equal(views[2], views[3])
    assert not np.array_equal(views[0], views[2])


def test_issue18_case11_fixed_eval_data_is_counted_for_every_training_client():
    """Issue 18, case 11: the evaluation rows are training client 5's own, but a fixed
    eval_data's releases were recorded under evaluation-client ids 0 and 1, which are other
    training clients: client 5's composition missed them. Now each evaluation on a fixed
    eval_data releases each of its rows about every client (a client may own them all), and the
    report is the busiest trainer's updates composed with every row of every evaluation, by hand
    with dp-accounting."""
    from keras_fedpriv.federated import GaussianUpload
    from keras_fedpriv.mechanisms.gaussian import gaussian_dp_event
    from keras_fedpriv.privacy import privacy_report
    from ledger_cases import by_hand

    x, y = digits()
    clients = partition(x[:600], y[:600], 6, seed=0)
    fl = HorizontalFL(_softmax_model(), clients, upload=GaussianUpload(1.0, 3.0, seed=0), seed=0)
    cb = LaplaceEvaluation(clients[5][0], eps=2.0, num_eval_clients=2, seed=0)
    fl.fit(rounds=3, clients_per_round=2, callbacks=[cb], verbose=0)
    busiest = int(fl.participation.max())
    # evaluation clients 0 and 1 trained less than the busiest client (so ids 0, 1 under-count)
    assert fl.participation[0] < busiest and fl.participation[1] < busiest
    assert cb.num_evaluations == 3 and cb.client_releases == {0: 3, 1: 3}
    rows = len(clients[5][0])  # 100: one evaluation is 100 releases about a client owning them
    expected = by_hand([(gaussian_dp_event(3.0), busiest), (cb.dp_event(), 3 * rows)])
    assert privacy_report(fl).epsilon == pytest.approx(expected, rel=2e-3, abs=2e-3)
    ledger = cb.privacy_ledger()
    (kind,) = ledger.kinds
    assert ledger.units_seen(kind) == 0 and ledger.total(kind) == 3 * rows  # about every client
    # with clean scores logged, the clean release is about every client too: inf for all
    clean = LaplaceEvaluation(clients[5][0], eps=2.0, num_eval_clients=2, log_clean=True, seed=0)
    clean.evaluate(np.array_split(clients[5][0], 2), model=fl.model)
    assert [(ledger_kind.mechanism, clean.privacy_ledger().total(ledger_kind),
             clean.privacy_ledger().units_seen(ledger_kind))
            for ledger_kind in clean.privacy_ledger().kinds] == [
        ("LaplaceEvaluation", rows, 0), ("LaplaceEvaluation clean_*", rows, 0)]


def test_a_budget_reserves_every_row_of_a_report_and_a_restored_copy_keeps_counting_rows():
    """A client's report of n rows is n releases about it: the `PrivacyBudget` a Flower client
    reserves its reply in (the ledger's growth since before the report) charges all n, not one
    per evaluation, and the per-row counts survive a JSON `state_dict` round trip."""
    import json

    from keras_fedpriv.mechanisms.ledger import ReleaseLedger
    from keras_fedpriv.privacy import BudgetExhausted, PrivacyBudget

    model, rows = _identity_model(), _table(5)

    def report(n):
        cb = LaplaceEvaluation(eps=2.0, seed=0)
        before = ReleaseLedger.from_dict(cb.privacy_ledger().to_dict())
        cb.report_outputs(cb.client_outputs(model, rows[:n]), 3)
        return cb, before

    one = PrivacyBudget(1e9).epsilon(report(1)[0].privacy_ledger())
    five_cb, before = report(5)
    five = PrivacyBudget(1e9).epsilon(five_cb.privacy_ledger())
    assert five > 2 * one  # five eps-LDP rows compose (eps 2 each: about 10, not 2)
    with pytest.raises(BudgetExhausted):  # one evaluation, but five releases
        PrivacyBudget((one + five) / 2).reserve(five_cb.privacy_ledger(), before=before)
    PrivacyBudget(five * 1.01).reserve(five_cb.privacy_ledger(), before=before)
    restored = LaplaceEvaluation(eps=2.0, seed=0)
    restored.load_state_dict(json.loads(json.dumps(five_cb.state_dict())))
    restored.report_outputs(restored.client_outputs(model, rows[:2]), 3)
    ledger = restored.privacy_ledger()
    (kind,) = ledger.kinds
    assert ledger.total(kind) == 7 and ledger.units_seen(kind) == 1
    assert restored.client_releases == {3: 2}  # reports; the ledger counts rows
