"""In-graph release counting for the protection layers (their part of the release ledger).

A layer's releases happen inside ``model.fit``, ``tf.data`` maps, XLA
clusters and replicas, where no Python runs. So each protection layer keeps
its counts in two local variables (like its secret key: not Keras weights,
shared by all replicas, never mirrored):

* ``release_totals`` (int64, one slot per kind of call, see ``SLOTS``):
  the number of calls of each kind that released at least one row, the
  number of secret keys that made keyed releases (``key_generations``: a
  reloaded or restored unseeded layer has a fresh key, so its keyed noise is
  a new, independent release) and the largest row size released
  (``max_coordinates``), and the layer's ``lineage``: a random id drawn when
  the layer is built, saved with the counts (see "Restoring" below);
* ``release_id_counts`` (int32, ``id_capacity`` slots: 4 bytes per
  example id the layer can tell apart, created on the first call that has
  example ids and fresh noise on TensorFlow, with the layer on JAX): per
  example id, the number of fresh-noise releases about that example, exact
  for ids in ``[0, id_capacity)``. ``id_capacity`` is a constructor argument
  of the layers (default ``ID_CAPACITY`` = 2**20: 4 MiB; at most
  ``MAX_ID_CAPACITY`` = 2**28: 1 GiB; 10**8 ids take 400 MB). An id outside
  that range (negative, or ``>= id_capacity``) is folded onto slot
  ``id mod id_capacity`` and sets the ``folded`` slot; from then on the
  ledger no longer reports the layer per example but as the largest slot's
  count of releases of **every** example (`_record_fresh_releases`): a
  slot shared by several ids counts each of their releases, so that count
  bounds every example's, and recording it for every example keeps the
  bound safe when it is composed with other layers' per-example counts
  (which may fold differently, or not at all). Reports say the counts are
  upper bounds;
* ``release_id_max`` (int32, created with ``release_id_counts``): a running
  maximum of the per-id counts, updated by the same call from the counts of
  that call's ids only (no scan of the whole table). It never under-states
  what the layer's calls counted (a race between concurrent calls can only
  over-state it); counts put in place from the host catch up at once
  (``load_weights``, ``.keras`` files, `keras_fedpriv.layers.local_state`'s
  ``load_local_state`` and ``restore``), and a full read of the table (any
  ledger or report; `PlanCheck` makes one at the start of every fit) raises
  it to the table's maximum too.
  `PlanCheck` reads it after every batch to bound the per-example releases
  without reading the whole table (`busiest_bound`).

Counting is a few ``assign_add`` / ``scatter_add`` ops on the layer's own
variables: atomic under concurrent calls (the variable's lock), compiled by
XLA, and executed wherever the layer runs. ``privacy_ledger()`` (host side)
turns the counts into a `keras_fedpriv.mechanisms.ledger.ReleaseLedger`.

Restoring never rewinds. The counts travel with every saved form of the
layer (`.keras`, `.weights.h5`, `tf.train.Checkpoint`, SavedModel), and
every restore into a live layer (``load_weights``, ``Checkpoint.restore``)
takes, count by count, the larger of the live and the saved value, as it
does for the random counter: a file saved earlier by the same layer (same
lineage) changes nothing, and a new layer takes the saved counts. A layer
that has already released refuses counts saved by *another* layer (another
lineage) that released too: neither history may be dropped, and their sum
would double-count whatever they share, so the error says to load into a
freshly built model instead.
"""

from __future__ import annotations

import contextlib
import numbers
import secrets
import threading
from typing import Any, Iterator

import keras
import numpy as np
from keras import ops

from keras_fedpriv.backend import impl
from keras_fedpriv.layers import input_checks
from keras_fedpriv.layers.secret_rng import local_variable

__all__ = ["ID_CAPACITY", "MAX_ID_CAPACITY", "ReleaseCounterMixin", "SLOTS", "busiest_bound",
           "replay_scope", "validate_id_capacity"]

#: The default ``id_capacity``: per-id counts for ids in [0, 2**20) (4 MiB per layer).
ID_CAPACITY = 2 ** 20
#: The largest ``id_capacity`` a layer accepts (1 GiB of int32 counts per layer).
MAX_ID_CAPACITY = 2 ** 28

#: Slots of ``release_totals``.
SLOTS = ("fresh_with_ids", "fresh_without_ids", "keyed_once", "non_private", "prior",
         "folded", "key_generations", "max_coordinates", "lineage")
