"""Adversarial: a plan names the release pattern it assumes, and the run is checked against it.

Issue 18, case 10: planned for 3 epochs at a target of 8, a plain ``model.fit(batch_size=32)``
reported 65.3: the plan assumed per-example releases, the run had no example ids (each call of
the layer is then a release about every example). `plan_mechanism` returns a `Plan` that says which
pattern it assumes; `PlanCheck` raises after the first batch whose report is over the target
(not an epoch later: 4096 rows were stopped at eps 118), naming the mismatch, and warns when the
pattern differs before that.
"""

import dataclasses
import math
import warnings

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv import __main__ as cli
from keras_fedpriv.privacy import (
    Plan,
    PlanCheck,
    PlanExceeded,
    PlanMismatchWarning,
    plan_mechanism,
    privacy_report,
)

from ledger_cases import vertical_model

pytestmark = [pytest.mark.jax]

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


def test_case10_a_plain_fit_against_a_per_example_plan_is_stopped_at_the_first_batch_over():
    """At 4096 rows (128 batches an epoch) a check at the epoch's end let the run reach eps
    118 against a target of 8: the check after every batch stops it one release past the
    plan's count."""
    plan = plan_mechanism(TARGET, releases=EPOCHS, mechanism="embedding_dp", num_coordinates=D)
    assert plan.pattern == "per_example"
    assert "per-example releases with example ids" in plan.assumption()
    model, x, y = _plain_model(plan.epsilon, n=4096)
    with pytest.raises(PlanExceeded) as err:
        model.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[PlanCheck(plan)])
    message = str(err.value)
    assert "per-example releases with example ids" in message
    assert f"{EPOCHS + 1} release(s) without example ids, each counted for every example" \
        in message
    assert "pattern='every_example'" in message
    assert _releases(model) == EPOCHS + 1  # stopped at the 4th batch of the first epoch
    assert TARGET < privacy_report(model, protects="features").epsilon < 1.5 * TARGET


def test_case10_a_vertical_model_without_ids_is_stopped_at_the_first_batch_over():
    plan = plan_mechanism(TARGET, releases=EPOCHS, mechanism="label_dp")
    model, x, y = vertical_model(label_dp=kf.LabelDPLayer(eps=plan.epsilon, per_batch=True,
                                                          seed=0), n=512)
    x = {k: v for k, v in x.items() if k != "example_ids"}
    with pytest.raises(PlanExceeded, match="without example ids"):
        model.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[PlanCheck(plan)])
    (row,) = privacy_report(model, protects="labels").releases
    assert row.count == EPOCHS + 1  # not the 16 batches of a whole epoch


def test_case10_a_run_within_its_plan_is_not_composed_between_epochs(monkeypatch):
    """The check after every batch counts; it composes only when counting cannot tell."""
    judged = []
    judge = Plan._judge
    monkeypatch.setattr(Plan, "_judge", lambda self, report, warn=True: judged.append(warn)
                        or judge(self, report, warn))
    plan = plan_mechanism(TARGET, releases=EPOCHS, mechanism="embedding_dp", num_coordinates=D)
    model, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=plan.epsilon, seed=0),
                                 label_dp=kf.LabelDPLayer(eps=1.0, seed=0))
    model.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[PlanCheck(plan)])
    assert judged == [True] * EPOCHS  # once per epoch, never per batch (4 batches an epoch)
    ledger = privacy_report(model, protects="features").ledger
    assert plan.within(ledger)
    assert not dataclasses.replace(plan, releases=EPOCHS - 1).within(ledger)
    assert not dataclasses.replace(plan, value=plan.value / 2).within(ledger)  # another event


def test_case10_a_pattern_mismatch_warns_before_the_target_is_reached_then_raises():
    plan = plan_mechanism(TARGET, releases=EPOCHS, mechanism="embedding_dp", num_coordinates=D)
    model, x, y = _plain_model(plan.epsilon, n=64)  # 2 batches per epoch: over in epoch 2
    with pytest.warns(PlanMismatchWarning, match="without example ids"), \
            pytest.raises(PlanExceeded, match="without example ids"):
        model.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[PlanCheck(plan)])
    assert _releases(model) == 4


