"""Plan a whole run: every mechanism's per-release setting for one target (eps, delta).

A horizontal run releases SignDS (or Gaussian) uploads, MagRR bits and
Laplace-protected evaluations about each client; a vertical run releases the
leader's labels (`LabelDPLayer`) and a follower's features
(`EmbeddingDPLayer`). `plan` takes the whole run and returns each
mechanism's setting, calibrated with the accountant `privacy_report` uses
(`MixedPLDAccountant`) on the events the mechanisms record.

**Groups.** Mechanisms that protect different secrets (labels, features,
client data) are reported separately by ``privacy_report(obj, protects=...)``:
each group meets the target on its own. Within a group the releases compose
(the busiest unit's releases of every mechanism, in one accountant), and the
target is split by **relative weights**: every mechanism's per-release eps is
``weight x s`` (a Gaussian upload's noise multiplier is ``1 / (weight x s)``)
for one common scale ``s``, the largest (found by a bracketing search) whose composition
stays at or below the target.

**Counting.** `HorizontalFL` (and the Flower strategy's `HorizontalLoop`)
samples ``clients_per_round`` clients uniformly without replacement every
round, so the busiest client can take part in every round: the plan counts
``rounds`` releases per client for the uploads and MagRR (a bound the run
cannot exceed) unless ``max_rounds_per_client`` states a smaller count (an
assumption: `PlanCheck` stops a run that breaks it). A Laplace evaluation is
due every ``evaluate_every`` rounds and releases each evaluated row once
(eps-LDP per row): about a client whose ``eval_rows`` rows it evaluates, one
evaluation is ``eval_rows`` releases (its data as a whole composes them), so
``rounds // evaluate_every * eval_rows`` releases.

**Too small to learn.** A per-release setting whose signal (`signal`) is at
or below `TOO_SMALL_SIGNAL` (measured by bench/learnability.py) warns
`TooSmallToLearnWarning`: at that signal the bench's training stayed within 5
points of chance.

Each mechanism's secret, event, largest setting, default weight, signal and
threshold come from the registry (`keras_fedpriv.mechanisms.registry`).

Example:
    >>> p = plan(8.0, 1e-5, mechanisms=("signds", "magrr", "laplace_eval"), rounds=100,
    ...          clients_per_round=20, num_clients=100, num_classes=10, evaluate_every=10,
    ...          eval_rows=50)
    >>> print(p)                                   # the table
    >>> SignDSEncoder(k=0.2, eps=p["signds"].value); MagRR(eps_rr=p["magrr"].value)
    >>> fl.fit(100, 20, callbacks=p.callbacks([magrr, laplace]))  # theirs + checks, every round
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from typing import Any, Iterable, Mapping, Sequence

import dp_accounting

from keras_fedpriv.mechanisms.events import pure_epsilon
from keras_fedpriv.mechanisms.registry import MECHANISMS as REGISTRY
from keras_fedpriv.mechanisms.registry import CLIENT_DATA, mechanism as registered
from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int
from keras_fedpriv.privacy.planning import Plan, PlanCheck, planned_epsilon
from keras_fedpriv.text_table import text_table

__all__ = ["DEFAULT_WEIGHTS", "RUN_MECHANISMS", "TOO_SMALL_SIGNAL", "MechanismPlan", "RunPlan",
           "TooSmallToLearnWarning", "plan", "signal", "too_small_to_learn"]

#: The mechanisms `plan` plans, and the secret each protects (the registry's).
RUN_MECHANISMS = {m.name: m.secret for m in REGISTRY.values()}
#: Relative per-release weights within a group (the registry's `Mechanism.weight`).
DEFAULT_WEIGHTS = {m.name: m.weight for m in REGISTRY.values()}
#: Signal (see `signal`) at or below which a mechanism stops carrying training
#: signal (the registry's `Mechanism.too_small`, measured by bench/learnability.py).
TOO_SMALL_SIGNAL = {m.name: m.too_small for m in REGISTRY.values() if m.too_small is not None}

_MIN_EPS = 1e-4  # no mechanism is planned below it (a weight must not zero a mechanism)


class TooSmallToLearnWarning(UserWarning):
    """A planned per-release setting carries too little signal to learn (see `TOO_SMALL_SIGNAL`)."""


def signal(mechanism: str, eps: float, *, num_classes: int = 2, k: float = 0.2) -> float:
    """How far one release at ``eps`` is from pure noise (0: no signal, 1: exact).

    * ``"signds"``: P(an index the encoder releases is in the top-k set) minus
      its chance value ``k`` (one index, ``h = 1``, as the encoder uses at
      small eps): ``k e^eps / (k e^eps + 1 - k) - k``.
    * ``"label_dp"``: K-ary randomized response, P(true label) - P(one other
      label) = ``(e^eps - 1) / (K - 1 + e^eps)``.
    * ``"embedding_dp"``: per coordinate (RR at eps/2), ``tanh(eps / 4)``.
    * ``"magrr"``: binary RR, ``tanh(eps / 2)``.

    Args:
        mechanism: one of the names above.
        eps: the mechanism's per-release eps (>= 0).
        num_classes: K for ``"label_dp"``.
        k: SignDS's top-k fraction, in (0, 1).

    Returns:
        The signal, in [0, 1) (`Mechanism.signal` of the registry).
    """
    return registered(mechanism).signal(eps, num_classes=num_classes, k=k)


@dataclasses.dataclass(frozen=True)
class MechanismPlan:
    """One mechanism's planned setting.

    Attributes:
        mechanism: a key of `RUN_MECHANISMS`.
        value: the per-release eps (SignDS's ``eps``, MagRR's ``eps_rr``,
            the layers' ``eps``, `LaplaceEvaluation`'s ``eps``), or the
            `GaussianUpload` noise multiplier.
        releases: the releases of the busiest unit the plan assumes.
        share: the mechanism's weight over its group's total weight.
        epsilon: what the report's row of this mechanism alone composes to.
        protects: the secret (the report's ``protects=``).
    """

    mechanism: str
    value: float
    releases: int
    share: float
    epsilon: float
    protects: str


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The plan of a whole run: one `MechanismPlan` per mechanism, and each group's total.

    Attributes:
        mechanisms: the `MechanismPlan` of every mechanism, in the order given.
        totals: ``{secret: composed eps of its group}`` (each at most the target).
        target_epsilon, target_delta: the target every group meets.
        assumption: how the releases were counted, in words.
    """

    mechanisms: tuple[MechanismPlan, ...]
    totals: dict[str, float]
    target_epsilon: float
    target_delta: float
    assumption: str
    num_classes: int = 2
    num_coordinates: int | None = None

    def __getitem__(self, mechanism: str) -> MechanismPlan:
        """The `MechanismPlan` of ``mechanism`` (KeyError if it was not planned)."""
        for m in self.mechanisms:
            if m.mechanism == mechanism:
                return m
        raise KeyError(f"{mechanism!r} was not planned; planned: "
                       f"{[m.mechanism for m in self.mechanisms]}.")

    def plans(self) -> dict[str, Plan]:
        """One `Plan` per secret, to check a run against (``Plan.check``, `PlanCheck`).

        Returns:
            ``{secret: Plan}``: each at the group's target, named after the
            group's mechanism with the largest weight (the others' releases
            are composed with it: a report over the target raises).
        """
        out = {}
        for secret in self.totals:
            group = [m for m in self.mechanisms if m.protects == secret]
            main = max(group, key=lambda m: m.share)
            out[secret] = Plan(main.mechanism, main.value, main.releases,
                               registered(main.mechanism).default_pattern,
                               self.target_epsilon, self.target_delta, self.num_classes,
                               self.num_coordinates)
        return out

    def check(self, obj: Any, callbacks: Iterable[Any] = ()) -> dict[str, Any]:
        """Compare what a run recorded with this plan, one secret at a time.

        Args:
            obj: what `privacy_report` takes (a model, a History, a `HorizontalFL`, ...).
            callbacks: more objects whose releases count.

        Returns:
            ``{secret: PrivacyReport}``.

        Raises:
            PlanExceeded: a secret's report is over the target.
        """
        callbacks = list(callbacks)
        return {s: p.check(obj, callbacks=callbacks) for s, p in self.plans().items()}

    def callbacks(self, callbacks: Iterable[Any] = ()) -> list[Any]:
        """The list to pass to ``fit``: ``callbacks`` followed by one `PlanCheck` per secret.

        ``fit(..., callbacks=p.callbacks([magrr, laplace]))`` runs MagRR and
        the evaluation and checks the report after them (a check placed
        after the callbacks that release sees their releases).

        Args:
            callbacks: the run's callbacks whose releases count (e.g. the
                `MagRR` and `LaplaceEvaluation` callbacks of a `HorizontalFL`
                run); they are returned first, unchanged.

        Returns:
            ``[*callbacks, *checks]``: the given callbacks, then the
            `PlanCheck` callbacks.
        """
        callbacks = list(callbacks)
        return [*callbacks, *(PlanCheck(p, callbacks=callbacks) for p in self.plans().values())]

    def __str__(self) -> str:
        rows = [(m.protects, m.mechanism,
                 f"noise multiplier {m.value:.4g}"
                 if REGISTRY[m.mechanism].parameter == "noise_multiplier"
                 else f"eps {m.value:.4g}", str(m.releases), f"{m.share:.0%}",
                 f"{m.epsilon:.3f}", f"{self.totals[m.protects]:.3f}") for m in self.mechanisms]
        table = text_table(["protects", "mechanism", "per release", "releases (busiest)",
                              "share", "eps alone", "group eps"], rows)
        return (f"Plan for (eps={self.target_epsilon:g}, delta={self.target_delta:g}) per "
                f"secret; {self.assumption}\n{table}")


def _group_event(parts):
    """One event of all the releases of a group: [(event, releases), ...].

    Composed by `MixedPLDAccountant` only, which multiplies a
    `SelfComposedDpEvent`'s count out for every event type (dp-accounting's
    own PLD accountant drops it for randomized response: `repeat_event`).
    """
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(e, n) for e, n in parts])


