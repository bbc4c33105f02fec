"""Flower's Deployment Engine through LoopbackDeployment
(keras_fedpriv/federated/flower/loopback.py):
a real SuperLink and 3 SuperNodes as processes on 127.0.0.1.

Each test starts its own processes on free ports (`LoopbackDeployment`), bounds
its time, and stops exactly the processes it started; a test checks that none
is left. Every message makes Flower start a ClientApp process, so a round costs
seconds here: the runs are two rounds long.
"""

import json
import os
import pathlib
import threading
import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from keras_fedpriv.datasets import breast_cancer_vertical  # noqa: E402
from keras_fedpriv.federated import HorizontalFL  # noqa: E402
from keras_fedpriv.federated.flower.loopback import LoopbackDeployment, _listening  # noqa: E402
from keras_fedpriv.optimizers import SignDSEncoder  # noqa: E402

from flower_stubs import APP, load_test_app  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(420)]



def _result(folder):
    history = json.loads((folder / "history.json").read_text())
    weights = np.load(folder / "weights.npz")
    return history, [weights[f"arr_{i}"] for i in range(len(weights.files))]


def _running(pid):
    try:
        return "zombie" not in pathlib.Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def _gone(deployment, pids):
    alive = [p for p in pids if _running(p)]
    ports = [deployment.superlink_port] + deployment.supernode_ports
    return alive, [p for p in ports if _listening(p)]


def _nodes(upload):
    return [{"partition-id": i, "num-partitions": 3, "upload": upload} for i in range(3)]


def test_three_supernodes_train_fedavg_as_the_in_process_run(tmp_path):
    apps = load_test_app()
    with LoopbackDeployment(3, node_configs=_nodes("fedavg")) as deployment:
        fedavg = deployment.run(APP, {"upload": "fedavg", "result-path": str(tmp_path / "f")},
                                timeout=300)
        assert fedavg.returncode == 0, fedavg.stdout[-3000:]
        assert "run status: finished:completed" in fedavg.stdout
        # `flwr run` exits with 0 when the ServerApp fails; the status on the SuperLink does not
        failed = deployment.run(APP, {"min-replies": 5}, timeout=120)
        assert failed.returncode != 0 and "finished:failed" in failed.stdout
        pids = deployment.alive()  # with the descendants Flower started
    alive, listening = _gone(deployment, pids)
    assert alive == [] and listening == []

    history, weights = _result(tmp_path / "f")
    assert history["rejected"] == []
    h = history["history"]
    assert h["replies"] == [3.0, 3.0]
    # the same run in one process gives the same global model
    clients, val = apps.data()
    model = apps.model_fn()
    initial = model.evaluate(*val, verbose=0, return_dict=True)["accuracy"]
    fl = HorizontalFL(model, clients, upload="fedavg", seed=apps.SEED)
    hist = fl.fit(rounds=2, clients_per_round=3, local_epochs=2, validation_data=val, verbose=0)
    for a, b in zip(model.get_weights(), weights):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert h["val_accuracy"][-1] == pytest.approx(hist.history["val_accuracy"][-1], abs=1e-6)
    assert h["val_accuracy"][-1] > initial + 0.3  # the global model learned


def test_killing_a_signds_client_mid_run_neither_stops_the_run_nor_corrupts_the_model(
        tmp_path):
    with LoopbackDeployment(3, node_configs=_nodes("signds")) as deployment:
        out = {}

        def run():
            out["done"] = deployment.run(
                APP, {"upload": "signds", "num-server-rounds": 3, "round-timeout": 40.0,
                      "result-path": str(tmp_path)}, timeout=360)

        thread = threading.Thread(target=run)
        thread.start()
        # kill SuperNode 2 once the run is under way (its query or first round)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "flwr-clientapp" not in deployment.log(
                "supernode-2") + _children_cmdlines(deployment, 2):
            time.sleep(0.2)
        deployment.kill_supernode(2)
        thread.join(timeout=380)
        assert not thread.is_alive()
        pids = deployment.alive()
    alive, listening = _gone(deployment, pids)
    assert alive == [] and listening == []
    done = out["done"]
    assert done.returncode == 0, done.stdout[-3000:]
    history, weights = _result(tmp_path)
    h = history["history"]
    assert len(h["replies"]) == 3  # every round ran
    assert h["replies"][-1] == 2.0  # the two live clients
    assert all(np.isfinite(w).all() for w in weights)
    # each good reply was a sign and h indices, nothing else; Flower's messages carry more
    dim = sum(w.size for w in weights)
    per_client = 4 * SignDSEncoder(k=0.2, eps=10.0).output_dim(dim) + 1
    assert h["payload_bytes_up"] == [r * per_client for r in h["replies"]]
    assert all(w > p for w, p in zip(h["wire_bytes_up"], h["payload_bytes_up"]))
    assert all(d > r * 4 * dim for d, r in zip(h["wire_bytes_down"], h["replies"]))
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert ledger["kinds"], "the server recorded what it received"


def _children_cmdlines(deployment, index):
    """Command lines of the processes in SuperNode ``index``'s process group."""
    pgid = deployment.processes[f"supernode-{index}"].pid
    out = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) == pgid:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ProcessLookupError):
            continue
    return " ".join(out)


VERTICAL = pathlib.Path(__file__).resolve().parents[1] / "examples" / "flower_vertical"


def test_a_leader_and_two_followers_train_the_vertical_example_as_separate_processes(tmp_path):
    """The vertical example app on the Deployment Engine: the ServerApp is the leader (labels +
    LabelDP), two SuperNodes are the followers (EmbeddingDP bits)."""
    nodes = [{"party": "f1"}, {"party": "f2"}]
    with LoopbackDeployment(2, node_configs=nodes) as deployment:
        done = deployment.run(VERTICAL, {"num-epochs": 2, "batch-size": 200,
                                         "result-path": str(tmp_path)}, timeout=360)
        pids = deployment.alive()
    alive, listening = _gone(deployment, pids)
    assert alive == [] and listening == []
    assert done.returncode == 0, done.stdout[-3000:]
    out = json.loads((tmp_path / "history.json").read_text())
    h = out["history"]
    assert out["rejected"] == [] and h["skipped"] == [0.0, 0.0]
    assert h["loss"][-1] < h["loss"][0]  # the model learned
    assert h["val_auc"][-1] > 0.9
    # each follower sent what EmbeddingDP promises: packed bits, one byte per example of its
    # 4-coordinate embedding, for every training example once an epoch; Flower's messages
    # carry more (ids, framing)
    n = len(breast_cancer_vertical()[2])  # the leader's training labels
    assert out["wire"] == {p: {"keys": ["bits"], "dtype": "uint8", "bytes_per_example": 1}
                           for p in ("f1", "f2")}
    assert h["bytes_up_f1"] == h["bytes_up_f2"] == [float(n)] * 2
    assert all(w > b for w, b in zip(h["wire_bytes_up"], h["bytes_up"]))
    # the leader's report: its labels released once per example
    assert "LabelDPLayer" in done.stdout and "run status: finished:completed" in done.stdout
