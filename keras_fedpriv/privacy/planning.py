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

A plan is only as good as its count of releases, and the count depends on
how the run releases: `plan_mechanism` (called `plan_run` in 0.1) returns a
`Plan` that names the **release pattern** it assumes (`PATTERNS`) and checks a run against it: `Plan.check`
(or the `PlanCheck` callback, after every batch and epoch) raises `PlanExceeded` when the
run's report is already over the target, naming how the run's releases
differ from the plan's, and warns (`PlanMismatchWarning`) when the pattern
differs before the target is reached.

These helpers plan one mechanism; `keras_fedpriv.privacy.plan`
(`keras_fedpriv.privacy.run_plan`) plans a whole run (several mechanisms,
each secret within the target) on top of them. What each mechanism protects,
its event and its largest setting come from the registry
(`keras_fedpriv.mechanisms.registry`).

Example:
    >>> eps = plan_epsilon(8.0, 1e-5, releases=20)                 # one label, 20 releases
    >>> z = plan_noise_multiplier(4.0, 1e-5, releases=50)          # GaussianUpload
    >>> eps = plan_epsilon(8.0, 1e-5, releases=10, mechanism="embedding_dp",
    ...                    num_coordinates=16)                     # EmbeddingDPLayer(eps=...)
    >>> plan = plan_mechanism(8.0, releases=3, mechanism="embedding_dp", num_coordinates=16,
    ...                       pattern="per_example")               # 3 epochs, with example ids
    >>> model.fit(x, y, epochs=3, callbacks=[PlanCheck(plan)])    # raises if the run differs
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Iterable

import dp_accounting
import numpy as np

from keras_fedpriv.backend import impl
from keras_fedpriv.layers.release_counter import FRESH_IDS, ReleaseCounterMixin, busiest_bound
from keras_fedpriv.mechanisms.ledger import ReleaseLedger
from keras_fedpriv.mechanisms.registry import (
    EVERY_EXAMPLE,
    PATTERNS,
    PER_CLIENT,
    PER_EXAMPLE,
    mechanism as registered,
    names,
)
from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int
from keras_fedpriv.privacy.accountant import MixedPLDAccountant
from keras_fedpriv.privacy.report import (
    EpsilonLogger,
    PrivacyReport,
    compose_epsilon,
    find_protections,
    privacy_ledger,
    privacy_report,
)

__all__ = ["EVERY_EXAMPLE", "MECHANISMS", "PATTERNS", "PER_CLIENT", "PER_EXAMPLE", "Plan",
           "PlanCheck", "PlanExceeded", "PlanMismatchWarning", "plan_epsilon", "plan_mechanism",
           "plan_noise_multiplier", "plan_run", "planned_epsilon", "release_pattern"]

#: Mechanisms whose per-release parameter is an eps (`plan_epsilon`; from the registry,
#: `keras_fedpriv.mechanisms.registry`).
MECHANISMS = names(alone=True, parameter="eps")
#: Every mechanism `plan_mechanism` plans (``"gaussian"``: `GaussianUpload`, a noise multiplier).
PLANNED_MECHANISMS = names(alone=True)


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
    entry = registered(mechanism, MECHANISMS)
    num_classes = validate_positive_int(num_classes, "num_classes", minimum=2)
    if "num_coordinates" in entry.takes:
        num_coordinates = validate_positive_int(num_coordinates, "num_coordinates")
    upper = entry.limit

    def make_event(eps):
        return entry.event(eps, num_classes=num_classes, num_coordinates=num_coordinates)

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

    gaussian = registered("gaussian")

    def make_event(z):
        return dp_accounting.SelfComposedDpEvent(gaussian.event(z), releases)

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


# ------------------------------------------------------------------ plans that check the run
class PlanExceeded(RuntimeError):
    """A run's report is over the target of its `Plan` (raised by `Plan.check` and `PlanCheck`)."""


class PlanMismatchWarning(UserWarning):
    """A run releases in another pattern than its `Plan` assumed (not over the target yet)."""


