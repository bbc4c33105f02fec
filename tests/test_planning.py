"""Planning a run (keras_fedpriv/privacy/planning.py): the per-release eps or noise for a target."""

import warnings

import dp_accounting
import numpy as np
import pytest

import keras_fedpriv as kf

from keras_fedpriv.mechanisms import quantize_rr_dp_event, randomized_response_dp_event
from keras_fedpriv.mechanisms.gaussian import gaussian_dp_event
from keras_fedpriv.privacy import compose_epsilon
from keras_fedpriv.privacy.planning import (
    PlanExceeded,
    PlanMismatchWarning,
    plan_epsilon,
    plan_mechanism,
    plan_noise_multiplier,
    plan_run,
    planned_epsilon,
    release_pattern,
)

pytestmark = [pytest.mark.jax]

DELTA = 1e-5


@pytest.mark.parametrize("mechanism, kwargs, event", [
    ("label_dp", dict(num_classes=10), lambda e: randomized_response_dp_event(e, 10)),
    ("embedding_dp", dict(num_coordinates=4), lambda e: quantize_rr_dp_event(e, 4)),
    ("magrr", {}, lambda e: randomized_response_dp_event(e, 2)),
])
def test_the_planned_eps_meets_the_target_tightly_and_never_exceeds_it(mechanism, kwargs, event):
    eps = plan_epsilon(4.0, DELTA, releases=5, mechanism=mechanism, **kwargs)
    spent = planned_epsilon(event(eps), 5, DELTA)
    assert 4.0 - 0.05 <= spent <= 4.0  # at the target, up to the tolerance, never above
    assert planned_epsilon(event(eps * 1.05), 5, DELTA) > 4.0  # the largest that fits
    # what the report of the finished run will say is what was planned
    assert compose_epsilon([(event(eps), 5)], DELTA) == pytest.approx(spent, rel=1e-6)


def test_one_release_plans_the_target_itself_and_a_loose_target_the_cap():
    assert plan_epsilon(2.0, releases=1) == pytest.approx(2.0, abs=2e-3)
    assert plan_epsilon(1e6, releases=1) == 60.0


def test_the_planned_noise_meets_the_target_for_the_gaussian_upload():
    z = plan_noise_multiplier(3.0, DELTA, releases=10)
    assert 3.0 - 0.05 <= planned_epsilon(gaussian_dp_event(z), 10, DELTA) <= 3.0
    assert planned_epsilon(gaussian_dp_event(z * 0.97), 10, DELTA) > 3.0
    assert plan_noise_multiplier(3.0, DELTA, releases=40) > z  # more rounds, more noise


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(target_epsilon=0.0, releases=3), ValueError, "target_epsilon"),
    (dict(target_epsilon=float("inf"), releases=3), ValueError, "target_epsilon"),
    (dict(target_epsilon=1.0, target_delta=2.0, releases=3), ValueError, "target_delta"),
    (dict(target_epsilon=1.0, releases=0), ValueError, "releases"),
    (dict(target_epsilon=1.0, releases=2.5), TypeError, "releases"),
    (dict(target_epsilon=1.0, releases=3, mechanism="dp"), ValueError,
     "`mechanism` must be one of"),
    (dict(target_epsilon=1.0, releases=3, mechanism="embedding_dp"), TypeError,
     "num_coordinates"),
    (dict(target_epsilon=1.0, releases=3, num_classes=1), ValueError, "num_classes"),
])
def test_bad_plans_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        plan_epsilon(**kwargs)


def test_a_planned_event_is_any_dp_accounting_event():
    composed = dp_accounting.ComposedDpEvent([randomized_response_dp_event(1.0, 2)] * 2)
    assert planned_epsilon(composed, 3, DELTA) == pytest.approx(6.0, abs=0.05)


# ------------------------------------------------------------ plans that check the run
def _per_batch_layer(plan, calls, ids=True):
    layer = kf.LabelDPLayer(eps=plan.epsilon, per_batch=True, seed=0)
    y = np.array([0.0, 1.0, 1.0, 0.0])
    for _ in range(calls):
        layer(y, example_ids=np.arange(4) if ids else None, training=True)
    return layer


