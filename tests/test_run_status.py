"""keras-fedpriv flwr-run: Flower's `flwr run`, with an exit status from the run's status."""

import os
import stat
import subprocess
import sys

import pytest

pytest.importorskip("flwr")  # the package keras_fedpriv.federated.flower needs it

from keras_fedpriv.federated.flower.run_status import flwr_run

pytestmark = [pytest.mark.jax]

FAKE_FLWR = """#!{python}
import json, sys
status, run_code = {status!r}, {run_code}
if sys.argv[1] == "run":
    print("Successfully started run 42")
    print("ServerApp: epoch 1 ...")
    sys.exit(run_code)
if sys.argv[1] == "list":
    assert sys.argv[2:] == ["loopback", "--run-id", "42", "--format", "json"], sys.argv
    print(json.dumps({{"runs": [{{"status": status}}]}}))
"""


def _fake_flwr(tmp_path, status, run_code=0):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "flwr"
    exe.write_text(FAKE_FLWR.format(python=sys.executable, status=status, run_code=run_code))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(bindir)


@pytest.mark.parametrize("status,code", [("finished:completed", 0), ("finished:failed", 1),
                                         ("finished:stopped", 1)])
def test_the_return_code_follows_the_runs_status_on_the_superlink(tmp_path, status, code):
    done = flwr_run("app", "loopback", "num-epochs=1", bindir=_fake_flwr(tmp_path, status))
    assert done.returncode == code
    assert done.stdout.rstrip().endswith(f"run status: {status}")
    assert "ServerApp: epoch 1" in done.stdout


def test_a_failing_flwr_run_keeps_its_own_code(tmp_path):
    done = flwr_run("app", "loopback", bindir=_fake_flwr(tmp_path, "finished:completed", 3))
    assert done.returncode == 3


def test_the_command_line_exits_non_zero_for_a_failed_run_and_says_why(tmp_path):
    env = {**os.environ, "PATH": _fake_flwr(tmp_path, "finished:failed") + os.pathsep
           + os.environ["PATH"]}
    done = subprocess.run([sys.executable, "-m", "keras_fedpriv", "flwr-run", "app", "loopback",
                           "--run-config", "num-epochs=1"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 1
    assert "ServerApp: epoch 1" in done.stdout  # streamed
    assert "run status: finished:failed" in done.stderr
    assert "did not complete" in done.stderr
