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
* ``release_id_counts`` (int32, created on the first call that has
  example ids and fresh noise): per example id, the number of fresh-noise
  releases about that example. Ids are taken modulo ``ID_CAPACITY``; an id
  outside ``[0, ID_CAPACITY)`` sets the ``folded`` slot and the per-id
  counts become upper bounds (two ids may share a slot), which reports say;
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
import secrets
import threading
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from keras_fedpriv.layers.secret_rng import _LocalVariable, _MonotoneVariable

__all__ = ["ID_CAPACITY", "ReleaseCounterMixin", "SLOTS", "busiest_bound"]

#: Per-id counts are kept for ids in [0, ID_CAPACITY) (4 MiB per layer that uses them).
ID_CAPACITY = 2 ** 20

#: Slots of ``release_totals``.
SLOTS = ("fresh_with_ids", "fresh_without_ids", "keyed_once", "non_private", "prior",
         "folded", "key_generations", "max_coordinates", "lineage")
(FRESH_IDS, FRESH_ANON, ONCE, NON_PRIVATE, PRIOR, FOLDED, KEY_GENERATIONS,
 MAX_COORDINATES, LINEAGE) = range(len(SLOTS))
#: The slots that count releases (a layer with any of them nonzero has released).
_RELEASE_SLOTS = (FRESH_IDS, FRESH_ANON, ONCE, NON_PRIVATE, PRIOR, KEY_GENERATIONS)

_TOTALS = "release_totals"
_BOUND = threading.local()  # `busiest_bound` is active in this thread
_ID_SLOTS = "release_id_slots"
_ID_VALUES = "release_id_values"


def _new_lineage():
    """A random nonzero 62-bit id (OS entropy: no global seed makes two layers share one)."""
    return secrets.randbits(62) | 1


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
    before = getattr(_BOUND, "active", False)
    _BOUND.active = True
    try:
        yield
    finally:
        _BOUND.active = before


def _released(totals):
    return bool(np.any(np.asarray(totals)[list(_RELEASE_SLOTS)] != 0))


def _saved_totals(saved, owner):
    """``saved`` totals as int64 with every slot (lineage 0 = unknown, for files written
    before lineages existed); ValueError if malformed (wrong size, negative counts)."""
    saved = np.asarray(saved, np.int64).reshape(-1)
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
    live = np.asarray(live, np.int64).reshape(-1)
    saved = _saved_totals(saved, owner)
    if _released(live) and (saved[LINEAGE] != live[LINEAGE]
                            or np.any(saved[:LINEAGE] < live[:LINEAGE])):
        raise ValueError(
            f"{owner}: the state being loaded is behind this layer's releases (or was saved by "
            f"another layer). Loading it would rewind the release count and replay noise already "
            f"sent; load a state only into a new copy, or one that has released no more than "
            f"the state records.")


class _ReleaseTotalsVariable(_LocalVariable):
    """``release_totals``: a checkpoint restore merges with `merge_release_totals`."""

    owner = "a protection layer"

    def _restore_from_tensors(self, restored_tensors):
        restored = restored_tensors["VARIABLE_VALUE"]
        if not tf.executing_eagerly():  # a graph-mode restore: never rewind, keep the lineage
            restored = tf.cast(tf.reshape(restored, [-1]), tf.int64)
            if restored.shape[0] == len(SLOTS) - 1:  # saved before lineages existed
                restored = tf.concat([restored, tf.zeros([1], tf.int64)], 0)
            keep = tf.one_hot(LINEAGE, len(SLOTS), on_value=True, off_value=False)
            live = self.read_value()
            return self.assign(tf.where(keep, live, tf.maximum(live, restored)))
        return self.assign(merge_release_totals(self.numpy(), np.asarray(restored), self.owner))


class _KeyUse:
    """Holds the 'current key has released' flag (a plain object: never checkpointed)."""

    def __init__(self):
        self.variable = _LocalVariable(np.int64(0), trainable=False, name="key_used")

    def reset(self):
        self.variable.assign(0)