(FRESH_IDS, FRESH_ANON, ONCE, NON_PRIVATE, PRIOR, FOLDED, KEY_GENERATIONS,
 MAX_COORDINATES, LINEAGE) = range(len(SLOTS))
#: The slots that count releases (a layer with any of them nonzero has released).
_RELEASE_SLOTS = (FRESH_IDS, FRESH_ANON, ONCE, NON_PRIVATE, PRIOR, KEY_GENERATIONS)

_TOTALS = "release_totals"
_BOUND = threading.local()  # `busiest_bound` is active in this thread
_REPLAY = threading.local()  # `replay_scope` is active in this thread
_ID_SLOTS = "release_id_slots"
_ID_VALUES = "release_id_values"


def validate_id_capacity(value: Any) -> int:
    """``value`` as an int if it is a valid ``id_capacity``, else a TypeError / ValueError.

    The number of example ids a layer counts exactly (ids ``0 .. value - 1``),
    1 to `MAX_ID_CAPACITY`; the layer's per-id table takes 4 bytes per id.

    Example:
        >>> validate_id_capacity(10**8)   # 400 MB of counts per layer
        100000000
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`id_capacity` must be an integer in [1, {MAX_ID_CAPACITY}] (the number "
                        f"of example ids counted exactly); got {value!r} of type "
                        f"{type(value).__name__}.")
    if not 1 <= int(value) <= MAX_ID_CAPACITY:
        raise ValueError(f"`id_capacity` must be an integer in [1, {MAX_ID_CAPACITY}] (2**28: "
                         f"1 GiB of counts per layer); got {value!r}.")
    return int(value)


def _fold_counts(counts, ids, values):
    """``counts[ids mod capacity] = max(counts, values)`` in place (numpy, host side).

    Returns:
        Whether an id was outside ``[0, capacity)`` (folded onto another's slot).
    """
    ids = np.asarray(ids, np.int64).reshape(-1)
    np.maximum.at(counts, np.mod(ids, counts.size),
                  np.asarray(values, np.int64).reshape(-1).astype(counts.dtype))
    return bool(np.any((ids < 0) | (ids >= counts.size)))


def _new_lineage():
    """A random nonzero 62-bit id (OS entropy: no global seed makes two layers share one)."""
    return secrets.randbits(62) | 1


@contextlib.contextmanager
def _flag(state: threading.local) -> Iterator[None]:
    """Within it, ``state.active`` is True in this thread (restored after, so scopes nest)."""
    before = getattr(state, "active", False)
    state.active = True
    try:
        yield
    finally:
        state.active = before


@contextlib.contextmanager
def busiest_bound() -> Iterator[None]:
    """Within it (this thread), protection layers' ``privacy_ledger()`` bound per-example counts.

    Each layer records its per-example fresh releases as ``release_id_max()``
    releases of one example (example id 0) instead of reading its whole
    per-id table: every example's count is at most that, so a report of the
    bounded ledger is never below the exact one (several layers' bounds add
    up on that one example: their busiest examples may differ). For a single
    layer the bound is exact. Meant for cheap checks after every batch
    (`PlanCheck`); an exact report reads the table.

    Yields:
        None.
    """
    with _flag(_BOUND):
        yield


@contextlib.contextmanager
def replay_scope() -> Iterator[None]:
    """Within it (this thread), protection layers record no release (at tracing: a traced
    function built within never counts, wherever it is called later, so nothing traced
    within may be kept for a call that releases; the follower keeps its replay function
    apart from its forward one).

    Only for a pass that recomputes one already counted, with the same state
    and inputs: a vertical follower's replay of the forward pass it sent,
    to get its gradients. Without it the replay would count the batch's ids
    again, and undoing that would need a copy of the whole per-id table at
    every step.

    Example:
        >>> with replay_scope():
        ...     again = protection(z, training=True, example_ids=ids)  # counted before

    Yields:
        None.
    """
    with _flag(_REPLAY):
        yield


def _released(totals):
    return bool(np.any(np.asarray(totals)[list(_RELEASE_SLOTS)] != 0))


def _saved_totals(saved, owner):
    """``saved`` totals as int64 with every slot (lineage 0 = unknown, for files written
    before lineages existed); ValueError if malformed (wrong size, negative counts)."""
    saved = np.asarray(saved, np.int64).reshape(-1)
    if saved.size == len(SLOTS) + 1:  # a variable's JAX layout (a party's own state)
        saved = _totals_from_variable(saved)
    if saved.size == len(SLOTS) - 1:
        saved = np.concatenate([saved, [0]])
    if saved.size != len(SLOTS) or np.any(saved[:LINEAGE] < 0):
        raise ValueError(f"{owner}: the saved release counts are malformed (expected "
                         f"{len(SLOTS)} non-negative counts); nothing was loaded.")
    return saved


def merge_release_totals(live: Any, saved: Any, owner: str) -> np.ndarray:
    """The totals after restoring ``saved`` into a layer whose totals are ``live``.

    Elementwise maximum (restoring never rewinds), keeping the live lineage.

    Raises:
        ValueError: ``saved`` is malformed (wrong size, negative counts), or
            both the layer and the saved counts have released and the saved
            ones come from another layer (another lineage).
    """
    live = np.asarray(live, np.int64).reshape(-1)
    saved = _saved_totals(saved, owner)
    if _released(live) and _released(saved) and saved[LINEAGE] != live[LINEAGE]:
        raise ValueError(
            f"{owner} has already released, and the state being restored was saved by another "
            f"layer (another model or run) that released too. Loading it would drop one of the "
            f"two release histories from the privacy report (or double-count what they share). "
            f"Build a fresh model and load the file into it (keras.models.load_model, or a new "
            f"model + load_weights / Checkpoint.restore) instead.")
    merged = np.maximum(live, saved)
    merged[LINEAGE] = live[LINEAGE]
    return merged


def refuse_if_behind(live: Any, saved: Any, owner: str) -> None:
    """Raise unless loading the totals ``saved`` as they are keeps every count of ``live``.

    For state that is loaded by assignment (a party's own state, e.g. a
    vertical follower's `state_dict`): a layer that has released accepts
    only a state of its own lineage whose counts are all at least its own.

    Raises:
        ValueError: the state is behind the live layer, or from another one.
    """
    live = _totals_from_variable(live)
    saved = _saved_totals(saved, owner)
    if _released(live) and (saved[LINEAGE] != live[LINEAGE]
                            or np.any(saved[:LINEAGE] < live[:LINEAGE])):
        raise ValueError(
            f"{owner}: the state being loaded is behind this layer's releases (or was saved by "
            f"another layer). Loading it would rewind the release count and replay noise already "
            f"sent; load a state only into a new copy, or one that has released no more than "
            f"the state records.")


def _totals_to_variable(totals):
    """Host totals (int64, one per slot) in the variable's layout.

    With int64 in traced code (TensorFlow) the same array. On JAX (no int64
    without x64) int32 counts, and the 62-bit lineage in two 31-bit parts: the
    ``LINEAGE`` slot the low part, one more slot the high part.
    """
    totals = np.asarray(totals, np.int64).reshape(-1)
    if impl().COUNT_DTYPE == "int64":
        return totals
    if np.any(totals[:LINEAGE] > 2**31 - 1):
        raise ValueError("release counts beyond 2**31 - 1 cannot be kept on JAX (int32).")
    out = np.zeros(len(SLOTS) + 1, np.int32)
    out[:LINEAGE] = totals[:LINEAGE]
    out[LINEAGE] = totals[LINEAGE] & (2**31 - 1)
    out[LINEAGE + 1] = totals[LINEAGE] >> 31
    return out


def _totals_from_variable(raw):
    """Inverse of `_totals_to_variable`: int64, one per slot."""
    raw = np.asarray(raw).astype(np.int64).reshape(-1)
    if raw.size == len(SLOTS):
        return raw
    out = raw[:len(SLOTS)].copy()
    out[LINEAGE] = raw[LINEAGE] | (raw[LINEAGE + 1] << 31)
    return out


def _slot_update(variable, slot, amount):
    """A vector for ``variable`` (the totals) that adds ``amount`` to ``slot``."""
    one_hot = np.zeros(variable.shape, np.int64)
    one_hot[slot] = 1
    return ops.convert_to_tensor(one_hot, impl().COUNT_DTYPE) * ops.cast(
        amount, impl().COUNT_DTYPE)


class _KeyUse:
    """Holds the 'current key has released' flag (a plain object: never in a TensorFlow
    checkpoint; on JAX the layer also keeps the variable, so ``fit`` carries it)."""

    def __init__(self, owner):
        self.variable = local_variable(owner, np.int64(0), "key_used")

    def reset(self):
        self.variable.assign(np.zeros((), np.int64))


class ReleaseCounterMixin:
    """Mixin: count a layer's releases in graph-safe local variables."""

    def _init_release_counter(self, id_capacity=ID_CAPACITY):
        self.id_capacity = validate_id_capacity(id_capacity)
        totals = np.zeros(len(SLOTS), np.int64)
        totals[LINEAGE] = _new_lineage()
        owner = f"{type(self).__name__} {self.name!r}"
        self.release_totals = impl().release_totals_variable(
            self, _totals_to_variable(totals),
            lambda live, saved: merge_release_totals(live, saved, owner))
        self.release_totals.owner = owner
        self._release_id_counts = None
        self._release_id_max = None
        self._release_lock = threading.Lock()
        # Whether the current key has made keyed releases. Kept out of every
        # checkpoint (a holder object is not tracked): a restored layer has a
        # fresh key, whose first keyed release starts a new generation.
        self._key_use = _KeyUse(self)
        if impl().COUNT_DTYPE != "int64":  # JAX: the layer carries it through `fit`
            self._key_used_slot = self._key_use.variable
            self._id_count_variable()  # no variable can be created inside a JAX trace
        impl().add_fresh_key_hook(self.rng_key, self._key_use.reset)

    def _count_key_generation(self, rows):
        """Count a new key generation at the first keyed release of the current key."""
        backend = impl()
        called = ops.cast(ops.greater(rows, 0), backend.COUNT_DTYPE)
        used = self._key_use.variable
        first = called * (1 - ops.cast(backend.read(used), backend.COUNT_DTYPE))
        backend.assign_add(self.release_totals,
                           _slot_update(self.release_totals, KEY_GENERATIONS, first))
        return backend.assign(used, ops.maximum(ops.cast(backend.read(used), backend.COUNT_DTYPE),
                                                called))

    def _count_coordinates(self, coordinates):
        """Keep the largest number of coordinates per row released so far.

        An ``assign_add`` of the excess (the same op as every other count; a
        race between concurrent calls can only over-state the maximum).
        """
        backend = impl()
        excess = ops.maximum(ops.cast(coordinates, backend.COUNT_DTYPE)
                             - backend.read(self.release_totals)[MAX_COORDINATES], 0)
        backend.assign_add(self.release_totals,
                           _slot_update(self.release_totals, MAX_COORDINATES, excess))

    # -- in the graph -------------------------------------------------------------------
    def _id_count_variable(self):
        with self._release_lock:
            if self._release_id_counts is None:
                with impl().outside_trace():
                    # the maximum first: once the counts exist, so does their maximum
                    self._release_id_max = local_variable(
                        self, np.int32(0), "release_id_max", monotone=True)
                    self._release_id_counts = local_variable(
                        self, np.zeros(self.id_capacity, np.int32), "release_id_counts",
                        monotone=True)
            return self._release_id_counts

    def _raise_id_max(self, counts):
        """Raise ``release_id_max`` to the largest of ``counts`` (in the graph).

        An ``assign_add`` of the excess, as for the largest row size: a race
        between concurrent calls can only over-state the maximum.
        """
        backend = impl()
        counts = ops.cast(ops.reshape(counts, [-1]), "int32")
        top = ops.max(ops.concatenate([counts, ops.zeros([1], "int32")], 0))
        excess = ops.maximum(top - backend.read(self._release_id_max), 0)
        return backend.assign_add(self._release_id_max, excess)

    def _count_release(self, slot, rows, example_ids=None):
        """Record one call of kind ``slot`` over ``rows`` rows (about ``example_ids`` if given).

        Per-id counts are kept for fresh-noise calls (``FRESH_IDS``); the
        other slots count calls only.
        """
        if getattr(_REPLAY, "active", False):  # a replay of a pass already counted
            return
        backend = impl()
        wide = backend.COUNT_DTYPE
        totals = self.release_totals
        called = ops.cast(ops.greater(rows, 0), wide)
        if slot != FRESH_IDS:
            backend.assign_add(totals, _slot_update(totals, slot, called))
            return
        ids = ops.reshape(example_ids, [-1])
        # Ids that do not name every row (a wrong count) cannot be trusted to
        # count per example: the call then counts for every example instead.
        match = ops.cast(ops.equal(ops.size(ids), ops.cast(rows, "int32")), wide)
        capacity = self.id_capacity
        outside = ops.cast(ops.any(ops.logical_or(ids < 0, ids >= capacity)), wide)
        update = (_slot_update(totals, FRESH_IDS, called * match)
                  + _slot_update(totals, FRESH_ANON, called * (1 - match))
                  + _slot_update(totals, FOLDED, outside * match))
        slots = ops.cast(ops.mod(ids, capacity), "int32")
        counts = self._id_count_variable()
        backend.scatter_add(counts, slots, ops.full(ops.shape(slots), 1, "int32")
                            * ops.cast(match, "int32"))
        self._raise_id_max(backend.gather(counts, slots))  # this call's ids, after the update
        backend.assign_add(totals, update)

    def _count_fresh_release(self, rows, example_ids, owner):
        """Record a fresh-noise call over ``rows`` rows: per example id with
        ``example_ids`` (integers, else a TypeError naming ``owner``), of
        every example without."""
        if example_ids is None:
            self._count_release(FRESH_ANON, rows)
            return
        host = input_checks.host_example_ids(example_ids, owner)  # JAX: refuses ids past int32
        ids = ops.reshape(ops.convert_to_tensor(example_ids if host is None else host), [-1])
        dtype = keras.backend.standardize_dtype(ids.dtype)
        if "int" not in dtype:
            raise TypeError(f"{owner}: `example_ids` must be integers; got dtype {dtype}.")
        self._count_release(FRESH_IDS, rows, ids)

    # -- on the host --------------------------------------------------------------------
    def _release_totals(self):
        return _totals_from_variable(impl().to_numpy(self.release_totals))

    def release_calls(self) -> dict[str, int]:
        """The calls counted so far, by kind (the release slots of ``SLOTS``).

        ``fresh_with_ids``: calls with fresh noise counted per example id;
        ``fresh_without_ids``: calls with fresh noise but no ids, each counted
        as a release of **every** example; ``keyed_once``, ``non_private``,
        ``prior`` and ``key_generations`` as in ``SLOTS``.

        Returns:
            A dict slot name -> count.
        """
        totals = self._release_totals()
        return {SLOTS[slot]: int(totals[slot]) for slot in _RELEASE_SLOTS}

    def _release_id_counts_nonzero(self):
        """(ids, counts) of the examples with at least one fresh release.

        Reading the whole table, it also raises ``release_id_max`` to the
        table's maximum if it was behind (counts assigned from the host, e.g.
        a restored state).
        """
        if self._release_id_counts is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        counts = impl().to_numpy(self._release_id_counts)
        ids = np.flatnonzero(counts)
        if ids.size:
            self._raise_id_max_to(int(counts[ids].max()))
        return ids, counts[ids].astype(np.int64)

    def _raise_id_max_to(self, value):
        """Host side: ``release_id_max`` = max(itself, ``value``).

        The same ``assign_add`` of the excess as in the graph (`_raise_id_max`):
        a call that counts in between is never overwritten by a smaller value.
        """
        self._id_count_variable()
        self._raise_id_max(np.array([value], np.int32))

    def release_id_max(self) -> int:
        """The most fresh-noise releases about one example id so far (a scalar read).

        Kept as a running maximum by the calls that count per example id (no
        scan of the per-id table); never below the true maximum of the
        counts this layer recorded, and 0 before any call with example ids.

        Returns:
            The count, an int.
        """
        if self._release_id_max is None:
            return 0
        return int(impl().to_numpy(self._release_id_max))

    def _record_fresh_releases(self, ledger, kind, totals):
        """Add the fresh-noise calls to ``ledger`` as ``kind``: per example id, and the
        calls without ids for every example (within `busiest_bound`: the running
        maximum, as the releases of one example).

        Once an id was folded (``folded`` slot), the per-id counts are per slot:
        the largest is recorded as releases of every example (approximate). Per
        slot they could under-count: another layer that folds differently (or not)
        would name the same example by another unit, and the report composes per
        unit."""
        if totals[FRESH_ANON]:
            ledger.record(kind, units=None, count=int(totals[FRESH_ANON]))
        if getattr(_BOUND, "active", False):
            busiest = self.release_id_max()
            if busiest:
                ledger.record_counts(kind, [0], [busiest], approximate=True)
            return
        ids, counts = self._release_id_counts_nonzero()
        if ids.size and totals[FOLDED]:
            ledger.record(kind, units=None, count=int(counts.max()))
            ledger.record_counts(kind, [], [], approximate=True)
        elif ids.size:
            ledger.record_counts(kind, ids, counts)

    def reset_release_counts(self) -> None:
        """Forget every recorded release (e.g. a fresh model for a new data set).

        The layer gets a new lineage, so a file it saved before the reset is
        treated as another layer's (never merged into the new counts as the
        same history). The random counter is not reset: no noise repeats.
        """
        totals = np.zeros(len(SLOTS), np.int64)
        totals[LINEAGE] = _new_lineage()
        self.release_totals.assign(_totals_to_variable(totals))
        self._key_use.reset()
        if self._release_id_counts is not None:
            self._release_id_counts.assign(np.zeros(self.id_capacity, np.int32))
            self._release_id_max.assign(np.int32(0))

    # `.keras` / `.weights.h5`: the counts travel with the model, so a
    # reloaded model's report still counts what the original released, and
    # loading into a live layer never rewinds them (see the module docstring).
    def save_own_variables(self, store: dict[str, Any]) -> None:
        super().save_own_variables(store)
        self._save_release_counts(store)

    def load_own_variables(self, store: dict[str, Any]) -> None:
        # checked first: a refused restore changes nothing
        totals = (merge_release_totals(self._release_totals(), store[_TOTALS],
                                       self.release_totals.owner)
                  if _TOTALS in store else None)
        id_counts = self._saved_id_counts(store)
        super().load_own_variables(store)
        self._load_release_counts(totals, id_counts)

    def _save_release_counts(self, store):
        store[_TOTALS] = np.asarray(self._release_totals())
        ids, counts = self._release_id_counts_nonzero()
        store[_ID_SLOTS] = ids.astype(np.int64)
        store[_ID_VALUES] = counts.astype(np.int64)

    def _saved_id_counts(self, store):
        """(ids, counts) saved in ``store``, checked; None if it has none."""
        if _ID_SLOTS not in store:
            return None
        ids = np.asarray(store[_ID_SLOTS], np.int64).reshape(-1)
        values = np.asarray(store[_ID_VALUES], np.int64).reshape(-1)
        if ids.size != values.size or np.any(values < 0):
            raise ValueError(f"{self.release_totals.owner}: the saved per-example release "
                             "counts are malformed; nothing was loaded.")
        return ids, values

    def _load_release_counts(self, totals, id_counts):
        if totals is not None:
            self.release_totals.assign(_totals_to_variable(totals))
        if id_counts is not None and id_counts[0].size:
            self._put_id_counts(*id_counts, merge=True)

    def _put_id_counts(self, ids, values, merge):
        """Put saved per-example counts in place (host side): per slot the larger of the
        table's and the saved count (``merge``), or the saved counts alone (a party's own
        state, which replaces its table). Ids saved by a layer with a larger
        ``id_capacity`` fold and set the ``folded`` slot; the running maximum follows."""
        variable = self._id_count_variable()
        counts = (impl().to_numpy(variable).copy() if merge
                  else np.zeros(tuple(variable.shape), np.int32))
        if _fold_counts(counts, ids, values):
            impl().assign_add(self.release_totals, _slot_update(self.release_totals, FOLDED, 1))
        variable.assign(counts)
        if np.size(values):  # never behind the table it now holds
            self._raise_id_max_to(int(np.max(values)))


# -- a party's own state (keras_fedpriv.layers.local_state) saves and restores the counts ----
def id_counts_of(layer: ReleaseCounter) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, counts)`` of ``layer``'s examples with at least one fresh release (empty when
    it keeps no per-example counts); reading them raises its running maximum if behind.

    Example: ``ids, counts = id_counts_of(kf.LabelDPLayer(eps=1.0))`` gives two empty arrays.
    """
    return layer._release_id_counts_nonzero()


def replace_id_counts(layer: ReleaseCounter, ids, values) -> None:
    """Put a party's saved per-example counts in place of ``layer``'s table (host side): ids
    past its ``id_capacity`` fold, and the running maximum follows.

    Example: ``replace_id_counts(layer, np.array([3]), np.array([2]))``.
    """
    layer._put_id_counts(ids, values, merge=False)


def id_count_table(layer: ReleaseCounter):
    """``layer``'s per-example count variable, created on first use (outside a trace).

    Example: ``id_count_table(layer).assign(saved_table)``.
    """
    return layer._id_count_variable()


def raise_id_max(layer: ReleaseCounter, counts) -> None:
    """Raise ``layer``'s running maximum per-example count to the largest of ``counts`` (in
    the graph or on the host; an ``assign_add`` of the excess, never lowered).

    Example: ``raise_id_max(layer, np.array([4], np.int32))``.
    """
    layer._raise_id_max(counts)
