"""Adversarial: a plan names the release pattern it assumes, and the run is checked against it.

Issue 18, case 10: planned for 3 epochs at a target of 8, a plain ``model.fit(batch_size=32)``
reported 65.3: the plan assumed per-example releases, the run had no example ids (each call of
the layer is then a release about every example). `plan_run` returns a `Plan` that says which
pattern it assumes; `PlanCheck` raises at the end of the first epoch whose report is over the
target, naming the mismatch, and warns when the pattern differs before that.
"""

import math
import warnings

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv import __main__ as cli
from keras_fedpriv.privacy import (
    PlanCheck,
    PlanExceeded,
    PlanMismatchWarning,
    plan_run,
    privacy_report,
)

from ledger_cases import vertical_model

TARGET, EPOCHS, D = 8.0, 3, 8


def _plain_model(eps, n):
    """A plain Keras model with an EmbeddingDPLayer: fit passes no example ids."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    inputs = keras.Input((6,))
    hidden = kf.EmbeddingDPLayer(eps=eps, seed=0)(keras.layers.Dense(D)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile("adam", "binary_crossentropy")
    return model, x, y


def _releases(model):
    (row,) = privacy_report(model, protects="features").releases
    return row.count


def test_case10_a_plain_fit_against_a_per_example_plan_is_stopped_after_one_epoch():
    plan = plan_run(TARGET, releases=EPOCHS, mechanism="embedding_dp", num_coordinates=D)
    assert plan.pattern == "per_example"
    assert "per-example releases with example ids" in plan.assumption()
    model, x, y = _plain_model(plan.epsilon, n=256)
    with pytest.raises(PlanExceeded) as err:
        model.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[PlanCheck(plan)])
    message = str(err.value)
    assert "per-example releases with example ids" in message
    assert "8 release(s) without example ids, each counted for every example" in message
    assert "pattern='every_example'" in message
    assert _releases(model) == 8  # stopped at the end of the first epoch (8 batches)
    assert privacy_report(model).epsilon > TARGET


def test_case10_a_pattern_mismatch_warns_before_the_target_is_reached_then_raises():
    plan = plan_run(TARGET, releases=EPOCHS, mechanism="embedding_dp", num_coordinates=D)
    model, x, y = _plain_model(plan.epsilon, n=64)  # 2 batches per epoch: over in epoch 2
    with pytest.warns(PlanMismatchWarning, match="without example ids"), \
            pytest.raises(PlanExceeded, match="without example ids"):
        model.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[PlanCheck(plan)])
    assert _releases(model) == 4


def test_case10_runs_that_match_their_plan_pass_silently_at_the_target():
    per_example = plan_run(TARGET, releases=EPOCHS, mechanism="embedding_dp", num_coordinates=D)
    model, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=per_example.epsilon,
                                                                  seed=0),
                                 label_dp=kf.LabelDPLayer(eps=1.0, seed=0))
    n, batches = 64, 64 // 32
    every = plan_run(TARGET, releases=EPOCHS * batches, mechanism="embedding_dp",
                     num_coordinates=D, pattern="every_example")
    plain, xp, yp = _plain_model(every.epsilon, n=n)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanMismatchWarning)
        model.fit(x, y, epochs=EPOCHS, batch_size=64, verbose=0,
                  callbacks=[PlanCheck(per_example)])
        plain.fit(xp, yp, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[PlanCheck(every)])
        for plan, fitted in ((per_example, model), (every, plain)):
            spent = plan.check(fitted).epsilon
            assert TARGET - 0.1 <= spent <= TARGET + 1e-6
    assert _releases(plain) == EPOCHS * batches


def test_case10_the_cli_names_the_pattern_it_plans_for(capsys):
    assert cli.main(["plan", "--target-eps", "8", "--releases", "6", "--mechanism",
                     "embedding_dp", "--num-coordinates", "8", "--pattern",
                     "every_example"]) == 0
    out = capsys.readouterr().out
    assert "release pattern: every_example" in out and "without example ids" in out
    assert cli.main(["plan", "--target-eps", "8", "--releases", "3", "--mechanism",
                     "label_dp"]) == 0
    assert "release pattern: per_example" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["plan", "--target-eps", "8", "--releases", "3", "--mechanism", "magrr",
                  "--pattern", "per_example"])
    assert "argument --pattern" in capsys.readouterr().err


def test_a_plan_refuses_what_it_cannot_check():
    with pytest.raises(ValueError, match="`pattern` must be one of"):
        plan_run(TARGET, releases=3, mechanism="signds", pattern="every_example")
    with pytest.raises(TypeError, match="`plan` must be a Plan"):
        PlanCheck(0.5)
    plan = plan_run(TARGET, releases=3, mechanism="label_dp")
    assert math.isclose(plan.epsilon, plan.value)
    with pytest.raises(ValueError, match="noise multiplier"):
        plan.noise_multiplier
