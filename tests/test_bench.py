"""Smoke runs of every benchmark script's ``--quick`` mode (in-process, docs/ untouched).

Each script is loaded from ``bench/`` as a module and its ``main(["--quick"])``
is called, as ``python bench/NAME.py --quick`` would; the test checks that it
finishes without an error, prints its table and leaves every file under docs/
unchanged. In-process runs share TensorFlow's start-up with the rest of the
session: about a minute in all on a 2-core machine. How long a script takes is
what the script measures, never asserted here.
"""

import hashlib
import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
DOCS = REPO / "docs"

# script -> (strings its --quick output must contain, marks)
SCRIPTS = {
    "audit": (["audits in", "0 unexpected verdict(s)", "caught"], ()),
    "budget": (["vertical", "horizontal", "ratio"], ()),
    "flower": (["HorizontalFL", "party worker in process", "signds"], (pytest.mark.flower,)),
    "gradient_inversion": (["batch 1", "FedAvg (L2, lr known)", "SignDS eps=10"], ()),
    "hfl_signds": (["FedAvg", "SignDS eps=10 + MagRR", "Gaussian", "DP-FedAvg", ": same"], ()),
    "hfl_throughput": (["training", "encode"], ()),
    "laplace_eval": (["silhouette final", "callback"], ()),
    "learnability": (["| signds | 0.35 |", "chance (most frequent test class)",
                      "embedding_dp: too small at eps"], ()),
    "layer_overhead": (["EmbeddingDPLayer", "LabelDPLayer", "ratio"], ()),
    "rr_with_prior": (["RR-with-prior", "2 seeds"], (pytest.mark.slow,)),
    "vertical_privacy": (["LabelDP, RR, eps=2", "EmbeddingDP, eps=4"], (pytest.mark.slow,)),
    "vertical_scale": (["| VerticalModel |", "LabelDP RR, eps=2", "completion 400",
                        "the leader's message loop, one process"], ()),
    "vertical_k": (["| 4 |", "the same eps for every K at each seed: True"], ()),
    "vertical_throughput": (["| VerticalModel |", "ratio"], ()),
}


def _docs_digest():
    return {str(p.relative_to(DOCS)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(DOCS.rglob("*")) if p.is_file()}


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# scripts that are no benchmark of their own, and the test that runs them instead
CHECKS = {"gpu_check": "tests/test_gpu_check.py"}


def test_every_script_is_covered():
    scripts = {p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(SCRIPTS) | set(CHECKS)
    assert all((REPO / test).exists() for test in CHECKS.values())


@pytest.mark.timeout(600)  # generous: a busy 2-core machine is 3-5x slower
@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, (_, m) in SCRIPTS.items()])
def test_quick_mode_runs(name, capsys, tmp_path, monkeypatch):
    expected, _ = SCRIPTS[name]
    monkeypatch.chdir(tmp_path)  # anything written to a relative path lands here
    before = _docs_digest()
    module = _load(name)
    status = module.main(["--quick"])
    out = capsys.readouterr().out
    assert status in (None, 0), out[-2000:]
    for text in expected:
        assert text in out, f"{text!r} not in the output of {name}.py --quick:\n{out[-2000:]}"
    assert _docs_digest() == before, f"{name}.py --quick changed docs/"


def test_quick_is_documented_in_every_help():
    for name in SCRIPTS:
        text = (BENCH / f"{name}.py").read_text()
        assert '"--quick"' in text and "def main(argv=None)" in text, name
