"""The package logger: progress goes through logging, with verbosity control."""

import logging

import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.logs import TF_LOGS_VARIABLE, quiet_tensorflow


def test_verbose_progress_goes_through_the_package_logger(caplog):
    vae = kf.VAEBottom(2, hidden_units=(8,), with_decoder=True, seed=0)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    kf.logger.propagate = True  # let caplog see it
    try:
        with caplog.at_level(logging.INFO, logger="keras_fedpriv"):
            vae.pretrain(x, epochs=2, batch_size=16, verbose=1)
            vae.pretrain(x, epochs=1, batch_size=16, verbose=0)
    finally:
        kf.logger.propagate = False
    lines = sorted({r.getMessage() for r in caplog.records if r.name == "keras_fedpriv"})
    assert len(lines) == 2  # the two epochs of the verbose call, none of the quiet one
    assert lines[0].startswith("VAEBottom.pretrain epoch 1/2: loss=")


def test_set_verbosity():
    previous = kf.set_verbosity("info")
    try:
        assert kf.logger.level == logging.INFO
        assert kf.set_verbosity(logging.ERROR) == logging.INFO
    finally:
        kf.set_verbosity(previous)
    with pytest.raises(ValueError, match="level"):
        kf.set_verbosity("loud")


# --------------------------------------------------------------------------- quiet start-up

@pytest.fixture
def own_meta_path(monkeypatch):
    """quiet_tensorflow may add an import hook: keep it off the test process's own path."""
    import sys

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))


def test_quiet_tensorflow_sets_the_level_and_keeps_the_users(own_meta_path):
    environ = {}
    assert quiet_tensorflow(environ) is True
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "3"}
    environ = {"TF_CPP_MIN_LOG_LEVEL": "0"}  # the user asked for every log: kept
    assert quiet_tensorflow(environ) is True
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "0"}


@pytest.mark.parametrize("value", ["1", "true", " YES "])
def test_the_switch_brings_the_logs_back(value, own_meta_path):
    import sys

    before = list(sys.meta_path)
    environ = {TF_LOGS_VARIABLE: value}
    assert quiet_tensorflow(environ) is False
    assert environ == {TF_LOGS_VARIABLE: value} and sys.meta_path == before


def test_importing_the_package_changes_no_environment():
    """A library import sets no variable and installs no hook; only a program's call does.

    Keras is imported first: its backends may set variables of their own (JAX, when it is
    installed, sets TF_CPP_MIN_LOG_LEVEL as it loads), which are not the package's doing.
    """
    import os
    import subprocess
    import sys

    code = ("import os, sys, keras\nbefore = dict(os.environ)\n"
            "import keras_fedpriv, keras_fedpriv.logs, keras_fedpriv.privacy\n"
            "print(os.environ != before,\n"
            "      any(type(f).__module__ == 'keras_fedpriv.logs' for f in sys.meta_path))")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]


def test_the_import_filter_follows_tensorflows_levels():
    """Level 1 hides INFO, 2 also WARNING, 3 also ERROR; FATAL and other text always pass."""
    from keras_fedpriv.logs import _hidden

    def line(severity):
        return severity + b"0000 00:00:1795668046.134050   32696 cuda_platform.cc:52] text\n"

    pre_init = (b"WARNING: All log messages before absl::InitializeLog() is called are written "
                b"to STDERR\n")
    for level, hidden in ((0, b""), (1, b"I"), (2, b"IW"), (3, b"IWE")):
        assert [s for s in (b"I", b"W", b"E", b"F") if _hidden(line(s), level)] == [
            bytes([c]) for c in hidden]
        assert _hidden(pre_init, level) == (level >= 1)
        assert not _hidden(b"Traceback (most recent call last):\n", level)


_FAKE_TENSORFLOW = '''import os
for line in (b"I0000 00:00:1795668046.134050   32696 port.cc:153] oneDNN custom operations\\n",
             b"F0000 00:00:1795668046.134050   32696 cpu_feature_guard.cc:1] compiled to use AVX\\n"):
    os.write(2, line)
mode = os.environ.get("FAKE_TF_MODE")
if mode == "raise":
    raise ImportError("broken install")
if mode == "abort":
    os.abort()
'''


@pytest.mark.parametrize("mode", ["ok", "raise", "abort", "no_sys_stderr"])
def test_the_import_hook_on_a_stand_in_tensorflow(tmp_path, mode):
    """A stand-in ``tensorflow`` package prints an INFO and a FATAL line: the INFO line is
    dropped, the FATAL line and a failing import's traceback are shown, fd 2 is restored;
    a crash inside the import still says where it died; no sys.stderr is no failure."""
    import os
    import subprocess
    import sys

    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(_FAKE_TENSORFLOW)
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            + ("sys.stderr = None\n" if mode == "no_sys_stderr" else "")
            + "from keras_fedpriv.logs import quiet_tensorflow\nquiet_tensorflow()\n"
            "import tensorflow, os\nos.write(2, b'after the import\\n')\n"
            "print(type(tensorflow.__loader__).__name__)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", TF_LOGS_VARIABLE)}
    env["FAKE_TF_MODE"] = mode
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert "oneDNN" not in out.stderr
    if mode == "abort":
        assert out.returncode != 0
        assert "Fatal Python error: Aborted" in out.stderr and "exec_module" in out.stderr
        return
    assert "compiled to use AVX" in out.stderr
    if mode == "raise":
        assert out.returncode == 1 and out.stderr.rstrip().endswith("broken install")
        return
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["SourceFileLoader"]  # the hook is gone from the module
    assert out.stderr.index("compiled to use AVX") < out.stderr.index("after the import")
