"""privatize_labels / privatize_dataset (keras_fedpriv/privatize.py): labels randomized once,
before training."""

import numpy as np

import keras_fedpriv as kf


def test_privatize_labels_keeps_dtype_and_is_reproducible_with_seed():
    y = np.array([0, 1] * 500, "int8")
    a = kf.privatize_labels(y, 0.3, seed=8)
    b = kf.privatize_labels(y, 0.3, seed=8)
    c = kf.privatize_labels(y, 0.3)
    assert a.dtype == np.int8 and np.array_equal(a, b)
    assert not np.array_equal(a, c)
