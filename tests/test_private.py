"""One place per backend: what may reach TensorFlow, or Keras' private API, and where.

* Every Keras or TensorFlow private API is reached in
  ``keras_fedpriv/backend/private.py`` only, so a Keras upgrade breaks one file.
* Under ``KERAS_BACKEND=jax`` with no TensorFlow installed (the GPU machines),
  every module imports, but the TensorFlow backend itself.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.jax]

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "keras_fedpriv"
PRIVATE = PACKAGE / "backend" / "private.py"

# What counts as reaching a private API: keras.src / tensorflow.python imports, and the
# private attributes of Keras objects the package needs.
_PRIVATE_USE = re.compile(
    r"keras\.src|tensorflow\.python|\._flatten_layers\b|\._loss_tracker\b|\._compile_loss\b"
    r"|_keras_call_info_injected|\._seed_generators\b|\._tracker\b")

# The modules that import TensorFlow at module level: its backend implementation only.
_TENSORFLOW_MODULES = {"keras_fedpriv.backend.tensorflow"}


def _code_lines(path):
    """(number, line) of ``path`` outside docstrings and comments."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r'"""(?:.|\n)*?"""', lambda m: "\n" * m.group(0).count("\n"), text)
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        if code.strip():
            yield number, code


def test_private_apis_are_reached_in_backend_private_only():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PRIVATE:
            continue
        for number, code in _code_lines(path):
            if _PRIVATE_USE.search(code):
                found.append(f"{path.relative_to(ROOT)}:{number}: {code.strip()}")
    assert not found, "private Keras/TensorFlow APIs outside backend/private.py:\n" + \
        "\n".join(found)


def test_the_private_api_rule_catches_what_it_names():
    for line in ("from keras.src import backend", "layer._flatten_layers()",
                 "from tensorflow.python.ops import x", "model._loss_tracker.update_state(1)"):
        assert _PRIVATE_USE.search(line), line
    assert not _PRIVATE_USE.search("keras.ops.sum(x)")


_NO_TENSORFLOW = """
import importlib, importlib.util, os, pkgutil, sys
sys.modules["tensorflow"] = None  # as on a machine without TensorFlow
import keras_fedpriv
flower = importlib.util.find_spec("flwr") is not None
failed = []
for info in pkgutil.walk_packages(keras_fedpriv.__path__, "keras_fedpriv."):
    try:
        importlib.import_module(info.name)
    except Exception as error:
        if not flower and "needs Flower" in str(error):
            continue  # the Flower adapters, where Flower (an optional extra) is not installed
        failed.append(f"{info.name}: {type(error).__name__}: {error}")
print("\\n".join(failed))
"""


def test_every_module_but_the_tensorflow_backend_imports_without_tensorflow():
    # this checkout first, then whatever the path held (a GPU machine's carried wheels)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": path}
    result = subprocess.run([sys.executable, "-c", _NO_TENSORFLOW], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    failed = [line for line in result.stdout.splitlines() if line.strip()]
    names = {line.split(":", 1)[0] for line in failed}
    assert names == _TENSORFLOW_MODULES, "\n".join(failed)