class ReleaseCounterMixin:
    """Mixin: count a layer's releases in graph-safe local variables."""

    def _init_release_counter(self):
        totals = np.zeros(len(SLOTS), np.int64)
        totals[LINEAGE] = _new_lineage()
        self.release_totals = _ReleaseTotalsVariable(totals, trainable=False, name=_TOTALS)
        self.release_totals.owner = f"{type(self).__name__} {self.name!r}"
        self._release_id_counts = None
        self._release_id_max = None
        self._release_lock = threading.Lock()
        # Whether the current key has made keyed releases. Kept out of every
        # checkpoint (a holder object is not tracked): a restored layer has a
        # fresh key, whose first keyed release starts a new generation.
        self._key_use = _KeyUse()
        self.rng_key.fresh_key_hooks.append(self._key_use.reset)

    def _count_key_generation(self, rows):
        """Count a new key generation at the first keyed release of the current key."""
        called = tf.cast(tf.greater(rows, 0), tf.int64)
        used = self._key_use.variable
        first = called * (1 - used.read_value())
        update = tf.one_hot(KEY_GENERATIONS, len(SLOTS), dtype=tf.int64) * first
        with tf.control_dependencies([self.release_totals.assign_add(update)]):
            return used.assign(tf.maximum(used.read_value(), called))

    def _count_coordinates(self, coordinates):
        """Keep the largest number of coordinates per row released so far.

        An ``assign_add`` of the excess (the same op as every other count; a
        race between concurrent calls can only over-state the maximum).
        """
        excess = tf.maximum(tf.cast(coordinates, tf.int64)
                            - self.release_totals.read_value()[MAX_COORDINATES], 0)
        self.release_totals.assign_add(
            tf.one_hot(MAX_COORDINATES, len(SLOTS), dtype=tf.int64) * excess)

    # -- in the graph -------------------------------------------------------------------
    def _id_count_variable(self):
        with self._release_lock:
            if self._release_id_counts is None:
                with tf.init_scope():
                    # the maximum first: once the counts exist, so does their maximum
                    self._release_id_max = _MonotoneVariable(
                        np.int32(0), trainable=False, name="release_id_max")
                    self._release_id_counts = _MonotoneVariable(
                        np.zeros(ID_CAPACITY, np.int32), trainable=False,
                        name="release_id_counts")
            return self._release_id_counts

    def _raise_id_max(self, counts):
        """Raise ``release_id_max`` to the largest of ``counts`` (in the graph).

        An ``assign_add`` of the excess, as for the largest row size: a race
        between concurrent calls can only over-state the maximum.
        """
        top = tf.reduce_max(tf.concat([tf.reshape(counts, [-1]), tf.zeros([1], tf.int32)], 0))
        excess = tf.maximum(top - self._release_id_max.read_value(), 0)
        return self._release_id_max.assign_add(excess)

    def _count_release(self, slot, rows, example_ids=None):
        """Record one call of kind ``slot`` over ``rows`` rows (about ``example_ids`` if given).

        Per-id counts are kept for fresh-noise calls (``FRESH_IDS``); the
        other slots count calls only.
        """
        called = tf.cast(tf.greater(rows, 0), tf.int64)
        if slot != FRESH_IDS:
            self.release_totals.assign_add(tf.one_hot(slot, len(SLOTS), dtype=tf.int64) * called)
            return
        ids = tf.cast(tf.reshape(example_ids, [-1]), tf.int64)
        # Ids that do not name every row (a wrong count) cannot be trusted to
        # count per example: the call then counts for every example instead.
        match = tf.cast(tf.equal(tf.cast(tf.size(ids), tf.int64),
                                 tf.cast(rows, tf.int64)), tf.int64)
        outside = tf.cast(tf.reduce_any(tf.logical_or(ids < 0, ids >= ID_CAPACITY)), tf.int64)
        update = (tf.one_hot(FRESH_IDS, len(SLOTS), dtype=tf.int64) * called * match
                  + tf.one_hot(FRESH_ANON, len(SLOTS), dtype=tf.int64) * called * (1 - match)
                  + tf.one_hot(FOLDED, len(SLOTS), dtype=tf.int64) * outside * match)
        slots = tf.math.floormod(ids, ID_CAPACITY)
        counts = self._id_count_variable()
        added = counts.scatter_add(tf.IndexedSlices(
            tf.fill(tf.shape(slots), tf.cast(match, tf.int32)), slots))
        with tf.control_dependencies([added]):  # this call's ids only, after their update
            self._raise_id_max(counts.sparse_read(slots))
        self.release_totals.assign_add(update)

    def _count_fresh_release(self, rows, example_ids, owner):
        """Record a fresh-noise call over ``rows`` rows: per example id with
        ``example_ids`` (integers, else a TypeError naming ``owner``), of
        every example without."""
        if example_ids is None:
            self._count_release(FRESH_ANON, rows)
            return
        ids = tf.reshape(tf.convert_to_tensor(example_ids), [-1])
        if not ids.dtype.is_integer:
            raise TypeError(f"{owner}: `example_ids` must be integers; got dtype "
                            f"{ids.dtype.name}.")
        self._count_release(FRESH_IDS, rows, ids)

    # -- on the host --------------------------------------------------------------------
    def _release_totals(self):
        return self.release_totals.numpy()

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
        counts = self._release_id_counts.numpy()
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
        self._raise_id_max(tf.constant([value], tf.int32))

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
        return int(self._release_id_max.numpy())

    def _record_fresh_releases(self, ledger, kind, totals):
        """Add the fresh-noise calls to ``ledger`` as ``kind``: per example id, and the
        calls without ids for every example (within `busiest_bound`: the running
        maximum, as the releases of one example)."""
        if totals[FRESH_ANON]:
            ledger.record(kind, units=None, count=int(totals[FRESH_ANON]))
        if getattr(_BOUND, "active", False):
            busiest = self.release_id_max()
            if busiest:
                ledger.record_counts(kind, [0], [busiest], approximate=True)
            return
        ids, counts = self._release_id_counts_nonzero()
        if ids.size:
            ledger.record_counts(kind, ids, counts, approximate=bool(totals[FOLDED]))

    def reset_release_counts(self) -> None:
        """Forget every recorded release (e.g. a fresh model for a new data set).

        The layer gets a new lineage, so a file it saved before the reset is
        treated as another layer's (never merged into the new counts as the
        same history). The random counter is not reset: no noise repeats.
        """
        totals = np.zeros(len(SLOTS), np.int64)
        totals[LINEAGE] = _new_lineage()
        self.release_totals.assign(totals)
        self._key_use.reset()
        if self._release_id_counts is not None:
            self._release_id_counts.assign(np.zeros(ID_CAPACITY, np.int32))
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
        if (ids.size != values.size or np.any(ids < 0) or np.any(ids >= ID_CAPACITY)
                or np.any(values < 0)):
            raise ValueError(f"{self.release_totals.owner}: the saved per-example release "
                             "counts are malformed; nothing was loaded.")
        return ids, values

    def _load_release_counts(self, totals, id_counts):
        if totals is not None:
            self.release_totals.assign(totals)
        if id_counts is not None and id_counts[0].size:
            ids, values = id_counts
            variable = self._id_count_variable()
            counts = variable.numpy()
            counts[ids] = np.maximum(counts[ids], values)
            variable.assign(counts)
            self._raise_id_max_to(int(counts[ids].max()))
