"""Splitting a data set among simulated clients (keras_fedpriv/federated/partition.py): IID and
Dirichlet label skew."""

import numpy as np
import pytest

from keras_fedpriv.federated import partition_indices
from digits_stubs import digits

pytestmark = [pytest.mark.jax]


def test_iid_partition_covers_every_row_once_in_near_equal_parts():
    parts = partition_indices(1000, 7, seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))


def test_dirichlet_partition_skews_labels_and_is_reproducible():
    _, y = digits()
    skewed = partition_indices(y, 50, alpha=0.1, seed=0)
    mild = partition_indices(y, 50, alpha=100.0, seed=0)
    assert np.array_equal(np.sort(np.concatenate(skewed)), np.arange(len(y)))
    classes = lambda parts: np.mean([len(np.unique(y[p])) for p in parts])  # noqa: E731
    assert classes(skewed) < 4 < 8 < classes(mild)
    again = partition_indices(y, 50, alpha=0.1, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(skewed, again))
    assert min(len(p) for p in skewed) >= 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(labels_or_n=10, num_clients=11), "num_clients"),
    (dict(labels_or_n=10, num_clients=0), "num_clients"),
    (dict(labels_or_n=np.zeros(10, int), num_clients=2, alpha=0.0), "alpha"),
    (dict(labels_or_n=np.zeros(10, int), num_clients=2, alpha=float("nan")), "alpha"),
    (dict(labels_or_n=10, num_clients=2, alpha=1.0), "labels"),
])
def test_partition_rejects_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        partition_indices(**kwargs)
