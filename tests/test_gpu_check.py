"""bench/gpu_check.py, run here on the CPU with JAX (``--cpu --quick --no-install``), so the
check made on a GPU machine cannot rot: its device query, its test pass (``-m jax`` under
``KERAS_BACKEND=jax``, counted from pytest's JUnit report) and each benchmark it times.

The check's test pass here runs this module's two probes (the tests marked ``jax`` below):
one passes and one, ``tensorflow_only``, is skipped under JAX. The probes also run in
``make test``'s JAX pass, where the first checks that the process has Keras on JAX.
"""

import importlib.util
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def _gpu_check():
    spec = importlib.util.spec_from_file_location("_gpu_check", REPO / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(tmp_path, *args):
    """``(exit status, summary)`` of gpu_check on the CPU with this Python's packages."""
    pytest.importorskip("jax")
    out = tmp_path / "summary.txt"
    status = _gpu_check().main(["--cpu", "--quick", "--no-install", "--out", str(out), *args])
    return status, out.read_text()


@pytest.mark.slow
def test_the_check_reports_the_device_and_counts_the_jax_tests(tmp_path, capsys):
    status, text = _check(tmp_path, "--tests", "tests/test_gpu_check.py", "--benches")
    assert text in capsys.readouterr().out
    assert "(cpu), Keras" in text and "on jax; devices: cpu:" in text, text
    assert "tests (-m jax): 1 passed, 0 failed, 0 errors, 1 skipped" in text, text
    assert "bench/" not in text and text.endswith("gpu_check: ok\n") and status == 0, text


@pytest.mark.slow
def test_the_check_times_each_benchmark_under_jax_and_leaves_docs_as_they_were(tmp_path):
    docs = {p: p.read_bytes() for p in (REPO / "docs").rglob("*") if p.is_file()}
    status, text = _check(tmp_path, "--no-tests")  # both benchmarks, in one check
    for name, keep in (("layer_overhead", " ratio "), ("hfl_throughput", "training (")):
        assert f"bench/{name}.py: exit 0" in text, text
        # the output lines the check keeps: the ratios, or the training and encoding rows
        section = text.split(f"bench/{name}.py:", 1)[1].split("\nbench/", 1)[0]
        assert keep in section, text
    assert status == 0, text
    assert {p: p.read_bytes() for p in docs} == docs


def test_a_failed_test_pass_fails_the_check_and_shows_pytests_output(tmp_path):
    status, text = _check(tmp_path, "--tests", "tests/test_gpu_check.py -k no_such_test",
                          "--benches")
    assert "tests (-m jax): 0 passed" in text and "pytest exit 5" in text, text
    assert text.endswith("gpu_check: FAILED\n") and status == 1, text


def test_junit_counts_read_every_suite(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text('<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"/>'
                      '<testsuite tests="3" failures="0" errors="1" skipped="0"/></testsuites>')
    counts = _gpu_check().junit_counts(report)
    assert counts == {"passed": 4, "failed": 1, "errors": 1, "skipped": 2}
    assert _gpu_check().junit_counts(tmp_path / "none.xml")["passed"] == 0


def test_a_pass_stopped_before_its_report_is_counted_from_its_progress():
    output = "collected 9 items\n..F.s [ 55%]\nsx.E\n\n2 failed in 3 s\n"
    counts = _gpu_check().progress_counts(output)
    assert counts == {"passed": 4, "failed": 1, "errors": 1, "skipped": 3}


# --------------------------------------------------------------------------- the probes

@pytest.mark.jax
def test_probe_keras_runs_on_the_backend_of_this_process():
    """Under KERAS_BACKEND=jax, Keras computes with JAX (on TensorFlow: with TensorFlow)."""
    import os

    import keras

    assert keras.backend.backend() == os.environ.get("KERAS_BACKEND", "tensorflow")
    x = keras.ops.convert_to_tensor(np.arange(12, dtype="float32").reshape(3, 4))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(keras.ops.sum(x, axis=0)),
                                  [12.0, 15.0, 18.0, 21.0])


@pytest.mark.jax
@pytest.mark.tensorflow_only("a probe of the skip: under JAX it is skipped, never run")
def test_probe_tensorflow_only_is_skipped_under_jax():
    import keras

    assert keras.backend.backend() == "tensorflow"
