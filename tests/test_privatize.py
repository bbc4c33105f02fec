"""privatize_labels / privatize_dataset (keras_fedpriv/privatize.py): labels randomized once,
before training."""

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.backend import BackendNotSupportedError

pytestmark = [pytest.mark.jax]


def test_privatize_labels_keeps_dtype_and_is_reproducible_with_seed():
    y = np.array([0, 1] * 500, "int8")
    a = kf.privatize_labels(y, 0.3, seed=8)
    b = kf.privatize_labels(y, 0.3, seed=8)
    c = kf.privatize_labels(y, 0.3)
    assert a.dtype == np.int8 and np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_bool_one_hot_labels_come_back_as_bool_one_hot_rows():
    y = np.eye(4, dtype=bool)[np.arange(200) % 4]
    out = kf.privatize_labels(y, 0.5, seed=2)
    assert out.dtype == bool and out.shape == y.shape and np.all(out.sum(axis=1) == 1)
    assert 0.2 < np.mean(np.all(out == y, axis=1)) < 0.8  # randomized, not passed through


@pytest.mark.tensorflow_only("tf.data")
def test_a_dataset_of_bool_one_hot_labels_comes_back_as_bool_one_hot_rows():
    import tensorflow as tf

    y = np.eye(4, dtype=bool)[np.arange(200) % 4]
    ds = kf.privatize_dataset(tf.data.Dataset.from_tensor_slices((np.zeros((200, 1)), y)),
                              0.5, seed=2)
    labels = np.stack([label for _, label in ds.as_numpy_iterator()])
    assert labels.dtype == bool and np.all(labels.sum(axis=1) == 1)


@pytest.mark.skipif(keras.backend.backend() == "tensorflow", reason="tf.data works there")
def test_privatize_dataset_names_the_jax_way():
    with pytest.raises(BackendNotSupportedError, match="privatize_labels"):
        kf.privatize_dataset(object(), 1.0)
