"""Vertical FL on Flower's apps gives what `VerticalDriver` gives in one process.

A leader (ServerApp: labels with LabelDP, its own bottom, the top) and two followers
(ClientApps: a bottom with EmbeddingDP each) on the bundled breast-cancer data. Also: what a
follower sends is packed bits only, and malformed or failed replies are never used.

The first test runs on Flower's Simulation Engine (Ray, two worker processes); the others
run the same apps in this process on a stand-in SuperLink (`flower_stubs.AppGrid`, two
stand-in workers, so each follower reloads its node state as on the engine): what they test
is the apps' handling, and a Ray cluster per test would make them run one after another for
minutes (the Simulation Engine's tests share one xdist group).
"""

import logging
import os
from pathlib import Path

import keras
import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.simulation import run_simulation  # noqa: E402

import keras_fedpriv as kf  # noqa: E402
from keras_fedpriv.datasets import breast_cancer_vertical  # noqa: E402
from keras_fedpriv.federated import VerticalModel  # noqa: E402
from keras_fedpriv.federated.flower.vertical import (  # noqa: E402
    vertical_client_app,
    vertical_server_app,
)
from keras_fedpriv.federated.vertical.driver import VerticalDriver  # noqa: E402
from keras_fedpriv.federated.vertical.loop import UntrainedEpoch  # noqa: E402
from keras_fedpriv.privacy import privacy_report  # noqa: E402

from flower_stubs import (  # noqa: E402
    TWO_WORKERS,
    AppGrid,
    assert_same_vertical_model,
    follower_arrays,
)

