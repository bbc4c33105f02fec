"""The TensorFlow implementation of the backend interface (`keras_fedpriv.backend.tensorflow`).

What both backends promise is tested in tests/test_backend.py; here, what is
particular to TensorFlow, and that a `.keras` file moves between the backends:
a model saved on TensorFlow loads on JAX with its counter and counts, and
with a fresh key.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import keras

if keras.backend.backend() != "tensorflow":
    pytest.skip("the TensorFlow backend's own tests", allow_module_level=True)

from keras_fedpriv.backend import tensorflow as tf_backend  # noqa: E402
from tests.test_backend import _data, _model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_counter_is_saved_in_tensorflows_philox_layout():
    model, flip = _model(seed=2)
    inputs, _ = _data(8)
    model(inputs)
    model(inputs)
    np.testing.assert_array_equal(tf_backend.counter_for_file(flip.rng_counter),
                                  [2 * tf_backend._SKIP, 0, 0])


_LOAD_ON_JAX = """
import sys, numpy as np, keras
sys.path.insert(0, {root!r})
from tests.test_backend import _Flip
layer = keras.models.load_model({path!r}).get_layer("flip")
print(keras.backend.backend(), layer.noise_draws, layer.release_calls()["fresh_with_ids"],
      layer.release_id_max(), np.asarray(layer.rng_key.numpy())[:2].astype(np.uint32).tolist())
"""


def test_a_keras_file_saved_on_tensorflow_loads_on_jax(tmp_path):
    pytest.importorskip("jax")
    model, flip = _model()
    inputs, _ = _data(8)
    for _ in range(3):
        model(inputs)
    path = str(tmp_path / "m.keras")
    model.save(path)
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", _LOAD_ON_JAX.format(root=ROOT, path=path)],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    backend, draws, calls, busiest, key = out.stdout.split(maxsplit=4)
    assert (backend, int(draws), int(calls), int(busiest)) == ("jax", 3, 3, 3)
    assert eval(key) != (np.asarray(flip.rng_key.numpy())[:2]).astype(np.uint32).tolist()
