"""Issue 18, case 9: one client must not stall the server (bounded work per reply and round).

A Laplace evaluation report was bounded only by 8e8 bytes (10^7 rows), and the server scored
every buffered row (silhouette is O(n^2): 22 s at 16k rows). Now the server asks each client
for at most ``max_report_rows`` rows and refuses a larger report from its byte size, before
parsing it; and one evaluation's scores are computed on at most ``max_scored_rows`` rows. The
uploads of a training round were already bounded before parsing: checked here too.
"""

import contextlib
import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ConfigRecord, Message, RecordDict  # noqa: E402

from keras_fedpriv.callbacks import LaplaceEvaluation  # noqa: E402
from keras_fedpriv.federated import HorizontalFL, partition  # noqa: E402
from keras_fedpriv.federated import laplace_eval as laplace_eval_module  # noqa: E402
from keras_fedpriv.federated.flower import HorizontalStrategy  # noqa: E402
from keras_fedpriv.federated.records import arrays_record  # noqa: E402
from keras_fedpriv.federated.horizontal.wire import parse_report  # noqa: E402
from keras_fedpriv.federated.malformed import MalformedMessage  # noqa: E402

from flower_stubs import model_fn  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.timeout(300)]

K = 10  # the test app model's outputs


@pytest.fixture
def parsed(monkeypatch):
    """The sizes of the arrays the server deserialized (flwr's ``Array.numpy``)."""
    sizes = []
    real = Array.numpy

    def spy(self):
        sizes.append(len(self.data))
        return real(self)

    monkeypatch.setattr(Array, "numpy", spy)
    return sizes


class _Grid:
    """Three connected clients that answer the strategy's query with their client ids."""

    nodes = [10, 11, 12]

    def get_node_ids(self):
        return self.nodes

    def send_and_receive(self, messages, timeout=None):
        return [Message(RecordDict({"config": ConfigRecord(
            {"client-id": self.nodes.index(m.metadata.dst_node_id)})}), reply_to=m)
            for m in messages]


@contextlib.contextmanager
def _no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def _probabilities(rows, seed):
    return np.random.default_rng(seed).dirichlet(np.ones(K), size=rows)


def _report(message, rows, seed=0):
    cid = _Grid.nodes.index(message.metadata.dst_node_id)
    return Message(RecordDict({"report": arrays_record({"report": _probabilities(rows, seed)}),
                               "config": ConfigRecord({"client-id": cid})}), reply_to=message)


def test_case9_a_report_larger_than_asked_is_refused_before_it_is_parsed(in_a_run, parsed):
    """Case 9: a report one row over the cap, and one of 10^5 rows (8 MB), were scored before."""
    laplace = LaplaceEvaluation(eps=2.0, from_logits=True, seed=0, metrics="calinski_harabasz")
    cap = 10_000  # the default max_report_rows
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=3, num_clients=3,
                                  seed=0, laplace_eval=laplace)
    grid = _Grid()
    with strategy.own_loop():
        strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), grid)
        asks = list(strategy.configure_evaluate(1, strategy.initial_arrays(), ConfigRecord(),
                                                grid))
    good, one_over, huge = asks
    replies = [_report(good, 50), _report(one_over, cap + 1, 1), _report(huge, 10**5, 2)]
    parsed.clear()
    strategy.aggregate_evaluate(1, replies)
    reasons = {who: why for _, who, why in strategy.rejected}
    huge_id, over_id = (_Grid.nodes.index(m.metadata.dst_node_id) for m in (huge, one_over))
    assert f"holds more than the {8 * cap * K + 4096} bytes" in reasons.get(huge_id, "used")
    assert f"the report holds {cap + 1} rows, more than the {cap} asked for" in \
        reasons.get(over_id, "used")
    assert max(parsed) < 8 * (cap + 1) * K + 4096  # the 8 MB report was never deserialized
    assert laplace.last_client_ids == [_Grid.nodes.index(good.metadata.dst_node_id)]
    assert len(laplace.last_server_view[0]) == 50
    # what was asked: the evaluate message carries the cap (the client reports no more)
    assert [m.content["config"]["max-rows"] for m in asks] == [cap] * 3


