"""The release ledger: what a protection released, under which DpEvent, about whom.

Every protection in this package (the layers, the SignDS encoder, the
upload schemes, MagRR, the Laplace evaluation, `VerticalModel` and
`HorizontalFL` for what they send without a mechanism) records each release
at the moment it happens, and answers ``privacy_ledger()`` with a
`ReleaseLedger`. `keras_fedpriv.privacy.privacy_report` composes ledgers; it
never counts epochs, layers or rounds itself.

A release is about a **unit**: ``"example"`` (one training example, named by
its example id) or ``"client"`` (one horizontal-FL client, named by its
index). A release whose unit is not known (a layer called without
``example_ids``, a client that is "this process") is recorded as a release
about *every* unit of that kind: an upper bound that is exact when every unit
takes part in every call.

The figure a report gives is the worst case over units: the eps of the unit
whose releases compose to the largest eps (the example released most, the
busiest client). Releases of the two unit kinds are composed together, as if
the busiest example belonged to the busiest client (the guarantee for one
example of that client).

This module is pure bookkeeping on DpEvents (dp-accounting's data model); it
knows nothing about Keras or transport.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import numbers
from typing import Any, Iterable, Mapping

import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

# the units and secrets, defined with the mechanisms that release about them
from keras_fedpriv.mechanisms.units import (
    CLIENT,
    CLIENT_DATA,
    EXAMPLE,
    FEATURES,
    LABELS,
    SECRETS,
    UNITS,
)

__all__ = ["CLIENT", "CLIENT_DATA", "EXAMPLE", "FEATURES", "LABELS", "SECRETS", "UNITS",
           "ReleaseKind", "ReleaseLedger", "holds_protections", "is_protection",
           "non_private_event", "register_protection"]


def non_private_event() -> dp_accounting.NonPrivateDpEvent:
    """The event of a release with no DP guarantee (makes every composition inf)."""
    return dp_accounting.NonPrivateDpEvent()


def is_protection(obj: Any) -> bool:
    """Whether ``obj`` keeps its own record of releases (has ``privacy_ledger()``)."""
    return callable(getattr(obj, "privacy_ledger", None))


def holds_protections(obj: Any) -> bool:
    """Whether ``obj`` lists protections it holds (has ``privacy_protections()``)."""
    return callable(getattr(obj, "privacy_protections", None))


def register_protection(model: Any, protection: Any) -> None:
    """Remember that ``protection`` released something about ``model``'s training data.

    Callbacks (`MagRR`, `LaplaceEvaluation`, `SignDSRounds`) and drivers
    (`HorizontalFL`) call it, so that ``privacy_report(model)`` and
    ``privacy_report(history)`` find them. Idempotent.
    """
    registered = model.__dict__.get("_fedpriv_protections")
    if registered is None:
        registered = []
        object.__setattr__(model, "_fedpriv_protections", registered)
    if not any(p is protection for p in registered):
        registered.append(protection)


@dataclasses.dataclass(frozen=True, eq=False)
class ReleaseKind:
    """What one release is.

    Attributes:
        mechanism: who released, e.g. ``"LabelDPLayer 'label_dp'"``.
        protects: the secret the release is about: ``"labels"``, ``"features"``
            or ``"client data"`` (`SECRETS`).
        unit: ``"example"`` or ``"client"``.
        event: the `dp_accounting.DpEvent` of ONE release about ONE unit.
        note: how releases of this kind are counted (shown in reports).
    """

    mechanism: str
    protects: str
    unit: str
    event: dp_accounting.DpEvent
    note: str = ""

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"`unit` must be one of {UNITS}; got {self.unit!r}.")
        if self.protects not in SECRETS:
            raise ValueError(f"`protects` must be one of {SECRETS}; got {self.protects!r}.")

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """A hashable identity (DpEvents holding lists are not hashable)."""
        return (self.mechanism, self.protects, self.unit, repr(self.event), self.note)


class ReleaseLedger:
    """Per-unit counts of releases, one column per `ReleaseKind`.

    ``record(kind, units)`` adds one release of ``kind`` about each unit in
    ``units`` (ids, repeated ids count repeatedly), or about every unit when
    ``units`` is None. Ledgers of several protections merge with `merged`.

    Example:
        >>> ledger = ReleaseLedger()
        >>> kind = ReleaseKind("SignDS", "client data", "client", event)
        >>> ledger.record(kind, units=[3, 7])
        >>> ledger.worst_counts()
    """

    def __init__(self) -> None:
        self._kinds = []            # ReleaseKind, in order of first record
        self._index = {}            # kind -> column
        self._per_unit = {u: collections.defaultdict(collections.Counter) for u in UNITS}
        self._everyone = collections.Counter()  # column -> releases about every unit
        self._approximate = set()   # columns whose per-unit counts are upper bounds

    # -- recording -------------------------------------------------------------------
    def _column(self, kind):
        if not isinstance(kind, ReleaseKind):
            raise TypeError(f"`kind` must be a ReleaseKind; got {type(kind).__name__}.")
        if kind.key not in self._index:
            self._index[kind.key] = len(self._kinds)
            self._kinds.append(kind)
        return self._index[kind.key]

    def record(self, kind: ReleaseKind, units: ArrayLike | None = None, count: int = 1) -> None:
        """Record ``count`` releases of ``kind`` about each of ``units`` (None: every unit)."""
        col = self._column(kind)
        count = int(count)
        if count < 0:
            raise ValueError(f"`count` must be >= 0; got {count}.")
        if count == 0:
            return
        if units is None:
            self._everyone[col] += count
            return
        table = self._per_unit[kind.unit][col]
        for u in np.asarray(units).reshape(-1).tolist():
            table[int(u)] += count

    def record_counts(self, kind: ReleaseKind, ids: ArrayLike, counts: ArrayLike,
                      approximate: bool = False) -> None:
        """Record ``counts[i]`` releases of ``kind`` about unit ``ids[i]`` (vectorized)."""
        col = self._column(kind)
        table = self._per_unit[kind.unit][col]
        for u, c in zip(np.asarray(ids).reshape(-1).tolist(),
                        np.asarray(counts).reshape(-1).tolist()):
            if c:
                table[int(u)] += int(c)
        if approximate:
            self._approximate.add(col)

    def merge(self, other: ReleaseLedger) -> ReleaseLedger:
        """Add every record of ``other`` to this ledger (in place); return self."""
        for kind in other._kinds:
            src = other._index[kind.key]
            col = self._column(kind)
            self._everyone[col] += other._everyone[src]
            table = self._per_unit[kind.unit][col]
            for u, c in other._per_unit[kind.unit][src].items():
                table[u] += c
            if src in other._approximate:
                self._approximate.add(col)
        return self

    def covers(self, other: ReleaseLedger) -> bool:
        """Whether this ledger holds at least every record of ``other``: each of its kinds,
        with no fewer releases about every unit and about every unit at once (what a restore
        must hold, so that it never rewinds a report).

        Example: ``ReleaseLedger().covers(ReleaseLedger())`` is True.
        """
        for kind in other._kinds:
            src = other._index[kind.key]
            if kind.key not in self._index:
                if other._everyone[src] or other._per_unit[kind.unit][src]:
                    return False
                continue
            col = self._index[kind.key]
            if self._everyone[col] < other._everyone[src]:
                return False
            mine = self._per_unit[kind.unit][col]
            if any(mine.get(u, 0) < c for u, c in other._per_unit[kind.unit][src].items()):
                return False
        return True

    def only(self, protects: str) -> ReleaseLedger:
        """A copy holding only the releases about ``protects`` (one of `SECRETS`)."""
        if protects not in SECRETS:
            raise ValueError(f"`protects` must be one of {SECRETS}; got {protects!r}.")
        out = ReleaseLedger()
        for kind in self._kinds:
            if kind.protects == protects:
                src = self._index[kind.key]
                col = out._column(kind)
                out._everyone[col] = self._everyone[src]
                out._per_unit[kind.unit][col] = collections.Counter(
                    self._per_unit[kind.unit][src])
                if src in self._approximate:
                    out._approximate.add(col)
        return out

    # -- checkpoints -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe copy of every record (for a protection's ``state_dict``)."""
        kinds = []
        for kind in self._kinds:
            col = self._index[kind.key]
            kinds.append({
                "mechanism": kind.mechanism, "protects": kind.protects, "unit": kind.unit,
                "note": kind.note, "event": _event_to_dict(kind.event),
                "everyone": int(self._everyone[col]),
                "units": {str(u): int(c) for u, c in self._per_unit[kind.unit][col].items()},
                "approximate": col in self._approximate})
        return {"kinds": kinds}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ReleaseLedger:
        """The ledger saved by `to_dict`."""
        if not isinstance(state, dict) or not isinstance(state.get("kinds"), list):
            raise ValueError("a ledger state must be a dict from ReleaseLedger.to_dict(); got "
                             f"{type(state).__name__}.")
        out = cls()
        for item in state["kinds"]:
            if not isinstance(item, dict) or not isinstance(item.get("units", {}), dict):
                raise ValueError("a ledger state's kinds must be dicts from "
                                 "ReleaseLedger.to_dict().")
            kind = ReleaseKind(item["mechanism"], item["protects"], item["unit"],
                               _event_from_dict(item["event"]), item.get("note", ""))
            out.record(kind, units=None, count=_count(item.get("everyone", 0)))
            units = item.get("units", {})
            out.record_counts(kind, [_unit_id(u) for u in units],
                              [_count(c) for c in units.values()],
                              approximate=bool(item.get("approximate", False)))
        return out

    @classmethod
    def merged(cls, ledgers: Iterable[ReleaseLedger]) -> ReleaseLedger:
        """One ledger holding the records of all ``ledgers``."""
        out = cls()
        for ledger in ledgers:
            out.merge(ledger)
        return out

    # -- reading ---------------------------------------------------------------------
    @property
    def kinds(self) -> list[ReleaseKind]:
        """The recorded `ReleaseKind`\\ s, in order of first record."""
        return list(self._kinds)

    def __len__(self) -> int:
        return sum(self.total(k) > 0 for k in self._kinds)

    def is_approximate(self, kind: ReleaseKind) -> bool:
        """Whether the per-unit counts of ``kind`` are upper bounds (ids folded)."""
        return self._index[kind.key] in self._approximate

    def units_seen(self, kind: ReleaseKind) -> int:
        """How many distinct units have named releases of ``kind``."""
        return len(self._per_unit[kind.unit][self._index[kind.key]])

    def total(self, kind: ReleaseKind) -> int:
        """Anonymous releases + the largest named count of ``kind`` (its busiest unit)."""
        col = self._index[kind.key]
        named = self._per_unit[kind.unit][col]
        return self._everyone[col] + (max(named.values()) if named else 0)

    def unit_profiles(self, unit: str) -> tuple[list[ReleaseKind], list[tuple[int, ...]]]:
        """Distinct count vectors (one entry per kind of ``unit``) of that unit kind's units.

        Returns ``(kinds, profiles)``: the kinds about ``unit`` and a list of
        count tuples, one per group of units with the same counts (anonymous
        releases added to every unit; dominated profiles removed). With
        anonymous releases only, a single profile.
        """
        kinds = [k for k in self._kinds if k.unit == unit]
        if not kinds:
            return [], []
        cols = [self._index[k.key] for k in kinds]
        base = np.array([self._everyone[c] for c in cols], np.int64)
        ids = set()
        for c in cols:
            ids.update(self._per_unit[unit][c])
        if not ids:
            return kinds, [tuple(int(v) for v in base)]
        ids = sorted(ids)
        matrix = np.zeros((len(ids), len(cols)), np.int64)
        position = {u: i for i, u in enumerate(ids)}
        for j, c in enumerate(cols):
            for u, n in self._per_unit[unit][c].items():
                matrix[position[u], j] = n
        matrix += base
        rows = np.unique(matrix, axis=0)
        keep = [r for r in rows
                if not any(np.all(o >= r) and np.any(o > r) for o in rows)]
        return kinds, [tuple(int(v) for v in r) for r in keep]


