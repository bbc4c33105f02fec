"""Randomize a data set's labels once, before training (ALGORITHMS.md section 1)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_fedpriv.layers.label_dp import LabelDPLayer

__all__ = ["privatize_labels", "privatize_dataset"]


def privatize_labels(labels, eps, mode="auto", num_classes=None, prior=None, seed=None):
    """Return a randomized copy of ``labels``, each example randomized once.

    The labels are validated row by row first (a clear ValueError names the
    first bad row). Training on the result for any number of epochs releases
    each label once: the guarantee is eps-label-DP.

    Args:
        labels: array-like of binary (N,)/(N, 1), one-hot (N, K) or sparse
            (N,) labels (see `LabelDPLayer`).
        eps: privacy parameter, finite and >= 0.
        mode: ``"auto"``, ``"binary"``, ``"onehot"`` or ``"sparse"``.
        num_classes: number of classes (required for sparse labels).
        prior: optional (N, K) per-example class probabilities for
            RR-with-prior (they must not depend on the example's own label).
        seed: None for a fresh OS-entropy secret, or an int (reproducible).

    Returns:
        A numpy array of the input's shape and dtype.

    Example:
        >>> y_noisy = privatize_labels(y_train, eps=2.0)
    """
    array = np.asarray(labels)
    layer = LabelDPLayer(eps, mode=mode, num_classes=num_classes, seed=seed)
    out = layer(array, example_ids=np.arange(array.shape[0] if array.ndim else 0, dtype=np.int64),
                prior=prior, training=True)
    return np.asarray(out).astype(array.dtype, copy=False)


def privatize_dataset(dataset, eps, mode="auto", num_classes=None, seed=None, label_index=-1):
    """Randomize the labels of a `tf.data.Dataset` once per example.

    The dataset is enumerated and each label is randomized by a pure function
    of (secret key, position), so re-iterating it (every epoch) yields the
    same noisy labels. Apply it **before** ``shuffle``/``repeat``/``batch``
    (on unbatched elements in a fixed order): after a reshuffle the positions
    would name other examples and the labels would be re-randomized.

    Args:
        dataset: a dataset of tuples ``(features, labels)`` (or longer tuples;
            ``label_index`` selects the label component). Elements are
            single examples: labels of shape () / (1,) for binary or sparse,
            (K,) for one-hot.
        eps, mode, num_classes, seed: as in `privatize_labels`.
        label_index: position of the labels in each element tuple.

    Returns:
        A dataset with the same element structure and randomized labels.

    Example:
        >>> ds = tf.data.Dataset.from_tensor_slices((x, y))
        >>> ds = privatize_dataset(ds, eps=1.0).shuffle(1000).batch(32)
    """
    layer = LabelDPLayer(eps, mode=mode, num_classes=num_classes, seed=seed)
    spec = dataset.element_spec
    if not isinstance(spec, tuple):
        raise TypeError("privatize_dataset: elements must be tuples such as (features, labels); "
                        f"got element_spec {spec!r}.")
    label_spec = spec[label_index]
    rank = label_spec.shape.rank
    if rank not in (0, 1):
        raise ValueError("privatize_dataset: apply it to unbatched elements (labels of shape () "
                         f"or (K,)); got label shape {label_spec.shape}. Use .unbatch() first.")

    def randomize(position, element):
        element = list(element)
        y = element[label_index]
        batch = tf.reshape(y, [1, -1]) if rank == 1 else tf.reshape(y, [1])
        noisy = layer(batch, example_ids=tf.reshape(position, [1]), training=True)
        element[label_index] = tf.reshape(noisy, tf.shape(y))
        return tuple(element)

    return dataset.enumerate().map(randomize, num_parallel_calls=tf.data.AUTOTUNE,
                                   deterministic=True)
