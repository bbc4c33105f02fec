"""Randomize a data set's labels once, before training.

`privatize_labels` (arrays) runs on every Keras backend; `privatize_dataset`
maps a ``tf.data.Dataset`` and needs Keras' TensorFlow backend.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Hashable

import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv import backend
from keras_fedpriv.layers.label_dp import LabelDPLayer

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["privatize_labels", "privatize_dataset"]


def _privatizer(layer, eps, mode, num_classes, seed):
    """The LabelDPLayer that randomizes: ``layer`` as given, or a new one from the arguments."""
    if layer is None:
        if eps is None:
            raise TypeError("give `eps` (a new LabelDPLayer randomizes the labels) or `layer` "
                            "(an existing LabelDPLayer, whose ledger then records the release).")
        return LabelDPLayer(eps, mode=mode, num_classes=num_classes, seed=seed)
    if not isinstance(layer, LabelDPLayer):
        raise TypeError(f"`layer` must be a keras_fedpriv.LabelDPLayer; got "
                        f"{type(layer).__name__}.")
    if eps is not None or seed is not None or mode != "auto" or num_classes is not None:
        raise ValueError("with `layer`, leave `eps`, `mode`, `num_classes` and `seed` unset: "
                         "the layer's own settings are used.")
    return layer


def privatize_labels(labels: ArrayLike, eps: float | None = None, mode: str = "auto",
                     num_classes: int | None = None, prior: ArrayLike | None = None,
                     seed: int | None = None, layer: LabelDPLayer | None = None) -> np.ndarray:
    """Return a randomized copy of ``labels``, each example randomized once.

    The labels are validated row by row first (a clear ValueError names the
    first bad row). Training on the result for any number of epochs releases
    each label once: the guarantee is eps-label-DP.

    Args:
        labels: array-like of binary (N,)/(N, 1), one-hot (N, K) or sparse
            (N,) labels (see `LabelDPLayer`); bool labels are read as 0/1.
        eps: privacy parameter, finite and >= 0.
        mode: ``"auto"``, ``"binary"``, ``"onehot"`` or ``"sparse"``.
        num_classes: number of classes (required for sparse labels).
        prior: optional (N, K) per-example class probabilities for
            RR-with-prior (they must not depend on the example's own label):
            one row per label, finite, in [0, 1], each row summing to 1
            within 0.01 (else a ValueError naming the row, not the values).
        seed: None for a fresh OS-entropy secret, or an int (reproducible).
        layer: instead of ``eps``/``mode``/``num_classes``/``seed``, an
            existing `LabelDPLayer` to randomize with. Its ledger records the
            release, so ``privacy_report([model, layer])`` counts it (a layer
            made here is dropped with its record).

    Returns:
        A numpy array of the input's shape and dtype.

    Example:
        >>> y_noisy = privatize_labels(y_train, eps=2.0)
    """
    if _is_dataset(labels):
        raise TypeError(f"privatize_labels: `labels` must be an array of labels (numpy array, "
                        f"list or tensor); got a {type(labels).__name__}. For a "
                        f"tf.data.Dataset use keras_fedpriv.privatize_dataset.")
    array = np.asarray(labels)
    if array.dtype == object:
        raise TypeError(f"privatize_labels: `labels` must be a numeric array of labels; got a "
                        f"{type(labels).__name__} that converts to an array of Python objects.")
    layer = _privatizer(layer, eps, mode, num_classes, seed)
    out = layer(array, example_ids=np.arange(array.shape[0] if array.ndim else 0, dtype=np.int64),
                prior=prior, training=True)
    return np.asarray(out).astype(array.dtype, copy=False)


def privatize_dataset(dataset: tf.data.Dataset, eps: float | None = None, mode: str = "auto",
                      num_classes: int | None = None, seed: int | None = None,
                      label_key: Hashable | None = None,
                      layer: LabelDPLayer | None = None) -> tf.data.Dataset:
    """Randomize the labels of a `tf.data.Dataset` once per example.

    The dataset is enumerated and each label is randomized by a pure function
    of (secret key, position), so re-iterating it (every epoch) yields the
    same noisy labels. Apply it **before** ``shuffle``/``repeat``/``batch``
    (on unbatched elements in a fixed order): after a reshuffle the positions
    would name other examples and the labels would be re-randomized.

    Which component holds the labels follows Keras' convention and is never
    guessed: for elements ``(x, y)`` or ``(x, y, sample_weight)`` the labels
    are ``y`` (position 1). Any other element structure (a dict, a tuple of
    another length) needs ``label_key``.

    Args:
        dataset: a dataset of single examples: tuples ``(features, labels)``
            / ``(features, labels, sample_weight)``, or other tuples or dicts
            together with ``label_key``. Labels have shape () / (1,) for
            binary or sparse, (K,) for one-hot.
        eps, mode, num_classes, seed, layer: as in `privatize_labels`.
        label_key: None (Keras' convention, position 1 of a 2- or 3-tuple),
            an int position in a tuple element, or a key of a dict element.

    Returns:
        A dataset with the same element structure and randomized labels.

    Raises:
        BackendNotSupportedError: Keras runs on JAX (``tf.data`` maps run
            TensorFlow ops); use `privatize_labels` on the label array there.

    Example:
        >>> ds = tf.data.Dataset.from_tensor_slices((x, y))
        >>> ds = privatize_dataset(ds, eps=1.0).shuffle(1000).batch(32)
    """
    backend.require_tensorflow(
        "privatize_dataset (a tf.data map)",
        jax_way="randomize the label array once with keras_fedpriv.privatize_labels(y, eps) "
                "(numpy in, numpy out; the same once-per-example guarantee) and build the "
                "input pipeline from the result, or put a LabelDPLayer with example_ids in the "
                "training step.")
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"privatize_dataset: `dataset` must be a tf.data.Dataset; got a "
                        f"{type(dataset).__name__}. For arrays of labels use "
                        f"keras_fedpriv.privatize_labels(y, ...), or build a dataset first with "
                        f"tf.data.Dataset.from_tensor_slices((x, y)).")
    spec = dataset.element_spec
    key = _label_key(spec, label_key)
    label_spec = spec[key]
    if not isinstance(label_spec, tf.TensorSpec):
        raise TypeError(f"privatize_dataset: the labels (component {key!r}) must be one tensor; "
                        f"got {type(label_spec).__name__}.")
    rank = label_spec.shape.rank
    if rank not in (0, 1):
        raise ValueError("privatize_dataset: apply it to unbatched elements (labels of shape () "
                         f"or (K,)); got label shape {label_spec.shape}. Use .unbatch() first.")
    layer = _privatizer(layer, eps, mode, num_classes, seed)
    is_dict = isinstance(spec, dict)

    def randomize(position, element):
        element = dict(element) if is_dict else list(element)
        y = element[key]
        batch = tf.reshape(y, [1, -1]) if rank == 1 else tf.reshape(y, [1])
        noisy = layer(batch, example_ids=tf.reshape(position, [1]), training=True)
        element[key] = tf.reshape(noisy, tf.shape(y))
        return element if is_dict else tuple(element)

    return dataset.enumerate().map(randomize, num_parallel_calls=tf.data.AUTOTUNE,
                                   deterministic=True)


def _is_dataset(value: Any) -> bool:
    """Whether ``value`` is a ``tf.data.Dataset`` (one exists only once TensorFlow is
    imported, so this never imports it)."""
    tf_module = sys.modules.get("tensorflow")
    return tf_module is not None and isinstance(value, tf_module.data.Dataset)


def _label_key(spec, label_key):
    """The position / key of the labels in elements of ``spec`` (never guessed)."""
    if isinstance(spec, dict):
        if label_key is None:
            raise ValueError("privatize_dataset: the elements are dicts, so say which entry holds "
                             f"the labels with `label_key` (one of {sorted(spec, key=str)}).")
        if label_key not in spec:
            raise ValueError(f"privatize_dataset: `label_key`={label_key!r} is not a key of the "
                             f"elements; allowed: {sorted(spec, key=str)}.")
        return label_key
    if not isinstance(spec, tuple):
        raise TypeError("privatize_dataset: elements must be tuples (features, labels[, "
                        "sample_weight]) or dicts with `label_key`; got an element of type "
                        f"{type(spec).__name__}.")
    if label_key is None:
        if len(spec) not in (2, 3):
            raise ValueError(f"privatize_dataset: elements are tuples of {len(spec)} components; "
                             "only (features, labels) and (features, labels, sample_weight) "
                             "have a known label position. Pass `label_key` (the label's "
                             "position).")
        return 1
    if isinstance(label_key, bool) or not isinstance(label_key, (int, np.integer)):
        raise TypeError(f"privatize_dataset: `label_key` must be an int position for tuple "
                        f"elements; got {label_key!r}.")
    if not 0 <= int(label_key) < len(spec):
        raise ValueError(f"privatize_dataset: `label_key`={int(label_key)} is out of range for "
                         f"elements of {len(spec)} components; allowed: 0..{len(spec) - 1} "
                         "(no negative positions).")
    return int(label_key)