def release_pattern(mechanism: str, pattern: str | None = None) -> str:
    """Check a release pattern against a mechanism; ``None`` gives the mechanism's default.

    Args:
        mechanism: one of `PLANNED_MECHANISMS`.
        pattern: one of `PATTERNS` (``"per_example"``, ``"every_example"``
            for `label_dp` / `embedding_dp`; ``"per_client"`` for `signds`,
            `magrr` and `gaussian`), or None.

    Returns:
        The pattern (default: ``"per_example"`` for the example mechanisms,
        ``"per_client"`` for the client ones).
    """
    allowed = registered(mechanism, PLANNED_MECHANISMS).patterns
    if pattern is None:
        return allowed[0]
    if pattern not in allowed:
        raise ValueError(f"`pattern` must be one of {allowed} for mechanism {mechanism!r}; got "
                         f"{pattern!r}.")
    return pattern


@dataclasses.dataclass(frozen=True)
class Plan:
    """A planned run: the per-release parameter, and the release pattern it assumes.

    Attributes:
        mechanism: one of `PLANNED_MECHANISMS` (or ``"laplace_eval"``, in
            the per-secret plans of a `RunPlan` led by a Laplace evaluation).
        value: the per-release eps (the mechanism's ``eps``; `MagRR`'s
            ``eps_rr``), or the noise multiplier for ``"gaussian"``.
        releases: the planned releases of the busiest unit, counted as
            ``pattern`` says.
        pattern: the release pattern assumed (a key of `PATTERNS`).
        target_epsilon, target_delta: what the run's report may say at most.
        num_classes, num_coordinates: the event's K (``"label_dp"``) and d
            (``"embedding_dp"``).
    """

    mechanism: str
    value: float
    releases: int
    pattern: str
    target_epsilon: float
    target_delta: float
    num_classes: int = 2
    num_coordinates: int | None = None

    @property
    def epsilon(self) -> float:
        """The per-release eps to give the mechanism (not for ``"gaussian"``)."""
        if self._noised:
            raise ValueError(f"a {self.mechanism!r} plan gives `noise_multiplier`, not a "
                             f"per-release eps.")
        return self.value

    @property
    def noise_multiplier(self) -> float:
        """The `GaussianUpload` noise multiplier (``"gaussian"`` plans only)."""
        if not self._noised:
            raise ValueError(f"a {self.mechanism!r} plan gives `epsilon`, not a noise "
                             f"multiplier.")
        return self.value

    @property
    def _noised(self) -> bool:
        return registered(self.mechanism).parameter == "noise_multiplier"

    @property
    def protects(self) -> str:
        """The secret the planned releases are about (``"labels"``, ``"features"``, ...)."""
        return registered(self.mechanism).secret

    def event(self) -> dp_accounting.DpEvent:
        """The `dp_accounting.DpEvent` of one planned release about one unit."""
        return registered(self.mechanism).event(self.value, num_classes=self.num_classes,
                                                num_coordinates=self.num_coordinates)

    def assumption(self) -> str:
        """The release pattern assumed, in words (used in errors and by the CLI)."""
        if self.pattern == PER_EXAMPLE:
            return (f"per-example releases with example ids, at most {self.releases} per "
                    f"example")
        if self.pattern == EVERY_EXAMPLE:
            return (f"at most {self.releases} calls without example ids, each counted for "
                    f"every example")
        return f"per-client releases, at most {self.releases} per client"

    def check(self, obj: Any, callbacks: Iterable[Any] = ()) -> Any:
        """Compare what a run recorded with this plan.

        Args:
            obj: what `keras_fedpriv.privacy.privacy_report` takes (a model,
                a `History`, a `HorizontalFL`, a protection, a list).
            callbacks: more objects whose releases count.

        Returns:
            The run's `PrivacyReport` about `protects`, at ``target_delta``.

        Raises:
            PlanExceeded: the report is over ``target_epsilon`` (the message
                names the plan's pattern and what the run recorded).

        Warns:
            PlanMismatchWarning: the run records releases in another pattern
                than planned (e.g. without example ids where the plan assumed
                ids), or none of the planned secret, while still within the
                target.
        """
        return self._judge(privacy_report(obj, delta=self.target_delta, callbacks=callbacks,
                                          protects=self.protects))

    def within(self, ledger: ReleaseLedger) -> bool:
        """Whether a ledger is within this plan by counting alone (no accounting).

        Args:
            ledger: a run's `ReleaseLedger` (e.g. ``privacy_ledger(model)``).

        Returns:
            True if every release about `protects` is the planned event
            about the planned unit and they add up to at most ``releases``
            for the busiest unit: the run's report is then at most the
            plan's figure. False means "compose to know", not "over".
        """
        event, unit, releases = self.event(), registered(self.mechanism).unit, 0
        for kind in ledger.kinds:
            if kind.protects != self.protects:
                continue
            count = ledger.total(kind)
            if count and (kind.unit != unit or kind.event != event):
                return False
            releases += count  # a bound on the busiest unit's count
        return releases <= self.releases

    def exceeds(self, epsilon: float) -> bool:
        """Whether ``epsilon`` is over ``target_epsilon`` (beyond the calibration's slack)."""
        return epsilon > self.target_epsilon + 1e-6 * max(1.0, self.target_epsilon)

    def _judge(self, report, warn=True):
        """Raise `PlanExceeded` if ``report`` is over the target; warn on a mismatch."""
        spent = report.epsilon
        observed, mismatch = self._observed(report)
        if self.exceeds(spent):
            raise PlanExceeded(
                f"The run has spent eps {spent:.4g} (delta={self.target_delta:g}) on the "
                f"{self.protects}, over the plan's target of {self.target_epsilon:g}. The plan "
                f"assumed {self.assumption()}, at {self._per_release()}; this run records "
                f"{observed}.{_ADVICE[self.pattern] if mismatch else ''}")
        if warn and (mismatch or not report.releases):
            warnings.warn(PlanMismatchWarning(
                f"The plan assumed {self.assumption()}; this run records {observed} (eps "
                f"{spent:.4g} so far, target {self.target_epsilon:g})."
                f"{_ADVICE[self.pattern] if mismatch else ''}"), stacklevel=3)
        return report

    def _per_release(self):
        eps = compose_epsilon([(self.event(), 1)], self.target_delta)
        name = "noise multiplier" if self._noised else "eps"
        return f"eps {eps:.4g} per release (the mechanism's {name}={self.value:.4g})"

    def _observed(self, report):
        """(what the run recorded in words, whether its pattern differs from the plan's)."""
        if not report.releases:
            return f"no release of the {self.protects} (is the planned mechanism used?)", False
        try:
            anonymous = [int(k["everyone"]) for k in report.ledger.to_dict()["kinds"]]
        except ValueError:  # an event the ledger cannot save: counts only
            anonymous = [0] * len(report.ledger.kinds)
        anonymous = dict(zip((k.key for k in report.ledger.kinds), anonymous))
        parts, mismatch = [], False
        for kind, row in zip([k for k in report.ledger.kinds if report.ledger.total(k) > 0],
                             report.releases):
            everyone = anonymous.get(kind.key, 0)
            named = row.count - everyone
            per = report.per_release_epsilon(row)
            what = []
            if everyone:
                what.append(f"{everyone} release(s) without {kind.unit} ids, each counted for "
                            f"every {kind.unit}")
                mismatch = mismatch or self.pattern == PER_EXAMPLE
            if named:
                what.append(f"{named} release(s) of the busiest {kind.unit} named by its id")
            at = "inf (no DP)" if math.isinf(per) else f"{per:.4g}"
            parts.append(f"{row.mechanism}: {' + '.join(what)} at eps {at} per release")
        return "; ".join(parts), mismatch


