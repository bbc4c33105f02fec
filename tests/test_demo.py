"""The demo (`python -m keras_fedpriv demo`): quick run, table, CLI."""

import io
import os
import subprocess
import sys

import pytest

from keras_fedpriv import demo
from keras_fedpriv.__main__ import build_parser, main

pytestmark = [pytest.mark.jax]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_cli(*args, timeout=300):  # generous: a busy machine starts TensorFlow slowly
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "keras_fedpriv", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def quick_run():
    out = io.StringIO()
    rows = demo.run_demo(quick=True, seed=0, out=out)
    return rows, out.getvalue()


def test_quick_demo_rows(quick_run):
    rows, text = quick_run
    # quick means the short list of configurations at the quick epoch count (its speed is
    # measured in bench/, not asserted here)
    quick = [(c["protection"], c["label_eps"], c["embedding_eps"])
             for c in demo.configurations(quick=True)]
    assert [(r["protection"], r["label_eps"], r["embedding_eps"]) for r in rows] == quick
    assert f"Training: {demo.QUICK_EPOCHS} epochs" in text
    by = {(r["protection"], r["label_eps"], r["embedding_eps"]): r for r in rows}
    assert set(by) == {("none", None, None), ("LabelDP", 0.5, None), ("LabelDP", 2.0, None),
                       ("EmbeddingDP", None, 4.0), ("both", 2.0, 4.0), ("VAEBottom", None, None)}
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0, r
        assert 0.0 <= r["norm_auc"] <= 1.0 and 0.0 <= r["direction_auc"] <= 1.0, r
        assert r["protected"]
    none = by[("none", None, None)]["accuracy"]
    assert none > 0.9
    # eps = 0.5 flips 38% of the training labels: it cannot beat no protection.
    assert by[("LabelDP", 0.5, None)]["accuracy"] <= none + 0.02
    # Label DP really randomized the training labels (flip probability 1/(1+e^eps)).
    assert 0.25 < by[("LabelDP", 0.5, None)]["labels_flipped"] < 0.5
    assert 0.05 < by[("LabelDP", 2.0, None)]["labels_flipped"] < 0.2
    assert "labels_flipped" not in by[("EmbeddingDP", None, 4.0)]
    # The attacks: unprotected, the direction attack recovers the labels; with eps = 0.5
    # label DP it cannot beat the randomized-response bound e^eps / (1 + e^eps) = 0.62 by
    # much (the rows of one epoch are a finite sample).
    assert by[("none", None, None)]["direction_auc"] > 0.9
    assert by[("LabelDP", 0.5, None)]["direction_auc"] < 0.62 + 0.1
    # Bytes the follower sent in one epoch: 398 rows x 8 float32 coordinates unprotected,
    # 398 rows x 8 packed bits (one byte) with EmbeddingDP.
    assert by[("none", None, None)]["bytes_up"] == 398 * 8 * 4
    assert by[("EmbeddingDP", None, 4.0)]["bytes_up"] == 398
    vae = by[("VAEBottom", None, None)]
    assert 0 < vae["deldp"].eps < float("inf") and vae["accuracy"] > 0.8


def test_quick_demo_output(quick_run):
    rows, text = quick_run
    assert "breast cancer" in text and "party_a" in text and "party_b" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("protection"))
    assert "test acc" in lines[header] and "what is protected" in lines[header]
    assert "norm AUC" in lines[header] and "direction AUC" in lines[header]
    table = lines[header + 2:header + 2 + len(rows)]
    for row, line in zip(rows, table):
        assert line.startswith(row["protection"])
        assert f"{row['accuracy']:.3f}" in line
    # aligned: the accuracy column ends at the same place on every line
    ends = {line.index(f"{r['accuracy']:.3f}") for r, line in zip(rows, table)}
    assert len(ends) == 1
    footer = " ".join(lines[header + 2 + len(rows):])
    assert "label-DP" in footer and "local-DP" in footer and "dELDP" in footer


