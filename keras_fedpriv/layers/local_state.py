"""Snapshot and restore the state a party's layers change when they are called.

A call of a layer may change more than its output: a protection layer
advances its random counter and its release counts, a ``Dropout`` or
``GaussianNoise`` layer its Keras seed generator, a ``BatchNormalization``
layer its moving statistics. `local_state` copies all of that (never the
trainable weights) into numpy arrays, and `load_local_state` puts it back.

Two uses in vertical FL:

* a follower that computes its gradients after the leader answered runs
  its forward pass again from the state it had before it sent its
  embedding: the same random counters give the same noise, so the
  recomputed message is the one that was sent (and is checked to be); the
  state after the first pass is then restored, so the second pass is
  neither a new draw nor a new release;
* a follower whose process does not live across messages (Flower's
  Deployment Engine starts one per message) keeps its state in its node's
  own storage between messages.

The secret key of a randomized layer is part of the state (the noise cannot
be replayed without it): keep a snapshot where the party keeps its key, on
the party's own machine.
"""

from __future__ import annotations

from typing import Any, Iterable

import keras
import numpy as np
from keras import ops

from keras_fedpriv.backend import impl
from keras_fedpriv.backend.private import flatten_layers
from keras_fedpriv.layers.release_counter import (
    id_count_table,
    id_counts_of,
    raise_id_max,
    replace_id_counts,
)

__all__ = ["Snapshot", "load_local_state", "local_state", "restore", "snapshot"]

# Local (non-Keras) variables of the package's layers, by attribute name.
_LOCAL_ATTRS = ("rng_key", "rng_counter", "release_totals", "input_errors")
# Entries a state saved by an older version may lack: they load as zero into a layer that has
# not released (see `_check_missing`).
_MAY_BE_MISSING = ("release_totals", "key_used")


def _sublayers(layers):
    seen, out = set(), []
    for layer in layers:
        if layer is None:
            continue
        for sub in flatten_layers(layer, include_self=True):
            if id(sub) not in seen:
                seen.add(id(sub))
                out.append(sub)
    return out


def _keras_state_variables(layers, local):
    """The non-trainable Keras variables of ``layers`` but the package's own local
    variables (``local``: on JAX they are Keras variables too, kept by name instead)."""
    seen, out = {id(v) for v in local}, []
    for layer in layers:
        if layer is None:
            continue
        for v in layer.variables:
            if not v.trainable and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def _entries(layers):
    """``([(name, variable)], [(j, layer with per-example counts)])`` of ``layers``."""
    layers = list(layers)
    backend = impl()
    local, counted = [], []
    for j, sub in enumerate(_sublayers(layers)):
        for attr in _LOCAL_ATTRS:
            var = getattr(sub, attr, None)
            if backend.is_local_variable(var):
                local.append((f"{j}/{attr}", var))
        key_use = getattr(sub, "_key_use", None)
        if key_use is not None:
            local.append((f"{j}/key_used", key_use.variable))
        if hasattr(sub, "_release_id_counts_nonzero"):
            counted.append((j, sub))
            for attr in ("_release_id_counts", "_release_id_max"):  # kept as slots/values
                if getattr(sub, attr, None) is not None:
                    local.append((None, getattr(sub, attr)))
    own = [getattr(v, "state", v) for _, v in local]
    out = [(f"keras/{i}", v) for i, v in enumerate(_keras_state_variables(layers, own))]
    return out + [(name, v) for name, v in local if name is not None], counted


def _value(variable):
    return variable.value if isinstance(variable, keras.Variable) else impl().read(variable)


def _sparse(counts):
    ids = np.flatnonzero(counts)
    return ids.astype(np.int64), counts[ids].astype(np.int64)


def local_state(layers: Iterable[Any]) -> dict[str, np.ndarray]:
    """Everything but the trainable weights that calling ``layers`` may change.

    Args:
        layers: Keras layers or models (None entries are skipped); their
            sublayers are included.

    Returns:
        A dict name -> numpy array: the non-trainable Keras variables
        (``keras/<i>``: moving statistics, seed-generator states) and the
        local variables of the package's layers (``<j>/rng_key``,
        ``<j>/rng_counter``, ``<j>/release_totals``, ``<j>/input_errors``,
        ``<j>/key_used``, and the per-example release counts as
        ``<j>/release_id_slots`` + ``<j>/release_id_values``, nonzero only).
        Names depend only on the layers' structure, so a copy of the same
        layers built elsewhere loads the state.
    """
    entries, counted = _entries(layers)
    out = {name: np.array(_value(v)) for name, v in entries}
    for j, sub in counted:
        ids, counts = id_counts_of(sub)
        out[f"{j}/release_id_slots"] = ids.astype(np.int64)
        out[f"{j}/release_id_values"] = counts.astype(np.int64)
    return out


