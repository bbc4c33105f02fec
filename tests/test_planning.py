"""Planning a run (keras_fedpriv/privacy/planning.py): the per-release eps or noise for a target."""

import dp_accounting
import pytest

from keras_fedpriv.mechanisms import quantize_rr_dp_event, randomized_response_dp_event
from keras_fedpriv.mechanisms.gaussian import gaussian_dp_event
from keras_fedpriv.privacy import compose_epsilon
from keras_fedpriv.privacy.planning import plan_epsilon, plan_noise_multiplier, planned_epsilon

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
