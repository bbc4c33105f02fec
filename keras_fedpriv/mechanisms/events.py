"""Helpers for dp_accounting events.

`repeat_event` exists because dp-accounting (0.6.0, checked 2026-11) drops the
count when a PLD accountant composes ``SelfComposedDpEvent(RandomizedResponseDpEvent, n)``
or ``accountant.compose(rr_event, n)``: `pld_privacy_accountant.py` composes the
RR PLD once and ignores ``count`` (the Gaussian and Laplace branches call
``self_compose(count)``). n releases would be reported as one. An explicit
`ComposedDpEvent` of n copies is accounted correctly, so every repeated
release in this package goes through `repeat_event`.
"""

from __future__ import annotations

import dp_accounting

from keras_fedpriv.mechanisms.validation import validate_positive_int

__all__ = ["repeat_event"]


def repeat_event(event, count):
    """``count`` independent releases of ``event`` as a DpEvent.

    Args:
        event: a `dp_accounting.DpEvent`.
        count: number of releases (>= 1).

    Returns:
        ``event`` itself for one release, else ``ComposedDpEvent([event] * count)``.
    """
    count = validate_positive_int(count, "count")
    if count == 1:
        return event
    return dp_accounting.ComposedDpEvent([event] * count)