def test_case9_the_scoring_cost_per_round_is_bounded_by_max_scored_rows(monkeypatch):
    """Case 9: four 4000-row reports were all scored (16k rows); now 5000 evenly spaced ones."""
    scored = []

    def score_fn(name):
        def score(x, labels, **kwargs):
            scored.append((name, len(x)))
            return 0.5
        return score

    monkeypatch.setattr(laplace_eval_module, "_score_fn", score_fn)
    laplace = LaplaceEvaluation(eps=2.0, seed=0)
    assert (laplace.max_report_rows, laplace.max_scored_rows) == (10_000, 5_000)  # defaults
    MAX_REPORT_ROWS, MAX_SCORED_ROWS = 10_000, 5_000
    reports = [(c, _probabilities(4000, c), None) for c in range(4)]
    laplace.receive_reports(reports)
    assert {n for _, n in scored} == {MAX_SCORED_ROWS}
    assert {name for name, _ in scored} == {"silhouette", "calinski_harabasz", "davies_bouldin"}
    every = np.concatenate([r for _, r, _ in reports])
    want = every[np.arange(MAX_SCORED_ROWS) * len(every) // MAX_SCORED_ROWS]
    np.testing.assert_array_equal(laplace.last_server_view[0], want)  # the same rows, chosen
    np.testing.assert_array_equal(laplace.last_server_view[1], want.argmax(axis=1))
    # each client keeps its share of the scored rows
    shares = np.bincount(np.arange(MAX_SCORED_ROWS) * len(every) // MAX_SCORED_ROWS // 4000)
    assert shares.tolist() == [MAX_SCORED_ROWS // 4] * 4
    # a report over max_report_rows is refused by the server's object too
    with pytest.raises(ValueError, match="max_report_rows"):
        laplace.receive_reports([(9, _probabilities(MAX_REPORT_ROWS + 1, 9), None)])


def test_case9_clients_report_at_most_max_report_rows_rows():
    """Case 9: in one process a client reports its first max_report_rows rows, as on Flower."""
    x = np.random.default_rng(0).random((120, 64)).astype("float32")
    y = np.arange(120) % K
    fl = HorizontalFL(model_fn(), partition(x, y, 3, seed=0), seed=0)
    laplace = LaplaceEvaluation(eps=2.0, from_logits=True, seed=0, max_report_rows=7)
    fl.fit(rounds=1, clients_per_round=3, callbacks=[laplace], verbose=0)
    assert len(laplace.last_server_view[0]) == 3 * 7
    model = fl.model
    assert laplace.client_outputs(model, x).shape == (7, K)
    assert laplace.client_outputs(model, x, max_rows=3).shape == (3, K)  # the server asked 3
    assert laplace.client_outputs(model, x, max_rows=10**9).shape == (7, K)  # never more
    with pytest.raises(ValueError, match="max_rows"):
        laplace.client_outputs(model, x, max_rows=0)
    with pytest.raises(ValueError, match="max_report_rows"):
        LaplaceEvaluation(x, eps=2.0, num_eval_clients=2, max_report_rows=59)
    with pytest.raises(ValueError, match="max_report_rows"):
        laplace.evaluate([x[:8]], [0], model=model)  # refused before any release
    assert laplace.client_releases == {0: 1, 1: 1, 2: 1}
    with pytest.raises(ValueError, match="max_scored_rows"):
        LaplaceEvaluation(eps=2.0, max_scored_rows=1)


def test_uploads_larger_than_asked_are_refused_before_they_are_parsed(in_a_run, parsed):
    """Already so before issue 18: an upload over twice a dense float64 update is dropped from
    its byte size, and a reply of the right size is parsed."""
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, num_clients=3,
                                  seed=0)
    with strategy.own_loop():
        asks = list(strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(),
                                             _Grid()))
    dim = strategy.server.dim

    def reply(message, update):
        cid = _Grid.nodes.index(message.metadata.dst_node_id)
        arrays = {"update": update, "num_examples": np.array([5], np.int64)}
        return Message(RecordDict({"upload": arrays_record(arrays),
                                   "config": ConfigRecord({"client-id": cid})}),
                       reply_to=message)

    huge = np.zeros(2 * dim + 1024, np.float64)  # > 16 * dim + 4096 bytes
    good = np.zeros(dim, np.float32)
    parsed.clear()
    _, metrics = strategy.aggregate_train(1, [reply(asks[0], huge), reply(asks[1], good)])
    (reason,) = [why for _, _, why in strategy.rejected]
    assert f"'upload' holds more than the {16 * dim + 4096} bytes" in reason
    assert max(parsed) <= 16 * dim + 4096  # the oversized array was never deserialized
    assert metrics["replies"] == 1.0


def test_review_a_report_of_huge_finite_values_is_refused_and_cannot_stop_the_round(in_a_run):
    """Review (HIGH): a report of the right shape holding +-1e308 passed the checks, and
    scikit-learn's error on it escaped aggregate_evaluate: one client ended the Flower run. Now
    values beyond `report_bound` (honest noise passes it with probability ~2 exp(-700)) are
    refused like any malformed report, and the honest reports are scored."""
    laplace = LaplaceEvaluation(eps=2.0, from_logits=True, seed=0)
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=3, num_clients=3,
                                  seed=0, laplace_eval=laplace)
    grid = _Grid()
    with strategy.own_loop():
        strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), grid)
        asks = list(strategy.configure_evaluate(1, strategy.initial_arrays(), ConfigRecord(),
                                                grid))
    evil = np.full((50, K), 1e308)
    evil[np.arange(50), np.arange(50) % K] = -1e308

    def reply(message, rows):
        cid = _Grid.nodes.index(message.metadata.dst_node_id)
        return Message(RecordDict({"report": arrays_record({"report": rows}),
                                   "config": ConfigRecord({"client-id": cid})}),
                       reply_to=message)

    metrics = strategy.aggregate_evaluate(1, [reply(asks[0], _probabilities(50, 0)),
                                              reply(asks[1], _probabilities(50, 1)),
                                              reply(asks[2], evil)])
    assert laplace.last_client_ids == [0, 1]
    assert all(np.isfinite(metrics[f"laplace_{m}"]) for m in
               ("silhouette", "calinski_harabasz", "davies_bouldin"))
    bound = laplace.report_bound(K)
    assert 1 + 700 * 2 / 2.0 <= bound < 1 + 710 * 2 / 2.0  # 700 noise scales past [0, 1]
    (rejected,) = strategy.rejected
    assert rejected[1] == _Grid.nodes.index(asks[2].metadata.dst_node_id)
    assert f"values beyond +-{bound:.6g}" in rejected[2]
    # a report with values at the bound is taken; one value just past it is refused
    edge = _probabilities(50, 2)
    edge[0, 0], edge[1, 1] = bound, -bound
    assert parse_report(reply(asks[0], edge), K, 10_000, bound).shape == (50, K)
    edge[3, 4] = -np.nextafter(bound, np.inf)
    with pytest.raises(MalformedMessage, match="values beyond"):
        parse_report(reply(asks[0], edge), K, 10_000, bound)