pytestmark = [pytest.mark.flower, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = {"f1": slice(0, 8), "f2": slice(8, 15)}
XA, XB, Y, XA_T, XB_T, Y_T = breast_cancer_vertical()
N = len(Y)
IDS, IDS_T = np.arange(N), np.arange(N, N + len(Y_T))
FEATURES = np.concatenate([XA, XA_T])  # the followers hold every row, train and test
RUN = {"epochs": 2, "batch_size": 64, "seed": 1}


def model_fn():
    """The same model in every process: leader 'lead' with its own bottom, followers f1, f2.

    Seeded initializers: the ServerApp builds its model in a thread of the Simulation Engine,
    where the global random state (``keras.utils.set_random_seed``) is shared with the engine's
    own threads."""
    seeds = iter(range(100))

    def dense(units, **kwargs):
        init = keras.initializers.GlorotUniform(seed=next(seeds))
        return keras.layers.Dense(units, kernel_initializer=init, **kwargs)

    def bottom(k, name):
        return keras.Sequential([keras.Input((k,)), dense(8, activation="relu"), dense(4)],
                                name=name)

    bottoms = {"f1": bottom(8, "b1"), "f2": bottom(7, "b2"), "lead": bottom(15, "b3")}
    top = keras.Sequential([keras.Input((12,)), dense(8, activation="relu"),
                            dense(1, activation="sigmoid")])
    model = VerticalModel(bottoms, top, leader="lead",
                          embedding_dp=kf.EmbeddingDPLayer(eps=4.0, seed=3),
                          label_dp=kf.LabelDPLayer(eps=2.0, seed=4))
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
    return model


def leader_fn():
    return model_fn().split_parties(metrics=[keras.metrics.AUC(name="auc")]).leader


def follower_data(party):
    return FEATURES[:, COLUMNS[party]]


def _tampering(follower):
    """f2 answers the training batch holding example 5 with int16 'bits', the one holding
    example 300 with one row short, and fails on the one holding example 150 (keyed by the
    batch's ids, so every process and runtime tampers the same batches)."""
    if follower.name != "f2":
        return follower
    embed = follower.embed

    def tampered(x, example_ids=None, training=True, **kwargs):
        if training and 150 in example_ids:
            raise RuntimeError("a follower crash quoting its data: 0.123456")
        message = embed(x, example_ids, training, **kwargs)
        if training and 5 in example_ids:
            return {"bits": message["bits"].astype(np.int16)}
        if training and 300 in example_ids:
            return {"bits": message["bits"][:-1]}
        return message

    follower.embed = tampered
    return follower


def _save_follower(folder):
    def on_finish(follower):
        np.savez(os.path.join(folder, f"{follower.name}.npz"), *follower_arrays(follower))
    return on_finish


# in one process: no real wait for a follower between two looks
_NO_WAIT = {"connect_timeout": 5, "poll_interval": 0.01}


def _serve(server, client, backend):
    """Run ``server`` and ``client`` with two nodes: on Flower's Simulation Engine with the
    ``backend`` config, or (``backend=None``) in this process on the stand-in SuperLink
    `AppGrid`, with two stand-in worker processes (so each follower also reloads its node
    state), which tests the apps' handling without starting Ray."""
    if backend is not None:
        run_simulation(server_app=server, client_app=client, num_supernodes=2,
                       backend_config=backend)
        return
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    with AppGrid(client, nodes, workers=2) as grid:
        server(grid, grid.context())


def _run_on_flower(tmp_path, monkeypatch, tamper=False, shuffle=True, backend=None, **run):
    # the Simulation Engine's worker processes import this checkout's package
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    out = {}

    def make_follower(party):
        follower = model_fn().split_parties().followers[party]
        return _tampering(follower) if tamper else follower

    client = vertical_client_app(make_follower, follower_data, parties=["f1", "f2"],
                                 on_finish=_save_follower(str(tmp_path)))
    server = vertical_server_app(leader_fn, lambda: (IDS, XB, Y), shuffle=shuffle,
                                 validation_fn=lambda: (IDS_T, XB_T, Y_T),
                                 on_finish=lambda r: out.update(result=r),
                                 **{**RUN, **(_NO_WAIT if backend is None else {}), **run})
    _serve(server, client, backend)
    return out["result"]


def _run_in_process(tamper=False, shuffle=True, **run):
    parties = model_fn().split_parties(metrics=[keras.metrics.AUC(name="auc")])
    if tamper:
        _tampering(parties.followers["f2"])
    driver = VerticalDriver(parties, {p: follower_data(p) for p in COLUMNS})
    result = driver.fit(Y, example_ids=IDS, x=XB, shuffle=shuffle,
                        validation_data=(IDS_T, Y_T, XB_T), **{**RUN, **run})
    return parties, result


def _assert_same_model(flower, local, parties, folder):
    saved = {p: np.load(os.path.join(folder, f"{p}.npz")) for p in parties.followers}
    assert_same_vertical_model(flower, local, parties, {
        p: [f[f"arr_{i}"] for i in range(len(f.files))] for p, f in saved.items()})


def test_vertical_on_flower_matches_the_in_process_driver(tmp_path, monkeypatch):
    flower = _run_on_flower(tmp_path, monkeypatch, backend=TWO_WORKERS)
    parties, local = _run_in_process()
    _assert_same_model(flower, local, parties, str(tmp_path))
    # the model improves
    assert flower.history["loss"][-1] < flower.history["loss"][0]
    assert flower.history["val_auc"][-1] > 0.9
    assert flower.rejected == [] and flower.history["skipped"] == [0.0, 0.0]
    # each follower's message is what EmbeddingDP promises: packed bits only, one uint8 byte
    # per example for a 4-coordinate embedding; Flower's framing is the rest of the wire
    assert flower.wire == {p: {"keys": ["bits"], "dtype": "uint8", "bytes_per_example": 1}
                           for p in COLUMNS}
    assert flower.history["bytes_up_f1"] == [float(N)] * 2
    assert flower.history["bytes_down_f1"] == [N * 4 * 4.0] * 2
    assert all(w > b for w, b in zip(flower.history["wire_bytes_up"],
                                     flower.history["bytes_up"]))
    # the leader's ledger: its labels, released once per example by LabelDP
    assert privacy_report(flower.leader, delta=1e-5).epsilon == pytest.approx(
        privacy_report(local.leader, delta=1e-5).epsilon)
    assert privacy_report(flower.leader, delta=1e-5, protects="labels").epsilon == \
        pytest.approx(kf.LabelDPLayer(eps=2.0).epsilon, rel=1e-3)


def test_several_batches_per_message_on_flower_match_the_in_process_driver(tmp_path,
                                                                          monkeypatch, in_a_run):
    """K = 3 batches per message (7 steps an epoch: messages of 3, 3 and 1 batches): the
    followers keep a queue of batches awaiting gradients in their node state between
    messages, and both runtimes still compute the same model and count the same bytes."""
    flower = _run_on_flower(tmp_path, monkeypatch, batches_per_message=3)
    parties, local = _run_in_process(batches_per_message=3)
    _assert_same_model(flower, local, parties, str(tmp_path))
    assert flower.rejected == [] and flower.history["steps"] == [7.0, 7.0]
    assert flower.history["bytes_up_f1"] == [float(N)] * 2
    assert flower.history["val_auc"][-1] > 0.9
    # the equality above could fail: K = 3 trains another model than K = 1 at that tolerance
    synchronous, _ = _run_in_process()
    for p in ("f1", "f2"):
        a, b = (x.followers[p].trainable_variables[0].numpy() for x in (parties, synchronous))
        assert not np.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_malformed_and_failed_replies_on_flower_are_refused_as_in_process(tmp_path, monkeypatch,
                                                                          caplog, in_a_run):
    logger = logging.getLogger("keras_fedpriv.vertical")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="keras_fedpriv.vertical"):
            flower = _run_on_flower(tmp_path, monkeypatch, tamper=True, shuffle=False)
    finally:
        logger.removeHandler(caplog.handler)
    parties, local = _run_in_process(tamper=True, shuffle=False)
    # batches 0 (ids 0-63), 2 (128-191) and 4 (256-319) of both epochs were refused
    reasons = {(e, s): r for e, s, p, r in flower.rejected if p == "f2"}
    assert sorted(reasons) == [(e, s) for e in (0, 1) for s in (0, 2, 4)]
    assert {p for _, _, p, _ in flower.rejected} == {"f2"}
    assert "uint8" in reasons[(0, 0)] and "shape" in reasons[(0, 4)]
    assert reasons[(0, 2)] == "error reply: RuntimeError (details stay with the follower)"
    assert "0.123456" not in str(flower.rejected)  # a follower's error text stays with it
    assert flower.rejected == local.rejected
    assert flower.history["skipped"] == [3.0, 3.0]
    assert "the reply of follower 'f2' was not used" in caplog.text
    # nothing refused was used: both runtimes skipped the same batches and agree
    _assert_same_model(flower, local, parties, str(tmp_path))


