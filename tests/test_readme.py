"""The README's quick starts run as written and do what they say."""

import pathlib
import re

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_label_quick_start():
    namespace = {}
    exec(_python_blocks()[0], namespace)  # noqa: S102 - our own README
    y, y_private = namespace["y"], namespace["y_private"]
    assert y_private.shape == y.shape and y_private.dtype == y.dtype
    # eps=2 flips a label with q = 1/(1+e^2) = 0.119. The README draws a fresh secret, so this
    # band on its 1000 labels is 6.5 standard deviations wide (outside: 7.6e-11); it still
    # excludes eps=1 (0.269) and eps=4 (0.018).
    flipped = np.mean(y_private != y)
    assert 0.05 < flipped < 0.19
    assert namespace["model"].evaluate(namespace["x"], y, verbose=0)[1] > 0.75


def test_embedding_quick_start():
    namespace = {}
    exec(_python_blocks()[1], namespace)  # noqa: S102
    model = namespace["model"]
    x_a = np.random.randn(32, 15).astype("float32")
    x_b = np.random.randn(32, 15).astype("float32")
    probs = model.predict([x_a, x_b], verbose=0)
    assert probs.shape == (32, 1) and np.all((probs >= 0) & (probs <= 1))
    protected = namespace["protected"]
    assert tuple(protected.shape) == (None, 16)


def test_vertical_quick_start():
    namespace = {}
    exec(_python_blocks()[2], namespace)  # noqa: S102
    history, attack = namespace["history"], namespace["attack"]
    # 512 rows x 8 float32 coordinates go up (and come down) per epoch.
    assert history.history["bytes_up"] == [512 * 8 * 4.0] * 2
    assert history.history["bytes_down"] == [512 * 8 * 4.0] * 2
    assert attack.num_evaluated == 512 and 0.0 <= attack.auc <= 1.0
    assert namespace["recorder"].cut_gradients("party_a").shape == (512, 8)


def test_horizontal_quick_start():
    namespace = {}
    exec(_python_blocks()[3], namespace)  # noqa: S102
    h = namespace["history"].history
    d = 64 * 64 + 64 + 64 * 10 + 10
    assert 4 * d == 19_240
    assert len(h["val_accuracy"]) == 10
    assert max(h["upload_bytes_per_client"]) <= 401 < 4 * d
    assert len(h["global_lr"]) == 10 and h["r_est"][-1] > 1e-5


def test_report_quick_start_follows_the_horizontal_one():
    namespace = {}
    exec(_python_blocks()[3], namespace)  # noqa: S102
    exec(_python_blocks()[4], namespace)  # noqa: S102
    report, fl = namespace["report"], namespace["fl"]
    rows = {r["mechanism"]: r for r in report.rows()}
    assert set(rows) == {"SignDS upload", "MagRR"}
    assert rows["SignDS upload"]["releases"] == fl.participation.max()
    assert rows["SignDS upload"]["eps_per_release"] == pytest.approx(100.0, rel=1e-3)
    assert report.epsilon > 100.0


# --------------------------------------------------------------------------- install hints

REPO = README.parent
# pip install "keras-fedpriv[flower]", pip install keras-fedpriv, a dependency on it: all ask the
# package index for a name it does not serve
_FROM_THE_INDEX = re.compile(r"keras-fedpriv\[|pip install\s+['\"]?keras-fedpriv\b|"
                             r"dependencies\s*=\s*\[[^\]]*['\"]keras-fedpriv")


def _shipped_text_files():
    """The repository's docs, examples, package and build files (no virtual env, no build)."""
    skip = {".venv", ".git", "build", "keras_fedpriv.egg-info", "__pycache__", ".pytest_cache"}
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if path.is_file() and not skip & set(rel.parts) and path.suffix in (
                ".md", ".py", ".toml", ".txt", ".cfg", ".html") or rel.name == "Makefile":
            yield rel, path.read_text(errors="replace")


def test_no_file_sends_users_to_the_index_for_keras_fedpriv():
    """keras-fedpriv is not on the package index: every hint installs it from the clone."""
    found = [f"{rel}: {m.group(0)!r}" for rel, text in _shipped_text_files()
             for m in _FROM_THE_INDEX.finditer(text) if rel.name != "test_readme.py"]
    assert not found, found
    for doc in ("README.md", "docs/flower.md", "examples/flower_horizontal/README.md",
                "examples/flower_vertical/README.md"):
        assert 'pip install -e ".[flower]"' in (REPO / doc).read_text(), doc


def test_the_flower_import_error_names_the_working_command(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "flwr", None)  # as if Flower were not installed
    for name in [m for m in sys.modules if m.startswith("keras_fedpriv.federated.flower")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError) as info:
        importlib.import_module("keras_fedpriv.federated.flower")
    assert 'pip install -e ".[flower]"' in str(info.value)
    assert "keras-fedpriv[" not in str(info.value)


# --------------------------------------------------------------------------- Flower simulations

def test_the_flower_guide_recommends_flwr_run_for_simulations():
    """`flwr run` on Flower's `local` connection, not the deprecated run_simulation."""
    text = (REPO / "docs" / "flower.md").read_text()
    assert "flwr run examples/flower_horizontal local --stream" in text
    paragraphs = text.split("\n\n")
    # every paragraph that names run_simulation says it is deprecated, or is the tests' reason
    for paragraph in paragraphs:
        if "run_simulation" in paragraph:
            assert "deprecated" in paragraph, paragraph
    assert "```python\nfrom flwr.simulation import run_simulation" not in text
    constant = pytest.importorskip("flwr.cli.constant")
    # the `local` connection is in every new Flower configuration of the installed Flower
    assert '[superlink.local]\naddress = ":local:"' in constant.DEFAULT_FLOWER_CONFIG_TOML