_EVENTS = {
    "randomized_response": (dp_accounting.RandomizedResponseDpEvent,
                            ("noise_parameter", "num_buckets")),
    "gaussian": (dp_accounting.GaussianDpEvent, ("noise_multiplier",)),
    "laplace": (dp_accounting.LaplaceDpEvent, ("noise_multiplier",)),
    "discrete_laplace": (dp_accounting.dp_event.DiscreteLaplaceDpEvent,
                         ("noise_parameter", "sensitivity")),
}


def _event_to_dict(event):
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return {"type": "non_private"}
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return {"type": "no_op"}
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return {"type": "composed", "events": [_event_to_dict(e) for e in event.events]}
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return {"type": "self_composed", "event": _event_to_dict(event.event),
                "count": int(event.count)}
    for name, (cls, fields) in _EVENTS.items():
        if isinstance(event, cls):
            return {"type": name, **{f: getattr(event, f) for f in fields}}
    raise ValueError(f"cannot save the DpEvent {event!r} in a ledger state.")


# A saved ledger is read strictly: a count that is negative or not an integer, or an event
# parameter out of its range, would make a restored ledger count less than was released.
def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError("a count in a ledger state must be an integer >= 0.")
    return int(value)


def _unit_id(value: Any) -> int:
    text = str(value)
    if isinstance(value, bool) or not text.isascii() or not text.isdigit():
        raise ValueError("a unit id in a ledger state must be an integer >= 0.")
    return int(text)