def test_a_follower_with_a_budget_refuses_the_embeddings_that_would_go_over_it(
        tmp_path, monkeypatch, in_a_run):
    import json

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    from keras_fedpriv.mechanisms.events import pure_epsilon

    one = pure_epsilon(kf.EmbeddingDPLayer(eps=4.0).dp_event(4))  # one 4-coordinate release
    out = {}
    # every example may be embedded once: the second epoch's embeddings are refused
    client = vertical_client_app(lambda party: model_fn().split_parties().followers[party],
                                 follower_data, parties=["f1", "f2"], max_epsilon=1.5 * one,
                                 budget_path=lambda ctx: str(
                                     tmp_path / f"follower-{ctx.node_config['partition-id']}"
                                                ".json"))
    server = vertical_server_app(leader_fn, lambda: (IDS, XB, Y), shuffle=False,
                                 on_epoch_end=lambda e, logs: out.setdefault("skipped", []).append(
                                     logs["skipped"]), **RUN, **_NO_WAIT)
    # an epoch that trains nothing stops the run, naming the followers and why
    with pytest.raises(UntrainedEpoch, match=r"^epoch 2 trained no step: .*follower 'f1' \(node "
                                             r"\d+\): error reply: BudgetExhausted: the "
                                             r"follower's privacy budget is spent; follower 'f2'"):
        _serve(server, client, None)
    batches = -(-N // RUN["batch_size"])
    assert out["skipped"] == [0.0, float(batches)]
    # each follower's own file (one entry for the run, numbered by the last of the batches
    # sent): every training example released once, none twice
    for i in range(2):
        entries = json.loads((tmp_path / f"follower-{i}.json").read_text())["entries"]
        assert [e["release"] + 1 for e in entries] == [batches]
        ledger = kf.privacy.PrivacyBudget(1.0, path=str(tmp_path / f"follower-{i}.json"),
                                          per_record=True).past().to_dict()
        counts = [c for k in ledger["kinds"] for c in k["units"].values()]
        assert len(counts) == N and set(counts) == {1}


@pytest.mark.parametrize("example", ["flower_horizontal", "flower_vertical"])
def test_the_example_apps_components_are_the_flower_apps_they_name(example, monkeypatch):
    """Each example's pyproject names a ServerApp and a ClientApp that import and exist."""
    import importlib
    import sys
    import tomllib

    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    folder = ROOT / "examples" / example
    config = tomllib.loads((folder / "pyproject.toml").read_text())
    components = config["tool"]["flwr"]["app"]["components"]
    monkeypatch.syspath_prepend(str(folder))
    for key, kind in (("serverapp", ServerApp), ("clientapp", ClientApp)):
        module, _, name = components[key].partition(":")
        app = getattr(importlib.import_module(module), name)
        assert isinstance(app, kind), components[key]
    for module in [m for m in sys.modules if m.startswith(example)]:
        del sys.modules[module]
    assert (folder / "run_loopback.py").exists()


def test_the_vertical_example_keeps_each_partys_secrets_unseeded():
    """The example draws every protection's key from OS entropy: no seed in any party."""
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "flower_vertical"))
    try:
        from flower_vertical import task
    finally:
        sys.path.pop(0)
    parties = task.model_fn().split_parties()
    assert parties.leader.label_dp.seed is None
    assert all(f.protection.seed is None for f in parties.followers.values())
    # each follower's columns are its own, and together the follower block
    cols = sorted(i for s in task.FOLLOWERS.values() for i in range(15)[s])
    assert cols == list(range(15))
    assert task.follower_features("f1").shape[1] == 8


