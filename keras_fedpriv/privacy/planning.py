"""Plan before you run: the per-release eps (or noise) that meets a target (eps, delta).

A run releases each unit (an example, a client) several times: EmbeddingDP
once per pass over the data, SignDS and MagRR once per round a client takes
part in, a per-batch LabelDP once per epoch. Given the target ``(eps,
delta)`` for the whole run and the planned number of releases of the busiest
unit, these helpers return the parameter of one release, calibrated with
dp-accounting (`MixedPLDAccountant`, the accountant `privacy_report`
uses; `dp_accounting.calibrate_dp_mechanism` for noise multipliers), so the report of
the finished run comes out at the target (up to the calibration tolerance,
and never above it).

Example:
    >>> eps = plan_epsilon(8.0, 1e-5, releases=20)                 # one label, 20 releases
    >>> z = plan_noise_multiplier(4.0, 1e-5, releases=50)          # GaussianUpload
    >>> eps = plan_epsilon(8.0, 1e-5, releases=10, mechanism="embedding_dp",
    ...                    num_coordinates=16)                     # EmbeddingDPLayer(eps=...)
"""

from __future__ import annotations

import dp_accounting

from keras_fedpriv.mechanisms.gaussian import gaussian_dp_event
from keras_fedpriv.mechanisms.quantize import quantize_rr_dp_event
from keras_fedpriv.mechanisms.randomized_response import randomized_response_dp_event
from keras_fedpriv.mechanisms.signds import signds_dp_event
from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int
from keras_fedpriv.privacy.accountant import MixedPLDAccountant

__all__ = ["MECHANISMS", "plan_epsilon", "plan_noise_multiplier", "planned_epsilon"]

#: Mechanisms whose per-release parameter is an eps.
MECHANISMS = ("label_dp", "embedding_dp", "signds", "magrr")

_MAX_EPS = {"label_dp": 60.0, "embedding_dp": 60.0, "signds": 100.0, "magrr": 60.0}


def _event(mechanism, eps, num_classes, num_coordinates):
    if mechanism == "label_dp":
        return randomized_response_dp_event(eps, num_classes)
    if mechanism == "embedding_dp":
        return quantize_rr_dp_event(eps, num_coordinates)
    if mechanism == "signds":
        return signds_dp_event(eps)
    return randomized_response_dp_event(eps, 2)  # magrr


def _check(target_epsilon, target_delta, releases):
    target_epsilon = validate_eps(target_epsilon, "target_epsilon", lower_open=True)
    target_delta = validate_eps(target_delta, "target_delta", upper=1.0)
    releases = validate_positive_int(releases, "releases")
    return target_epsilon, target_delta, releases


def planned_epsilon(event: dp_accounting.DpEvent, releases: int,
                    target_delta: float = 1e-5) -> float:
    """eps at ``target_delta`` of ``releases`` releases of ``event`` (what a report will say)."""
    releases = validate_positive_int(releases, "releases")
    acc = MixedPLDAccountant()
    acc.compose(event, releases)
    return acc.get_epsilon(target_delta)


def plan_epsilon(target_epsilon: float, target_delta: float = 1e-5, *, releases: int,
                 mechanism: str = "label_dp", num_classes: int = 2,
                 num_coordinates: int | None = None, tolerance: float = 1e-3) -> float:
    """The per-release eps whose ``releases`` compositions reach ``target_epsilon``.

    Args:
        target_epsilon: the eps the whole run may spend (finite, > 0).
        target_delta: its delta.
        releases: releases of the busiest unit in the planned run: 1 for
            labels privatized once, the number of epochs (plus inference
            passes) for `EmbeddingDPLayer` or a per-batch `LabelDPLayer`,
            the rounds a client takes part in for SignDS and MagRR (with
            client sampling, the rounds of the busiest client; ``rounds`` is
            the safe plan).
        mechanism: ``"label_dp"`` (K-ary randomized response),
            ``"embedding_dp"`` (quantize + RR on ``num_coordinates``
            coordinates; the result is the layer's ``eps``), ``"signds"``
            or ``"magrr"`` (its ``eps_rr``).
        num_classes: K for ``"label_dp"``.
        num_coordinates: the embedding size d for ``"embedding_dp"``.
        tolerance: the calibration's absolute tolerance on eps.

    Returns:
        The eps to give the mechanism (the largest found whose composition
        stays at or below ``target_epsilon``).

    Raises:
        ValueError: the target cannot be met (e.g. below what one release at
            the smallest eps costs) or bad arguments.
    """
    target_epsilon, target_delta, releases = _check(target_epsilon, target_delta, releases)
    if mechanism not in MECHANISMS:
        raise ValueError(f"`mechanism` must be one of {MECHANISMS}; got {mechanism!r}.")
    num_classes = validate_positive_int(num_classes, "num_classes", minimum=2)
    if mechanism == "embedding_dp":
        num_coordinates = validate_positive_int(num_coordinates, "num_coordinates")
    upper = _MAX_EPS[mechanism]

    def make_event(eps):
        return _event(mechanism, eps, num_classes, num_coordinates)

    spent_at_max = planned_epsilon(make_event(upper), releases, target_delta)
    if spent_at_max <= target_epsilon:
        return upper
    # dp-accounting's calibration searches a noise parameter (eps falls as it
    # grows); here eps rises with the parameter, so bisect on the same accountant.
    return _bisect(lambda e: planned_epsilon(make_event(e), releases, target_delta),
                   target_epsilon, 1e-6, upper, tolerance)


def _bisect(spent, target, low, high, tolerance):
    """Largest x in [low, high] with spent(x) <= target (spent increasing)."""
    if spent(low) > target:
        raise ValueError(f"the target eps {target:g} cannot be met: even a per-release eps of "
                         f"{low:g} spends {spent(low):.4g} over the planned releases.")
    while high - low > tolerance:
        mid = (low + high) / 2
        if spent(mid) <= target:
            low = mid
        else:
            high = mid
    return low


def plan_noise_multiplier(target_epsilon: float, target_delta: float = 1e-5, *, releases: int,
                          tolerance: float = 1e-3) -> float:
    """The noise multiplier of `GaussianUpload` that meets ``(target_epsilon, target_delta)``.

    Args:
        target_epsilon, target_delta: the budget of the busiest client.
        releases: the uploads of the busiest client (rounds it takes part in).
        tolerance: the calibration's tolerance on the noise multiplier.

    Returns:
        The smallest noise multiplier (within ``tolerance``) whose
        ``releases`` uploads stay within the budget, calibrated by
        `dp_accounting.calibrate_dp_mechanism`.
    """
    target_epsilon, target_delta, releases = _check(target_epsilon, target_delta, releases)

    def make_event(z):
        return dp_accounting.SelfComposedDpEvent(gaussian_dp_event(z), releases)

    def spent(z):
        return planned_epsilon(make_event(z), 1, target_delta)

    # Bracket by doubling from z = 1 (a tiny z makes a huge PLD: do not start there).
    high = 1.0
    while spent(high) > target_epsilon:
        high *= 2.0
        if high > 1e6:
            raise ValueError(f"the target eps {target_epsilon:g} cannot be met with a noise "
                             f"multiplier below 1e6 over {releases} releases.")
    low = high / 2.0
    while low > 1e-3 and spent(low) <= target_epsilon:
        high, low = low, low / 2.0
    return float(dp_accounting.calibrate_dp_mechanism(
        MixedPLDAccountant, make_event, target_epsilon, target_delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(low, high), tol=tolerance))
