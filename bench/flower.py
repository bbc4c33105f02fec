"""One horizontal-FL workload in one process, on Flower's Simulation Engine and on its Deployment Engine.

The workload of ``examples/flower_horizontal`` (digits split among 3
clients, its softmax regression 64 -> 10, every client every round, 2 local
epochs), with FedAvg and with the example's SignDS + MagRR, run three ways in the
same run:

1. `HorizontalFL` (one process, the baseline);
2. Flower's Simulation Engine (`flwr.simulation.run_simulation`, Ray) with
   ``horizontal_client_app`` / ``horizontal_server_app``;
3. Flower's Deployment Engine on loopback: a SuperLink and 3 SuperNodes as
   separate processes (`LoopbackDeployment`), ``flwr run`` of the seeded test
   app ``tests/flower_app`` (digits among 3 clients, MLP 64-16-10, FedAvg),
   three ways: Flower's floor (an empty ClientApp that answers at once, with a
   ServerApp that only exchanges the same messages:
   ``tests/flower_app/floor``), our horizontal app with a new ClientApp process
   per message (no worker), and with one party worker per SuperNode
   (``keras-fedpriv worker``; the relay ClientApp hands it each message).

4. The vertical example (``examples/flower_vertical``) on the Deployment Engine
   with a party worker per follower, with its defaults (batch 32, K = 13) and
   with more steps per message through the run config only (batch 8, K = 50):
   seconds per training step amortized over the epochs, message rounds per
   epoch, val AUC and the leader's eps.

Reported per runtime and scheme: seconds per round (ratio to `HorizontalFL`),
the upload payload per round (what the scheme sends: the dense update, or a
sign and h indices) and what Flower's messages take (`message_nbytes`: the
serialized message with its metadata, before HTTP/TLS framing), up and down.

Usage::

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/flower.py            # updates docs
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/flower.py --quick    # smoke run, no docs
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/flower.py --only vertical  # its rows, no docs

``--quick`` runs the in-process baseline and a party worker in this process
(the relay's round trip per message on the test app), no Flower processes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = pathlib.Path(__file__).resolve().parent.parent
APP = REPO / "examples" / "flower_horizontal"
VERTICAL = REPO / "examples" / "flower_vertical"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(APP))
TEST_APP = REPO / "tests" / "flower_app"

import _report  # noqa: E402
from flower_horizontal import task  # noqa: E402

from keras_fedpriv.callbacks import MagRR  # noqa: E402
from keras_fedpriv.federated import HorizontalFL  # noqa: E402

NUM_CLIENTS, LOCAL_EPOCHS, R_INIT = 3, 2, 1e-2


class _Context:
    """What the example's task functions read from a Flower Context."""

    def __init__(self, upload):
        self.run_config = self.node_config = {"upload": upload}


def _magrr(upload):
    return MagRR(eps_rr=task.EPS_RR, r_init=R_INIT) if upload == "signds" else None


def in_process(upload, rounds):
    clients = [task.client_data(i, NUM_CLIENTS) for i in range(NUM_CLIENTS)]
    fl = HorizontalFL(task.model_fn(), clients, upload=task.client_upload_fn(_Context(upload)))
    magrr = _magrr(upload)
    h = fl.fit(rounds=rounds, clients_per_round=NUM_CLIENTS, local_epochs=LOCAL_EPOCHS,
               validation_data=task.server_validation_data(), verbose=0,
               callbacks=[magrr] if magrr else [])
    return {"round_time_s": h.history["round_time_s"],
            "payload_bytes_up": h.history["upload_bytes"],
            "val_accuracy": h.history["val_accuracy"]}


