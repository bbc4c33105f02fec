"""A vertical follower's SuperNode and party worker killed mid-run, on Flower's Deployment Engine.

The vertical example app (examples/flower_vertical) through `LoopbackDeployment`: a SuperLink,
two follower SuperNodes, a party worker beside each, and a ``state-dir`` per follower (its
durable node state). Killing a follower's SuperNode and worker mid-run and restarting both: the
run completes, the follower rejoins under a new node id (the leader takes it back by its rejoin
token), its own state counts every release exactly once, and its random counters never go back
(no noise drawn twice). A follower that stays away stops the run with an error that names it.

The two runs share one deployment (a module fixture, in this order: the rejoin, then the
follower that stays away), as the processes of a real one serve run after run: one start of
the SuperLink, the SuperNodes and the workers (each loads TensorFlow) instead of two. The
processes bind 127.0.0.1 (free ports); every wait is bounded; at the end the fixture stops
exactly the processes it started and checks that none is left.
"""

import json
import pathlib
import re
import threading
import time

import pytest

pytest.importorskip("flwr")

from keras_fedpriv.federated.flower.loopback import LoopbackDeployment  # noqa: E402
from keras_fedpriv.federated.flower.party_store import PartyStore  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(900)]

VERTICAL = pathlib.Path(__file__).resolve().parents[1] / "examples" / "flower_vertical"
# 2 epochs: the kill falls in the first, the second runs with f1 back from its start
K, BATCH, EPOCHS = 2, 64, 2
SENT = re.compile(r"follower 'f1' \(node (\d+)\) (answered|refused) message (\d+) \((\d+) "
                  r"batches embedded\): random counter (\d+) -> (\d+)")


def _running(pid):
    try:
        return "zombie" not in pathlib.Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The SuperLink, two follower SuperNodes (each with a ``state-dir``) and their workers,
    for the module's runs; ``deployment.state`` is the folder of the state folders."""
    folder = tmp_path_factory.mktemp("vertical-faults")
    nodes = []
    for party in ("f1", "f2"):
        state = folder / f"state-{party}"
        state.mkdir(mode=0o700)
        nodes.append({"party": party, "state-dir": str(state)})
    with LoopbackDeployment(2, node_configs=nodes, worker_app="flower_vertical.party:app",
                            worker_app_dir=VERTICAL) as started:
        started.state = folder
        yield started
        pids = started.alive()  # with the descendants Flower started
    assert [p for p in pids if _running(p)] == []  # exactly what it started, all stopped


def _start_run(deployment, run_config, timeout):
    """`deployment.run` in a thread; its result lands in the returned dict under "done"."""
    out = {}

    def run():
        out["done"] = deployment.run(VERTICAL, run_config, timeout=timeout)

    thread = threading.Thread(target=run, daemon=True)  # a failed test does not wait for it
    thread.start()
    return thread, out


def _wait_for(deployment, name, pattern, count, timeout, start=0):
    """Wait until process ``name``'s log, from character ``start`` on (this run's part),
    matches ``pattern`` ``count`` times (bounded)."""
    deadline = time.monotonic() + timeout
    while len(re.findall(pattern, deployment.log(name)[start:])) < count:
        assert time.monotonic() < deadline, deployment.log(name)[-3000:]
        time.sleep(0.2)


def _kill_follower(deployment):
    deployment.kill_supernode(0)
    deployment.kill_worker(0)


def _batches_of(rejected, party, total, k):
    """Batches of the messages whose reply from ``party`` the leader did not use."""
    n = 0
    for epoch, step, p, _ in rejected:
        if p != party or epoch >= EPOCHS:  # the last gradients carry no batch
            continue
        n += 1 if step < 0 else min(k, total - step)
    return n