def _validate_mechanisms(mechanisms):
    if isinstance(mechanisms, str) or not isinstance(mechanisms, Sequence) or not mechanisms:
        raise TypeError(f"`mechanisms` must be a non-empty sequence of names from "
                        f"{tuple(RUN_MECHANISMS)}; got {mechanisms!r}.")
    for name in mechanisms:
        if name not in RUN_MECHANISMS:
            raise ValueError(f"`mechanisms` must hold names from {tuple(RUN_MECHANISMS)}; got "
                             f"{name!r}.")
    if len(set(mechanisms)) != len(mechanisms):
        raise ValueError(f"`mechanisms` names a mechanism twice: {list(mechanisms)!r}.")
    uploads = [name for name in mechanisms if REGISTRY[name].upload]
    if len(uploads) > 1:
        raise ValueError(f"`mechanisms` names the uploads {' and '.join(map(repr, uploads))}: a "
                         f"run has one upload.")
    return tuple(mechanisms)


def _validate_weights(weights, mechanisms):
    weights = dict(weights or {})
    for name, w in weights.items():
        if name not in mechanisms:
            raise ValueError(f"`weights` names {name!r}, which is not in `mechanisms` "
                             f"{list(mechanisms)!r}.")
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not (
                math.isfinite(w) and w > 0):
            raise ValueError(f"`weights[{name!r}]` must be a finite number > 0; got {w!r}.")
    return {m: float(weights.get(m, DEFAULT_WEIGHTS[m])) for m in mechanisms}