def simulation(upload, rounds):
    from flwr.simulation import run_simulation

    from keras_fedpriv.federated.flower import horizontal_client_app, horizontal_server_app

    out = {}
    eps_rr = task.EPS_RR if upload == "signds" else None
    client = horizontal_client_app(
        task.model_fn, lambda c: task.client_data(int(c.node_config["partition-id"]),
                                                  NUM_CLIENTS),
        lambda: task.client_upload_fn(_Context(upload)), eps_rr=eps_rr)
    server = horizontal_server_app(
        task.model_fn, lambda: task.server_upload_fn(_Context(upload)), rounds=rounds,
        clients_per_round=NUM_CLIENTS, local_epochs=LOCAL_EPOCHS, num_clients=NUM_CLIENTS,
        magrr=lambda context: _magrr(upload), validation_data=task.server_validation_data(),
        on_finish=lambda r: out.update(history=r.history))
    started = time.perf_counter()
    run_simulation(server_app=server, client_app=client, num_supernodes=NUM_CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    out["history"]["total_s"] = [time.perf_counter() - started]
    return out["history"]


def deployment(app, rounds, worker=False):
    """One ``flwr run`` of ``app`` on a fresh loopback deployment of 3 SuperNodes.

    Returns the run's history (``round_time_s``) and, with ``worker``, the
    workers' per-message handling times in ms (from their logs).
    """
    from keras_fedpriv.federated.flower.loopback import LoopbackDeployment

    with tempfile.TemporaryDirectory() as folder:
        nodes = [{"partition-id": i, "num-partitions": NUM_CLIENTS} for i in range(NUM_CLIENTS)]
        extra = ({"worker_app": "kfp_test_app.apps:client", "worker_app_dir": str(TEST_APP)}
                 if worker else {})
        with LoopbackDeployment(NUM_CLIENTS, node_configs=nodes, **extra) as dep:
            done = dep.run(app, {"num-server-rounds": rounds, "clients-per-round": NUM_CLIENTS,
                                 "result-path": folder}, timeout=900)
            logs = "".join(dep.log(f"worker-{i}") for i in range(NUM_CLIENTS)) if worker else ""
        if done.returncode != 0:
            raise RuntimeError(f"flwr run failed:\n{done.stdout[-3000:]}")
        history = json.loads(pathlib.Path(folder, "history.json").read_text())["history"]
    handled = [float(m) for m in re.findall(r"handled train \(run \d+\) in ([\d.]+) ms", logs)]
    return history, handled


def vertical_deployment(run_config=None, parties=("f1", "f2")):
    """The vertical example (`examples/flower_vertical`, its run config's defaults with
    ``run_config``'s overrides) on loopback with a party worker beside each follower's SuperNode.

    Args:
        run_config: run config overrides.
        parties: the followers' names, one SuperNode (and worker) each (the Criteo-like
            data's follower is ``("follower",)``).

    Returns:
        A dict: ``history`` (per epoch: ``epoch_time_s``, ``steps``, ``loss``, ``val_auc``
        with held-out rows, ``wire_bytes_up`` / ``wire_bytes_down``), ``wire`` (each
        follower's reply layout, ``bytes_per_example``), ``k`` (the run's K), ``eps`` (the
        leader's composed eps from its privacy report; None if absent), ``up_s`` (seconds
        until the deployment was up) and ``total_s`` (the whole run, start-up included).
    """
    import tomllib

    from keras_fedpriv.federated.flower.loopback import LoopbackDeployment

    config = tomllib.loads((VERTICAL / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    relay = config["components"]["clientapp"]
    run_config = dict(run_config or {})
    k = int(run_config.get("batches-per-message", config["config"]["batches-per-message"]))
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        # the worker serves what the app's relay ClientApp names (client_app.py: party.py's app)
        target = _relay_target(relay)
        with LoopbackDeployment(len(parties), node_configs=[{"party": p} for p in parties],
                                worker_app=target, worker_app_dir=str(VERTICAL)) as dep:
            up = time.perf_counter() - started
            done = dep.run(VERTICAL, {**run_config, "result-path": folder}, timeout=900)
        total = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"flwr run failed:\n{done.stdout[-3000:]}")
        saved = json.loads(pathlib.Path(folder, "history.json").read_text())
    # the last line of the leader's privacy report: "worst unit, all releases ... <eps>"
    eps = re.findall(r"worst unit, all releases.*?([\d.]+(?:e[+-]?\d+)?)[ \t]*$", done.stdout,
                     re.MULTILINE)
    return {"history": saved["history"], "wire": saved["wire"], "k": k,
            "eps": float(eps[-1]) if eps else None, "up_s": up, "total_s": total}


def _relay_target(component):
    """The ClientApp a relay ClientApp (``"module:attr"`` of the vertical app) hands to."""
    import importlib

    sys.path.insert(0, str(VERTICAL))
    try:
        module, _, attr = component.partition(":")
        return getattr(importlib.import_module(module), attr).target
    finally:
        sys.path.remove(str(VERTICAL))


# the example's defaults (batch 32: 13 steps per epoch, K = 13), then more steps per message
# through the run config only (batch 8: 50 steps per epoch, all in one message, K = 50)
VERTICAL_RUNS = (("batch 32 (defaults)", {}),
                 ("batch 8", {"batch-size": 8, "batches-per-message": 50}))


def vertical_rows():
    """One row per run of `VERTICAL_RUNS`: the vertical example with party workers, s per
    training step amortized, message rounds per epoch, val AUC and the leader's eps."""
    rows = []
    for name, run_config in VERTICAL_RUNS:
        run = vertical_deployment(run_config)
        h, k, eps, up, total = (run[key] for key in ("history", "k", "eps", "up_s", "total_s"))
        steps, epoch_s = sum(h["steps"]), sum(h["epoch_time_s"])
        later = (sum(h["epoch_time_s"][1:]) / sum(h["steps"][1:])) if len(h["steps"]) > 1 \
            else None
        # training rounds (K batches each; the last gradients ride on the validation round)
        # plus the validation round, as bench/vertical_k.py counts them
        rounds = math.ceil(h["steps"][0] / k) + 1
        rows.append([f"vertical example, party workers, {name}, K = {k}",
                     f"{len(h['steps'])} x {int(h['steps'][0])}", str(rounds),
                     f"{epoch_s / steps:.2f}", "-" if later is None else f"{later:.2f}",
                     f"{total:.0f} ({up:.0f})", f"{h['val_auc'][-1]:.3f}",
                     "-" if eps is None else f"{eps:.3g}"])
        print(" | ".join(rows[-1]), flush=True)
    return rows


def vertical_table():
    """The vertical rows as a markdown table (runs the deployments)."""
    return _report.markdown_table(
        ["Deployment Engine, leader + 2 followers on loopback", "epochs x steps",
         "message rounds / epoch", "s / step (all epochs)", "s / step (after the first epoch)",
         "whole run s (start-up)", "val AUC", "leader eps (labels, delta 1e-5)"],
        vertical_rows())


def worker_in_process(messages):
    """A party worker in a thread of this process serving the test app; the relay's round
    trip (serialize, socket, handle, reply) per train message, in ms, after the first."""
    import threading

    from flwr.app import ArrayRecord, ConfigRecord, Context, Metadata, RecordDict
    from flwr.app.message.message import make_message

    from keras_fedpriv.federated.flower.worker import PartyWorker, relay_client_app

    folder = tempfile.mkdtemp(prefix="kfpw-")
    worker = PartyWorker("kfp_test_app.apps:client", os.path.join(folder, "w.sock"),
                         app_dir=TEST_APP).listen()
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    from kfp_test_app import apps

    relay, weights = relay_client_app("kfp_test_app.apps:client"), apps.model_fn().get_weights()
    context = Context(run_id=1, node_id=1, state=RecordDict(), run_config={},
                      node_config={"partition-id": 0, "worker-socket": str(worker.socket_path)})
    times = []
    try:
        for r in range(messages):
            meta = Metadata(run_id=1, message_id=f"m{r}", src_node_id=0, dst_node_id=1,
                            reply_to_message_id="", group_id=str(r), created_at=time.time(),
                            ttl=600.0, message_type="train")
            msg = make_message(metadata=meta, content=RecordDict({
                "weights": ArrayRecord(numpy_ndarrays=weights),
                "config": ConfigRecord({"round": r, "local-epochs": 2})}))
            started = time.perf_counter()
            if relay(msg, context).has_error():
                raise RuntimeError("the worker answered with an error")
            times.append((time.perf_counter() - started) * 1e3)
    finally:
        worker.stop_event.set()
        thread.join(timeout=30)
        os.rmdir(folder)
    return times[1:]


def deployment_rows(rounds):
    """Flower's floor, our horizontal app without and with workers: s / round after the first."""
    floor, _ = deployment(TEST_APP / "floor", rounds)
    base = _mean(floor["round_time_s"])
    rows = [["empty ClientApp (Flower's floor)", f"{base:.2f}", "1.0x", "+0.00", "-"]]
    for name, worker in (("horizontal, no worker (a process per message)", False),
                         ("horizontal, party worker", True)):
        h, handled = deployment(TEST_APP, rounds, worker)
        per_round = _mean(h["round_time_s"])
        rows.append([name, f"{per_round:.2f}", f"{per_round / base:.1f}x",
                     f"{per_round - base:+.2f}",
                     f"{statistics.median(handled[NUM_CLIENTS:]):.0f}" if handled else "-"])
        print(" | ".join(rows[-1]), flush=True)
    return rows


def _mean(values, skip_first=True):
    values = list(values)
    if skip_first and len(values) > 1:
        values = values[1:]  # the first round traces the training function
    return statistics.mean(values)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 rounds in process, a worker in a thread, no Flower "
                             "processes, no docs")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=["vertical"],
                        help="vertical: only the vertical example's deployment rows, printed "
                             "(docs untouched)")
    args = parser.parse_args(argv)
    if args.only == "vertical":
        print(vertical_table())
        return
    rounds = 2 if args.quick else args.rounds
    runtimes = [("HorizontalFL", in_process)]
    if not args.quick:
        runtimes.append(("Flower simulation", simulation))
    started = time.time()
    rows = []
    for upload in ("fedavg", "signds"):
        base = None
        for name, fn in runtimes:
            h = fn(upload, rounds)
            per_round = _mean(h["round_time_s"])
            base = base or per_round
            wire_up = _mean(h["wire_bytes_up"], False) if "wire_bytes_up" in h else None
            wire_down = _mean(h["wire_bytes_down"], False) if "wire_bytes_down" in h else None
            payload = _mean(h["payload_bytes_up"], False)
            row = [upload, name, f"{per_round:.3f}", f"{per_round / base:.1f}x",
                   f"{payload:.0f}", "-" if wire_up is None else f"{wire_up:.0f}",
                   "-" if wire_up is None else f"{wire_up / payload:.2f}",
                   "-" if wire_down is None else f"{wire_down:.0f}",
                   f"{h['val_accuracy'][-1]:.3f}"]
            rows.append(row)
            print(" | ".join(row), flush=True)
    header = ["upload", "runtime", "s / round (after the first)", "vs HorizontalFL",
              "payload up B / round", "Flower message up B / round", "message / payload",
              "Flower message down B / round", f"val acc after {rounds} rounds"]
    table = _report.markdown_table(header, rows)
    print(table)
    handled = worker_in_process(3 if args.quick else 10)
    print(f"party worker in process: relay round trip per train message "
          f"{statistics.median(handled):.1f} ms (median of {len(handled)})", flush=True)
    if args.quick:
        return
    floor_rows = deployment_rows(rounds)
    floor_table = _report.markdown_table(
        ["Deployment Engine, 3 SuperNodes on loopback", "s / round (after the first)",
         "vs floor", "s over the floor", "worker ms / train message (median)"], floor_rows)
    print(floor_table)
    vertical = vertical_table()
    print(vertical)
    signds_payload = float(next(r for r in rows if r[0] == "signds")[4]) / NUM_CLIENTS
    body = f"""## Flower: one workload on three runtimes (`bench/flower.py`)

Command (run {_report.today()}, {time.time() - started:.0f} s on {_report.machine()}):

```
TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/flower.py
```

The workload of `examples/flower_horizontal`: digits among {NUM_CLIENTS} clients, its
softmax regression 64 -> 10, all clients every round, {LOCAL_EPOCHS} local epochs, {rounds}
rounds, SignDS k = {task.K:g}, eps = {task.EPS:g} with MagRR (eps_rr = {task.EPS_RR:g},
r_init = {R_INIT:g}). Seconds per round skip
the first round (tracing). Bytes: the upload payload is what the scheme sends; a Flower
message is `message_nbytes` (Flower's serialized message with metadata, before
HTTP/TLS framing), summed over the round's clients.

{table}

Flower's Deployment Engine, a SuperLink and {NUM_CLIENTS} SuperNodes as processes on
127.0.0.1 (`LoopbackDeployment`), on the seeded test app `tests/flower_app` (digits among
{NUM_CLIENTS} clients, MLP 64-16-10, FedAvg, 2 local epochs, {rounds} rounds): Flower's own
floor (an empty ClientApp that answers at once, the server exchanging the same messages),
then our horizontal app with a new ClientApp process per message, and with a party worker
beside each SuperNode (`keras-fedpriv worker`; the relay ClientApp hands it each message
over a Unix socket). A fresh deployment per row; s / round skip the first round.

{floor_table}

In process, a party worker answers a train message of this app, relay round trip
included, in {statistics.median(handled):.0f} ms (median).

Vertical FL on the same engine: `examples/flower_vertical` (breast cancer, the leader as
the ServerApp, a party worker beside each of the 2 followers' SuperNodes), with its run
config's defaults (batch 32: 13 steps per epoch, K = 13), then with more steps per message
through the run config only (`--run-config "batch-size=8 batches-per-message=50"`: 50 steps
per epoch, all in one message). With K = the steps of an epoch, an epoch is one training
message round and one validation round per follower (which also carries the last
gradients). Seconds per training step are the leader's epoch times over its steps
(validation included); the whole run adds the deployment's start-up (in brackets),
`flwr run`, the ServerApp's start and the followers' introduction. The leader's eps is its
privacy report's (LabelDP on its labels, once per example whatever the batch); each
follower's EmbeddingDP ledger stays with the follower.

{vertical}

Each vertical message round costs about one floor round (Flower's polling and the relay's
process start; a worker answers in 0.05-1 s), so an epoch costs about two floor rounds
plus its steps' compute: at 13 steps per message about 1.1 s per step, at 50 steps 0.4-0.5 s
(0.52 and 0.37 after the first epoch in two runs on 2026-11-26, this machine, shared).
Seconds per step fall as K grows with the data (an epoch of 1,000 steps at K = 64 is 16
training rounds, not 1,000). Before the party workers and K > 1
(2026-11-23 to 25, this machine): about 10 s per vertical step, and 14.7 (FedAvg) and 17.4
(SignDS) s per round for the horizontal app with a ClientApp process per message.

Reading: Flower 1.41 starts a new `flwr-clientapp` process for every message, and its
SuperNodes and server poll with fixed sleeps: that is the floor, paid by any app. Without a
worker each of those processes also imports TensorFlow and builds and traces the model
(seconds on 2 cores, more when the clients start at once); with a worker the relay process
imports Flower only and the worker answers from a warm model, so a round costs the floor
plus the training itself. The Simulation Engine keeps its Ray workers and our traced
training function between rounds. Flower adds a fixed overhead of about half a kilobyte per message
(metadata, record and array names, array headers). FedAvg's upload is the dense update,
so its message is within a few percent of the payload; SignDS's payload is a sign and h
indices ({signds_payload:.0f} B per client here), so on this small model its message is several times
its payload, and the gap shrinks as h grows with the model (h indices of 4 B each
against a constant overhead). The download, the dense global model, is the same for
both schemes and dominates the traffic. SignDS learns slowly with 3 clients (it is built for many
clients per round; see the hfl_signds section).
"""
    path = _report.update_section("flower", body)
    print(f"updated {path}")


if __name__ == "__main__":
    main()
