"""Split a data set among simulated clients: IID, or non-IID by Dirichlet(alpha) over labels.

The non-IID split is the usual label-skew benchmark (Hsu et al. 2019, "Measuring
the effects of non-identical data distribution"): for each class, the fraction
of its examples that goes to each client is drawn from Dirichlet(alpha, ...,
alpha). Small alpha (0.1) gives clients that see one or two classes; large alpha
(100) approaches the IID split.
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed

__all__ = ["partition", "partition_indices"]


def _is_dataset(value):
    """True for a `tf.data.Dataset` (checked by name: no TensorFlow import here)."""
    return any(c.__name__ in ("DatasetV2", "DatasetV1") and c.__module__.startswith("tensorflow")
               for c in type(value).__mro__)


def _rng(seed):
    return np.random.default_rng(validate_seed(seed))


def partition_indices(labels_or_n: int | ArrayLike, num_clients: int, alpha: float | None = None,
                      seed: int | None = None, min_size: int = 1,
                      max_tries: int = 100) -> list[np.ndarray]:
    """Indices of the examples of each client.

    Args:
        labels_or_n: the number of examples (IID split), or the integer class
            labels of shape (n,) or one-hot labels of shape (n, K) (needed for
            the Dirichlet split; also accepted for IID).
        num_clients: number of clients (>= 1, <= number of examples).
        alpha: None for an IID split (a random permutation cut into near-equal
            parts); a positive float for the Dirichlet(alpha) label-skew split.
        seed: None or an int for a reproducible split. The split is not
            privacy-critical, so seed=None uses a fresh OS-entropy seed.
        min_size: every client gets at least this many examples; the Dirichlet
            split is redrawn until that holds.
        max_tries: how many Dirichlet draws to try before giving up.

    Returns:
        A list of ``num_clients`` sorted int64 index arrays that partition
        ``range(n)``.

    Raises:
        ValueError: bad arguments, or no Dirichlet draw gave every client
            ``min_size`` examples (lower ``min_size``/``num_clients`` or raise
            ``alpha``).
    """
    num_clients = validate_positive_int(num_clients, "num_clients")
    min_size = validate_positive_int(min_size, "min_size", minimum=0)
    labels = None
    if isinstance(labels_or_n, numbers.Integral) and not isinstance(labels_or_n, bool):
        n = int(labels_or_n)
    else:
        labels = np.asarray(labels_or_n)
        if labels.ndim == 2:
            labels = labels.argmax(axis=1)
        if labels.ndim != 1:
            raise ValueError(f"`labels_or_n` must be a count, (n,) class ids or (n, K) one-hot "
                             f"labels; got an array of shape {labels.shape}.")
        n = labels.shape[0]
    if num_clients * max(min_size, 1) > n:
        raise ValueError(f"`num_clients`={num_clients} clients with at least "
                         f"{max(min_size, 1)} example(s) each need more than the {n} examples.")
    rng = _rng(seed)
    if alpha is None:
        return [np.sort(part) for part in np.array_split(rng.permutation(n), num_clients)]
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not (
            np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"`alpha` must be None (IID) or a finite number > 0; got {alpha!r}.")
    if labels is None:
        raise ValueError("`alpha` (the Dirichlet label-skew split) needs the labels, "
                         "not just the number of examples, in `labels_or_n`.")
    labels = labels.astype(np.int64)
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_clients, float(alpha)))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ValueError(f"no Dirichlet(alpha={alpha}) split in {max_tries} tries gave every one of "
                     f"the {num_clients} clients at least `min_size`={min_size} examples; "
                     f"raise alpha or lower min_size.")


def partition(x: ArrayLike, y: ArrayLike, num_clients: int, alpha: float | None = None,
              seed: int | None = None, min_size: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """Split arrays ``x`` and ``y`` among clients (see `partition_indices`).

    Returns:
        A list of ``(x_client, y_client)`` tuples.

    Example:
        >>> from sklearn.datasets import load_digits
        >>> x, y = load_digits(return_X_y=True)
        >>> clients = partition(x, y, num_clients=100, alpha=0.5, seed=0)
    """
    for name, value in (("x", x), ("y", y)):
        if _is_dataset(value):
            raise TypeError(f"partition: `{name}` must be an array (numpy array, list or tensor) "
                            f"of examples; got a {type(value).__name__}. Split the arrays before "
                            "building the datasets, or take the arrays out of the dataset first "
                            "(e.g. with `dataset.as_numpy_iterator()`).")
    arrays = {"x": np.asarray(x), "y": np.asarray(y)}
    for name, given in (("x", x), ("y", y)):
        if arrays[name].ndim == 0:
            raise TypeError(f"partition: `{name}` must be an array with one row per example; "
                            f"got a scalar of type {type(given).__name__}.")
    x, y = arrays["x"], arrays["y"]
    if len(x) != len(y):
        raise ValueError(f"`x` and `y` must have the same number of rows; got {len(x)} "
                         f"and {len(y)}.")
    labels = y if alpha is not None else len(y)
    return [(x[idx], y[idx])
            for idx in partition_indices(labels, num_clients, alpha, seed, min_size)]
