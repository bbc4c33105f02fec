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

import math

import dp_accounting

from keras_fedpriv.mechanisms.validation import validate_positive_int

__all__ = ["pure_dp_event", "pure_epsilon", "repeat_event"]


def repeat_event(event: dp_accounting.DpEvent, count: int) -> dp_accounting.DpEvent:
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


def pure_epsilon(event: dp_accounting.DpEvent) -> float | None:
    """Pure eps (delta = 0) of a DpEvent; None if it has none (e.g. Gaussian).

    Randomized response, Laplace and discrete Laplace events give their eps,
    compositions (`ComposedDpEvent`, `SelfComposedDpEvent`) the sum (basic
    composition is exact for pure DP in the worst case), `NoOpDpEvent` 0 and
    `NonPrivateDpEvent` ``inf``.
    """
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return math.inf
    if isinstance(event, dp_accounting.ComposedDpEvent):
        parts = [pure_epsilon(e) for e in event.events]
        return None if any(p is None for p in parts) else float(sum(parts))
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        part = pure_epsilon(event.event)
        return None if part is None else part * event.count
    if isinstance(event, dp_accounting.RandomizedResponseDpEvent):
        a, k = event.noise_parameter, event.num_buckets
        if a == 0:
            return math.inf
        return math.log((1 - a + a / k) / (a / k))
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return math.inf if event.noise_multiplier == 0 else 1.0 / event.noise_multiplier
    if isinstance(event, dp_accounting.dp_event.DiscreteLaplaceDpEvent):
        return event.noise_parameter * event.sensitivity
    return None


def pure_dp_event(eps: float) -> dp_accounting.DpEvent:
    """Binary randomized response at exactly ``eps``: a DpEvent that dominates every eps-DP mechanism.

    Every eps-DP mechanism's privacy profile (all its hockey-stick and Renyi
    divergences) is dominated by that of binary eps-randomized response
    (Kairouz, Oh and Viswanath, "The composition theorem for differential
    privacy", ICML 2015). For mechanisms that dp-accounting has no event for
    (the exponential mechanism of SignDS) or that its accountant does not
    support. Unlike `randomized_response_dp_event`, which describes this
    package's thresholded randomized response as realized, this is the
    ideal mechanism at ``eps`` itself.
    """
    eps = float(eps)
    if math.isinf(eps):
        return dp_accounting.NonPrivateDpEvent()
    t = math.exp(-eps)
    return dp_accounting.RandomizedResponseDpEvent(noise_parameter=2.0 * t / (1.0 + t),
                                                   num_buckets=2)