def test_case10_runs_that_match_their_plan_pass_silently_at_the_target():
    per_example = plan_mechanism(TARGET, releases=EPOCHS, mechanism="embedding_dp", num_coordinates=D)
    model, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=per_example.epsilon,
                                                                  seed=0),
                                 label_dp=kf.LabelDPLayer(eps=1.0, seed=0))
    n, batches = 64, 64 // 32
    every = plan_mechanism(TARGET, releases=EPOCHS * batches, mechanism="embedding_dp",
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
        plan_mechanism(TARGET, releases=3, mechanism="signds", pattern="every_example")
    with pytest.raises(TypeError, match="`plan` must be a Plan"):
        PlanCheck(0.5)
    plan = plan_mechanism(TARGET, releases=3, mechanism="label_dp")
    assert math.isclose(plan.epsilon, plan.value)
    with pytest.raises(ValueError, match="noise multiplier"):
        plan.noise_multiplier


# ------------------------------------------------ issue 20: a plan for a whole run
def _signds_run(rounds, clients_per_round, signds_eps, callbacks, num_clients=4):
    from keras_fedpriv.federated import HorizontalFL, SignDSUpload, partition
    from keras_fedpriv.optimizers import SignDSEncoder

    rng = np.random.default_rng(0)
    x = rng.normal(size=(30 * num_clients, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.05),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fl = HorizontalFL(model, partition(x, y, num_clients, seed=0), seed=0,
                      upload=SignDSUpload(SignDSEncoder(k=0.2, eps=signds_eps, seed=0)))
    fl.fit(rounds=rounds, clients_per_round=clients_per_round, callbacks=callbacks, verbose=0)
    return fl


@pytest.mark.filterwarnings("ignore:SignDS. k . d")
def test_whole_run_a_participation_bound_that_sampling_breaks_is_stopped():
    """2 of 4 clients a round for 4 rounds is 2 rounds per client on average, but uniform
    sampling lets one client take part in more: a plan that assumes the mean is stopped;
    the default plan (every round) holds."""
    from keras_fedpriv.privacy import plan

    kwargs = dict(mechanisms=("signds",), rounds=4, clients_per_round=2, num_clients=4,
                  warn=False)
    mean = plan(TARGET, max_rounds_per_client=2, **kwargs)
    assert mean["signds"].releases == 2 and "assumed" in mean.assumption
    with pytest.raises(PlanExceeded, match="over the plan's target"):
        _signds_run(4, 2, mean["signds"].value, mean.callbacks())
    safe = plan(TARGET, **kwargs)
    assert safe["signds"].releases == 4
    fl = _signds_run(4, 2, safe["signds"].value, safe.callbacks())
    assert max(fl.participation) > 2  # the run did what the mean-based plan did not count
    assert privacy_report(fl, protects="client data").epsilon <= TARGET + 1e-6


@pytest.mark.filterwarnings("ignore:SignDS. k . d")
def test_whole_run_a_laplace_evaluation_left_out_of_the_plan_is_caught():
    from keras_fedpriv.callbacks import LaplaceEvaluation
    from keras_fedpriv.privacy import plan

    p = plan(TARGET, mechanisms=("signds",), rounds=2, clients_per_round=4, num_clients=4,
             warn=False)
    laplace = LaplaceEvaluation(eps=1.0, seed=0, from_logits=True)
    with pytest.raises(PlanExceeded, match="over the plan's target"):
        _signds_run(2, 4, p["signds"].value, p.callbacks([laplace]))
    with_it = plan(TARGET, mechanisms=("signds", "laplace_eval"), rounds=2, clients_per_round=4,
                   num_clients=4, eval_rows=30, warn=False)  # each client holds 30 rows
    laplace = LaplaceEvaluation(eps=with_it["laplace_eval"].value, seed=0, from_logits=True)
    fl = _signds_run(2, 4, with_it["signds"].value, with_it.callbacks([laplace]))
    assert privacy_report([fl, laplace], protects="client data").epsilon <= TARGET + 1e-6


def test_whole_run_weights_cannot_put_a_mechanism_at_eps_zero():
    from keras_fedpriv.privacy import plan

    kwargs = dict(mechanisms=("signds", "magrr"), rounds=10, clients_per_round=2, num_clients=4)
    with pytest.raises(ValueError, match=r"with `weights` \{'signds': 1.0, 'magrr': 1e-09\}: "
                                         r"where every per-release eps is at least 0.0001"):
        plan(TARGET, weights={"magrr": 1e-9}, **dict(kwargs, rounds=1))  # 1: a cheap PLD
    tiny = plan(TARGET, weights={"magrr": 1e-3}, warn=False, **kwargs)  # small, not zero
    assert 1e-4 <= tiny["magrr"].value < 1e-2 * tiny["signds"].value
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match=r"`weights\['magrr'\]` must be a finite number"):
            plan(TARGET, weights={"magrr": bad}, **kwargs)


def test_whole_run_a_plan_cannot_count_fewer_releases_than_the_run_makes():
    from keras_fedpriv.privacy import plan

    kwargs = dict(mechanisms=("signds", "magrr"), rounds=10, clients_per_round=2, num_clients=4)
    with pytest.raises(ValueError, match=r"`releases\['magrr'\]`=1 is fewer than the 10"):
        plan(TARGET, releases={"magrr": 1}, **kwargs)
    with pytest.raises(ValueError, match="`clients_per_round`=5 is more than"):
        plan(TARGET, **dict(kwargs, clients_per_round=5))
    with pytest.raises(ValueError, match="cannot hold: 10 rounds of 2 clients among 4"):
        plan(TARGET, max_rounds_per_client=4, **kwargs)  # 20 participations > 4 x 4
    assert plan(TARGET, releases={"magrr": 12}, warn=False, **kwargs)["magrr"].releases == 12
    with pytest.raises(ValueError, match=r"`releases\['embedding_dp'\]`=1 is fewer than the 5"):
        plan(TARGET, mechanisms=("embedding_dp",), epochs=5, num_coordinates=D,
             releases={"embedding_dp": 1})  # 5 epochs release every example 5 times


def _batches_forever(x, y, size):
    """The batches of ``size`` of ``(x, y)`` in order, again and again (``.repeat()``)."""
    while True:
        for start in range(0, len(y), size):
            rows = slice(start, start + size)
            yield keras.tree.map_structure(lambda a: a[rows], x), y[rows]


def test_examples_released_more_often_than_planned_within_an_epoch_stop_at_the_first_batch_over():
    """Planned for 2 releases per example at a target of 4, an epoch in which every id comes 8
    times (64 ids, ``.repeat()`` with ``steps_per_epoch=16``: 16 batches of 32) used to pass
    the check after every batch (per-example counts were read at the epoch's end only) and
    stop after batch 16 at eps ~9.9. The running per-example maximum stops it after the 5th
    batch, the first that releases an example a 3rd time."""
    plan = plan_mechanism(4.0, releases=2, mechanism="embedding_dp", num_coordinates=D)
    model, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=plan.epsilon, seed=0),
                                 label_dp=kf.LabelDPLayer(eps=1.0, seed=0), n=64)
    data = _batches_forever(x, y, 32)
    batches = []
    seen = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
    with pytest.raises(PlanExceeded, match="3 release\\(s\\) of the busiest example"):
        model.fit(data, epochs=1, steps_per_epoch=16, verbose=0,
                  callbacks=[seen, PlanCheck(plan)])
    assert batches == [0, 1, 2, 3, 4]
    assert _releases(model) == 3
    assert 4.0 < privacy_report(model, protects="features").epsilon < 9.0


