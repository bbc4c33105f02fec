"""The registry of mechanisms: what each one protects and how a plan treats it, in one table.

Every mechanism a run can be planned with has one `Mechanism` entry in
`MECHANISMS`: the secret its releases are about, the unit they name, its
`dp_accounting.DpEvent` per release, the largest per-release setting a plan
gives it, how much training signal one release carries (`Mechanism.signal`)
and where that signal is too small to learn, its default weight in a
whole-run plan, and the release patterns a plan of it may assume. The
planners (`keras_fedpriv.privacy.plan_epsilon`, `plan_mechanism`, `plan`), the
too-small-to-learn check and the command line (``keras-fedpriv plan``) read
this table; none of them switches on a mechanism's name.

The module imports nothing but the standard library (the events import
dp-accounting and the mechanisms when they are built), so the command line's
``--help`` reads it without importing TensorFlow.

The secrets (`LABELS`, `FEATURES`, `CLIENT_DATA`), units (`EXAMPLE`, `CLIENT`) and release
patterns come from `keras_fedpriv.mechanisms.units` and are re-exported here.

Example:
    >>> from keras_fedpriv.mechanisms.registry import mechanism
    >>> signds = mechanism("signds")
    >>> signds.secret, signds.unit, signds.default_pattern
    ('client data', 'client', 'per_client')
    >>> signds.event(2.0)                    # one release at eps 2 (a dp_accounting DpEvent)
    >>> signds.too_small_to_learn(0.35)      # a sentence: at eps 0.35 SignDS learns nothing
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

# the secrets, units and release patterns (a module of their own, which the ledger reads too)
from keras_fedpriv.mechanisms.units import (
    CLIENT,
    CLIENT_DATA,
    EVERY_EXAMPLE,
    EXAMPLE,
    FEATURES,
    LABELS,
    PATTERNS,
    PER_CLIENT,
    PER_EXAMPLE,
    SECRETS,
    UNIT_PATTERNS,
    UNITS,
)

__all__ = ["CLIENT", "CLIENT_DATA", "EVERY_EXAMPLE", "EXAMPLE", "FEATURES", "LABELS",
           "MECHANISMS", "PATTERNS", "PER_CLIENT", "PER_EXAMPLE", "SECRETS", "UNITS",
           "Mechanism", "mechanism", "names"]



# ------------------------------------------------------------------ events, built on demand
def _rr_event(eps, num_classes, num_coordinates):
    from keras_fedpriv.mechanisms.randomized_response import randomized_response_dp_event

    return randomized_response_dp_event(eps, num_classes)


def _quantize_event(eps, num_classes, num_coordinates):
    from keras_fedpriv.mechanisms.quantize import quantize_rr_dp_event

    return quantize_rr_dp_event(eps, num_coordinates)


def _signds_event(eps, num_classes, num_coordinates):
    from keras_fedpriv.mechanisms.signds import signds_dp_event

    return signds_dp_event(eps)


def _bit_event(eps, num_classes, num_coordinates):
    return _rr_event(eps, 2, num_coordinates)


def _gaussian_event(noise_multiplier, num_classes, num_coordinates):
    from keras_fedpriv.mechanisms.gaussian import gaussian_dp_event

    return gaussian_dp_event(noise_multiplier)


def _laplace_eval_event(eps, num_classes, num_coordinates):
    from keras_fedpriv.mechanisms.laplace import laplace_dp_event

    # a row's scores: sensitivity 2 in L1 over num_classes values (LaplaceEvaluation)
    return laplace_dp_event(eps, 2.0, num_values=num_classes, distance=2.0)


# ------------------------------------------------------------------ learnability signals
def _signds_signal(eps, num_classes, k):
    # P(an index released is in the top-k set) minus its chance value k (one index, h = 1)
    return k / (k + (1 - k) * math.exp(-eps)) - k


def _kary_signal(eps, num_classes, k):
    # K-ary randomized response: P(true label) - P(one other label)
    return -math.expm1(-eps) / (1 + (num_classes - 1) * math.exp(-eps))


def _quantize_signal(eps, num_classes, k):
    return math.tanh(eps / 4)  # per coordinate: binary RR at eps / 2


def _bit_signal(eps, num_classes, k):
    return math.tanh(eps / 2)  # binary randomized response


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """The facts about one mechanism that the planners and the command line share.

    Attributes:
        name: the name the planners and ``keras-fedpriv plan`` take.
        title: what it is, in a few words (the command line's help).
        secret: what its releases are about (`LABELS`, `FEATURES`, `CLIENT_DATA`).
        unit: whom a release names (`EXAMPLE` or `CLIENT`).
        parameter: ``"eps"`` (a per-release eps) or ``"noise_multiplier"``.
        limit: the largest per-release eps a plan gives it; for a noise
            multiplier, the smallest.
        weight: its default relative weight within its secret in a whole-run plan.
        alone: whether it is planned alone (`plan_epsilon`, `plan_mechanism`);
            a Laplace evaluation is planned within a whole run only.
        takes: the sizes its event needs besides the value (``"num_classes"``:
            K; ``"num_coordinates"``: d).
        make_event: ``(value, num_classes, num_coordinates) -> DpEvent`` (see `event`).
        signal_formula: ``(eps, num_classes, k) -> signal`` (see `signal`), or None.
        too_small: the signal (`signal`) at or below which training learned
            nothing (bench/learnability.py), or None where not measured.
        upload: whether it is a client's upload (a run has one).

    Example:
        >>> mechanism("label_dp").event(1.0, num_classes=10)  # K-ary randomized response
    """

    name: str
    title: str
    secret: str
    unit: str
    parameter: str
    limit: float
    weight: float
    alone: bool
    takes: tuple[str, ...]
    make_event: Callable[[float, int, int | None], Any] = dataclasses.field(repr=False)
    signal_formula: Callable[[float, int, float], float] | None = dataclasses.field(
        default=None, repr=False)
    too_small: float | None = None
    upload: bool = False

    @property
    def patterns(self) -> tuple[str, ...]:
        """The release patterns a plan of it may assume (the first is the default)."""
        return UNIT_PATTERNS[self.unit]

    @property
    def default_pattern(self) -> str:
        """The release pattern a plan assumes when none is given."""
        return self.patterns[0]

    @property
    def max_scale(self) -> float:
        """The largest per-release eps (for a noise multiplier: 1 / the smallest one)."""
        return 1.0 / self.limit if self.parameter == "noise_multiplier" else self.limit

    def event(self, value: float, *, num_classes: int = 2,
              num_coordinates: int | None = None) -> Any:
        """The `dp_accounting.DpEvent` of one release at ``value``.

        Args:
            value: the per-release eps (or the noise multiplier).
            num_classes: K (``"label_dp"``, ``"laplace_eval"``).
            num_coordinates: d (``"embedding_dp"``).

        Returns:
            The event (imports dp-accounting and the mechanism on first use).
        """
        return self.make_event(value, num_classes, num_coordinates)

    def signal(self, eps: float, *, num_classes: int = 2, k: float = 0.2) -> float:
        """How far one release at ``eps`` is from pure noise (0: none, 1: exact).

        Args:
            eps: the per-release eps (>= 0).
            num_classes: K (``"label_dp"``).
            k: SignDS's top-k fraction.

        Returns:
            The signal, in [0, 1).

        Raises:
            ValueError: the mechanism has no signal formula.
        """
        from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int

        if self.signal_formula is None:
            have = tuple(m.name for m in MECHANISMS.values() if m.signal_formula is not None)
            raise ValueError(f"`mechanism` must be one of {have} for a signal; got "
                             f"{self.name!r}.")
        eps = validate_eps(eps, "eps")
        if not 0.0 < k < 1.0:
            raise ValueError(f"`k` must be a fraction in (0, 1); got {k!r}.")
        num_classes = validate_positive_int(num_classes, "num_classes", minimum=2)
        return float(self.signal_formula(eps, num_classes, k))

    def too_small_to_learn(self, eps: float, *, num_classes: int = 2, k: float = 0.2
                           ) -> str | None:
        """Why ``eps`` per release is too small to learn, or None (see `too_small`).

        Args:
            eps: the per-release eps.
            num_classes: K (``"label_dp"``).
            k: SignDS's top-k fraction.

        Returns:
            A sentence naming the signal and the threshold, or None.
        """
        if self.too_small is None:
            return None
        have = self.signal(eps, num_classes=num_classes, k=k)
        if have > self.too_small:
            return None
        return (f"{self.name} at a per-release eps of {eps:.3g} carries a signal of {have:.3g}, "
                f"at or below {self.too_small:.3g}, where training on digits stayed within 5 "
                f"points of chance (bench/learnability.py).")


#: Every mechanism, by name. The thresholds of too small to learn are the signals of the
#: largest per-release eps at which the test accuracy of bench/learnability.py stayed within
#: 5 points of chance (digits, 10 classes): SignDS eps 3 (k = 0.2, 100 rounds of 20 of 100
#: clients), LabelDP eps 0.1 (K = 10, randomized once), EmbeddingDP eps 0.3 (d = 32).
#: Measured by `TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/learnability.py`, 2026-11-26 on
#: a shared 2-core CPU (docs/benchmarks.md, "Learnability"). Default weights: SignDS (or the
#: Gaussian upload) carries the training signal and gets the most; MagRR's bit only steers the
#: server's step size from the bits of a whole round, and a Laplace evaluation's scores
#: average over many examples: each gets a tenth of SignDS's per-release eps.
MECHANISMS = {m.name: m for m in (
    Mechanism("label_dp", "K-ary randomized response of labels (LabelDPLayer)",
              secret=LABELS, unit=EXAMPLE, parameter="eps", limit=60.0, weight=1.0, alone=True,
              takes=("num_classes",), make_event=_rr_event, signal_formula=_kary_signal,
              too_small=0.0104),
    Mechanism("embedding_dp", "quantize + RR of an embedding (EmbeddingDPLayer)",
              secret=FEATURES, unit=EXAMPLE, parameter="eps", limit=60.0, weight=1.0,
              alone=True, takes=("num_coordinates",), make_event=_quantize_event,
              signal_formula=_quantize_signal, too_small=0.0749),
    Mechanism("signds", "SignDS's exponential mechanism (SignDSEncoder)",
              secret=CLIENT_DATA, unit=CLIENT, parameter="eps", limit=100.0, weight=1.0,
              alone=True, takes=(), make_event=_signds_event, signal_formula=_signds_signal,
              too_small=0.6339, upload=True),
    Mechanism("magrr", "MagRR's client bit (its eps_rr)",
              secret=CLIENT_DATA, unit=CLIENT, parameter="eps", limit=60.0, weight=0.1,
              alone=True, takes=(), make_event=_bit_event, signal_formula=_bit_signal),
    Mechanism("gaussian", "clip + Gaussian noise (GaussianUpload's noise multiplier)",
              secret=CLIENT_DATA, unit=CLIENT, parameter="noise_multiplier", limit=0.05,
              weight=1.0, alone=True, takes=(), make_event=_gaussian_event, upload=True),
    Mechanism("laplace_eval", "Laplace-protected evaluation scores (LaplaceEvaluation)",
              secret=CLIENT_DATA, unit=CLIENT, parameter="eps", limit=60.0, weight=0.1,
              alone=False, takes=("num_classes",), make_event=_laplace_eval_event),
)}


def names(*, alone: bool | None = None, parameter: str | None = None,
          takes: str | None = None) -> tuple[str, ...]:
    """The names of the mechanisms that match, in the registry's order.

    Args:
        alone: True: only those planned alone; False: only the others; None: all.
        parameter: ``"eps"`` or ``"noise_multiplier"``: only those with it; None: all.
        takes: ``"num_classes"`` or ``"num_coordinates"``: only those whose
            event needs it; None: all.

    Returns:
        A tuple of names.

    Example:
        >>> names(alone=True, parameter="eps")
        ('label_dp', 'embedding_dp', 'signds', 'magrr')
    """
    return tuple(m.name for m in MECHANISMS.values()
                 if (alone is None or m.alone == alone)
                 and (parameter is None or m.parameter == parameter)
                 and (takes is None or takes in m.takes))


def mechanism(name: str, allowed: tuple[str, ...] | None = None) -> Mechanism:
    """The registry's entry of ``name``.

    Args:
        name: a mechanism's name.
        allowed: the names the caller accepts (default: every name).

    Returns:
        Its `Mechanism`.

    Raises:
        ValueError: ``name`` is not in ``allowed`` (the message lists them).

    Example:
        >>> mechanism("magrr").secret
        'client data'
    """
    allowed = tuple(MECHANISMS) if allowed is None else allowed
    if not isinstance(name, str) or name not in allowed:
        raise ValueError(f"`mechanism` must be one of {allowed}; got {name!r}.")
    return MECHANISMS[name]