def test_full_configurations():
    configs = demo.configurations()
    kinds = [(c["protection"], c["label_eps"], c["embedding_eps"]) for c in configs]
    assert kinds == [("none", None, None),
                     ("LabelDP", 0.5, None), ("LabelDP", 1.0, None), ("LabelDP", 2.0, None),
                     ("LabelDP", 4.0, None),
                     ("EmbeddingDP", None, None), ("EmbeddingDP", None, 1.0),
                     ("EmbeddingDP", None, 4.0), ("EmbeddingDP", None, 16.0),
                     ("both", 2.0, 4.0), ("VAEBottom", None, None)]
    emb4 = configs[7]["protected"]
    assert "2 per coordinate" in emb4 and "16 per example" in emb4
    assert "no DP" in configs[5]["protected"]


def test_data_split():
    xa, xb, y, xa_test, xb_test, y_test = demo.load_data()
    assert xa.shape == (398, 15) and xb.shape == (398, 15) and y.shape == (398, 1)
    assert xa_test.shape == (171, 15) and xb_test.shape == (171, 15)
    # standardized with the training split's statistics
    assert abs(float(xa.mean())) < 1e-5 and abs(float(xb.std()) - 1.0) < 1e-4
    # stratified: same positive rate (within one example) in both splits
    assert abs(float(y.mean()) - float(y_test.mean())) < 0.01


@pytest.mark.parametrize("epochs,err", [(0, ValueError), (-3, ValueError), (2.5, TypeError),
                                        (True, TypeError)])
def test_run_demo_rejects_bad_epochs(epochs, err):
    with pytest.raises(err, match="epochs"):
        demo.run_demo(epochs=epochs, out=None)


def test_parser():
    args = build_parser().parse_args(["demo", "--epochs", "3", "--seed", "7", "--quick"])
    assert (args.command, args.epochs, args.seed, args.quick) == ("demo", 3, 7, True)
    args = build_parser().parse_args(["demo"])
    assert (args.epochs, args.seed, args.quick) == (None, None, False)


def test_cli_help():
    result = _run_cli("demo", "--help")
    assert result.returncode == 0, result.stderr
    assert "--epochs" in result.stdout and "--seed" in result.stdout


def test_cli_bad_epochs():
    result = _run_cli("demo", "--epochs", "0")
    assert result.returncode == 2
    assert "--epochs" in result.stderr and "integer >= 1" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["-1", "ten", "2.5"])
def test_main_bad_epochs(value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["demo", "--epochs", value])
    assert info.value.code == 2
    assert "--epochs" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "x", str(2**31)])
def test_main_bad_seed(value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["demo", "--seed", value])
    assert info.value.code == 2
    assert "--seed" in capsys.readouterr().err


@pytest.mark.parametrize("seed,err", [(-1, ValueError), (2**31, ValueError), (1.5, TypeError),
                                      (True, TypeError)])
def test_run_demo_rejects_bad_seed(seed, err):
    with pytest.raises(err, match="seed"):
        demo.run_demo(seed=seed, out=None)


def test_main_without_command(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().err


def test_demo_figure_is_written(tmp_path):
    """The demo's privacy-utility / attack figure, from rows shaped like run_demo's."""
    rows = [dict(protection="none", label_eps=None, embedding_eps=None, accuracy=0.96,
                 norm_auc=0.9, direction_auc=1.0)]
    rows += [dict(protection="LabelDP", label_eps=e, embedding_eps=None, accuracy=0.8 + 0.03 * i,
                  norm_auc=0.55 + 0.1 * i, direction_auc=0.6 + 0.1 * i)
             for i, e in enumerate((0.5, 1.0, 2.0))]
    rows += [dict(protection="EmbeddingDP", label_eps=None, embedding_eps=e, accuracy=0.9,
                  norm_auc=0.9, direction_auc=1.0) for e in (1.0, 4.0)]
    path = demo.plot_demo(rows, tmp_path / "demo.png")
    assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