def test_two_layers_whose_busiest_examples_differ_are_checked_on_exact_counts():
    """The running maxima of two layers bound an example's releases by their sum (4 here,
    over the plan's 2); the exact counts then decide: 2 per example passes, and a 3rd
    release of example 0 by the second layer (whose own maximum stays 2) is caught at once."""
    plan = plan_mechanism(4.0, releases=2, mechanism="embedding_dp", num_coordinates=3)
    first, second = (kf.EmbeddingDPLayer(eps=plan.epsilon, seed=s) for s in (1, 2))
    check = PlanCheck(plan, callbacks=[first, second])
    check.on_train_begin()
    x = np.ones((4, 3), "float32")
    for step in range(2):
        first(x, training=True, example_ids=np.arange(4))
        second(x, training=True, example_ids=np.arange(4, 8))
        check.on_train_batch_end(step)  # within the target: 2 releases of each example
    assert first.release_id_max() == second.release_id_max() == 2
    second(x, training=True, example_ids=np.arange(4))
    assert second.release_id_max() == 2
    with pytest.raises(PlanExceeded, match="over the plan's target"):
        check.on_train_batch_end(2)


def test_counts_restored_from_the_host_are_seen_from_the_first_batch_of_a_fit():
    """Per-example counts put in place without the layer's calls (a follower's restored state)
    raise the running maximum as they are loaded, so the check's first batch, about other
    examples, already sees 3 restored releases (plan: 2)."""
    from keras_fedpriv.layers.local_state import load_local_state, local_state

    plan = plan_mechanism(4.0, releases=2, mechanism="embedding_dp", num_coordinates=3)
    layer = kf.EmbeddingDPLayer(eps=plan.epsilon, seed=1)
    x = np.ones((4, 3), "float32")
    layer(x, training=True, example_ids=np.arange(4))
    state = local_state([layer])
    state["0/release_id_values"] = np.full(4, 3, np.int64)  # as if restored: 3 each
    load_local_state([layer], state)
    assert layer.release_id_max() == 3  # caught up with the loaded table at once
    check = PlanCheck(plan, callbacks=[layer])
    check.on_train_begin()
    layer(x, training=True, example_ids=np.arange(4, 8))  # other examples: their maximum is 1
    with pytest.raises(PlanExceeded, match="3 release\\(s\\) of the busiest example"):
        check.on_train_batch_end(0)
