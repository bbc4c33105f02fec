"""Horizontal FL on Flower's apps gives what `HorizontalFL` gives in one process.

Also: the server drops what is malformed, and counts what it received. The first test runs
on Flower's Simulation Engine (Ray, two worker processes); the budget and malformed-reply
tests run the same apps in this process on a stand-in SuperLink (`flower_stubs.AppGrid`):
they test the apps' handling, and the Simulation Engine's tests run one after another.
"""

import json
import logging
import sys

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.simulation import run_simulation  # noqa: E402

from keras_fedpriv.federated import HorizontalFL, partition  # noqa: E402
from keras_fedpriv.federated.flower import (  # noqa: E402
    HorizontalStrategy,
    horizontal_client_app,
    horizontal_server_app,
)
from keras_fedpriv.federated.malformed import MalformedMessage  # noqa: E402
from keras_fedpriv.federated.uploads import (  # noqa: E402
    FedAvgUpload,
    GaussianUpload,
    SignDSUpload,
)
from keras_fedpriv.optimizers import SignDSEncoder  # noqa: E402
from keras_fedpriv.privacy import privacy_report  # noqa: E402

from flower_stubs import (  # noqa: E402
    APP,
    TWO_WORKERS,
    AppGrid,
    Reply,
    assert_same_horizontal_run,
    model_fn,
    signds_apps,
)

pytestmark = [pytest.mark.flower, pytest.mark.timeout(300)]


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype("float32"), d.target.astype("int32")


def _simulate(client_app, server_app, num_supernodes, backend=None):
    """Run the apps with ``num_supernodes`` nodes: on Flower's Simulation Engine with the
    ``backend`` config, or (``backend=None``; needs the ``in_a_run`` fixture) in this
    process on the stand-in SuperLink `AppGrid` with two stand-in workers (each client then
    reloads its node state, as on the engine), which tests the apps without starting Ray."""
    if backend is not None:
        run_simulation(server_app=server_app, client_app=client_app,
                       num_supernodes=num_supernodes, backend_config=backend)
        return
    nodes = [{"partition-id": i, "num-partitions": num_supernodes}
             for i in range(num_supernodes)]
    with AppGrid(client_app, nodes, workers=2) as grid:
        server_app(grid, grid.context())


def test_signds_with_magrr_on_flower_matches_the_in_process_run():
    x, y = _digits()
    clients = partition(x[:900], y[:900], 3, seed=0)
    val = (x[1400:], y[1400:])
    out = {}
    # each client holds 300 rows: the server's bound is what they send
    client, server = signds_apps(clients, 300, out, rounds=3, clients_per_round=2,
                                 num_clients=3, local_epochs=2, validation_data=val)
    _simulate(client, server, 3, TWO_WORKERS)
    result = out["result"]
    assert_same_horizontal_run(result, clients, 300, rounds=3, clients_per_round=2,
                               local_epochs=2, validation_data=val)
    assert result.history["replies"] == [2.0, 2.0, 2.0] and result.rejected == []
    # SignDS on the wire: a sign and h indices per client, nothing else; Flower's framing
    # is the rest of what crosses
    h = SignDSEncoder(k=0.2, eps=10.0).output_dim(64 * 16 + 16 + 16 * 10 + 10)
    assert result.history["payload_bytes_up"] == [2.0 * (4 * h + 1)] * 3
    assert all(w > p for w, p in zip(result.history["wire_bytes_up"],
                                     result.history["payload_bytes_up"]))