@pytest.mark.parametrize("eps, sensitivity, sampler", [
    (2.0, 2.0, "discrete"), (0.5, 2.0, "discrete"), (2.0, 1.0, "discrete"),
    (2.0, 2.0, "continuous"), (1000.0, 2.0, "discrete")])
def test_review_report_bound_is_700_noise_scales_and_honest_reports_pass(eps, sensitivity,
                                                                         sampler):
    with pytest.warns(UserWarning) if sensitivity < 2 else _no_warning():
        laplace = LaplaceEvaluation(eps=eps, sensitivity=sensitivity, sampler=sampler, seed=0)
    scale = sensitivity / eps
    bound = laplace.report_bound(K)
    assert 1 + 700 * scale <= bound <= 1 + 701.5 * scale
    noisy = laplace.client_report(_probabilities(10_000, 3), client_id=0)
    assert np.abs(noisy).max() < min(bound, 1 + 30 * scale)  # far inside the bound
    with pytest.raises(ValueError, match="num_classes"):
        LaplaceEvaluation(eps=eps, sensitivity=2.0).report_bound()


def test_review_a_score_scikit_learn_cannot_compute_is_nan_with_a_warning():
    """Review (HIGH): receive_reports raised sklearn's ValueError on a report of +-1e308; each
    score it cannot compute (raises, or returns NaN/inf) is now NaN with a warning naming it."""
    reports = [(c, laplace_eval_module.laplace(_probabilities(200, c), 2.0,
                                              rng=np.random.default_rng(c)), None)
               for c in range(3)]
    evil = np.full((200, K), 1e308)
    evil[np.arange(200), np.arange(200) % K] = -1e308
    laplace = LaplaceEvaluation(eps=2.0, seed=0)
    with pytest.warns(UserWarning) as caught:
        logs = laplace.receive_reports(reports + [(9, evil, None)])
    texts = [str(w.message) for w in caught]
    assert np.isnan(logs["laplace_davies_bouldin"]) and np.isnan(logs["laplace_calinski_harabasz"])
    assert any(t.startswith("LaplaceEvaluation: davies_bouldin of the noisy vectors is logged "
                            "as NaN: scikit-learn raised ValueError") for t in texts)
    assert any(t.startswith("LaplaceEvaluation: calinski_harabasz of the noisy vectors is logged "
                            "as NaN: the score is") for t in texts)
    # the honest reports alone still score
    logs = LaplaceEvaluation(eps=2.0, seed=0).receive_reports(reports)
    assert all(np.isfinite(v) for v in logs.values())


def test_review_a_silhouette_sample_at_or_above_max_scored_rows_warns_it_has_no_effect():
    for size in (5_000, 6_000):
        with pytest.warns(UserWarning, match=rf"silhouette_sample_size={size}\) has no effect: "
                                             r"at most max_scored_rows=5000 rows are scored"):
            LaplaceEvaluation(eps=2.0, silhouette_sample_size=size)
    with _no_warning():
        LaplaceEvaluation(eps=2.0, silhouette_sample_size=4_999)
        LaplaceEvaluation(eps=2.0, silhouette_sample_size=6_000, max_scored_rows=8_000)