def _required(value, name, mechanisms):
    """``value`` as a positive int; a clear TypeError when it was not given."""
    if value is None:
        raise TypeError(f"`{name}` is required to plan {', '.join(map(repr, mechanisms))}; "
                        f"got None.")
    return validate_positive_int(value, name)


def _releases(mechanisms, rounds, clients_per_round, num_clients, max_rounds_per_client,
              evaluate_every, eval_rows, epochs, label_releases, releases):
    """{mechanism: releases of the busiest unit}, and the assumption in words."""
    client = [m for m in mechanisms if RUN_MECHANISMS[m] == CLIENT_DATA]
    out, words = {}, []
    if client:
        rounds = _required(rounds, "rounds", client)
        num_clients = _required(num_clients, "num_clients", client)
        clients_per_round = _required(clients_per_round, "clients_per_round", client)
        if clients_per_round > num_clients:
            raise ValueError(f"`clients_per_round`={clients_per_round} is more than the "
                             f"`num_clients`={num_clients} clients.")
        per_client = rounds
        if max_rounds_per_client is not None:
            per_client = validate_positive_int(max_rounds_per_client, "max_rounds_per_client")
            if per_client > rounds:
                raise ValueError(f"`max_rounds_per_client`={per_client} is more than the "
                                 f"`rounds`={rounds}.")
            if per_client * num_clients < rounds * clients_per_round:
                raise ValueError(
                    f"`max_rounds_per_client`={per_client} cannot hold: {rounds} rounds of "
                    f"{clients_per_round} clients among {num_clients} take part "
                    f"{rounds * clients_per_round} times, more than {per_client} each.")
            words.append(f"at most {per_client} of {rounds} rounds per client (assumed: "
                         f"sampling can pick a client every round; PlanCheck enforces it)")
        else:
            words.append(f"{clients_per_round} of {num_clients} clients sampled per round: the "
                         f"busiest client can take part in all {rounds} rounds")
        for m in client:
            out[m] = per_client
        if "laplace_eval" in client:
            every = validate_positive_int(evaluate_every, "evaluate_every")
            rows = _required(eval_rows, "eval_rows", ["laplace_eval"])
            if not rounds // every:
                raise ValueError(f"`evaluate_every`={every} is more than the `rounds`={rounds}: "
                                 f"no evaluation would run.")
            out["laplace_eval"] = rounds // every * rows  # one release per row evaluated
            words.append(f"a Laplace evaluation every {every} round(s), of {rows} row(s) of "
                         f"every client (one release per row)")
    if "embedding_dp" in mechanisms:
        out["embedding_dp"] = _required(epochs, "epochs", ["embedding_dp"])
        words.append(f"features released once per epoch ({out['embedding_dp']}) with example ids")
    if "label_dp" in mechanisms:
        out["label_dp"] = validate_positive_int(label_releases, "label_releases")
        words.append(f"labels released {out['label_dp']} time(s) per example")
    for name, count in dict(releases or {}).items():
        if name not in mechanisms:
            raise ValueError(f"`releases` names {name!r}, which is not in `mechanisms` "
                             f"{list(mechanisms)!r}.")
        count = validate_positive_int(count, f"releases[{name!r}]")
        if count < out[name]:
            raise ValueError(f"`releases[{name!r}]`={count} is fewer than the {out[name]} "
                             f"the run can release about its busiest unit; a count may only "
                             f"grow (e.g. inference passes).")
        out[name] = count
        words.append(f"{name}: {count} release(s) as given")
    return out, "; ".join(words) + "."


