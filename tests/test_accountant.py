"""MixedPLDAccountant (keras_fedpriv/privacy/accountant.py): each event's PLD under its own
relation."""

import dp_accounting
import pytest
from dp_accounting import pld

from keras_fedpriv.mechanisms import randomized_response_dp_event
from keras_fedpriv.privacy import MixedPLDAccountant

pytestmark = [pytest.mark.jax]

DELTA = 1e-5


def _pld_eps(event, relation=dp_accounting.NeighboringRelation.REPLACE_ONE):
    accountant = pld.PLDAccountant(relation)
    accountant.compose(event)
    return accountant.get_epsilon(DELTA)


def _mixed_eps(event, count=1):
    accountant = MixedPLDAccountant()
    accountant.compose(event, count)
    return accountant.get_epsilon(DELTA)


def test_randomized_response_matches_dp_accountings_replace_one_pld():
    rr = randomized_response_dp_event(1.5, 4)
    assert _mixed_eps(rr, 7) == pytest.approx(_pld_eps(dp_accounting.ComposedDpEvent([rr] * 7)),
                                              rel=1e-3)


@pytest.mark.parametrize("event", [dp_accounting.GaussianDpEvent(2.0),
                                   dp_accounting.LaplaceDpEvent(1.5)])
def test_gaussian_and_laplace_match_dp_accountings_default_relation(event):
    expected = _pld_eps(dp_accounting.ComposedDpEvent([event] * 5),
                        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    assert _mixed_eps(event, 5) == pytest.approx(expected, rel=1e-3)


def test_a_self_composed_randomized_response_keeps_its_count():
    rr = randomized_response_dp_event(1.0, 2)
    assert _mixed_eps(dp_accounting.SelfComposedDpEvent(rr, 5)) == pytest.approx(5.0, abs=0.05)
    nested = dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(rr, 2), rr])
    assert _mixed_eps(nested, 2) == pytest.approx(6.0, abs=0.05)


def test_mixed_relations_compose_to_more_than_either_and_at_most_the_sum():
    rr, gauss = randomized_response_dp_event(1.0, 2), dp_accounting.GaussianDpEvent(3.0)
    both = _mixed_eps(dp_accounting.ComposedDpEvent([rr, gauss]))
    assert max(_mixed_eps(rr), _mixed_eps(gauss)) < both <= _mixed_eps(rr) + _mixed_eps(gauss)


def test_non_private_is_infinite_and_no_op_is_free():
    accountant = MixedPLDAccountant()
    accountant.compose(dp_accounting.NoOpDpEvent())
    assert accountant.get_epsilon(DELTA) == 0.0 and accountant.get_delta(1.0) == 0.0
    accountant.compose(dp_accounting.NonPrivateDpEvent())
    assert accountant.get_epsilon(DELTA) == float("inf") and accountant.get_delta(1.0) == 1.0


def test_an_unsupported_event_is_refused_by_name():
    accountant = MixedPLDAccountant()
    event = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0))
    assert not accountant.supports(event)
    with pytest.raises(dp_accounting.UnsupportedEventError, match="randomized response, Gaussian"):
        accountant.compose(event)


def test_it_works_with_dp_accountings_calibration():
    noise = dp_accounting.calibrate_dp_mechanism(
        MixedPLDAccountant, lambda s: dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(s), 10), target_epsilon=2.0, target_delta=DELTA,
        bracket_interval=dp_accounting.ExplicitBracketInterval(1.0, 16.0))
    assert _mixed_eps(dp_accounting.GaussianDpEvent(noise), 10) == pytest.approx(2.0, abs=0.02)
