"""Privacy reports: compose the release ledgers of a run with dp-accounting.

`privacy_report(obj)` accepts anything that leads to protections: a Keras
model (its layers, its optimizer and the protections registered on it by the
callbacks and drivers that trained it), a Keras `History`, an optimizer, a
`HorizontalFL` run, a protection itself (a layer, an upload scheme, a
`SignDSEncoder`, `MagRR`, `LaplaceEvaluation`), or a list of these. Every
protection is found once, however many paths lead to it, so the model, its
History, its optimizer and the run give the same figure for the same run.

The report composes what the protections **recorded** (their
``privacy_ledger()``; see `keras_fedpriv.mechanisms.ledger`): nothing is
inferred from epochs, rounds or layers. A second ``fit`` adds to it,
inference passes of an `EmbeddingDPLayer` are in it, and any release
without a DP guarantee makes the total ``inf``. So does finding no
protection at all (a plain Keras model, a wrong object): nothing found is
never "private".

The figure is the worst case over units (the example released most, the
busiest client): for each distinct per-unit profile of release counts the
events are composed with dp-accounting, and the largest eps is reported.

Accountants:

* ``"pld"`` (default, tight): `MixedPLDAccountant`, a dp-accounting
  `PrivacyAccountant` that builds each event's privacy loss distribution
  with the neighbouring relation the event is stated for (randomized
  response: replace one value; the Gaussian and Laplace events of this
  package already carry the replacement sensitivity) and composes them.
* ``"rdp"``: dp-accounting's `RdpAccountant` (``REPLACE_ONE``), which
  supports randomized response, Gaussian and Laplace events exactly. A pure
  eps-DP event it does not support (discrete Laplace) enters as binary
  randomized response at that eps, which dominates every eps-DP mechanism
  (Kairouz, Oh, Viswanath 2015), and the report says so.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from typing import Any, Callable, Iterable

import dp_accounting
import keras

from keras_fedpriv.backend.private import flatten_layers
from keras_fedpriv.mechanisms.events import pure_dp_event, pure_epsilon
from keras_fedpriv.mechanisms.ledger import (
    CLIENT,
    EXAMPLE,
    SECRETS,
    ReleaseKind,
    ReleaseLedger,
    holds_protections,
    is_protection,
    non_private_event,
    register_protection,
)
from keras_fedpriv.mechanisms.validation import validate_eps
from keras_fedpriv.privacy.accountant import MixedPLDAccountant
from keras_fedpriv.text_table import text_table

__all__ = ["CentralRelease", "EpsilonLogger", "PrivacyReport", "Release", "compose_epsilon",
           "find_protections", "privacy_ledger", "privacy_report",
           "pure_epsilon", "register_central_reader", "register_protection"]

_VDI = 1e-4
ACCOUNTANTS = ("pld", "rdp")
NeighborRel = dp_accounting.NeighboringRelation


# ------------------------------------------------------------------ events
def _flatten(event, count=1, out=None):
    """Counter of base events with their multiplicities."""
    out = collections.Counter() if out is None else out
    if isinstance(event, dp_accounting.ComposedDpEvent):
        for e in event.events:
            _flatten(e, count, out)
    elif isinstance(event, dp_accounting.SelfComposedDpEvent):
        _flatten(event.event, count * event.count, out)
    elif isinstance(event, dp_accounting.NoOpDpEvent):
        pass
    else:
        out[event] += count
    return out


def _non_private(counter):
    return any(pure_epsilon(e) == math.inf for e in counter)


def _check_accountant(accountant):
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"`accountant` must be one of {ACCOUNTANTS}; got {accountant!r}.")
    return accountant


def _check_protects(protects):
    if protects is not None and protects not in SECRETS:
        raise ValueError(f"`protects` must be None (every release) or one of {SECRETS}; got "
                         f"{protects!r}.")
    return protects


def _rdp_event(event):
    """(event the RDP accountant composes, note or None)."""
    if dp_accounting.rdp.RdpAccountant(neighboring_relation=NeighborRel.REPLACE_ONE).supports(
            event):
        return event, None
    eps = pure_epsilon(event)
    if eps is None:
        raise ValueError(f"privacy_report: the RDP accountant cannot take {event!r}.")
    return (pure_dp_event(eps),
            f"{type(event).__name__} entered the RDP accountant as binary randomized response "
            f"at its eps {eps:.4g} (dominates every eps-DP mechanism)")


def compose_epsilon(events_with_counts: Iterable[tuple[dp_accounting.DpEvent, int]],
                    delta: float, accountant: str = "pld") -> float:
    """eps at ``delta`` of the composition of ``[(event, count), ...]``.

    Returns ``inf`` if any event is not private (`NonPrivateDpEvent`, or
    randomized response that never randomizes).
    """
    _check_accountant(accountant)
    counter = collections.Counter()
    for event, count in events_with_counts:
        _flatten(event, count, counter)
    counter = collections.Counter({e: c for e, c in counter.items() if c > 0})
    if not counter:
        return 0.0
    if _non_private(counter):
        return math.inf
    if accountant == "pld":
        acc = MixedPLDAccountant(_VDI)
        for event, count in counter.items():
            if not acc.supports(event):
                raise ValueError(f"privacy_report: cannot account for {event!r} (supported: "
                                 "randomized response, Gaussian, Laplace, discrete Laplace and "
                                 "their compositions).")
            acc.compose(event, int(count))
        return acc.get_epsilon(delta)
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=NeighborRel.REPLACE_ONE)
    for event, count in counter.items():
        acc.compose(_rdp_event(event)[0], int(count))
    return float(acc.get_epsilon(delta))


# ------------------------------------------------------------ protections
def _children(obj):
    """Objects reachable from ``obj`` that may be or hold protections."""
    if isinstance(obj, keras.callbacks.History):
        return [obj.model] if obj.model is not None else []
    out = []
    if holds_protections(obj):
        out += list(obj.privacy_protections())
    if isinstance(obj, keras.layers.Layer):
        out += list(flatten_layers(obj, include_self=False))
        if isinstance(obj, keras.Model) and getattr(obj, "optimizer", None) is not None:
            out.append(obj.optimizer)
        out += list(obj.__dict__.get("_fedpriv_protections", []))
    inner = getattr(obj, "inner_optimizer", None)  # LossScaleOptimizer and SignDS
    if inner is not None:
        out.append(inner)
    return out


def find_protections(obj: Any) -> list[Any]:
    """Every protection (an object with ``privacy_ledger()``) reachable from ``obj``, once each."""
    found, seen, stack = [], set(), list(obj) if isinstance(obj, (list, tuple)) else [obj]
    while stack:
        item = stack.pop(0)
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if is_protection(item):
            found.append(item)
        stack.extend(_children(item))
    return found


def _describe(obj):
    if isinstance(obj, keras.callbacks.History):
        return "a History" + ("" if obj.model is not None else " without a model")
    name = getattr(obj, "name", None)
    return f"{type(obj).__name__} {name!r}" if isinstance(name, str) else type(obj).__name__


def _nothing_found(objs):
    """The ledger of a search that found no protection: a release without DP of every secret.

    Whatever was passed was trained, evaluated or served without anything
    that records releases (or is not what the user meant to pass): nothing
    found is never "private".
    """
    searched = ", ".join(_describe(o) for o in objs if o is not None) or "nothing"
    ledger = ReleaseLedger()
    for secret in SECRETS:
        ledger.record(ReleaseKind(
            f"no protection found in {searched}", secret, EXAMPLE, non_private_event(),
            "nothing reachable from it records releases (searched its layers, optimizer and "
            "the callbacks and drivers registered on it): data used without a protection is "
            "released without DP. Pass the protected model, run or protection."), units=None)
    return ledger


def privacy_ledger(obj: Any) -> ReleaseLedger:
    """The merged `ReleaseLedger` of every protection reachable from ``obj``.

    If no protection is reachable at all, the ledger holds one release
    without DP of every secret (its composed eps is ``inf``): a model
    without protections is not private, and neither is a wrong object.
    """
    found = find_protections(obj)
    if not found:
        return _nothing_found(list(obj) if isinstance(obj, (list, tuple)) else [obj])
    return ReleaseLedger.merged(p.privacy_ledger() for p in found)


# ------------------------------------------------------------- central DP
_RELATIONS = {"add-or-remove-one": NeighborRel.ADD_OR_REMOVE_ONE,
              "replace-one": NeighborRel.REPLACE_ONE}


@dataclasses.dataclass
class CentralRelease:
    """Central DP on a released aggregate (e.g. `CentralDP`'s): another threat model.

    The local releases of a report are what the server receives about each
    client; a central release is the noised aggregate (the model) that
    everyone downstream sees, and its guarantee trusts the server, which saw
    the uploads. The two are shown side by side and never composed together.

    Attributes:
        mechanism: who released, e.g. a strategy with central DP.
        events: ``[(dp_accounting event, count), ...]`` as the central
            accountant defines them (per round: Gaussian, or Poisson-sampled /
            sampled-without-replacement Gaussian).
        neighboring: ``"add-or-remove-one"`` or ``"replace-one"`` (user level).
        orders: the RDP orders to compose at (None: dp-accounting's default).
        note: how the releases were counted.
    """

    mechanism: str
    events: list[tuple[dp_accounting.DpEvent, int]]
    neighboring: str = "add-or-remove-one"
    orders: tuple[float, ...] | None = None
    note: str = ""

    @property
    def releases(self) -> int:
        """The number of central releases recorded."""
        return int(sum(c for _, c in self.events))

    def epsilon(self, delta: float) -> float:
        """eps at ``delta``: the events composed with dp-accounting's RDP accountant (as Flower's).

        Args:
            delta: the delta of the (eps, delta).

        Returns:
            The composed eps (0.0 if nothing was released).
        """
        if not self.releases:
            return 0.0
        acc = dp_accounting.rdp.RdpAccountant(
            orders=list(self.orders) if self.orders else None,
            neighboring_relation=_RELATIONS[self.neighboring])
        for event, count in self.events:
            if count:
                acc.compose(event, int(count))
        return float(acc.get_epsilon(delta))


#: runtime -> the reader of that runtime's central-DP accountant, registered by the runtime's
#: adapter when it is imported (this module knows no runtime's format)
_CENTRAL_READERS: dict[str, Callable[[Any], CentralRelease]] = {}


def register_central_reader(runtime: str, reader: Callable[[Any], CentralRelease]) -> None:
    """Let `privacy_report` read ``runtime``'s central-DP accountant with ``reader``.

    The Flower adapter (`keras_fedpriv.federated.flower.central_dp`) registers
    ``"flower"`` with its ``flower_central_release`` when it is imported;
    `privacy_report`'s ``flower_accountant`` is read by it.

    Args:
        runtime: the runtime's name, e.g. ``"flower"``.
        reader: ``reader(accountant_or_state) -> CentralRelease``.

    Example:
        >>> register_central_reader("flower", flower_central_release)
    """
    if not callable(reader):
        raise TypeError(f"`reader` must be callable; got {type(reader).__name__}.")
    _CENTRAL_READERS[str(runtime)] = reader


def _read_central(runtime: str, accountant: Any, argument: str) -> CentralRelease:
    reader = _CENTRAL_READERS.get(runtime)
    if reader is None:
        raise ValueError(f"`{argument}` is read by keras-fedpriv's {runtime} adapter, which "
                         "registers its reader when imported: import "
                         f"keras_fedpriv.federated.{runtime}.central_dp first (it needs "
                         f"{runtime}).")
    return reader(accountant)


# ------------------------------------------------------------------ report
@dataclasses.dataclass
class Release:
    """One row of a report: one kind of release and how often the busiest unit got it.

    Attributes:
        mechanism: who released, e.g. ``"LabelDPLayer 'label_dp'"``.
        protects: what the release is about.
        unit: ``"example"`` or ``"client"``.
        event: the `dp_accounting` event of one release about one unit.
        count: releases of this kind about the unit that got the most.
        note: how releases of this kind are counted.
    """

    mechanism: str
    protects: str
    unit: str
    event: dp_accounting.DpEvent
    count: int
    note: str = ""


@dataclasses.dataclass
class PrivacyReport:
    """What was released, per kind of release and composed for the worst unit.

    Attributes:
        ledger: the merged `ReleaseLedger`: the local releases (what the
            server, or whoever receives the messages, sees).
        delta: the delta of every composed eps.
        accountant: ``"pld"`` or ``"rdp"``.
        central: central DP on released aggregates (`CentralRelease`), a
            different threat model: shown beside the local figure
            (`central_epsilon`), never composed into `epsilon`.
    """

    ledger: ReleaseLedger
    delta: float
    accountant: str = "pld"
    central: list[CentralRelease] = dataclasses.field(default_factory=list)

    @property
    def central_epsilon(self) -> float | None:
        """The central guarantee's eps at ``delta`` (None if no central release is recorded).

        Against everyone who sees the released model; it trusts the server.
        Several central records compose by basic composition (each at
        ``delta / count``), which never understates.
        """
        if not self.central:
            return None
        share = self.delta / len(self.central)
        return float(sum(c.epsilon(share) for c in self.central))

    @property
    def releases(self) -> list[Release]:
        """The rows (`Release`), one per kind of release recorded."""
        return [Release(k.mechanism, k.protects, k.unit, k.event, self.ledger.total(k),
                        k.note + (" (per-example counts are upper bounds: ids outside the "
                                  "counted range were folded)" if self.ledger.is_approximate(k)
                                  else ""))
                for k in self.ledger.kinds if self.ledger.total(k) > 0]

    def per_release_epsilon(self, row: Release) -> float:
        """eps of one release of ``row`` (at ``delta`` for Gaussian events)."""
        return compose_epsilon([(row.event, 1)], self.delta, self.accountant)

    def row_epsilon(self, row: Release) -> float:
        """eps of all ``row.count`` releases of ``row``, composed."""
        return compose_epsilon([(row.event, row.count)], self.delta, self.accountant)

    @property
    def epsilon(self) -> float:
        """eps of the worst unit: every release about it, composed (``inf`` if not private)."""
        per_unit = [self.ledger.unit_profiles(u) for u in (EXAMPLE, CLIENT)]
        choices = [[list(zip(kinds, p)) for p in profiles] or [[]]
                   for kinds, profiles in per_unit]
        worst = 0.0
        for combo in itertools.product(*choices):
            events = [(k.event, c) for part in combo for k, c in part]
            worst = max(worst, compose_epsilon(events, self.delta, self.accountant))
            if math.isinf(worst):
                break
        return worst

    @property
    def private(self) -> bool:
        """False if any recorded release had no DP guarantee."""
        return not math.isinf(self.epsilon)

    def units(self) -> list[str]:
        """The units the report is about (``"example"``, ``"client"``)."""
        return sorted({k.unit for k in self.ledger.kinds})

    def notes(self) -> list[str]:
        """How each figure was obtained (accountant conversions, bounds)."""
        out = []
        if self.accountant == "rdp":
            for row in self.releases:
                for event in _flatten(row.event):
                    try:
                        note = _rdp_event(event)[1]
                    except ValueError:
                        note = None
                    if note and note not in out:
                        out.append(note)
        return out

    def rows(self) -> list[dict[str, Any]]:
        """The table as a list of dicts."""
        return [dict(mechanism=r.mechanism, protects=r.protects, unit=r.unit,
                     eps_per_release=self.per_release_epsilon(r), releases=r.count,
                     eps_composed=self.row_epsilon(r), note=r.note) for r in self.releases]

    def __str__(self) -> str:
        header = ("mechanism", "protects", "unit", "eps / release", "releases (busiest unit)",
                  f"composed eps (delta={self.delta:g})")
        cells = [(r["mechanism"], r["protects"], r["unit"], _fmt(r["eps_per_release"]),
                  str(r["releases"]), _fmt(r["eps_composed"])) for r in self.rows()]
        cells.append(("worst unit, all releases", "", "/".join(self.units()), "", "",
                      _fmt(self.epsilon)))
        lines = [text_table(header, cells),
                 f"Accountant: {self.accountant.upper()} (dp-accounting)."]
        lines += list(dict.fromkeys(f"- {r.mechanism}: {r.note}" for r in self.releases
                                    if r.note))  # one line per distinct note
        lines += [f"- {n}" for n in self.notes()]
        if self.central:
            lines.append(
                "Central DP (another threat model: the guarantee against everyone who sees the "
                "released model; it trusts the server, which receives the uploads above; not "
                f"composed with them): eps {_fmt(self.central_epsilon)} at delta={self.delta:g}.")
            lines += [f"- {c.mechanism}: {c.releases} noised aggregates, eps "
                      f"{_fmt(c.epsilon(self.delta / len(self.central)))}; {c.note}"
                      for c in self.central]
        return "\n".join(lines)


def _fmt(eps):
    return "inf (not private)" if math.isinf(eps) else f"{eps:.3g}"


def privacy_report(obj: Any, delta: float = 1e-5, accountant: str = "pld",
                   callbacks: Iterable[Any] = (), protects: str | None = None,
                   flower_accountant: Any = None) -> PrivacyReport:
    """Compose every release recorded by the protections reachable from ``obj``.

    Args:
        obj: a Keras model, a `History`, an optimizer, a `HorizontalFL`, a
            protection (layer, upload, encoder, callback), or a list of these.
        delta: the delta of the composed (eps, delta).
        accountant: ``"pld"`` (default; tight) or ``"rdp"``.
        callbacks: more objects to include (e.g. callbacks of a run that
            were not registered on the model); the same as adding them to
            ``obj``.
        protects: None (default: every release, composed as if one person
            were in every row) or one secret, ``"labels"``, ``"features"``
            or ``"client data"``: only the releases about it (e.g. the
            leader's labels, against the followers).
        flower_accountant: None, or Flower's ``PrivacyAccountant`` (or its
            ``state_dict()``) of the same run: its central releases are
            reported beside the local ones (``report.central_epsilon``), not
            composed with them; Flower's accountant is read by
            `keras_fedpriv.federated.flower.central_dp.flower_central_release`
            (imported with `keras_fedpriv.federated.flower`, which needs
            Flower; see `register_central_reader`). Pass the state after the run's last round
            (an earlier one under-counts). A strategy given
            `keras_fedpriv.federated.flower.central_dp.CentralDP` brings its
            own; the same accountant object passed again is counted once, its
            ``state_dict()`` twice (an over-count).

    Returns:
        A `PrivacyReport`; ``print(report)`` shows the table and
        ``report.epsilon`` the worst unit's composed eps.

    Example:
        >>> history = model.fit(x, y, epochs=5)
        >>> print(privacy_report(history, delta=1e-5))
    """
    delta = validate_eps(delta, "delta", upper=1.0)
    _check_accountant(accountant)
    _check_protects(protects)
    objs = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    objs += list(callbacks)
    if not objs or all(o is None for o in objs):
        raise TypeError("privacy_report: pass a Keras model, a History, an optimizer, a "
                        "HorizontalFL, a protection, or a list of these.")
    for o in objs:
        if not (isinstance(o, (keras.layers.Layer, keras.callbacks.Callback,
                               keras.optimizers.Optimizer))
                or is_protection(o) or holds_protections(o)):
            raise TypeError(f"privacy_report: cannot collect releases from "
                            f"{type(o).__name__}; pass a Keras model, a History, an optimizer, "
                            f"a HorizontalFL, a protection, or a list of these.")
    ledger = privacy_ledger(objs)
    if protects is not None:
        ledger = ledger.only(protects)
    central, seen = [], set()
    for o in objs:
        if callable(getattr(o, "central_privacy", None)):
            held = getattr(o, "accountant", None)
            seen.add(id(held) if held is not None else None)
            central += list(o.central_privacy())
    if flower_accountant is not None and id(flower_accountant) not in seen:
        central.append(_read_central("flower", flower_accountant, "flower_accountant"))
    return PrivacyReport(ledger, delta, accountant, central)


class EpsilonLogger(keras.callbacks.Callback):
    """Log the composed eps of the run so far into the training history every epoch / round.

    Adds ``epsilon`` (the worst unit's composed eps at ``delta``, from the
    release ledgers, `privacy_report`) to the logs. With ``model.fit`` it
    reports the model (its layers, optimizer and registered callbacks); with
    `HorizontalFL.fit` the run. Place it after the callbacks that release
    (e.g. `SignDSRounds`) so that the epoch's releases are in its figure.

    Args:
        delta: the delta of the reported (eps, delta).
        accountant: ``"pld"`` or ``"rdp"``.
        callbacks: other objects whose releases count (as in `privacy_report`).
        protects: None (all releases) or one secret (as in `privacy_report`).
    """

    def __init__(self, delta: float = 1e-5, accountant: str = "pld", callbacks: Iterable[Any] = (),
                 protects: str | None = None) -> None:
        super().__init__()
        self.delta = validate_eps(delta, "delta", upper=1.0)
        self.accountant = _check_accountant(accountant)
        self.callbacks = list(callbacks)
        self.protects = _check_protects(protects)
        self._fl = None
        self.last_report = None

    def on_federated_train_begin(self, fl: Any) -> None:
        self._fl = fl

    def _run(self) -> Any:
        """What is reported: the `HorizontalFL` run, else the model being fit."""
        return self._fl if self._fl is not None else self.model

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.last_report = privacy_report(self._run(), delta=self.delta,
                                          accountant=self.accountant, callbacks=self.callbacks,
                                          protects=self.protects)
        if logs is not None:
            logs["epsilon"] = self.last_report.epsilon