def _parameter(value: Any, low: float, high: float = math.inf, low_open: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError("an event parameter in a ledger state must be a finite number.")
    if value > high or value < low or (low_open and value == low):
        raise ValueError("an event parameter in a ledger state is out of range.")
    return value


_EVENT_FIELDS = {"non_private": (), "no_op": (), "composed": ("events",),
                 "self_composed": ("event", "count"),
                 **{name: fields for name, (_, fields) in _EVENTS.items()}}


def _event_from_dict(data):
    kind = data.get("type") if isinstance(data, dict) else None
    fields = _EVENT_FIELDS.get(kind)
    if fields is None or set(data) != {"type", *fields}:
        raise ValueError(f"unknown or malformed DpEvent {kind!r} in a ledger state.")
    if kind == "non_private":
        return dp_accounting.NonPrivateDpEvent()
    if kind == "no_op":
        return dp_accounting.NoOpDpEvent()
    if kind == "composed":
        if not isinstance(data["events"], list):
            raise ValueError("a composed DpEvent in a ledger state lists its events.")
        return dp_accounting.ComposedDpEvent([_event_from_dict(e) for e in data["events"]])
    if kind == "self_composed":
        return dp_accounting.SelfComposedDpEvent(_event_from_dict(data["event"]),
                                                 _count(data["count"]))
    if kind == "randomized_response":
        _parameter(data["noise_parameter"], 0.0, 1.0)
        if _count(data["num_buckets"]) < 2:
            raise ValueError("randomized response in a ledger state needs >= 2 buckets.")
    elif kind in ("gaussian", "laplace"):
        _parameter(data["noise_multiplier"], 0.0, low_open=True)
    else:  # discrete_laplace
        _parameter(data["noise_parameter"], 0.0, low_open=True)
        if _count(data["sensitivity"]) < 1:
            raise ValueError("a discrete Laplace sensitivity in a ledger state must be >= 1.")
    cls, fields = _EVENTS[kind]
    return cls(**{f: data[f] for f in fields})
