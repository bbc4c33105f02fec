"""The command line: ``keras-fedpriv --version``, ``audit`` and ``plan`` (in-process)."""

import pathlib
import re
import tomllib
from importlib import metadata

import pytest

import keras_fedpriv
from keras_fedpriv import __main__ as cli
from keras_fedpriv import privacy

REPO = pathlib.Path(__file__).resolve().parent.parent


def _error(argv, capsys):
    """Run ``main(argv)`` expecting an argparse error; return its stderr."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# --------------------------------------------------------------------------- --version / --help

def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.strip() == f"keras-fedpriv {cli.package_version()}"
    assert cli.package_version() == keras_fedpriv.__version__


def test_version_falls_back_to_the_package_attribute(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert cli.package_version() == keras_fedpriv.__version__


@pytest.mark.parametrize("argv,expected", [
    ([], ["demo", "audit", "plan", "--version", "examples:"]),
    (["audit"], ["MECHANISM", "--eps", "--trials", "--seed", "examples:", "binary_rr",
                 "embedding_dp_layer", "Clopper-Pearson"]),
    (["plan"], ["--target-eps", "--delta", "--releases", "--mechanism", "--num-classes",
                "--num-coordinates", "examples:", "gaussian"]),
])
def test_help_reads_well(argv, expected, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv + ["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for text in expected:
        assert text in out, text
    assert max(len(line) for line in out.splitlines()) <= 100


def test_the_plan_help_reads_the_registry_of_mechanisms(capsys):
    from keras_fedpriv.mechanisms import registry

    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    out = capsys.readouterr().out
    for name in registry.names(alone=True):
        assert f"{name:14s} {registry.MECHANISMS[name].title}" in out
    for m in registry.MECHANISMS.values():
        assert f"{m.name}={m.weight:g}" in out  # the default weights of a whole run
    assert "{" + ",".join(registry.PATTERNS) + "}" in out  # --pattern's choices


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


# --------------------------------------------------------------------------- audit

@pytest.mark.parametrize("mechanism", sorted(cli.AUDITS))
def test_audit_every_mechanism(mechanism, capsys):
    assert cli.main(["audit", mechanism, "--eps", "2", "--trials", "400", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "claimed eps:" in out and "empirical lower bound:" in out
    assert "confidence:           0.95" in out and "runs per input:       400" in out
    assert "consistent" in out


def test_audit_matches_the_library(capsys):
    argv = ["audit", "kary_rr", "--eps", "1.5", "--num-classes", "5", "--trials", "1000",
            "--seed", "3", "--confidence", "0.9"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    result = privacy.audit_kary_rr(1.5, num_classes=5, num_trials=1000, seed=3, confidence=0.9)
    assert result.name in out and "5-ary" in out
    assert f"empirical lower bound: {result.eps_lower_bound:.4f}" in out
    assert "confidence:           0.9\n" in out


def test_audit_layer_options(capsys):
    assert cli.main(["audit", "label_dp_layer", "--eps", "1", "--num-classes", "4",
                     "--trials", "200", "--seed", "1"]) == 0
    assert "sparse" in capsys.readouterr().out
    assert cli.main(["audit", "embedding_dp_layer", "--eps", "1", "--num-coordinates", "3",
                     "--trials", "200", "--seed", "1"]) == 0
    assert "claimed eps:          1.5" in capsys.readouterr().out  # 3 coordinates x eps / 2


def test_audit_refuted_claim_exits_1(monkeypatch, capsys):
    real = privacy.audit_binary_rr

    def overclaiming(eps, **kwargs):
        result = real(eps, **kwargs)
        return privacy.AuditResult(**{**result.__dict__, "claimed_eps": 0.01})

    monkeypatch.setattr(privacy, "audit_binary_rr", overclaiming)
    assert cli.main(["audit", "binary_rr", "--eps", "3", "--trials", "2000", "--seed", "0"]) == 1
    assert "REFUTED" in capsys.readouterr().out


@pytest.mark.parametrize("argv,expected", [
    (["audit", "binary_rr"], "--eps"),
    (["audit", "binary_rr", "--eps", "-1"],
     "argument --eps: must be a finite number > 0; got '-1'"),
    (["audit", "binary_rr", "--eps", "inf"], "argument --eps"),
    (["audit", "binary_rr", "--eps", "x"], "argument --eps"),
    (["audit", "binary_rr", "--eps", "1", "--trials", "10"],
     "argument --trials: must be an integer >= 100; got 10"),
    (["audit", "binary_rr", "--eps", "1", "--seed", "-2"], "argument --seed"),
    (["audit", "binary_rr", "--eps", "1", "--confidence", "1"], "argument --confidence"),
    (["audit", "gauss", "--eps", "1"], "argument MECHANISM: invalid choice: 'gauss'"),
    (["audit", "binary_rr", "--eps", "1", "--num-coordinates", "2"],
     "argument --num-coordinates: not used by mechanism 'binary_rr'"),
    (["audit", "laplace", "--eps", "1", "--num-classes", "3"],
     "argument --num-classes: not used by mechanism 'laplace'"),
    (["audit", "kary_rr", "--eps", "1", "--num-classes", "1"],
     "argument --num-classes: must be an integer >= 2; got 1"),
])
def test_audit_bad_arguments(argv, expected, capsys):
    err = _error(argv, capsys)
    assert expected in err
    assert "usage: keras-fedpriv audit" in err


# --------------------------------------------------------------------------- plan

def test_plan_label_dp(capsys):
    argv = ["plan", "--target-eps", "8", "--releases", "20", "--mechanism", "label_dp",
            "--num-classes", "10"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    eps = privacy.plan_epsilon(8.0, 1e-5, releases=20, mechanism="label_dp", num_classes=10)
    assert f"per-release eps: {eps:.4f}" in out
    assert "target eps=8, delta=1e-05 over 20 release(s)" in out


def test_plan_embedding_dp_and_delta(capsys):
    argv = ["plan", "--target-eps", "4", "--delta", "1e-6", "--releases", "5", "--mechanism",
            "embedding_dp", "--num-coordinates", "8"]
    assert cli.main(argv) == 0
    eps = privacy.plan_epsilon(4.0, 1e-6, releases=5, mechanism="embedding_dp",
                               num_coordinates=8)
    assert f"per-release eps: {eps:.4f}" in capsys.readouterr().out


def test_plan_gaussian(monkeypatch, capsys):
    calls = []

    def spy(target_epsilon, target_delta, *, releases):  # the real one calibrates for seconds
        calls.append((target_epsilon, target_delta, releases))
        return 1.23456

    monkeypatch.setattr(privacy, "plan_noise_multiplier", spy)
    assert cli.main(["plan", "--target-eps", "4", "--delta", "1e-7", "--releases", "10",
                     "--mechanism", "gaussian"]) == 0
    assert calls == [(4.0, 1e-7, 10)]
    assert "noise multiplier: 1.2346" in capsys.readouterr().out


def test_plan_one_mechanism_warns_when_too_small_to_learn(capsys):
    assert cli.main(["plan", "--target-eps", "0.5", "--releases", "20", "--mechanism",
                     "label_dp", "--num-classes", "10"]) == 0
    err = capsys.readouterr().err
    assert "warning: label_dp at a per-release eps of" in err
    assert cli.main(["plan", "--target-eps", "8", "--releases", "1", "--mechanism",
                     "label_dp", "--num-classes", "10"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("argv,expected", [
    (["plan", "--releases", "3", "--mechanism", "signds"], "--target-eps"),
    (["plan", "--target-eps", "1", "--mechanism", "signds"], "--releases"),
    (["plan", "--target-eps", "1", "--releases", "3"], "--mechanism"),
    (["plan", "--target-eps", "0", "--releases", "3", "--mechanism", "signds"],
     "argument --target-eps: must be a finite number > 0; got '0'"),
    (["plan", "--target-eps", "1", "--releases", "0", "--mechanism", "signds"],
     "argument --releases: must be an integer >= 1; got 0"),
    (["plan", "--target-eps", "1", "--delta", "1", "--releases", "3", "--mechanism", "signds"],
     "argument --delta: must be a number in [0, 1); got '1'"),
    (["plan", "--target-eps", "1", "--releases", "3", "--mechanism", "laplace"],
     "argument --mechanism: invalid choice: 'laplace'"),
    (["plan", "--target-eps", "1", "--releases", "3", "--mechanism", "embedding_dp"],
     "argument --num-coordinates: required with --mechanism embedding_dp"),
    (["plan", "--target-eps", "1", "--releases", "3", "--mechanism", "signds",
      "--num-classes", "3"], "argument --num-classes: only used with --mechanism label_dp"),
    (["plan", "--target-eps", "1", "--releases", "3", "--mechanism", "gaussian",
      "--num-coordinates", "3"],
     "argument --num-coordinates: only used with --mechanism embedding_dp"),
    (["plan", "--target-eps", "1e-9", "--releases", "1000", "--mechanism", "magrr"],
     "cannot be met"),
    # a whole run (--mechanisms): errors name the option, not the Python argument
    (["plan", "--target-eps", "8", "--mechanisms", "signds", "--mechanism", "signds"],
     "argument --mechanism: not used with --mechanisms"),
    (["plan", "--target-eps", "8", "--releases", "3", "--mechanism", "signds", "--rounds", "3"],
     "argument --rounds: only used with --mechanisms"),
    (["plan", "--target-eps", "8", "--mechanisms", "signds", "--rounds", "5"],
     "--num-clients is required to plan 'signds'"),
    (["plan", "--target-eps", "8", "--mechanisms", "signds,foo", "--rounds", "5"],
     "argument --mechanisms: expected names from"),
    (["plan", "--target-eps", "8", "--mechanisms", "embedding_dp"],
     "--epochs is required to plan 'embedding_dp'"),
    (["plan", "--target-eps", "8", "--mechanisms", "laplace_eval", "--rounds", "5",
      "--clients-per-round", "2", "--num-clients", "4"],
     "--eval-rows is required to plan 'laplace_eval'"),
    (["plan", "--target-eps", "8", "--mechanisms", "signds", "--rounds", "5",
      "--clients-per-round", "3", "--num-clients", "2"],
     "--clients-per-round=3 is more than the --num-clients=2 clients"),
    (["plan", "--target-eps", "8", "--mechanisms", "signds", "--weight", "signds=x"],
     "argument --weight: expected MECHANISM=NUMBER; got 'signds=x'"),
])
def test_plan_bad_arguments(argv, expected, capsys):
    err = _error(argv, capsys)
    assert expected in err
    assert "usage: keras-fedpriv plan" in err


# --------------------------------------------------------------------------- plan, a whole run

def test_plan_run_prints_the_whole_runs_table_and_warns_on_stderr(capsys):
    argv = ["plan", "--target-eps", "8", "--mechanisms", "signds,magrr", "--rounds", "20",
            "--clients-per-round", "5", "--num-clients", "10", "--weight", "magrr=0.5"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    expected = privacy.plan(8.0, 1e-5, mechanisms=("signds", "magrr"), rounds=20,
                            clients_per_round=5, num_clients=10, weights={"magrr": 0.5},
                            warn=False)
    assert str(expected) in captured.out
    signds = next(m for m in expected.mechanisms if m.mechanism == "signds")
    assert f"eps {signds.value:.4g}" in captured.out
    # per-release eps ~0.6 over 20 rounds: too small to learn; the advice names the option
    assert "warning: signds at a per-release eps" in captured.err
    assert "--max-rounds-per-client" in captured.err


def test_plan_whole_run_counts_each_evaluated_row_as_a_release_about_the_client(capsys):
    argv = ["plan", "--target-eps", "8", "--mechanisms", "signds,laplace_eval", "--rounds", "10",
            "--clients-per-round", "2", "--num-clients", "4", "--evaluate-every", "5",
            "--eval-rows", "30"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    expected = privacy.plan(8.0, 1e-5, mechanisms=("signds", "laplace_eval"), rounds=10,
                            clients_per_round=2, num_clients=4, evaluate_every=5, eval_rows=30,
                            warn=False)
    assert str(expected) in out
    assert expected["laplace_eval"].releases == 2 * 30  # 2 evaluations of 30 rows


def test_plan_run_vertical_gives_each_secret_the_target(capsys):
    argv = ["plan", "--target-eps", "4", "--mechanisms", "label_dp,embedding_dp",
            "--epochs", "2", "--num-classes", "2", "--num-coordinates", "4"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "labels" in out and "features" in out


# --------------------------------------------------------------------------- packaging

def test_py_typed_marker_ships():
    marker = pathlib.Path(keras_fedpriv.__file__).parent / "py.typed"
    assert marker.is_file() and marker.read_text() == ""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["keras_fedpriv"]


def test_entry_point_is_main():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert config["project"]["scripts"]["keras-fedpriv"] == "keras_fedpriv.__main__:main"


# --------------------------------------------------------------------------- light start-up

@pytest.mark.parametrize("argv", [["--help"], ["worker", "--help"], ["audit", "--help"]])
def test_help_imports_no_tensorflow(argv):
    """``keras-fedpriv --help`` (the console script calls ``main``) and ``python -m``."""
    import subprocess
    import sys

    code = ("import sys\nfrom keras_fedpriv.__main__ import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "print('HEAVY', sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage: keras-fedpriv" in out.stdout and "HEAVY []" in out.stdout
    module = subprocess.run([sys.executable, "-X", "importtime", "-m", "keras_fedpriv", *argv],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert module.returncode == 0 and "usage: keras-fedpriv" in module.stdout
    imported = {line.split("|")[-1].strip() for line in module.stderr.splitlines()}
    assert "tensorflow" not in imported and "keras" not in imported


def test_the_help_texts_name_the_planners_mechanisms():
    from keras_fedpriv.privacy import planning, run_plan

    assert cli.PLAN_MECHANISMS == planning.PLANNED_MECHANISMS
    assert sorted(cli.RUN_MECHANISMS) == sorted(run_plan.RUN_MECHANISMS)


def test_the_help_texts_show_the_demos_real_defaults():
    from keras_fedpriv import demo, demo_horizontal

    assert (cli.DEFAULT_EPOCHS, cli.QUICK_EPOCHS, cli.DEFAULT_ROUNDS) == (
        demo.DEFAULT_EPOCHS, demo.QUICK_EPOCHS, demo_horizontal.DEFAULT_ROUNDS)


def test_worker_needs_an_app_and_a_socket(capsys):
    err = _error(["worker", "--socket", "/tmp/x.sock"], capsys)
    assert "--app" in err
    err = _error(["worker", "--app", "m:a", "--socket", "/tmp/x.sock", "--max-frame-mib", "0"],
                 capsys)
    assert "--max-frame-mib" in err and "integer >= 1" in err


# --------------------------------------------------------------------------- quiet start-up

# What TensorFlow 2.21 prints while it starts (absl's pre-init warning, then INFO lines such as
# "oneDNN custom operations are on" and "Could not find cuda drivers", "failed call to cuInit")
_TF_START_UP = re.compile(r"absl::InitializeLog|^[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]",
                          re.MULTILINE)
# a command that imports TensorFlow and runs an op (an EmbeddingDPLayer), in seconds
_AUDIT = ["audit", "embedding_dp_layer", "--eps", "4", "--trials", "100", "--seed", "0"]


def _run_tensorflow_command(launcher, **extra_env):
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_FEDPRIV_TF_LOGS")}
    env.update(extra_env)
    out = subprocess.run([*launcher, *_AUDIT], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=600)  # generous: TensorFlow starts slowly when busy
    assert out.returncode == 0, out.stderr[-3000:]
    assert "verdict:              consistent" in out.stdout
    return out.stderr


@pytest.mark.parametrize("launcher", ["console script", "python -m"])
def test_the_command_starts_quietly(launcher):
    """No TF_CPP_MIN_LOG_LEVEL in the environment: none of TensorFlow's start-up lines."""
    import sys

    if launcher == "python -m":
        command = [sys.executable, "-m", "keras_fedpriv"]
    else:
        command = [str(pathlib.Path(sys.executable).with_name("keras-fedpriv"))]
        if not pathlib.Path(command[0]).is_file():
            pytest.skip("the console script is not installed next to this Python")
    stderr = _run_tensorflow_command(command)
    assert not _TF_START_UP.search(stderr), stderr[-3000:]


def test_the_switch_brings_tensorflows_logs_back():
    """KERAS_FEDPRIV_TF_LOGS=1 (``python -m keras_fedpriv``): TensorFlow prints as usual."""
    import sys

    stderr = _run_tensorflow_command([sys.executable, "-m", "keras_fedpriv"],
                                     KERAS_FEDPRIV_TF_LOGS="1")
    assert _TF_START_UP.search(stderr), stderr[-3000:]


def test_the_help_names_the_switch(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "KERAS_FEDPRIV_TF_LOGS=1" in capsys.readouterr().out


def test_the_demo_writes_a_figure_only_where_asked():
    """No --figure: no figure (the demo never writes into the current folder by itself)."""
    assert cli.build_parser().parse_args(["demo"]).figure is None
    assert cli.build_parser().parse_args(["demo", "--figure", "out/f.png"]).figure == "out/f.png"