@pytest.mark.parametrize("mechanism, kwargs, pattern", [
    ("label_dp", dict(num_classes=10), "per_example"),
    ("embedding_dp", dict(num_coordinates=4), "per_example"),
    ("magrr", {}, "per_client"),
])
def test_plan_mechanism_plans_what_plan_epsilon_plans_and_names_its_pattern(mechanism, kwargs,
                                                                            pattern):
    plan = plan_mechanism(4.0, DELTA, releases=5, mechanism=mechanism, **kwargs)
    assert plan.epsilon == plan_epsilon(4.0, DELTA, releases=5, mechanism=mechanism, **kwargs)
    assert plan.pattern == pattern and plan.releases == 5
    assert planned_epsilon(plan.event(), 5, DELTA) <= 4.0
    assert "5 per" in plan.assumption()


def test_plan_run_is_the_0_1_name_of_plan_mechanism():
    import keras_fedpriv.privacy as privacy

    assert plan_run is plan_mechanism and privacy.plan_run is privacy.plan_mechanism


def test_a_gaussian_plan_gives_the_noise_multiplier():
    plan = plan_mechanism(3.0, DELTA, releases=10, mechanism="gaussian")
    assert plan.noise_multiplier == pytest.approx(plan_noise_multiplier(3.0, DELTA, releases=10))
    assert plan.pattern == "per_client" and plan.protects == "client data"
    with pytest.raises(ValueError, match="noise_multiplier"):
        plan.epsilon


def test_plan_check_passes_a_matching_run_and_refuses_one_release_too_many():
    plan = plan_mechanism(6.0, DELTA, releases=3, mechanism="label_dp")
    layer = _per_batch_layer(plan, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanMismatchWarning)
        report = plan.check(layer)
    assert 5.9 <= report.epsilon <= 6.0 + 1e-6
    layer(np.array([0.0, 1.0]), example_ids=np.arange(2), training=True)
    with pytest.raises(PlanExceeded, match="over the plan's target of 6"):
        plan.check(layer)


def test_plan_check_names_calls_without_ids_against_a_per_example_plan():
    plan = plan_mechanism(6.0, DELTA, releases=3, mechanism="label_dp")
    with pytest.warns(PlanMismatchWarning, match="2 release.s. without example ids"):
        plan.check(_per_batch_layer(plan, 2, ids=False))
    with pytest.raises(PlanExceeded, match="assumed per-example releases with example ids"):
        plan.check(_per_batch_layer(plan, 4, ids=False))
    every = plan_mechanism(6.0, DELTA, releases=4, mechanism="label_dp", pattern="every_example")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanMismatchWarning)
        # planned without ids: the same run is within the plan, no warning
        assert every.check(_per_batch_layer(every, 4, ids=False)).epsilon <= 6.0 + 1e-6


def test_plan_check_warns_when_the_planned_secret_was_never_released():
    plan = plan_mechanism(6.0, DELTA, releases=3, mechanism="embedding_dp", num_coordinates=4)
    with pytest.warns(PlanMismatchWarning, match="no release of the features"):
        plan.check(_per_batch_layer(plan_mechanism(6.0, DELTA, releases=3), 1))


def test_release_patterns_are_checked_against_the_mechanism():
    assert release_pattern("label_dp") == "per_example"
    assert release_pattern("gaussian") == "per_client"
    assert release_pattern("embedding_dp", "every_example") == "every_example"
    with pytest.raises(ValueError, match="`pattern` must be one of"):
        release_pattern("magrr", "per_example")
    with pytest.raises(ValueError, match="`mechanism` must be one of"):
        release_pattern("laplace")


def test_plan_check_follows_a_horizontal_run_round_by_round():
    import keras

    from keras_fedpriv.federated import HorizontalFL, partition
    from keras_fedpriv.federated.uploads import GaussianUpload
    from keras_fedpriv.privacy import PlanCheck, privacy_report

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    plan = plan_mechanism(4.0, DELTA, releases=3, mechanism="gaussian")

    def run(rounds):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.05),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        fl = HorizontalFL(model, partition(x, y, 4, seed=0),
                          upload=GaussianUpload(1.0, plan.noise_multiplier, seed=0), seed=0)
        fl.fit(rounds=rounds, clients_per_round=4, callbacks=[PlanCheck(plan)], verbose=0)
        return fl

    assert privacy_report(run(3)).epsilon <= 4.0 + 1e-6
    with pytest.raises(PlanExceeded, match="at most 3 per client"):
        run(5)
