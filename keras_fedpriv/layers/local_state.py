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

import numpy as np
import tensorflow as tf

__all__ = ["load_local_state", "local_state"]

# Local (non-Keras) variables of the package's layers, by attribute name.
_LOCAL_ATTRS = ("rng_key", "rng_counter", "release_totals", "input_errors")


def _sublayers(layers):
    seen, out = set(), []
    for layer in layers:
        if layer is None:
            continue
        for sub in layer._flatten_layers(include_self=True, recursive=True):
            if id(sub) not in seen:
                seen.add(id(sub))
                out.append(sub)
    return out


def _keras_state_variables(layers):
    seen, out = set(), []
    for layer in layers:
        if layer is None:
            continue
        for v in layer.variables:
            if not v.trainable and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


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
    layers = list(layers)
    out = {f"keras/{i}": np.array(v.numpy())
           for i, v in enumerate(_keras_state_variables(layers))}
    for j, sub in enumerate(_sublayers(layers)):
        for attr in _LOCAL_ATTRS:
            var = getattr(sub, attr, None)
            if isinstance(var, tf.Variable):
                out[f"{j}/{attr}"] = np.array(var.numpy())
        key_use = getattr(sub, "_key_use", None)
        if key_use is not None:
            out[f"{j}/key_used"] = np.array(key_use.variable.numpy())
        if hasattr(sub, "_release_id_counts_nonzero"):
            ids, counts = sub._release_id_counts_nonzero()
            out[f"{j}/release_id_slots"] = ids.astype(np.int64)
            out[f"{j}/release_id_values"] = counts.astype(np.int64)
    return out


def load_local_state(layers: Iterable[Any], state: dict[str, Any]) -> None:
    """Restore what `local_state` returned for the same layers.

    Arrays are reshaped to their variables' shapes (a transport that turns
    scalars into shape (1,) arrays is fine).

    Args:
        layers: the layers given to `local_state` (or copies of them with
            the same structure).
        state: its result.

    Raises:
        ValueError: the state does not fit the layers (another structure).
    """
    layers = list(layers)
    keras_vars = _keras_state_variables(layers)
    for i, v in enumerate(keras_vars):
        name = f"keras/{i}"
        if name not in state:
            raise ValueError(f"load_local_state: the state has no {name!r}; it was taken from "
                             "layers of another structure.")
        v.assign(np.reshape(state[name], v.shape))
    for j, sub in enumerate(_sublayers(layers)):
        for attr in _LOCAL_ATTRS:
            var = getattr(sub, attr, None)
            name = f"{j}/{attr}"
            if isinstance(var, tf.Variable):
                if name not in state:
                    raise ValueError(f"load_local_state: the state has no {name!r}; it was taken "
                                     "from layers of another structure.")
                var.assign(np.reshape(state[name], var.shape))
        key_use = getattr(sub, "_key_use", None)
        if key_use is not None and f"{j}/key_used" in state:
            key_use.variable.assign(np.reshape(state[f"{j}/key_used"], ()))
        if hasattr(sub, "_release_id_counts_nonzero") and f"{j}/release_id_slots" in state:
            ids = np.asarray(state[f"{j}/release_id_slots"], np.int64).reshape(-1)
            values = np.asarray(state[f"{j}/release_id_values"], np.int64).reshape(-1)
            if ids.size or sub._release_id_counts is not None:
                counts = np.zeros(sub._id_count_variable().shape, np.int32)
                counts[ids] = values
                sub._id_count_variable().assign(counts)
