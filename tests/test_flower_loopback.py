"""Flower's Deployment Engine through LoopbackDeployment
(keras_fedpriv/federated/flower/loopback.py):
a real SuperLink and 3 SuperNodes as processes on 127.0.0.1.

Each test starts its own processes on free ports (`LoopbackDeployment`), bounds
its time, and stops exactly the processes it started; a test checks that none
is left. Every message makes Flower start a ClientApp process, so a round costs
seconds here: the runs are one to three rounds or epochs long.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from keras_fedpriv.datasets import breast_cancer_vertical  # noqa: E402
from keras_fedpriv.federated import HorizontalFL  # noqa: E402
from keras_fedpriv.federated.flower import worker  # noqa: E402
from keras_fedpriv.federated.flower.loopback import (  # noqa: E402
    LoopbackDeployment,
    _listening,
    free_port,
    kill_family,
    process_family,
)

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
        # one round: every message starts a ClientApp process that imports TensorFlow (about
        # 11 CPU-s each); the runs of several rounds, and a failed run's exit status, are
        # checked with party workers (the docs' one-host recipe, tests/test_flower_faults_*)
        fedavg = deployment.run(APP, {"upload": "fedavg", "num-server-rounds": 1,
                                      "result-path": str(tmp_path / "f")}, timeout=300)
        assert fedavg.returncode == 0, fedavg.stdout[-3000:]
        assert "run status: finished:completed" in fedavg.stdout
        pids = deployment.alive()  # with the descendants Flower started
    alive, listening = _gone(deployment, pids)
    assert alive == [] and listening == []

    history, weights = _result(tmp_path / "f")
    assert history["rejected"] == []
    h = history["history"]
    assert h["replies"] == [3.0]
    # the same run in one process gives the same global model
    clients, val = apps.data()
    model = apps.model_fn()
    initial = model.evaluate(*val, verbose=0, return_dict=True)["accuracy"]
    fl = HorizontalFL(model, clients, upload="fedavg", seed=apps.SEED)
    hist = fl.fit(rounds=1, clients_per_round=3, local_epochs=2, validation_data=val, verbose=0)
    for a, b in zip(model.get_weights(), weights):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert h["val_accuracy"][-1] == pytest.approx(hist.history["val_accuracy"][-1], abs=1e-6)
    assert h["val_accuracy"][-1] > initial + 0.3  # the global model learned


VERTICAL = pathlib.Path(__file__).resolve().parents[1] / "examples" / "flower_vertical"


def test_a_leader_and_two_followers_train_the_vertical_example_as_separate_processes(tmp_path):
    """The vertical example app on the Deployment Engine: the ServerApp is the leader (labels +
    LabelDP), two SuperNodes are the followers (EmbeddingDP bits), each with the party worker
    its relay ClientApp hands messages to (as run_loopback.py starts them)."""
    nodes = [{"party": "f1"}, {"party": "f2"}]
    with LoopbackDeployment(2, node_configs=nodes, worker_app="flower_vertical.party:app",
                            worker_app_dir=VERTICAL) as deployment:
        # 3 epochs: the example is unseeded (fresh keys in every party), and over 40 runs of it
        # in one process the loss fell by 6.7 standard deviations of its fall (2 epochs: 5.3)
        done = deployment.run(VERTICAL, {"num-epochs": 3, "batch-size": 200,
                                         "result-path": str(tmp_path)}, timeout=360)
        pids = deployment.alive()
        worker_logs = [deployment.log(f"worker-{i}") for i in range(2)]
    alive, listening = _gone(deployment, pids)
    assert alive == [] and listening == []
    assert done.returncode == 0, done.stdout[-3000:]
    out = json.loads((tmp_path / "history.json").read_text())
    h = out["history"]
    assert out["rejected"] == [] and h["skipped"] == [0.0] * 3
    assert h["loss"][-1] < h["loss"][0]  # the model learned
    assert h["val_auc"][-1] > 0.9
    # each follower sent what EmbeddingDP promises: packed bits, one byte per example of its
    # 4-coordinate embedding, for every training example once an epoch; Flower's messages
    # carry more (ids, framing)
    n = len(breast_cancer_vertical()[2])  # the leader's training labels
    assert out["wire"] == {p: {"keys": ["bits"], "dtype": "uint8", "bytes_per_example": 1}
                           for p in ("f1", "f2")}
    assert h["bytes_up_f1"] == h["bytes_up_f2"] == [float(n)] * 3
    assert all(w > b for w, b in zip(h["wire_bytes_up"], h["bytes_up"]))
    # the leader's report: its labels released once per example
    assert "LabelDPLayer" in done.stdout and "run status: finished:completed" in done.stdout
    # the followers' workers answered every message of the run (hello, train, validate, finish)
    handled = [re.findall(r"handled (\S+) \(run", log) for log in worker_logs]
    assert all(h.count("train") >= 2 and "query.finish" in h for h in handled), handled


# --------------------------------------------------------------------------- docs/flower.md

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "flower.md"


def _doc_block(marker, language):
    match = re.search(rf"<!-- {marker}[^>]*-->\s*```{language}\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"docs/flower.md has no {language} block after <!-- {marker} -->"
    return match.group(1)


def _run_status(flwr, output, env):
    run_id = re.search(r"Successfully started run (\d+)", output)
    assert run_id, output[-3000:]
    done = subprocess.run([flwr, "list", "loopback", "--run-id", run_id.group(1), "--format",
                           "json"], capture_output=True, text=True, env=env, timeout=120)
    return run_id.group(1), json.loads(done.stdout)["runs"][0]["status"]


def test_the_one_host_recipe_in_the_docs_runs_as_written():
    """The commands of docs/flower.md's one-host recipe, line by line, with free ports and a
    private temporary folder in place of its ports and /tmp paths."""
    folder = tempfile.mkdtemp(prefix="kfp-r-")
    subs = {"9092": str(free_port()), "9094": str(free_port()), "9095": str(free_port()),
            "/tmp/fl-party": f"{folder}/p"}
    commands, toml = _doc_block("one-host recipe", "bash"), _doc_block("one-host connection",
                                                                       "toml")
    for old, new in subs.items():
        assert old in commands, old
        commands, toml = commands.replace(old, new), toml.replace(old, new)
    lines = [line for line in commands.splitlines() if line.strip()]
    assert [line.split()[0] for line in lines] == [
        "install", "flower-superlink", "keras-fedpriv", "keras-fedpriv", "FLWR_HOME=" +
        f"{folder}/p-0/home", "FLWR_HOME=" + f"{folder}/p-1/home", "flwr"]
    bindir = str(pathlib.Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_INTERNAL")}
    env.update(PATH=bindir + os.pathsep + env.get("PATH", ""), TF_CPP_MIN_LOG_LEVEL="3",
               FLWR_HOME=f"{folder}/home")
    os.makedirs(env["FLWR_HOME"])
    pathlib.Path(env["FLWR_HOME"], "config.toml").write_text(toml)
    repo = DOC.parents[1]
    subprocess.run(["bash", "-c", lines[0]], check=True, cwd=repo, env=env, timeout=60)
    procs = []

    def start(line):
        log = open(f"{folder}/log-{len(procs)}.txt", "wb")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(["bash", "-c", line], cwd=repo, env=env,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True), log))

    try:
        for line in lines[1:4]:
            start(line)
        sockets = re.findall(r"--socket (\S+)", commands)
        deadline = time.monotonic() + 300
        for path in sockets:  # the recipe: SuperNodes after the workers are ready
            while True:
                try:
                    assert worker.ping(path) == "kfp_test_app.apps:client"
                    break
                except OSError:
                    assert time.monotonic() < deadline, "a worker did not start"
                    time.sleep(0.3)
        while not _listening(int(subs["9092"])):
            assert time.monotonic() < deadline, "the SuperLink did not listen"
            time.sleep(0.3)
        for line in lines[4:6]:
            start(line)
        flwr = shutil.which("flwr", path=bindir)
        # one run (that workers serve run after run is checked on the fault tests' deployments)
        done = subprocess.run(["bash", "-c", lines[6]], cwd=repo, env=env, timeout=300,
                              capture_output=True, text=True)
        runs = [_run_status(flwr, done.stdout + done.stderr, env)]
        family = process_family([p.pid for p, _ in procs])
    finally:
        for proc, log in reversed(procs):  # SuperNodes, workers, SuperLink; each by its group
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            log.close()
        logs = [pathlib.Path(f"{folder}/log-{i}.txt").read_text(errors="replace")
                for i in range(len(procs))]
        shutil.rmtree(folder, ignore_errors=True)
    left = kill_family(family, wait=30)  # only processes still the ones recorded (no reused id)
    assert [status for _, status in runs] == ["finished:completed"], logs[0][-3000:]
    for i in (1, 2):  # each worker answered the run, then stopped on SIGTERM
        assert procs[i][0].returncode == 0, logs[i][-3000:]
        for run_id, _ in runs:
            assert f"handled train (run {run_id})" in logs[i]
        assert "worker stopped after" in logs[i]
    assert not any(os.path.exists(p) for p in sockets)
    assert left == []


@pytest.mark.parametrize("example", ["horizontal", "vertical"])
def test_the_examples_one_host_commands_name_what_exists(example):
    """docs/flower.md's commands for the two examples: each worker's ClientApp is defined
    in its app folder, each SuperNode's party folder is one the recipe creates (private
    socket and state), and every run-config key is one the app declares (Flower refuses
    others)."""
    import ast
    import tomllib

    lines = [line for line in _doc_block(f"one-host {example} example", "bash").splitlines()
             if line.strip()]
    assert [line.split()[0] for line in lines][:3] == ["install", "keras-fedpriv",
                                                      "keras-fedpriv"]
    folders = lines[0].split()[4:]
    repo = DOC.parents[1]
    for line in lines[1:3]:
        app, app_dir = re.search(r"--app (\S+) --app-dir (\S+)", line).groups()
        module, attr = app.split(":")
        source = (repo / app_dir / (module.replace(".", "/") + ".py")).read_text()
        assigned = {t.id for node in ast.walk(ast.parse(source))
                    if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Name)}
        assert attr in assigned, line
        assert re.search(r"--socket (\S+)/worker.sock", line).group(1) in folders
    nodes = [line for line in lines if "flower-supernode" in line]
    assert len(nodes) == 2
    for line, folder in zip(nodes, folders):
        config = re.search(r'--node-config "([^"]+)"', line).group(1)
        assert f"worker-socket='{folder}/worker.sock'" in config
        assert f"state-dir='{folder}'" in config
        assert line.startswith(f"FLWR_HOME={folder}/home ")
    app_dir, run_config = re.fullmatch(
        r'keras-fedpriv flwr-run (\S+) loopback --run-config "([^"]+)"', lines[-1]).groups()
    declared = tomllib.loads((repo / app_dir / "pyproject.toml").read_text())
    declared = declared["tool"]["flwr"]["app"]["config"]
    keys = {item.split("=")[0] for item in run_config.split()}
    assert keys <= set(declared), keys - set(declared)


def test_kill_family_kills_only_processes_that_are_still_the_ones_recorded():
    """A process id recorded before a stop may belong to another process by the time the
    leftovers are killed (ids are reused): `kill_family` compares start times first."""
    parent = subprocess.Popen(["bash", "-c", "sleep 120 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (family := process_family([parent.pid])):
            assert time.monotonic() < deadline, "the child did not start"
            time.sleep(0.05)
        (pid, started), = family.items()
        assert kill_family({pid: str(int(started) + 1)}, wait=0.2) == []  # another process
        assert _running(pid)  # left alone
        assert kill_family(family, wait=30) == [] and not _running(pid)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