def plan(target_epsilon: float, target_delta: float = 1e-5, *, mechanisms: Sequence[str],
         rounds: int | None = None, clients_per_round: int | None = None,
         num_clients: int | None = None, max_rounds_per_client: int | None = None,
         evaluate_every: int = 1, eval_rows: int | None = None,
         epochs: int | None = None, label_releases: int = 1,
         releases: Mapping[str, int] | None = None, weights: Mapping[str, float] | None = None,
         num_classes: int = 2, num_coordinates: int | None = None, k: float = 0.2,
         tolerance: float = 1e-3, warn: bool = True) -> RunPlan:
    """Every mechanism's per-release setting for a whole run, each secret within the target.

    Each group of mechanisms protecting one secret (client data; labels;
    features) meets ``(target_epsilon, target_delta)`` on its own, as
    ``privacy_report(obj, protects=...)`` reports it: the group's releases of
    the busiest unit are composed with `MixedPLDAccountant` and stay at or
    below the target (within ``tolerance`` of it).

    Args:
        target_epsilon: the eps each secret may spend (finite, > 0).
        target_delta: its delta.
        mechanisms: names from `RUN_MECHANISMS`: ``"signds"`` or
            ``"gaussian"`` (the upload), ``"magrr"``, ``"laplace_eval"``
            (horizontal); ``"label_dp"``, ``"embedding_dp"`` (vertical).
        rounds: federated rounds (the client mechanisms).
        clients_per_round: clients sampled per round (<= ``num_clients``).
        num_clients: clients in the run.
        max_rounds_per_client: an assumed bound on the rounds the busiest
            client takes part in (default: ``rounds``, which sampling cannot
            exceed); a smaller one is an assumption `PlanCheck` enforces.
        evaluate_every: a `LaplaceEvaluation`'s ``every_n_epochs``.
        eval_rows: the most rows a `LaplaceEvaluation` evaluates of one
            client (an integer >= 1; required with ``"laplace_eval"``): each
            evaluation is that many releases about the client. Pass the
            client's data size or the evaluation's ``max_report_rows``,
            whichever is smaller (a fixed ``eval_data``: all its rows). There
            is no default: the cap (10000 rows) would plan a per-row eps so
            small that the accountant's discretization, not the noise,
            decides the figure.
        epochs: training epochs (``"embedding_dp"``: one release per epoch
            with example ids, of one protected follower; add through
            ``releases`` the inference passes (over the training rows with
            their ids: one each; without ids, `fit`'s ``validation_data``
            included: one per batch) and every other protected follower's
            releases (the report composes them as one secret)).
        label_releases: releases per label (1: randomized once, keyed by
            example ids; the epochs for ``per_batch=True``).
        releases: ``{mechanism: count}`` raising a count above (e.g. epochs
            plus inference passes for ``"embedding_dp"``); never lowering it.
        weights: ``{mechanism: weight > 0}``: relative per-release eps
            within a group (default `DEFAULT_WEIGHTS`).
        num_classes: K of the labels (``"label_dp"``) and of the evaluated
            model's outputs (``"laplace_eval"``).
        num_coordinates: d of the embedding (``"embedding_dp"``).
        k: SignDS's top-k fraction (for the signal of ``"signds"``).
        tolerance: absolute tolerance on the largest per-release eps.
        warn: warn `TooSmallToLearnWarning` where a setting is too small.

    Returns:
        A `RunPlan` (``print`` it for the table; ``plan["signds"].value``;
        ``fit(..., callbacks=plan.callbacks([magrr, laplace]))`` runs them
        and checks the run).

    Raises:
        ValueError / TypeError: bad arguments (named), or a target that the
            planned releases cannot meet.
    """
    target_epsilon = validate_eps(target_epsilon, "target_epsilon", lower_open=True)
    target_delta = validate_eps(target_delta, "target_delta", upper=1.0)
    mechanisms = _validate_mechanisms(mechanisms)
    weights = _validate_weights(weights, mechanisms)
    counts, assumption = _releases(mechanisms, rounds, clients_per_round, num_clients,
                                   max_rounds_per_client, evaluate_every, eval_rows, epochs,
                                   label_releases, releases)
    num_classes = validate_positive_int(num_classes, "num_classes", minimum=2)
    if any("num_coordinates" in REGISTRY[m].takes for m in mechanisms):
        num_coordinates = validate_positive_int(num_coordinates, "num_coordinates")
    tolerance = validate_eps(tolerance, "tolerance", lower_open=True)

    def event(name, scale):  # a noise multiplier is planned as its inverse (grows with eps)
        entry = REGISTRY[name]
        value = 1.0 / scale if entry.parameter == "noise_multiplier" else scale
        return entry.event(value, num_classes=num_classes, num_coordinates=num_coordinates)

    values, totals = {}, {}
    for secret in dict.fromkeys(RUN_MECHANISMS[m] for m in mechanisms):
        group = [m for m in mechanisms if RUN_MECHANISMS[m] == secret]
        scale, totals[secret] = _calibrate(group, weights, counts, event, target_epsilon,
                                           target_delta, tolerance)
        for m in group:
            values[m] = min(weights[m] * scale, REGISTRY[m].max_scale)
    rows = []
    for m in mechanisms:
        group_weight = sum(weights[g] for g in mechanisms if RUN_MECHANISMS[g] == RUN_MECHANISMS[m])
        alone = totals[RUN_MECHANISMS[m]] if weights[m] == group_weight else planned_epsilon(
            event(m, values[m]), counts[m], target_delta)  # alone in its group: its total
        noised = REGISTRY[m].parameter == "noise_multiplier"
        rows.append(MechanismPlan(
            m, 1.0 / values[m] if noised else values[m], counts[m],
            weights[m] / group_weight, alone, RUN_MECHANISMS[m]))
    result = RunPlan(tuple(rows), totals, target_epsilon, target_delta, assumption,
                     num_classes, num_coordinates)
    if warn:
        sampled = (max_rounds_per_client is None and clients_per_round is not None
                   and num_clients is not None and clients_per_round < num_clients)
        _warn_too_small(result, num_classes, k, sampled)
    return result


