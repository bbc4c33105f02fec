"""A dp-accounting accountant for runs whose events use different neighbouring relations.

dp-accounting's `PLDAccountant` takes one neighbouring relation. The
randomized-response events of this package (label DP, quantize + RR, SignDS,
MagRR) are stated for replacing one value (``REPLACE_ONE``: their PLDs need
it), while the Gaussian and Laplace events already carry the replacement
sensitivity in their parameters (2C for a clipped update, 2 for probability
vectors) and are built with dp-accounting's default relation. `MixedPLDAccountant`
is a `dp_accounting.PrivacyAccountant` that builds each event's PLD for the
relation it is stated for and composes them directly, which is what one
`PLDAccountant` would do if it accepted both. It also composes the count of a
self-composed randomized-response event (dp-accounting 0.6.0's PLD accountant
drops it).

Being a `PrivacyAccountant`, it works with dp-accounting's tools, e.g.
`dp_accounting.calibrate_dp_mechanism` (see `keras_fedpriv.privacy.planning`).
"""

from __future__ import annotations

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from keras_fedpriv.mechanisms.events import pure_epsilon

__all__ = ["MixedPLDAccountant"]

_VDI = 1e-4
NeighborRel = dp_accounting.NeighboringRelation


def _base_pld(event, vdi):
    if isinstance(event, dp_accounting.RandomizedResponseDpEvent):
        return pld_lib.from_randomized_response(event.noise_parameter, event.num_buckets,
                                                value_discretization_interval=vdi,
                                                neighboring_relation=NeighborRel.REPLACE_ONE)
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return pld_lib.from_gaussian_mechanism(event.noise_multiplier,
                                               value_discretization_interval=vdi)
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return pld_lib.from_laplace_mechanism(event.noise_multiplier,
                                              value_discretization_interval=vdi)
    if isinstance(event, dp_accounting.dp_event.DiscreteLaplaceDpEvent):
        return pld_lib.from_discrete_laplace_mechanism(event.noise_parameter, event.sensitivity,
                                                       value_discretization_interval=vdi)
    return None


_SUPPORTED = (dp_accounting.RandomizedResponseDpEvent, dp_accounting.GaussianDpEvent,
              dp_accounting.LaplaceDpEvent, dp_accounting.dp_event.DiscreteLaplaceDpEvent)


class MixedPLDAccountant(dp_accounting.PrivacyAccountant):
    """PLD accountant over randomized-response, Gaussian, Laplace and discrete-Laplace events.

    Args:
        value_discretization_interval: the PLDs' discretization (smaller is
            tighter and slower).

    Example:
        >>> acc = MixedPLDAccountant()
        >>> acc.compose(randomized_response_dp_event(1.0, 2), 10)
        >>> acc.get_epsilon(1e-5)
    """

    def __init__(self, value_discretization_interval: float = _VDI) -> None:
        super().__init__(NeighborRel.REPLACE_ONE)
        self._vdi = float(value_discretization_interval)
        self._pld = None
        self._non_private = False

    def _maybe_compose(self, event, count, do_compose):
        if isinstance(event, dp_accounting.NoOpDpEvent):
            return None
        if isinstance(event, dp_accounting.NonPrivateDpEvent) or pure_epsilon(event) == float(
                "inf"):
            if do_compose and count > 0:
                self._non_private = True
            return None
        if isinstance(event, dp_accounting.ComposedDpEvent):
            for e in event.events:
                bad = self._maybe_compose(e, count, do_compose)
                if bad is not None:
                    return bad
            return None
        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            return self._maybe_compose(event.event, count * event.count, do_compose)
        if not isinstance(event, _SUPPORTED):
            return self.CompositionErrorDetails(
                invalid_event=event, error_message="supported: randomized response, Gaussian, "
                "Laplace, discrete Laplace and their compositions")
        if not do_compose or count <= 0:
            return None
        base = _base_pld(event, self._vdi)
        pld = base.self_compose(count) if count > 1 else base
        self._pld = pld if self._pld is None else self._pld.compose(pld)
        return None

    def get_epsilon(self, target_delta: float) -> float:
        if self._non_private:
            return float("inf")
        if self._pld is None:
            return 0.0
        return float(self._pld.get_epsilon_for_delta(target_delta))

    def get_delta(self, target_epsilon: float) -> float:
        if self._non_private:
            return 1.0
        if self._pld is None:
            return 0.0
        return float(self._pld.get_delta_for_epsilon(target_epsilon))
