"""Paths around the label and embedding mechanisms that must not leak (issue 11).

Each test fails on the code before the fix and names its case in its docstring.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_fedpriv as kf

RNG = np.random.default_rng(11)


def test_privatize_dataset_randomizes_y_not_sample_weight():
    """Case 1: (x, y, sample_weight) elements: y is randomized, the weights are untouched."""
    n = 400
    x = np.zeros((n, 2), "float32")
    y = (np.arange(n) % 2).astype("float32")
    w = np.ones(n, "float32")
    out = list(kf.privatize_dataset(tf.data.Dataset.from_tensor_slices((x, y, w)), eps=0.0,
                                    seed=3))
    noisy = np.array([e[1].numpy() for e in out])
    np.testing.assert_array_equal([e[2].numpy() for e in out], w)
    assert 0.35 < np.mean(noisy != y) < 0.65  # eps=0: labels are coin flips


def test_privatize_dataset_never_guesses_the_label_position():
    """Case 1: dicts and tuples of other lengths need an explicit label_key."""
    n = 10
    d = tf.data.Dataset.from_tensor_slices({"x": np.zeros((n, 2), "float32"),
                                            "label": np.zeros(n, "float32")})
    with pytest.raises(ValueError, match="label_key"):
        kf.privatize_dataset(d, eps=1.0)
    out = list(kf.privatize_dataset(d, eps=0.0, seed=1, label_key="label"))
    assert set(out[0]) == {"x", "label"}
    four = tf.data.Dataset.from_tensor_slices((np.zeros(n), np.zeros(n), np.zeros(n),
                                               np.zeros(n)))
    with pytest.raises(ValueError, match="label_key"):
        kf.privatize_dataset(four, eps=1.0)
    with pytest.raises(ValueError, match="label_key"):
        kf.privatize_dataset(four, eps=1.0, label_key=-1)
