"""Issue 18, case 9: one client must not stall the server (bounded work per reply and round).

A Laplace evaluation report was bounded only by 8e8 bytes (10^7 rows), and the server scored
every buffered row (silhouette is O(n^2): 22 s at 16k rows). Now the server asks each client
for at most ``max_report_rows`` rows and refuses a larger report from its byte size, before
parsing it; and one evaluation's scores are computed on at most ``max_scored_rows`` rows. The
uploads of a training round were already bounded before parsing: checked here too.
"""

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ConfigRecord, Message, RecordDict  # noqa: E402

from keras_fedpriv.callbacks import LaplaceEvaluation  # noqa: E402
from keras_fedpriv.federated import HorizontalFL, partition  # noqa: E402
from keras_fedpriv.federated import laplace_eval as laplace_eval_module  # noqa: E402
from keras_fedpriv.federated.flower import HorizontalStrategy  # noqa: E402
from keras_fedpriv.federated.flower.common import _record  # noqa: E402

from flower_stubs import model_fn  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.timeout(300)]

K = 10  # the test app model's outputs


@pytest.fixture
def in_a_run(monkeypatch):
    """Flower builds a Message only inside a run: a stand-in run id for these tests."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0)


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


def _probabilities(rows, seed):
    return np.random.default_rng(seed).dirichlet(np.ones(K), size=rows)


def _report(message, rows, seed=0):
    cid = _Grid.nodes.index(message.metadata.dst_node_id)
    return Message(RecordDict({"report": _record({"report": _probabilities(rows, seed)}),
                               "config": ConfigRecord({"client-id": cid})}), reply_to=message)


def test_case9_a_report_larger_than_asked_is_refused_before_it_is_parsed(in_a_run, parsed):
    """Case 9: a report one row over the cap, and one of 10^5 rows (8 MB), were scored before."""
    laplace = LaplaceEvaluation(eps=2.0, from_logits=True, seed=0, metrics="calinski_harabasz")
    cap = 10_000  # the default max_report_rows
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=3, num_clients=3,
                                  seed=0, laplace_eval=laplace)
    grid = _Grid()
    strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), grid)
    asks = list(strategy.configure_evaluate(1, strategy.initial_arrays(), ConfigRecord(), grid))
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
    asks = list(strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid()))
    dim = strategy.server.dim

    def reply(message, update):
        cid = _Grid.nodes.index(message.metadata.dst_node_id)
        arrays = {"update": update, "num_examples": np.array([5], np.int64)}
        return Message(RecordDict({"upload": _record(arrays),
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
