"""The horizontal demo (keras_fedpriv/demo_horizontal.py): FedAvg vs SignDS vs SignDS+MagRR on
digits."""

import io

import pytest

from keras_fedpriv.demo_horizontal import footnote, run_horizontal_demo


pytestmark = [pytest.mark.jax]

def test_horizontal_demo_rows():
    out = io.StringIO()
    rows = run_horizontal_demo(rounds=8, seed=0, quick=True, out=out)
    by = {(r["upload"], r["eps"]): r for r in rows}
    assert set(by) == {("FedAvg", "-"), ("SignDS", "100"), ("SignDS+MagRR", "100 + 5")}
    dense = 4 * (64 * 128 + 128 + 128 * 10 + 10)
    assert all(r["dense_bytes"] == dense for r in rows)
    assert by[("FedAvg", "-")]["upload_bytes"] == dense
    # SignDS at eps=100: h is the cap, 100 int32 indices + 1 sign byte
    assert by[("SignDS", "100")]["upload_bytes"] == 401
    assert by[("FedAvg", "-")]["accuracy"] > 0.6
    assert by[("SignDS", "100")]["accuracy"] > 0.3  # 10 classes: chance is 0.1
    # every configuration ran the 8 rounds asked for, one history entry per round
    assert all(len(r["history"]["val_accuracy"]) == 8 for r in rows)
    assert len(by[("SignDS+MagRR", "100 + 5")]["history"]["global_lr"]) == 8
    # the table shows what the busiest client spent over the run, beside the per-upload eps:
    # 8 rounds of 20 of 100 clients put some client in 2 or more rounds, at most in all 8
    assert by[("FedAvg", "-")]["run_eps"] == float("inf")
    assert 100.0 < by[("SignDS", "100")]["run_eps"] <= 8 * 100.0
    assert by[("SignDS+MagRR", "100 + 5")]["run_eps"] > 100.0
    text = out.getvalue()
    assert "96x smaller" in text and "bytes/client/round" in text
    assert "run eps" in text and "busiest client spent over the whole run" in text.replace("\n", " ")
    # the footnote names only what ran: --quick skips the Gaussian and SignDS eps=10 runs
    footer = " ".join(text.split("what is protected")[1].splitlines()[1 + 1 + len(rows):])
    assert "MagRR" in footer and "FedAvg" in footer
    assert "Gaussian" not in footer and "eps=10" not in footer


def test_the_footnote_names_each_configuration_that_ran():
    rows = [{"upload": "FedAvg", "eps": "-"}, {"upload": "SignDS", "eps": "10"},
            {"upload": "Gaussian", "eps": "13*"}]
    text = footnote(rows)
    assert "*Gaussian" in text and "eps=10" in text and "FedAvg" in text
    assert "MagRR" not in text
    assert footnote(rows[:1]) == "FedAvg uploads the dense update without protection."
