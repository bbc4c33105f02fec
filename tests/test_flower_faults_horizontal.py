"""A horizontal client that crashes and restarts mid-run, on Flower's Deployment Engine.

Real processes on 127.0.0.1 (`LoopbackDeployment`): a SuperLink, 3 SuperNodes with a party
worker each and a private ``state-dir`` per client (`durable_state_mod`). SuperNode 2 and its
worker are killed once client 2 has answered a round, then restarted with the same node
config (Flower gives the SuperNode a new node id). The test bounds every wait, and stops
exactly the processes it started. Measured on a busy 2-core machine: the 6-round run 148-191 s
(289 s at load 9), the test 216-372 s; replies per round [3, 2, 2, 3, 3, 3] (round 2 waits out
its timeout for the killed node; in round 3 the dead node is still listed beside the new one, so
client 2 is not asked) or [3, 2, 3, 3, 3, 3] (Flower's "Node Unavailable" reply for round 2,
sender id 0, is dropped as client 2's; the new node answers from round 3). The run is 5 rounds
long: the new node answers from round 3 or 4, and the last round has a round to spare.

The same deployment (a module fixture) then serves a run that fails (every round below
min_replies), as a real deployment serves run after run. The run also checks what a SignDS
reply carries (a sign and h indices, nothing else) and that the model stays finite with a
client gone; a client killed for good in a vertical run: tests/test_adversarial_vertical_faults.py.
At the end the fixture stops exactly the processes it started and checks that none is left
and no port still listens.
"""

import json
import pathlib
import shutil
import tempfile
import threading
import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from keras_fedpriv.federated.flower.loopback import LoopbackDeployment, _listening  # noqa: E402
from keras_fedpriv.federated.flower.party_store import PartyStore  # noqa: E402
from keras_fedpriv.optimizers import SignDSEncoder  # noqa: E402

from flower_stubs import APP  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(900)]

ROUNDS = 5
KILLED = 2  # the partition id (client id) of the SuperNode that is killed


def _client_state(folder, run_id=None):
    """``(run id, SignDS release count, its ledger's count)`` from a client's state file (of
    run ``run_id``, default: the only run), or None before the client's first answer."""
    if run_id is None:
        files = list(pathlib.Path(folder).glob("run-*.state"))
        if not files:
            return None
        (only,) = files
        run_id = int(only.name.split("-")[1])
    state = PartyStore(folder).load(run_id, f"partition-{KILLED}")
    if state is None or "keras-fedpriv" not in state:
        return None
    uploads = json.loads(state["keras-fedpriv"]["upload"])
    encoder = next(s for s in uploads if "num_releases" in s)
    counted = sum(sum(kind["units"].values()) for kind in encoder["ledger"]["kinds"])
    return run_id, int(encoder["num_releases"]), counted


def _wait(what, check, seconds):
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(0.5)
    return value


def _server_count(ledger, client):
    """The releases the server's ledger counted about ``client`` for the SignDS uploads."""
    kinds = [k for k in ledger["kinds"] if "upload (received" in k["mechanism"]]
    assert kinds, [k["mechanism"] for k in ledger["kinds"]]
    return sum(int(k["units"].get(str(client), 0)) for k in kinds)


