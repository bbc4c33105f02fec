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
  (``max_coordinates``);
* ``release_id_counts`` (int32, created on the first call that has
  example ids and fresh noise): per example id, the number of fresh-noise
  releases about that example. Ids are taken modulo ``ID_CAPACITY``; an id
  outside ``[0, ID_CAPACITY)`` sets the ``folded`` slot and the per-id
  counts become upper bounds (two ids may share a slot), which reports say.

Counting is a few ``assign_add`` / ``scatter_add`` ops on the layer's own
variables: atomic under concurrent calls (the variable's lock), compiled by
XLA, and executed wherever the layer runs. ``privacy_ledger()`` (host side)
turns the counts into a `keras_fedpriv.mechanisms.ledger.ReleaseLedger`.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import tensorflow as tf

from keras_fedpriv.layers.secret_rng import _LocalVariable

__all__ = ["ID_CAPACITY", "ReleaseCounterMixin", "SLOTS"]

#: Per-id counts are kept for ids in [0, ID_CAPACITY) (4 MiB per layer that uses them).
ID_CAPACITY = 2 ** 20

#: Slots of ``release_totals``.
SLOTS = ("fresh_with_ids", "fresh_without_ids", "keyed_once", "non_private", "prior",
         "folded", "key_generations", "max_coordinates")
(FRESH_IDS, FRESH_ANON, ONCE, NON_PRIVATE, PRIOR, FOLDED, KEY_GENERATIONS,
 MAX_COORDINATES) = range(len(SLOTS))

_TOTALS = "release_totals"
_ID_SLOTS = "release_id_slots"
_ID_VALUES = "release_id_values"


class _KeyUse:
    """Holds the 'current key has released' flag (a plain object: never checkpointed)."""

    def __init__(self):
        self.variable = _LocalVariable(np.int64(0), trainable=False, name="key_used")

    def reset(self):
        self.variable.assign(0)


class ReleaseCounterMixin:
    """Mixin: count a layer's releases in graph-safe local variables."""

    def _init_release_counter(self):
        self.release_totals = _LocalVariable(np.zeros(len(SLOTS), np.int64), trainable=False,
                                             name=_TOTALS)
        self._release_id_counts = None
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
                    self._release_id_counts = _LocalVariable(
                        np.zeros(ID_CAPACITY, np.int32), trainable=False,
                        name="release_id_counts")
            return self._release_id_counts

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
        self._id_count_variable().scatter_add(tf.IndexedSlices(
            tf.fill(tf.shape(slots), tf.cast(match, tf.int32)), slots))
        self.release_totals.assign_add(update)

    # -- on the host --------------------------------------------------------------------
    def _release_totals(self):
        return self.release_totals.numpy()

    def _release_id_counts_nonzero(self):
        """(ids, counts) of the examples with at least one fresh release."""
        if self._release_id_counts is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        counts = self._release_id_counts.numpy()
        ids = np.flatnonzero(counts)
        return ids, counts[ids].astype(np.int64)

    def _record_fresh_releases(self, ledger, kind, totals):
        """Add the fresh-noise calls to ``ledger`` as ``kind``: per example id, and the
        calls without ids for every example."""
        if totals[FRESH_ANON]:
            ledger.record(kind, units=None, count=int(totals[FRESH_ANON]))
        ids, counts = self._release_id_counts_nonzero()
        if ids.size:
            ledger.record_counts(kind, ids, counts, approximate=bool(totals[FOLDED]))

    def reset_release_counts(self) -> None:
        """Forget every recorded release (e.g. a fresh model for a new data set)."""
        self.release_totals.assign(np.zeros(len(SLOTS), np.int64))
        self._key_use.reset()
        if self._release_id_counts is not None:
            self._release_id_counts.assign(np.zeros(ID_CAPACITY, np.int32))

    # `.keras` / `.weights.h5`: the counts travel with the model, so a
    # reloaded model's report still counts what the original released.
    def save_own_variables(self, store: dict[str, Any]) -> None:
        super().save_own_variables(store)
        self._save_release_counts(store)

    def load_own_variables(self, store: dict[str, Any]) -> None:
        super().load_own_variables(store)
        self._load_release_counts(store)

    def _save_release_counts(self, store):
        store[_TOTALS] = np.asarray(self._release_totals())
        ids, counts = self._release_id_counts_nonzero()
        store[_ID_SLOTS] = ids.astype(np.int64)
        store[_ID_VALUES] = counts.astype(np.int64)

    def _load_release_counts(self, store):
        if _TOTALS in store:
            self.release_totals.assign(np.asarray(store[_TOTALS], np.int64))
        if _ID_SLOTS in store:
            ids = np.asarray(store[_ID_SLOTS], np.int64)
            if ids.size:
                counts = np.zeros(ID_CAPACITY, np.int32)
                counts[ids] = np.asarray(store[_ID_VALUES], np.int64)
                self._id_count_variable().assign(counts)