def _calibrate(group, weights, counts, event, target, delta, tolerance):
    """The largest common scale s whose group composes to at most ``target``, and its eps.

    Every returned scale was composed and found at or below ``target``; the
    search only chooses which scales to compose. Each composition is a PLD
    (the costly part), so the bracket is closed by interpolation: the
    composition is smooth and increasing in s, and a probe just past the
    interpolated crossing, on the side that did not move last, usually
    closes it to ``step`` in two or three compositions (bisection where the
    interpolation stalls).
    """
    # the report composes the same events in its own order: its float sum may differ
    # in the last digits, so the search keeps a hair below the target
    limit = target * (1 - 1e-9)
    cache = {}

    def composed(s):
        return _group_event([(event(m, min(weights[m] * s, REGISTRY[m].max_scale)), counts[m])
                             for m in group])

    def spent(s):
        if s not in cache:
            cache[s] = planned_epsilon(composed(s), 1, delta)
        return cache[s]

    top = max(REGISTRY[m].max_scale / weights[m] for m in group)
    floor = max(_MIN_EPS / weights[m] for m in group)  # every mechanism at >= _MIN_EPS
    # Bracket from a guess linear in s: basic composition of the releases' pure
    # eps, or advanced composition's leading term where smaller (many releases:
    # a Laplace evaluation's rows); for the Gaussian upload the classic
    # sqrt(2 ln(1.25 / delta)) / sigma of its composed noise. At its target the
    # group spends about the target. Then grow (`grown`) or halve: large scales
    # make large PLDs.
    per_scale = sum(
        pure_epsilon(event(m, weights[m])) * min(counts[m], _advanced(counts[m], delta))
        if REGISTRY[m].parameter == "eps"
        else 2 * weights[m] * math.sqrt(2 * counts[m] * math.log(1.25 / delta)) for m in group)
    low = min(top, max(floor, target / per_scale))
    def grown(s):  # past the crossing if eps is about linear in s; at most doubled
        return min(top, s * min(2.0, 1.25 * limit / max(spent(s), limit / 2)))

    if spent(low) <= limit:
        high = grown(low)
        while high < top and spent(high) <= limit:
            low, high = high, grown(high)
        if high == top and spent(top) <= limit:
            return top, spent(top)
    else:
        high = low
        while low > floor and spent(low) > limit:
            high, low = low, max(low / 2, floor)
        if spent(low) > limit:
            raise ValueError(
                f"the target eps {target:g} cannot be met by {group} with `weights` "
                f"{ {m: weights[m] for m in group} }: where every per-release eps is at least "
                f"{_MIN_EPS:g} (a smaller one learns nothing) the group spends "
                f"{spent(low):.4g}. Raise the smallest weights, the target, or plan fewer "
                f"releases.")
    step = tolerance / max(weights[m] for m in group)
    nudge, last_half, misses = 0.0, high - low, 0
    while high - low > step:
        if misses >= 2:  # the interpolation stalls: bisect
            probe = (low + high) / 2
        else:  # eps grows about as a power of s: interpolate in log-log, aim past the crossing
            guess = low + (high - low) * (limit - spent(low)) / (spent(high) - spent(low))
            if spent(low) > 0:
                guess = low * (high / low) ** (math.log(limit / spent(low))
                                               / math.log(spent(high) / spent(low)))
            probe = min(max(guess + nudge, low + step / 4), high - step / 4)
        if spent(probe) <= limit:
            low, nudge = probe, step / 2  # next aim above: close the bracket from both ends
        else:
            high, nudge = probe, -step / 2
        if high - low <= last_half / 2:
            last_half, misses = high - low, 0
        else:
            misses += 1
    return low, spent(low)