def test_a_client_with_a_budget_refuses_the_reply_that_would_go_over_it(tmp_path, caplog,
                                                                         in_a_run):
    import json

    x, y = _digits()
    clients = partition(x[:900], y[:900], 3, seed=0)

    def upload_fn():
        return SignDSEncoder(k=0.2, eps=10.0, seed=5)

    out = {}
    # one SignDS release is eps 10; a second would compose to about 20 > 12
    client = horizontal_client_app(model_fn, lambda ctx: clients[ctx.node_config["partition-id"]],
                                   upload_fn, seed=1, max_epsilon=12.0,
                                   budget_path=lambda ctx: str(
                                       tmp_path / f"client-{ctx.node_config['partition-id']}.json"))
    # the two refused rounds fall below min_replies: a limit of 2 lets the run finish
    server = horizontal_server_app(model_fn, upload_fn, rounds=3, clients_per_round=3,
                                   num_clients=3, seed=1, max_failed_rounds=2,
                                   on_finish=lambda r: out.update(result=r))
    with caplog.at_level(logging.WARNING, logger="keras_fedpriv.flower"):
        _simulate(client, server, 3)
    result = out["result"]
    assert result.history["replies"] == [3.0, 0.0, 0.0]
    reasons = {r for _, _, r in result.rejected}
    assert reasons == {"error reply: the client's privacy budget is spent; it refused the "
                       "'train' message"}
    # the model is the one the first round made: nothing after it was released
    model = model_fn()
    HorizontalFL(model, clients, upload=upload_fn(), seed=1).fit(rounds=1, clients_per_round=3,
                                                                 verbose=0)
    for a, b in zip(model.get_weights(), result.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # each client's own file holds the one release it sent, for the next run's budget
    for i in range(3):
        (entry,) = json.loads((tmp_path / f"client-{i}.json").read_text())["entries"]
        assert [sum(k["units"].values()) for k in entry["ledger"]["kinds"]] == [1]


class _Tampered:
    """A client's upload scheme that sends something other than the scheme promises."""

    def __init__(self, inner, how):
        self.inner, self.how = inner, how

    def client_message(self, delta, num_examples, client_id=None):
        return self.inner.client_message(delta, num_examples, client_id=client_id)

    def privacy_protections(self):
        return [self.inner]

    def aggregate(self, uploads, global_lr=None):
        return self.inner.aggregate(uploads, global_lr)

    def to_wire(self, upload):
        arrays = dict(self.inner.to_wire(upload))
        if self.how == "nan":
            arrays["update"] = arrays["update"].copy()
            arrays["update"][3] = np.nan
        elif self.how == "crash":
            raise RuntimeError("this client crashed mid-round")
        return arrays


def test_a_malformed_and_a_crashing_client_are_dropped_and_the_round_completes(caplog,
                                                                               in_a_run):
    x, y = _digits()
    clients = partition(x[:1200], y[:1200], 4, seed=0)
    val = (x[1400:], y[1400:])

    def upload_for(context):
        how = {2: "nan", 3: "crash"}.get(context.node_config["partition-id"])
        return FedAvgUpload() if how is None else _Tampered(FedAvgUpload(), how)

    out = {}
    client = horizontal_client_app(model_fn, lambda ctx: clients[ctx.node_config["partition-id"]],
                                   upload_for, seed=0)
    server = horizontal_server_app(model_fn, FedAvgUpload, rounds=2, clients_per_round=4,
                                   num_clients=4, seed=0, validation_data=val,
                                   on_finish=lambda r: out.update(result=r))
    with caplog.at_level(logging.WARNING, logger="keras_fedpriv.flower"):
        _simulate(client, server, 4)
    result = out["result"]
    assert result.history["replies"] == [2.0, 2.0]
    assert result.history["dropped"] == [2.0, 2.0]
    reasons = {cid: reason for _, cid, reason in result.rejected}
    assert "NaN" in reasons[2] and "malformed upload" in reasons[2]
    assert reasons[3].startswith("error reply")
    assert "crashed mid-round" not in reasons[3]  # the client's exception text stays home
    assert "dropped the reply of client 2" in caplog.text
    weights = result.model.get_weights()
    assert all(np.isfinite(w).all() for w in weights)
    # the global model is what FedAvg of the two honest clients gives
    model = model_fn()
    fl = HorizontalFL(model, clients[:2], upload="fedavg", seed=0)
    history = fl.fit(rounds=2, clients_per_round=2, validation_data=val, verbose=0).history
    # per round first: if this ever fails, the message says from which round on they differ
    # (seen once, 2026-11-25, full suite with oneDNN off: Flower 0.343 / 0.385 against
    # in process 0.383 / 0.537; not reproduced in 8 runs since)
    assert np.allclose(result.history["val_accuracy"], history["val_accuracy"], atol=0.006), (
        f"val_accuracy per round on Flower {result.history['val_accuracy']} vs in process "
        f"{history['val_accuracy']}")
    for a, b in zip(model.get_weights(), weights):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert result.history["val_accuracy"][-1] > 0.5
    # the malformed reply still counts as a release of client 2 (it was sent)
    assert privacy_report(result, delta=1e-5).epsilon == float("inf")


# ------------------------------------------------ the apps' pieces, without starting Flower
class _Context:
    def __init__(self):
        from flwr.app import RecordDict

        self.state = RecordDict()


def test_a_clients_state_is_reloaded_on_every_message_so_no_worker_replays_noise():
    """Ray hands a node's messages to any free worker: a stale cached copy must not replay."""
    from keras_fedpriv.federated.flower.horizontal import _load_state, _save_state
    from keras_fedpriv.federated.horizontal.parties import HorizontalClient

    context = _Context()
    data = (np.zeros((4, 2), np.float32), np.zeros(4, np.int32))
    # the same client cached in two worker processes
    a, b = (HorizontalClient(None, data, GaussianUpload(1.0, 1.0, seed=3), client_id=0)
            for _ in range(2))
    delta = np.full(50, 0.01, np.float32)
    sent = []
    for party in (a, b, a):  # round 0 on worker A, round 1 on B, round 2 on A again
        _load_state(context, party)
        sent.append(party.upload.client_message(delta, 4, client_id=0).message)
        _save_state(context, party)
    assert not np.allclose(sent[0], sent[2]) and not np.allclose(sent[1], sent[2])
    state = json.loads(context.state["keras-fedpriv"]["upload"])[0]
    assert state["releases_by_unit"] == {"0": 3}


def test_a_long_lived_client_process_keeps_only_a_few_recent_runs(monkeypatch):
    """A party worker serves run after run: its cached models and clients stay at the few
    most recent runs, and a run that comes back after its entries were dropped resumes from
    its node state (its release counters go on; no noise is drawn twice)."""
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from keras_fedpriv.federated.horizontal import wire
    from keras_fedpriv.federated.horizontal.loop import TrainRequest
    from keras_fedpriv.federated.flower.horizontal import _caches
    from keras_fedpriv.federated.flower.recent_runs import DEFAULT_KEEP_RUNS

    for attr, value in (("_run_id", 7), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)
    x, y = _digits()
    app = horizontal_client_app(model_fn, lambda ctx: (x[:40], y[:40]),
                                lambda: GaussianUpload(1.0, 1.0, seed=3), seed=0)
    runs = list(range(9100, 9100 + DEFAULT_KEEP_RUNS + 3))
    contexts = {run: Context(run_id=run, node_id=5, node_config={"partition-id": 0},
                             state=RecordDict(), run_config={}) for run in runs}

    order = TrainRequest(round=0, client_ids=[0], local_epochs=1,
                         weights=model_fn().get_weights(), batch_norm=[], magrr_cut=None)

    def send(run, kind):
        content = wire.query_content() if kind == "query" else wire.train_content(order)
        reply = app(Message(content, dst_node_id=5, message_type=kind), contexts[run])
        assert not reply.has_error(), reply.error.reason

    def cached_runs():
        trainers, clients = _caches()
        return {k[0] for k in trainers} | {k[0] for k in clients}

    def releases(run):
        return json.loads(contexts[run].state["keras-fedpriv"]["upload"])[0]["releases_by_unit"]

    try:
        send(runs[0], "train")
        for run in runs[1:]:
            send(run, "query")
            assert run in cached_runs() and len(cached_runs()) <= DEFAULT_KEEP_RUNS
        assert cached_runs() == set(runs[-DEFAULT_KEEP_RUNS:])  # the first run's went
        send(runs[0], "train")  # it comes back: rebuilt from its node state
        assert releases(runs[0]) == {"0": 2}
        assert len(cached_runs()) <= DEFAULT_KEEP_RUNS and runs[0] in cached_runs()
    finally:
        for cache in _caches():
            for key in [k for k in cache if k[0] in runs]:
                del cache[key]


def _server():
    from keras_fedpriv.federated.horizontal.parties import HorizontalServer

    return HorizontalServer(model_fn(), SignDSUpload(SignDSEncoder(k=0.2, eps=10.0)))


def _good_content(server):
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    scheme = server.upload
    delta = np.random.default_rng(0).normal(size=server.dim).astype(np.float32)
    wire = scheme.to_wire(scheme.client_message(delta, 10))
    return RecordDict({"upload": ArrayRecord({k: Array(v) for k, v in wire.items()}),
                       "config": ConfigRecord({"client-id": 0})})


@pytest.mark.parametrize("tamper, match", [
    (lambda c: c.__setitem__("extra", c["config"]), "exactly the records"),
    (lambda c: c.__setitem__("upload", c["config"]), "ArrayRecord"),
    (lambda c: c["config"].__setitem__("magrr-report", 1), "exactly"),
    (lambda c: c["upload"].__setitem__("pad", __import__("flwr").app.Array(
        np.zeros(10**6, np.float64))), "more than"),
    (lambda c: c.__delitem__("config"), "exactly the records"),
])
def test_the_server_parses_a_malicious_reply_without_deserializing_or_crashing(tamper, match):
    from keras_fedpriv.federated.horizontal.wire import parse_train_reply

    server = _server()
    content = _good_content(server)
    assert parse_train_reply(Reply(content), server, False, "average").upload.nbytes > 0
    tamper(content)
    with pytest.raises(MalformedMessage, match=match):
        parse_train_reply(Reply(content), server, False, "average")


def test_a_client_id_claimed_twice_or_missing_takes_no_part():
    from flwr.app import ConfigRecord, RecordDict

    from keras_fedpriv.federated.flower.strategy import _client_ids

    def claim(node, cid):
        return Reply(RecordDict({"config": ConfigRecord({} if cid is None else
                                                         {"client-id": cid})}), node)

    class Sent:  # a query as a grid that gives messages no ids leaves it
        def __init__(self, node):
            self.metadata = type("Metadata", (), {"message_id": "", "dst_node_id": node})()

    replies = [claim(10, 0), claim(11, 1), claim(12, 1), claim(13, None), claim(14, -2),
               claim(15, "x"), Reply(None, 16, error=True)]
    claims = _client_ids([Sent(n) for n in range(10, 17)], replies)
    assert claims == {10: 0, 11: 1, 12: 1, 13: None, 14: None, 15: None, 16: None}
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=1)
    strategy.claims = claims
    assert strategy._claimed(range(10, 17)) == {0: 10}  # client 1: two nodes, neither