def test_a_follower_killed_mid_run_rejoins_and_counts_every_release_once(deployment, tmp_path):
    # the deployment's first run (the module fixture's)
    thread, out = _start_run(deployment, {
        "num-epochs": EPOCHS, "batch-size": BATCH, "batches-per-message": K,
        "round-timeout": 60.0, "follower-deadline": 300.0,
        "result-path": str(tmp_path / "result")}, timeout=800)
    # f1 answered its 3rd message (its 2nd training message of epoch 1): kill it
    _wait_for(deployment, "worker-0", r"follower 'f1' \(node \d+\) answered message", 3,
              timeout=400)
    killed_at = time.monotonic()
    _kill_follower(deployment)
    time.sleep(3)
    deployment.restart_worker(0)
    deployment.restart_supernode(0)
    thread.join(timeout=820)
    assert not thread.is_alive()
    worker_log = deployment.log("worker-0")
    done = out["done"]
    assert done.returncode == 0, done.stdout[-4000:]
    assert "run status: finished:completed" in done.stdout
    result = json.loads((tmp_path / "result" / "history.json").read_text())
    h, rejected = result["history"], result["rejected"]
    total = int(h["steps"][0] + h["skipped"][0])  # training batches per epoch
    print(f"steps per epoch {h['steps']}, skipped {h['skipped']}, epoch seconds "
          f"{[round(t, 1) for t in h['epoch_time_s']]}, kill at {killed_at:.0f}")

    # the run trained every epoch, and f1 took part again after its restart
    back = re.search(r"follower 'f1' is back as node (\d+) \(was node (\d+)\)", done.stdout)
    assert back and back.group(1) != back.group(2), done.stdout[-4000:]
    assert all(s > 0 for s in h["steps"]) and h["skipped"][-1] == 0.0
    # the kill cost a message: once f1 was back its batches were asked again
    assert sum(h["reasked"]) > 0

    # f1's messages as it logged them once its state was written, over both of its lives
    sent = [(int(n), kind, int(m), int(b), int(c0), int(c1))
            for n, kind, m, b, c0, c1 in SENT.findall(worker_log)]
    nodes = [s[0] for s in sent]
    assert nodes[0] != nodes[-1] and nodes[-1] == int(back.group(1))  # served as the new node
    # never a message served twice, never a random counter used twice (no noise replayed)
    numbers = [s[2] for s in sent]
    assert numbers == sorted(set(numbers))
    for a, b in zip(sent, sent[1:]):
        assert b[4] >= a[5], (a, b)
    # its ledger: every embedding it answered with is counted exactly once, the ones the
    # leader did not receive (in flight at the kill) included
    store = PartyStore(deployment.state / "state-f1")
    (state_file,) = list((deployment.state / "state-f1").glob("run-*.state"))
    state = store.load(int(state_file.name.split("-")[1]), "f1")
    arrays = {k: a.numpy() for k, a in state["keras-fedpriv-vertical-state"].items()}
    totals = next(v for k, v in arrays.items() if k.endswith("/release_totals"))
    counter = sum(int(v.reshape(-1)[0]) for k, v in arrays.items() if k.endswith("/rng_counter"))
    answered = sum(s[3] for s in sent if s[1] == "answered")
    assert int(totals[0]) == answered
    assert counter == sent[-1][5]
    # training batches and one validation batch per epoch, and the batches asked again
    asked = EPOCHS * (total + 1) + int(sum(h["reasked"]))
    received = asked - _batches_of(rejected, "f1", total, K)
    assert 0 <= answered - received <= K * len([r for r in rejected if r[2] == "f1"])


def test_a_follower_that_stays_away_stops_the_run_naming_it(deployment):
    # after the rejoin run, on the same deployment (f1 restarted there)
    start = len(deployment.log("worker-0"))  # this run's part of f1's log
    thread, out = _start_run(deployment, {
        "num-epochs": EPOCHS, "batch-size": BATCH, "batches-per-message": K,
        "round-timeout": 20.0, "follower-deadline": 20.0}, timeout=600)
    _wait_for(deployment, "worker-0", r"follower 'f1' \(node \d+\) answered message", 2,
              timeout=400, start=start)
    _kill_follower(deployment)
    thread.join(timeout=620)
    assert not thread.is_alive()
    done = out["done"]
    assert done.returncode != 0
    assert "run status: finished:failed" in done.stdout
    assert re.search(r"follower 'f1' \(node \d+\) has been missing for \d+ s, longer than the "
                     r"run's follower deadline of 20 s", done.stdout), done.stdout[-4000:]
