"""Check keras-fedpriv on a GPU with JAX: the backend-neutral tests and two benchmarks.

Meant for a machine with JAX and CUDA but no TensorFlow (such as the project's lent GPU
machines: Python 3.12, JAX 0.11.2 with its CUDA 13 plugins, numpy, h5py, ml-dtypes, absl-py,
rich, scipy, scikit-learn, pytest; no Keras, dp-accounting, optree, namex or TensorFlow, and
no package index). The script

1. installs the carried wheels (``--wheels``, default ``.whl/``, with ``--no-deps`` into
   ``--target``, which the test and benchmark processes then find on ``PYTHONPATH``);
2. asks JAX for its devices (a GPU is required unless ``--cpu``);
3. runs the tests that ``make test``'s JAX pass runs (``KERAS_BACKEND=jax pytest -m jax``,
   ``--workers`` processes sharing the GPU, memory allocated as needed);
4. times ``bench/layer_overhead.py`` and ``bench/hfl_throughput.py`` under JAX (their
   ``--quick`` mode with ``--quick``; docs/ is left as it was);

and prints a short summary (devices, test counts, the benchmarks' ratio lines and times),
also written to ``--out``. Each step has its own time limit inside ``--budget`` (480 s by
default), so the whole check ends in under 8 minutes. Exit status 0 when JAX saw the device,
no test failed and both benchmarks finished.

The wheels (about 3.4 MB; download them here, once, in the repository root; ``.whl/`` is
ignored by git). Keras needs namex and optree (compiled: the cp312 manylinux wheel),
dp-accounting needs dm-tree (compiled), and keras-tuner (which some `jax` test modules
import) needs kt-legacy; their other needs (absl-py, attrs, grpcio, mpmath, numpy, protobuf,
requests, rich, h5py, ml-dtypes, packaging, scipy, typing-extensions, wrapt) are on the
machine (``--no-deps``: their version pins, such as dp-accounting's attrs < 24, are not
enforced). Flower is not carried: the Flower tests skip themselves there
(``importorskip("flwr")``). A test module that still fails to import is reported as an
error, and the other modules run (``--continue-on-collection-errors``)::

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \\
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \\
        --platform manylinux2014_x86_64 -d .whl \\
        keras==3.15.1 namex==0.1.0 optree==0.20.0 dp-accounting==0.6.0 dm-tree==0.1.10
    python3 -m pip download --no-deps --only-binary=:all: -d .whl keras-tuner==1.4.8 \
        kt-legacy==1.0.5

Then, with the device tool (one call; about 5 minutes of its device time)::

    run(command="PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out $OUT/gpu_check.txt",
        carry=[".whl"], timeout_s=540)

Here, on the CPU (what tests/test_gpu_check.py runs, without installing anything)::

    KERAS_BACKEND=jax .venv/bin/python bench/gpu_check.py --cpu --quick --no-install
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

REPO = pathlib.Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"

#: bench script -> (its arguments for a full check, for --quick, the lines of its output kept)
BENCHES = {
    "layer_overhead": (["--no-docs", "--rounds", "5", "--steps", "30"], ["--quick"],
                       re.compile(r"\bratio\b")),
    "hfl_throughput": (["--repeats", "5", "--encode-repeats", "3", "--magrr-repeats", "5"],
                       ["--quick"], re.compile(r"^(training|magrr|encode) ")),
}

#: seconds a step may take at most (each also gets no more than the budget has left)
LIMITS = {"install": 60, "devices": 60, "tests": 300, "bench": 150}

_DEVICES = """
import json, jax, keras
print(json.dumps({"jax": jax.__version__, "keras": keras.__version__,
                  "backend": keras.backend.backend(), "platform": jax.default_backend(),
                  "devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()]}))
"""


class Clock:
    """The time left of the check's budget."""

    def __init__(self, budget: float):
        self.end = time.monotonic() + budget

    def limit(self, step: str) -> float:
        """Seconds for ``step``: its own limit, or what is left of the budget if less."""
        return max(1.0, min(LIMITS[step], self.end - time.monotonic()))


def run(command: list[str], env: dict, timeout: float) -> tuple[int, str, float]:
    """``(exit status, output, seconds)`` of ``command`` in the repository root; status 124
    when it ran past ``timeout`` seconds (then it and every process it started are killed)."""
    started = time.monotonic()
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: pytest's workers too
            output, _ = proc.communicate()
            status = 124
    return status, output, time.monotonic() - started


def install(wheels: pathlib.Path, target: pathlib.Path, clock: Clock) -> list[str]:
    """Install every wheel in ``wheels`` into ``target`` (no dependencies, no index)."""
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise SystemExit(f"no wheels in {wheels}: download them first (see the docstring of "
                         f"{pathlib.Path(__file__).name}), or pass --no-install")
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
               "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target),
               *map(str, found)]
    status, output, _ = run(command, dict(os.environ), clock.limit("install"))
    if status:
        raise SystemExit(f"installing the wheels failed ({status}):\n{output[-3000:]}")
    return [w.name.split("-")[0] for w in found]


def environment(args: argparse.Namespace, site: pathlib.Path | None) -> dict:
    """The environment of the test and benchmark processes: Keras on JAX, the installed
    wheels first on the path, GPU memory taken as needed (several processes share it)."""
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3",
               XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1")
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    if args.cpu:
        env["JAX_PLATFORMS"] = "cpu"
    return env


def devices(env: dict, clock: Clock) -> dict:
    """What JAX and Keras report in a process with ``env``."""
    status, output, _ = run([sys.executable, "-c", _DEVICES], env, clock.limit("devices"))
    if status:
        raise SystemExit(f"JAX or Keras did not start ({status}):\n{output[-3000:]}")
    return json.loads(output.strip().splitlines()[-1])


def junit_counts(path: pathlib.Path) -> dict:
    """Passed, failed, errors and skipped from a pytest JUnit XML report."""
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if path.exists() and path.stat().st_size:
        for suite in ElementTree.parse(path).getroot().iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
    return {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": counts["failures"], "errors": counts["errors"],
            "skipped": counts["skipped"]}


_PROGRESS = re.compile(r"^([.FEsxX]+)\s*(\[\s*\d+%\])?$")


def progress_counts(output: str) -> dict:
    """Counts from pytest's progress characters (``-q``), for a pass stopped before it wrote
    its report."""
    marks = "".join(m.group(1) for line in output.splitlines()
                    if (m := _PROGRESS.match(line.strip())))
    return {"passed": marks.count(".") + marks.count("X"), "failed": marks.count("F"),
            "errors": marks.count("E"), "skipped": marks.count("s") + marks.count("x")}


def run_tests(args: argparse.Namespace, env: dict, clock: Clock) -> dict:
    """The JAX pass's tests (``-m jax``) on ``args.tests``: counts, status, seconds and the
    output's last lines."""
    with tempfile.TemporaryDirectory() as folder:
        report = pathlib.Path(folder, "junit.xml")
        command = [sys.executable, "-m", "pytest", "-q", "-m", "jax", "-p", "no:cacheprovider",
                   "--continue-on-collection-errors", f"--junitxml={report}",
                   "-o", "junit_family=xunit2"]
        if args.workers:
            command += ["-n", str(args.workers), "--dist", "loadgroup"]
        status, output, seconds = run(command + shlex.split(args.tests), env,
                                      clock.limit("tests"))
        counts = junit_counts(report) if report.exists() else progress_counts(output)
    return dict(counts, status=status, seconds=seconds, tail=output.strip().splitlines()[-15:])


def run_bench(name: str, args: argparse.Namespace, env: dict, clock: Clock) -> dict:
    """``bench/<name>.py`` under JAX: status, seconds and its result lines. docs/ is put back
    as it was (a full run of some scripts rewrites their section of docs/benchmarks.md)."""
    full, quick, keep = BENCHES[name]
    docs = {p: p.read_bytes() for p in (REPO / "docs").glob("*.md")}
    try:
        status, output, seconds = run([sys.executable, str(BENCH / f"{name}.py"),
                                       *(quick if args.quick else full)],
                                      env, clock.limit("bench"))
    finally:
        for path, text in docs.items():
            if path.read_bytes() != text:
                path.write_bytes(text)
    lines = [line.strip() for line in output.splitlines() if keep.search(line)]
    return {"status": status, "seconds": seconds, "lines": lines,
            "tail": [] if status == 0 else output.strip().splitlines()[-15:]}


def summary(info: dict, tests: dict | None, benches: dict) -> list[str]:
    """The check's result as lines of text."""
    lines = [f"JAX {info['jax']} ({info['platform']}), Keras {info['keras']} on "
             f"{info['backend']}; devices: {', '.join(info['devices'])}"]
    if tests is not None:
        lines.append(f"tests (-m jax): {tests['passed']} passed, {tests['failed']} failed, "
                     f"{tests['errors']} errors, {tests['skipped']} skipped in "
                     f"{tests['seconds']:.0f} s (pytest exit {tests['status']})")
        if tests["status"]:
            lines += ["  " + line for line in tests["tail"]]
    for name, result in benches.items():
        lines.append(f"bench/{name}.py: exit {result['status']} in {result['seconds']:.0f} s")
        lines += ["  " + line for line in result["lines"] + result["tail"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=pathlib.Path, default=REPO / ".whl",
                        help="folder of the wheels to install (default: .whl/)")
    parser.add_argument("--target", type=pathlib.Path,
                        default=pathlib.Path(tempfile.gettempdir()) / "kfp-gpu-site",
                        help="where the wheels are installed (pip --target)")
    parser.add_argument("--no-install", action="store_true",
                        help="use this Python's packages as they are (no wheels)")
    parser.add_argument("--cpu", action="store_true",
                        help="JAX on the CPU (JAX_PLATFORMS=cpu); no GPU is required")
    parser.add_argument("--quick", action="store_true",
                        help="the benchmarks' --quick mode (seconds, not minutes)")
    parser.add_argument("--tests", default="tests",
                        help="pytest's arguments, in one string: what to test (default: tests)")
    parser.add_argument("--no-tests", action="store_true", help="skip the tests")
    parser.add_argument("--benches", nargs="*", choices=sorted(BENCHES), default=sorted(BENCHES),
                        help="benchmarks to time (default: both; none: --benches)")
    parser.add_argument("--workers", type=int, default=None,
                        help="pytest-xdist processes (default: 4 on a GPU, 0 with --cpu)")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="seconds for the whole check (each step stops within it)")
    parser.add_argument("--out", type=pathlib.Path, help="also write the summary here")
    args = parser.parse_args(argv)
    if args.workers is None:
        args.workers = 0 if args.cpu else 4
    clock = Clock(args.budget)

    site = None
    if not args.no_install:
        names = install(args.wheels, args.target, clock)
        site = args.target
        print(f"installed into {site}: {', '.join(names)}", flush=True)
    env = environment(args, site)
    info = devices(env, clock)
    print(f"devices: {info['devices']}", flush=True)
    ok = info["backend"] == "jax" and (args.cpu or info["platform"] == "gpu")
    if not ok:
        print(f"no GPU for JAX (platform {info['platform']}, Keras backend {info['backend']});"
              " pass --cpu to check on the CPU", flush=True)
    tests = None if args.no_tests else run_tests(args, env, clock)
    if tests is not None:
        ok = ok and tests["status"] == 0 and tests["failed"] == tests["errors"] == 0
    benches = {}
    for name in args.benches:
        benches[name] = run_bench(name, args, env, clock)
        ok = ok and benches[name]["status"] == 0
    text = "\n".join(summary(info, tests, benches) + [f"gpu_check: {'ok' if ok else 'FAILED'}"])
    print(text, flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
