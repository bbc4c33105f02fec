"""The examples' defaults learn: each example's run, in one process on the same settings."""

import importlib
import math
import sys
from pathlib import Path

import pytest

HORIZONTAL = Path(__file__).resolve().parents[1] / "examples" / "flower_horizontal"


def _import(folder, *modules):
    sys.path.insert(0, str(folder))
    try:
        return [importlib.import_module(m) for m in modules]
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def horizontal():
    pytest.importorskip("flwr")  # the example's package imports Flower's names
    task, one_process = _import(HORIZONTAL, "flower_horizontal.task",
                                "flower_horizontal.one_process")
    settings = task.run_settings()  # pyproject.toml's run config: what `flwr run` uses
    fl, history = one_process.run(settings, seed=0)
    return task, settings, fl, history.history


def test_the_horizontal_examples_defaults_learn(horizontal):
    """SignDS + MagRR on the app's defaults reaches val_accuracy >= 0.8 in its rounds."""
    task, settings, _, history = horizontal
    assert settings.upload == "signds"  # the protected run, not FedAvg
    assert len(history["val_accuracy"]) == settings.rounds
    assert history["val_accuracy"][0] < 0.5  # it starts from chance, and learns
    assert history["val_accuracy"][-1] >= 0.8
    assert history["replies"] == [float(settings.clients_per_round)] * settings.rounds


def test_the_horizontal_example_reports_what_each_client_released(horizontal):
    """Every client uploads every round: rounds * (SignDS eps + MagRR eps), composed."""
    from keras_fedpriv.privacy import privacy_report

    task, settings, fl, _ = horizontal
    assert settings.clients_per_round == settings.num_clients
    report = privacy_report(fl, delta=task.DELTA)
    assert report.epsilon == pytest.approx(settings.rounds * (task.EPS + task.EPS_RR), rel=1e-3)


def test_the_horizontal_examples_defaults_are_its_pyproject_run_config(horizontal):
    task, settings, _, _ = horizontal
    assert settings == task.RunSettings()
    # a key the deployment sets per run overrides the default; the rest stay
    override = task.run_settings({"num-clients": 3, "clients-per-round": 3,
                                  "num-server-rounds": 20})
    assert (override.num_clients, override.clients_per_round, override.rounds,
            override.local_epochs) == (3, 3, 20, settings.local_epochs)
    line = task.progress_line(2, settings, {"replies": 4.0, "val_accuracy": 0.5,
                                            "round_time_s": 1.25}, 66.0, 3.0)
    assert line == (f"round 2/{settings.rounds}: 4/{settings.clients_per_round} replies, "
                    "val_accuracy 0.500, eps 66.0 so far, 1.2 s (total 3.0 s)")


@pytest.mark.parametrize("config, match", [
    ({"num-clients": 0}, r"'num-clients' must be an integer >= 1; got 0"),
    ({"local-epochs": 1.5}, r"'local-epochs' must be an integer >= 1; got 1.5"),
    ({"num-server-rounds": True}, r"'num-server-rounds' must be an integer >= 1; got True"),
    ({"round-timeout": math.inf}, r"'round-timeout' must be a finite number > 0"),
    ({"upload": "plain"}, r"'upload' must be 'signds' or 'fedavg'; got 'plain'"),
    ({"num-clients": 3}, r"clients-per-round <= num-clients; got 3, 5, 3"),
])
def test_the_horizontal_example_refuses_a_bad_run_config(horizontal, config, match):
    task = horizontal[0]
    with pytest.raises(ValueError, match=match):
        task.run_settings(config)


def test_a_horizontal_client_takes_only_its_own_partition(horizontal):
    task = horizontal[0]
    sizes = [len(task.client_data(i, 5)[1]) for i in range(5)]
    assert sum(sizes) == 1797 - len(task.server_validation_data()[1])
    with pytest.raises(ValueError, match=r"'partition-id' must be in \[0, num-partitions=5\)"):
        task.client_data(5, 5)


def test_the_example_apps_start_tensorflow_quietly():
    """Flower imports the app package first in each of its processes: no TensorFlow start-up
    lines there (none set TF_CPP_MIN_LOG_LEVEL), and the package set it for what they start."""
    import os
    import re
    import subprocess

    code = ("import os, sys\nsys.path.insert(0, sys.argv[1])\nimport flower_horizontal.task\n"
            "import keras\nkeras.ops.convert_to_numpy(keras.ops.ones(2) + 1)\n"
            "print(os.environ['TF_CPP_MIN_LOG_LEVEL'])")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_FEDPRIV_TF_LOGS")}
    out = subprocess.run([sys.executable, "-c", code, str(HORIZONTAL)], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["3"]
    start_up = re.compile(r"absl::InitializeLog|oneDNN|cuda drivers|cuInit|cpu_feature_guard")
    assert not start_up.search(out.stderr), out.stderr[-3000:]


TUNE_EPS = Path(__file__).resolve().parents[1] / "examples" / "tune_eps.py"
# runs the example with matplotlib unimportable, as in a `[flower]` install
_NO_MATPLOTLIB = ("import runpy, sys; sys.modules['matplotlib'] = None; "
                  "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def _tune_eps(tmp_path, *args):
    import os
    import subprocess

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-c", _NO_MATPLOTLIB, str(TUNE_EPS), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_tune_eps_runs_without_matplotlib_and_writes_no_file_by_default(tmp_path):
    figure = TUNE_EPS.parents[1] / "docs" / "tuning_frontier.png"
    before = figure.stat().st_mtime_ns
    out = _tune_eps(tmp_path, "--trials", "1", "--epochs", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "no figure written (--figure PATH" in out.stdout
    assert "1 trials; best under eps <= 2" in out.stdout
    assert list(tmp_path.iterdir()) == [] and figure.stat().st_mtime_ns == before


def test_tune_eps_asks_for_matplotlib_before_searching_when_a_figure_is_wanted(tmp_path):
    out = _tune_eps(tmp_path, "--trials", "1", "--epochs", "1", "--figure", "f.png")
    assert out.returncode == 2
    assert "--figure needs matplotlib" in out.stderr and "pip install matplotlib" in out.stderr
    assert "trials; best" not in out.stdout and list(tmp_path.iterdir()) == []