@pytest.fixture(scope="module")
def deployment():
    """A SuperLink and 3 SuperNodes with a party worker each; ``deployment.folders`` are the
    clients' state folders (mode 0700), each with a budget file (a cap no run reaches: it only
    records)."""
    folders = [tempfile.mkdtemp(prefix="kfp-s-") for _ in range(3)]  # mode 0700
    nodes = [{"partition-id": i, "num-partitions": 3, "upload": "signds", "state-dir": f,
              "max-epsilon": 1e9, "privacy-budget-path": f"{f}/budget.json"}
             for i, f in enumerate(folders)]
    try:
        with LoopbackDeployment(3, node_configs=nodes, worker_app="kfp_test_app.apps:client",
                                worker_app_dir=APP) as started:
            started.folders = folders
            yield started
            pids = started.alive()  # with the descendants Flower started
            ports = [started.superlink_port] + started.supernode_ports
        assert not [p for p in pids if pathlib.Path(f"/proc/{p}").exists()
                    and "zombie" not in pathlib.Path(f"/proc/{p}/status").read_text().lower()]
        assert not [p for p in ports if _listening(p)]
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_and_restarted_client_takes_part_again_and_never_replays_its_noise(
        deployment, tmp_path):
    """Then a second run whose rounds all fall below min_replies fails on the SuperLink with a
    message that says so."""
    folders = deployment.folders
    out = {}

    def run():
        started = time.monotonic()
        out["done"] = deployment.run(
            APP, {"upload": "signds", "num-server-rounds": ROUNDS, "local-epochs": 1,
                  "clients-per-round": 3, "min-replies": 2, "round-timeout": 60.0,
                  "result-path": str(tmp_path)}, timeout=780)
        out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run)
    thread.start()
    # client 2 has released two uploads (its state file says so): it answered round 1
    # and is answering round 2; kill it there, mid-run
    _wait("client 2 answered a round", lambda: (_client_state(folders[KILLED]) or
                                                (0, 0, 0))[1] >= 2, 400)
    deployment.kill_supernode(KILLED)
    deployment.kill_worker(KILLED)
    run_id, at_kill, counted_at_kill = _client_state(folders[KILLED])
    deployment.restart_worker(KILLED)
    deployment.restart_supernode(KILLED)
    thread.join(timeout=800)
    assert not thread.is_alive()
    # a run whose rounds cannot count: every client refuses 101 local epochs (its
    # max_local_epochs is 100), and max-failed-rounds=0 stops it at the first
    out["failed"] = deployment.run(
        APP, {"upload": "signds", "num-server-rounds": 3, "local-epochs": 101,
              "max-failed-rounds": 0, "round-timeout": 60.0,
              "result-path": str(tmp_path / "failed")}, timeout=300)
    _, end, counted_at_end = _client_state(folders[KILLED], run_id)
    budget = json.loads(pathlib.Path(folders[KILLED], "budget.json").read_text())
    done = out["done"]
    assert done.returncode == 0, done.stdout[-3000:]
    record = json.loads((tmp_path / "history.json").read_text())
    replies = record["history"]["replies"]
    print(f"\nrun of {ROUNDS} rounds in {out['seconds']:.0f} s; replies per round {replies}; "
          f"client {KILLED} asked {[[n for c, n in r if c == KILLED] for r in record['asked']]}; "
          f"dropped {record['rejected']}")
    # every round ran; a round may fall short while the killed node is waited for (a busy
    # machine can also make a live client miss that round's timeout), and the run says so
    assert len(replies) == ROUNDS and replies[-1] == 3.0, done.stdout[-3000:]
    assert record["failed_rounds"] == [r for r, n in enumerate(replies, 1) if n < 2]
    # client 2 was asked at its first node, then answered from its new node in the same run
    first = next(n for r in record["asked"] for c, n in r if c == KILLED)
    again = [n for r in record["replied"] for c, n in r if c == KILLED and n != first]
    assert again, record["replied"]
    assert len(set(again)) == 1
    # its counter continued from the state file: every release counted once, none replayed
    # (a client restarted from nothing would count from 0 and draw its first noise again)
    assert at_kill >= 2 and counted_at_kill == at_kill
    assert end == at_kill + len(again) and counted_at_end == end
    # its budget file recorded each of those releases once, in this run's entry
    (entry,) = [e for e in budget["entries"] if e["run"] == str(run_id)]
    assert sum(sum(k["units"].values()) for k in entry["ledger"]["kinds"]) == end
    # the server counted every round it asked client 2, under the same client id, whichever
    # node answered: never fewer than the client released
    asked = sum(1 for r in record["asked"] for c, _ in r if c == KILLED)
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert _server_count(ledger, KILLED) == asked >= end
    assert run_id > 0 and np.isfinite(record["history"]["val_accuracy"]).all()
    # the model was not corrupted, and each good reply was a sign and h indices, nothing else
    # (Flower's messages carry more)
    weights = np.load(tmp_path / "weights.npz")
    weights = [weights[f"arr_{i}"] for i in range(len(weights.files))]
    assert all(np.isfinite(w).all() for w in weights)
    h, dim = record["history"], sum(w.size for w in weights)
    per_client = 4 * SignDSEncoder(k=0.2, eps=10.0).output_dim(dim) + 1
    assert h["payload_bytes_up"] == [r * per_client for r in replies]
    assert all(w > p for w, p in zip(h["wire_bytes_up"], h["payload_bytes_up"]))
    assert all(d > r * 4 * dim for d, r in zip(h["wire_bytes_down"], replies))
    _failed_run_checks(out["failed"], tmp_path / "failed")


def _failed_run_checks(failed, folder):
    """The run that crossed max-failed-rounds: failed on the SuperLink, said why, left its
    record."""
    assert failed.returncode != 0 and "run status: finished:failed" in failed.stdout
    assert "1 rounds fell below min_replies=2 (rounds [1]), more than max-failed-rounds=0" \
        in failed.stdout, failed.stdout[-3000:]
    record = json.loads((folder / "history.json").read_text())
    assert record["failed_rounds"] == [1] and record["history"]["below_min_replies"] == [1.0]