_ADVICE = {
    PER_EXAMPLE: (" A layer called without `example_ids` (e.g. a plain `model.fit`, or a "
                  "`VerticalModel` whose inputs lack `example_ids`) releases every row once per "
                  "batch and counts each call for every example: pass example ids "
                  "(`with_example_ids`), or plan with pattern='every_example' and releases = "
                  "batches per epoch x epochs (+ inference batches)."),
    EVERY_EXAMPLE: "",
    PER_CLIENT: "",
}


def plan_mechanism(target_epsilon: float, target_delta: float = 1e-5, *, releases: int,
                   mechanism: str = "label_dp", pattern: str | None = None,
                   num_classes: int = 2, num_coordinates: int | None = None,
                   tolerance: float = 1e-3) -> Plan:
    """Plan one mechanism: its per-release parameter for a target, and the pattern it assumes.

    (`keras_fedpriv.privacy.plan` plans a whole run, several mechanisms.)

    Args:
        target_epsilon, target_delta: what the run's report may say at most.
        releases: the releases of the busiest unit, counted as ``pattern``
            says (`PATTERNS`).
        mechanism: one of `PLANNED_MECHANISMS` (``"gaussian"`` plans the
            `GaussianUpload` noise multiplier).
        pattern: ``"per_example"`` (default for ``"label_dp"`` and
            ``"embedding_dp"``: the layer sees example ids, `releases` =
            passes over the busiest example), ``"every_example"`` (no ids:
            `releases` = calls), or ``"per_client"`` (the client mechanisms).
        num_classes: K for ``"label_dp"``.
        num_coordinates: d for ``"embedding_dp"``.
        tolerance: the calibration's tolerance.

    Returns:
        A `Plan`: ``plan.epsilon`` (or ``plan.noise_multiplier``) configures
        the mechanism; ``plan.check(model)`` or the `PlanCheck` callback
        checks the run against it.

    Example:
        >>> plan = plan_mechanism(8.0, releases=3, mechanism="embedding_dp",
        ...                       num_coordinates=16)       # 3 epochs, with example ids
        >>> EmbeddingDPLayer(eps=plan.epsilon); model.fit(..., callbacks=[PlanCheck(plan)])
    """
    pattern = release_pattern(mechanism, pattern)
    target_epsilon, target_delta, releases = _check(target_epsilon, target_delta, releases)
    if registered(mechanism).parameter == "noise_multiplier":
        value = plan_noise_multiplier(target_epsilon, target_delta, releases=releases,
                                      tolerance=tolerance)
    else:
        value = plan_epsilon(target_epsilon, target_delta, releases=releases,
                             mechanism=mechanism, num_classes=num_classes,
                             num_coordinates=num_coordinates, tolerance=tolerance)
    return Plan(mechanism, float(value), releases, pattern, target_epsilon, target_delta,
                int(num_classes), None if num_coordinates is None else int(num_coordinates))