def _advanced(count, delta):
    """``sqrt(2 n ln(1 / delta))``: n small-eps pure releases compose to about this many eps
    (advanced composition's leading term; many releases, e.g. a Laplace evaluation's rows).
    ``ln(1 / delta)`` is taken as at least 1: a starting guess only, never 0 (``delta`` = 1)."""
    return math.sqrt(2 * count * max(math.log(1 / delta), 1.0))


def too_small_to_learn(mechanism: str, eps: float, *, num_classes: int = 2, k: float = 0.2
                       ) -> str | None:
    """Why a per-release ``eps`` is too small to learn, or None (see `TOO_SMALL_SIGNAL`).

    Args:
        mechanism: a mechanism's name (only those in `TOO_SMALL_SIGNAL` can be
            too small; None for the others).
        eps: its per-release eps.
        num_classes: K for ``"label_dp"``.
        k: SignDS's top-k fraction.

    Returns:
        A sentence naming the signal and the threshold, or None.
    """
    if mechanism not in REGISTRY:
        return None
    return REGISTRY[mechanism].too_small_to_learn(eps, num_classes=num_classes, k=k)


def _warn_too_small(result, num_classes, k, sampled=False):
    for m in result.mechanisms:
        why = too_small_to_learn(m.mechanism, m.value, num_classes=num_classes, k=k)
        if why is None:
            continue
        weight = f" or give {m.mechanism!r} a larger weight" if m.share < 1 else ""
        if sampled and m.protects == CLIENT_DATA:
            weight += (" (the plan counts every round for the busiest client: a smaller "
                       "`max_rounds_per_client` is an assumption PlanCheck enforces)")
        warnings.warn(TooSmallToLearnWarning(
            f"{why} Raise the target, plan fewer releases (rounds, epochs){weight}."),
            stacklevel=3)