def test_the_vertical_example_serves_the_criteo_like_wide_deep_parties(tmp_path, monkeypatch,
                                                                        in_a_run, capsys):
    """Run config ``dataset = "criteo-like"``: the example's own apps (in this process on the
    stand-in SuperLink, 2,048 rows) train `wide_deep_vertical`'s split model from the same
    initial weights as in process; a wrong party name and a bad key are refused by name."""
    import importlib
    import json
    import sys
    from types import SimpleNamespace

    from keras_fedpriv.criteo_like import CriteoLike
    from keras_fedpriv.wide_deep import wide_deep_vertical

    monkeypatch.syspath_prepend(str(ROOT / "examples" / "flower_vertical"))
    task = importlib.import_module("flower_vertical.task")
    party = importlib.import_module("flower_vertical.party")
    server = importlib.import_module("flower_vertical.server_app")
    run = {"dataset": "criteo-like", "rows": 2048, "test-rows": 512, "protect": False,
           "num-epochs": 1, "batch-size": 512, "batches-per-message": 2,
           "result-path": str(tmp_path)}
    try:
        context = SimpleNamespace(run_config=run)
        model = task.model_fn(context=context)
        local = wide_deep_vertical(CriteoLike(2048, seed=0), seed=0)
        parties = model.split_parties()
        assert parties.leader.label_dp is None and parties.followers["follower"].protection is None
        for a, b in zip(model.trainable_variables, local.trainable_variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        # the follower's 13 fields of the training and test rows; the leader's by the same ids
        assert task.follower_features("follower", context).shape == (2560, 13)
        ids, x, y = task.leader_data(context)
        assert list(ids) == list(range(2048)) and x.shape == (2048, 26) and y.shape == (2048, 1)
        with AppGrid(party.app, [{"party": "follower"}]) as grid:
            for node in grid.nodes.values():  # a SuperNode's context holds the run config
                node.run_config = dict(run)
            server.app(grid, grid.context(run))
        history = json.loads((tmp_path / "history.json").read_text())["history"]
        assert history["steps"] == [4.0] and history["skipped"] == [0.0]
        assert 0.0 <= history["val_auc"][0] <= 1.0
        assert "val_auc per epoch" in capsys.readouterr().out
        for bad, words in (({"dataset": "criteo"}, "`dataset` must be one of breast-cancer, "
                                                   "criteo-like; got 'criteo'"),
                           ({"rows": 0}, "`rows` must be an integer >= 1; got 0"),
                           ({"protect": "no"}, "`protect` must be true or false; got 'no'")):
            with pytest.raises(ValueError, match=words):
                task.run_data(SimpleNamespace(run_config={**run, **bad}))
        with pytest.raises(ValueError, match="`party` must be one of follower .* got 'f1'"):
            party._follower("f1", context)
    finally:
        for module in [m for m in sys.modules if m.startswith("flower_vertical")]:
            del sys.modules[module]


def test_a_follower_refuses_a_message_of_more_batches_than_its_node_config_allows(monkeypatch):
    """The follower's operator caps K (node config ``max-batches-per-message``): a message of 3
    batches is answered with an error and releases nothing; 2 batches are served, and the
    next message's 2 gradients are applied from the node state (a new message, a new call)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from keras_fedpriv.federated.flower.vertical import _followers

    for attr, value in (("_run_id", 7), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)
    app = vertical_client_app(lambda party: model_fn().split_parties().followers[party],
                              follower_data, max_batches_per_message=8)
    context = Context(run_id=7, node_id=3, node_config={"party": "f1",
                                                        "max-batches-per-message": 2},
                      state=RecordDict(), run_config={})

    def send(ids=None, gradients=None):
        content = RecordDict({"config": ConfigRecord({"epoch": 0, "step": 0})})
        if ids is not None:
            content["ids"] = ArrayRecord({f"{i}/ids": Array(np.asarray(a, np.int64))
                                          for i, a in enumerate(ids)})
        if gradients is not None:
            content["gradient"] = ArrayRecord({f"{i}/gradient": Array(g)
                                               for i, g in enumerate(gradients)})
        return app(Message(content, dst_node_id=3, message_type="train"), context).content

    try:
        refused = send([np.arange(4), np.arange(4, 8), np.arange(8, 12)])
        assert "at most 2" in refused["error"]["reason"]
        served = send([np.arange(4), np.arange(4, 7)])
        assert sorted(served["embedding"].keys()) == ["0/bits", "1/bits"]
        follower = _followers()[(7, 3)].follower
        assert int(follower.protection.release_totals.numpy()[0]) == 2  # the refused: none
        assert follower.pending_batches == 2
        done = send(gradients=[np.ones((4, 4), np.float32), np.ones((3, 4), np.float32)])
        assert "error" not in done and not follower.pending
    finally:
        _followers().pop((7, 3), None)


def test_a_long_lived_follower_process_keeps_only_a_few_recent_runs(monkeypatch):
    """A party worker serves run after run: its cached followers stay at the few most recent
    runs, and a run that comes back after its follower was dropped resumes from its node
    state (the gradient of its waiting batch is applied; no release is counted twice)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from keras_fedpriv.federated.flower.recent_runs import DEFAULT_KEEP_RUNS
    from keras_fedpriv.federated.flower.vertical import _followers

    for attr, value in (("_run_id", 7), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)
    app = vertical_client_app(lambda party: model_fn().split_parties().followers[party],
                              follower_data)
    runs = list(range(8100, 8100 + DEFAULT_KEEP_RUNS + 3))
    contexts = {run: Context(run_id=run, node_id=3, node_config={"party": "f1"},
                             state=RecordDict(), run_config={}) for run in runs}

    def send(run, key, array):
        content = RecordDict({"config": ConfigRecord({"epoch": 0, "step": 0}),
                              key: ArrayRecord({f"0/{key}": Array(array)})})
        reply = app(Message(content, dst_node_id=3, message_type="train"), contexts[run])
        assert "error" not in reply.content
        return reply.content

    try:
        for run in runs:
            assert "embedding" in send(run, "ids", np.arange(4, dtype=np.int64))
            cached = {k[0] for k in _followers()}
            assert run in cached and len(cached) <= DEFAULT_KEEP_RUNS
        assert {k[0] for k in _followers()} == set(runs[-DEFAULT_KEEP_RUNS:])
        send(runs[0], "gradient", np.ones((4, 4), np.float32))  # back, from its node state
        follower = _followers()[(runs[0], 3)].follower
        assert not follower.pending  # the waiting batch came back with the state, and is done
        assert int(follower.protection.release_totals.numpy()[0]) == 1
    finally:
        for key in [k for k in _followers() if k[0] in runs]:
            _followers().pop(key, None)