#: The name `plan_mechanism` had in keras-fedpriv 0.1 (it plans one mechanism, not a whole run:
#: that is `keras_fedpriv.privacy.plan`).
plan_run = plan_mechanism


class PlanCheck(EpsilonLogger):
    """Check a run against its `Plan` after every batch and at the end of every epoch (or round).

    Raises `PlanExceeded` (which stops the fit) as soon as the run's report
    is over the plan's target, and warns `PlanMismatchWarning` at the end of
    an epoch when the run releases in another pattern than planned. Works
    with ``model.fit`` and `HorizontalFL.fit` (checked every round); place it
    after the callbacks that release.

    During ``model.fit`` it also checks after every training and validation
    batch, so a run that releases more often than planned is stopped at the
    first batch that takes it over the target, not an epoch later: a run
    without example ids where the plan assumed them (every call is then a
    release about every example), or one whose examples come back more
    often than planned within an epoch (oversampled data, ``.repeat()``
    with ``steps_per_epoch``, validation over training ids).

    That check is cheap. A protection layer keeps a running maximum of its
    per-example counts where it counts them (``release_id_max``); after a
    batch the check reads its small counters and that maximum, and bounds the
    run's report by them (`busiest_bound`: the busiest example of each layer,
    added up), without reading the per-example table. Nothing is composed
    while the bound is within the plan by counting alone (`Plan.within`: a
    run that follows its plan never composes between epochs), and the exact
    per-example counts are read only when the bound's report is over the
    target: for one layer the bound is exact and the run stops there; with
    several, the exact counts decide, after every batch until the epoch ends.

    Args:
        plan: the `Plan` (from `plan_mechanism`).
        callbacks: other objects whose releases count (as in `privacy_report`).
    """

    def __init__(self, plan: Plan, callbacks: Iterable[Any] = ()) -> None:
        if not isinstance(plan, Plan):
            raise TypeError(f"`plan` must be a Plan from plan_mechanism(); got "
                            f"{type(plan).__name__}.")
        super().__init__(plan.target_delta, callbacks=callbacks, protects=plan.protects)
        self.plan = plan
        self._protections = None  # found at the first batch of a fit
        self._read = {}           # id(protection) -> (its counters, its bounded ledger then)
        self._exact = False       # the bound was over the target: per-example counts decide

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Find the run's protections again at the first batch (a new fit may add some)."""
        self._protections, self._read, self._exact = None, {}, False

    def _counters(self, protection):
        """What must change for ``protection``'s (bounded) ledger to change: a layer's small
        counters and running per-example maximum, or another protection's ledger totals."""
        if isinstance(protection, ReleaseCounterMixin):  # a protection layer
            calls = impl().to_numpy(protection.release_totals)  # a host copy, either backend
            if not self._exact:  # the per-example calls matter through the maximum only
                calls = np.delete(calls, FRESH_IDS)
            return tuple(calls.tolist()), protection.release_id_max(), None
        ledger = protection.privacy_ledger().only(self.plan.protects)
        return tuple((k.key, ledger.total(k)) for k in ledger.kinds), 0, ledger

    def _check_batch(self):
        """Check the releases so far, cheaply (see the class's docstring): raise `PlanExceeded`
        at the first batch whose report is over the target."""
        objs, protects = [self._run(), *self.callbacks], self.plan.protects
        if self._protections is None:
            self._protections = find_protections(objs)
            for protection in self._protections:  # once per fit: a full read brings a layer's
                protection.privacy_ledger()        # running maximum up to counts restored since
        if not self._protections:  # nothing found: not private
            self.plan._judge(PrivacyReport(privacy_ledger(objs), self.plan.target_delta),
                             warn=False)
            return
        changed = False
        for protection in self._protections:
            *key, ledger = self._counters(protection)
            last = self._read.get(id(protection))
            if last is not None and last[0] == key:
                continue
            if ledger is None:
                with busiest_bound():
                    ledger = protection.privacy_ledger().only(protects)
            self._read[id(protection)] = (key, ledger)
            changed = True
        if not changed:
            return
        bound = ReleaseLedger.merged(v[1] for v in self._read.values())
        if self.plan.within(bound):
            return
        if not self.plan.exceeds(PrivacyReport(bound, self.plan.target_delta).epsilon):
            return
        self._exact = True  # from now on, every per-example count changes the check
        exact = ReleaseLedger.merged(p.privacy_ledger().only(protects) for p in self._protections)
        self.last_report = self.plan._judge(PrivacyReport(exact, self.plan.target_delta),
                                            warn=False)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Check the releases so far (raises `PlanExceeded` when over the target)."""
        self._check_batch()

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Check the releases so far, evaluation passes included."""
        self._check_batch()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Check the run so far (raises `PlanExceeded` when over the target; warns on a
        pattern mismatch)."""
        self._read, self._exact = {}, False  # the next batch reads every counter afresh
        self.last_report = self.plan.check(self._run(), callbacks=self.callbacks)