def test_the_example_client_takes_its_scheme_from_its_own_node_config_not_the_run_config():
    sys.path.insert(0, str(APP.parent.parent / "examples" / "flower_horizontal"))
    try:
        from flower_horizontal import task
    finally:
        sys.path.pop(0)

    class Ctx:
        run_config = {"upload": "fedavg"}  # the server's side asks for no protection
        node_config = {"partition-id": 0}

    assert isinstance(task.client_upload_fn(Ctx()), SignDSEncoder)
    assert task.client_eps_rr(Ctx()) == task.EPS_RR
    assert task.server_upload_fn(Ctx()) == "fedavg"  # its replies would then be dropped


@pytest.mark.parametrize("report, match", [
    (np.zeros((3, 10), np.float32), "float64"),
    (np.zeros((3, 9)), r"shape \(n, 10\)"),
    (np.zeros((0, 10)), "non-empty"),
    (np.full((3, 10), np.inf), "NaN or infinity"),
])
def test_the_server_drops_a_malformed_laplace_report(report, match):
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    from keras_fedpriv.federated.horizontal.wire import parse_report as _parse_report

    good = RecordDict({"report": ArrayRecord({"report": Array(np.zeros((3, 10)))}),
                       "config": ConfigRecord({"client-id": 0})})
    assert _parse_report(Reply(good), 10).shape == (3, 10)
    bad = RecordDict({"report": ArrayRecord({"report": Array(report)}),
                      "config": ConfigRecord({"client-id": 0})})
    with pytest.raises(MalformedMessage, match=match):
        _parse_report(Reply(bad), 10)
