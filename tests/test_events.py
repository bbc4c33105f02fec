"""dp-accounting event helpers (keras_fedpriv/mechanisms/events.py)."""

import dp_accounting
import pytest
from dp_accounting import pld

from keras_fedpriv import mechanisms as M

pytestmark = [pytest.mark.jax]


def test_dp_accounting_self_composed_rr_bug_is_avoided():
    """Canary: dp-accounting's PLD accountant drops the count of self-composed RR.

    If this starts failing, dp-accounting fixed the bug and `repeat_event`
    may use SelfComposedDpEvent again.
    """
    rr = M.randomized_response_dp_event(1.0, 2)

    def eps_of(event):
        accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(event)
        return accountant.get_epsilon(1e-9)

    assert eps_of(dp_accounting.SelfComposedDpEvent(rr, 5)) == pytest.approx(1.0, abs=0.01)
    assert eps_of(M.repeat_event(rr, 5)) == pytest.approx(5.0, abs=0.05)