def load_local_state(layers: Iterable[Any], state: dict[str, Any]) -> None:
    """Restore what `local_state` returned for the same layers.

    Arrays are reshaped to their variables' shapes (a transport that turns
    scalars into shape (1,) arrays is fine).

    A state without a layer's ``release_totals`` / ``key_used`` (saved
    before that layer counted its releases, e.g. an older `VAEBottom`) loads
    them as zero into a layer that has not released, and is refused by one
    that has (its counts would be zeroed).

    Args:
        layers: the layers given to `local_state` (or copies of them with
            the same structure).
        state: its result.

    Raises:
        ValueError: the state does not fit the layers (another structure),
            or lacks the release counts of a layer that has released.
    """
    layers = list(layers)
    entries, counted = _entries(layers)
    for name, _ in entries:  # all checked first: a refused state changes nothing
        if name not in state:
            _check_missing(name, layers)
    for name, v in entries:
        if name in state:  # a missing one may load as zero: the layer's value already is
            v.assign(np.reshape(state[name], v.shape))
    for j, sub in counted:
        if f"{j}/release_id_slots" not in state:
            continue
        ids = np.asarray(state[f"{j}/release_id_slots"], np.int64).reshape(-1)
        values = np.asarray(state[f"{j}/release_id_values"], np.int64).reshape(-1)
        if ids.size or sub._release_id_counts is not None:
            replace_id_counts(sub, ids, values)


def _check_missing(name, layers):
    """Raise unless the entry ``name``, missing from a state, may load as zero.

    A state taken before a layer kept release counts (a `VAEBottom` saved by
    an older version has no ``release_totals`` nor ``key_used``) loads into
    a layer that has not released: its counts stay zero, as they were when
    that state was taken. A layer that has released would lose its counts,
    and any other missing entry means another structure: both refused.
    """
    j, _, attr = name.partition("/")
    if attr in _MAY_BE_MISSING and j.isdigit():
        layer = _sublayers(layers)[int(j)]
        if not any(layer.release_calls().values()):
            return
        raise ValueError(f"load_local_state: the state has no {name!r} (saved by a version "
                         f"that did not count this layer's releases), and "
                         f"{type(layer).__name__} {layer.name!r} has released: loading it would "
                         "zero its release counts. Load the state only into a copy that has "
                         "not released.")
    raise ValueError(f"load_local_state: the state has no {name!r}; it was taken from "
                     "layers of another structure.")


class Snapshot:
    """`local_state` kept as tensors in memory (no copy to the host): see `snapshot`."""

    def __init__(self, values: dict[str, Any], counts: dict[int, Any],
                 maxima: dict[int, Any] | None = None) -> None:
        self.values = values
        self.counts = counts
        # per layer, its ``release_id_max`` when the snapshot was taken (never below the table)
        self.maxima = {} if maxima is None else maxima

    def to_state(self) -> dict[str, np.ndarray]:
        """The same snapshot in `local_state`'s format (numpy; per-example counts sparse)."""
        out = {name: np.array(t) for name, t in self.values.items()}
        for j, t in self.counts.items():
            ids, counts = _sparse(np.asarray(t)) if t is not None else (
                np.zeros(0, np.int64), np.zeros(0, np.int64))
            out[f"{j}/release_id_slots"], out[f"{j}/release_id_values"] = ids, counts
        return out


def snapshot(layers: Iterable[Any], id_counts: bool = True) -> Snapshot:
    """A fast in-memory `local_state` of ``layers`` (tensors; later updates do not change it).

    Args:
        layers: as for `local_state`.
        id_counts: also copy the per-example release counts (a table of the
            layer's ``id_capacity`` slots, 4 bytes each). False for a state
            that `restore` puts back around calls that count nothing per
            example: the tables are then neither copied nor restored.

    Returns:
        A `Snapshot` for `restore` (``.to_state()`` gives `local_state`'s format,
        without per-example counts if ``id_counts`` is False).
    """
    entries, counted = _entries(layers)
    backend = impl()
    counted = counted if id_counts else []
    counts = {j: (None if sub._release_id_counts is None
                  else ops.copy(backend.read(sub._release_id_counts))) for j, sub in counted}
    maxima = {j: ops.copy(backend.read(sub._release_id_max)) for j, sub in counted
              if sub._release_id_counts is not None}
    return Snapshot({name: ops.copy(_value(v)) for name, v in entries}, counts, maxima)


def restore(layers: Iterable[Any], state: Snapshot | dict[str, Any]) -> None:
    """Put back a `snapshot` (or a `local_state` dict) of the same layers."""
    if not isinstance(state, Snapshot):
        load_local_state(layers, state)
        return
    entries, counted = _entries(layers)
    # Copies: on JAX a variable holds the very array it is assigned, and a compiled party
    # step donates its variables' buffers (frees them): the snapshot must keep its own.
    for name, v in entries:
        v.assign(ops.copy(state.values[name]))
    for j, sub in counted:
        if j not in state.counts:  # taken without the per-example counts: left as they are
            continue
        t = state.counts[j]
        if t is not None:
            id_count_table(sub).assign(ops.copy(t))
            if j in state.maxima:  # never behind the table it now holds (a scalar, no scan)
                raise_id_max(sub, ops.reshape(state.maxima[j], [1]))
            else:
                raise_id_max(sub, t)
        elif sub._release_id_counts is not None:
            sub._release_id_counts.assign(np.zeros(tuple(sub._release_id_counts.shape), np.int32))
