"""Label formats of LabelDPLayer (keras_fedpriv/layers/label_formats.py): detection, conversion,
row checks."""

import re

import numpy as np
import pytest
import tensorflow as tf

import keras_fedpriv as kf
from keras_fedpriv.layers import label_formats as F


@pytest.mark.parametrize("labels,kwargs", [
    (np.array([0, 1, 1, 0], "float32"), {}),
    (np.array([[0], [1], [1], [0]], "int32"), {}),
    (np.array([0, 1, 1, 0], "int64"), {"mode": "binary"}),
    (np.eye(3, dtype="float32")[[0, 1, 2, 1]], {}),
    (np.eye(3, dtype="int32")[[0, 1, 2, 1]], {"mode": "onehot"}),
    (np.array([0, 4, 2, 3], "int64"), {"num_classes": 5}),
    (np.array([[0], [4], [2], [3]], "int32"), {"mode": "sparse", "num_classes": 5}),
])
def test_label_formats_are_preserved(labels, kwargs):
    layer = kf.LabelDPLayer(0.0, **kwargs)
    out = np.asarray(layer(labels, example_ids=np.arange(4), training=True))
    assert out.shape == labels.shape and out.dtype == labels.dtype
    if labels.ndim == 2 and labels.shape[1] > 1:
        assert np.all(out.sum(axis=1) == 1) and set(np.unique(out)) <= {0, 1}
    else:
        assert set(np.unique(out)) <= set(range(kwargs.get("num_classes", 2)))
    # At inference the labels pass through untouched (the same object).
    assert layer(labels, example_ids=np.arange(4), training=False) is labels


@pytest.mark.parametrize("shape, mode, num_classes, expected", [
    ((8,), "auto", None, ("binary", 2)),
    ((8, 1), "auto", None, ("binary", 2)),
    ((8,), "auto", 5, ("sparse", 5)),
    ((8, 1), "auto", 2, ("binary", 2)),
    ((8, 4), "auto", None, ("onehot", 4)),
    ((8, 4), "onehot", 4, ("onehot", 4)),
    ((8,), "sparse", 3, ("sparse", 3)),
])
def test_auto_mode_detection(shape, mode, num_classes, expected):
    assert F.resolve_mode(mode, shape, num_classes) == expected


@pytest.mark.parametrize("shape, mode, num_classes, fragment", [
    ((2, 3, 4), "auto", None, "rank 3"),
    ((8, 1), "onehot", None, "static K >= 2"),
    ((8, 4), "onehot", 3, "num_classes=3 but one-hot labels have 4 columns"),
    ((8, 4), "binary", None, "Use mode='onehot'"),
    ((8,), "sparse", None, "needs num_classes"),
])
def test_shapes_that_fit_no_format_are_refused(shape, mode, num_classes, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        F.resolve_mode(mode, shape, num_classes)


@pytest.mark.parametrize("labels, mode, k", [
    (np.array([0, 1, 1, 0], "float32"), "binary", 2),
    (np.array([[2], [0], [1]], "int64"), "sparse", 3),
    (np.eye(4, dtype="float16")[[3, 0, 2]], "onehot", 4),
])
def test_class_ids_round_trip_to_the_same_format(labels, mode, k):
    ids = F.to_class_ids(labels, mode)
    assert ids.dtype == tf.int32 and ids.shape == (len(labels),)
    back = F.from_class_ids(ids, labels, mode, k)
    assert back.dtype == labels.dtype
    np.testing.assert_array_equal(np.asarray(back), labels)


@pytest.mark.parametrize("labels, mode, k, bad", [
    (np.array([0, 1, 2, 1, 0.5], "float32"), "binary", 2, [2, 4]),
    (np.array([0, 3, 2, -1, 1.5], "float32"), "sparse", 3, [1, 3, 4]),
    (np.array([[1, 0], [1, 1], [0, 0], [0, 1]], "float32"), "onehot", 2, [1, 2]),
])
def test_the_graph_row_check_agrees_with_the_eager_one(labels, mode, k, bad):
    ok, rule = F.rows_ok(labels, mode, k)
    assert np.flatnonzero(~np.asarray(ok)).tolist() == bad
    assert rule.startswith(f"LabelDPLayer(mode='{mode}')")
    with pytest.raises(ValueError, match=f"row {bad[0]} "):
        F.validate_eager(labels, mode, k)
    F.validate_eager(np.delete(labels, bad, axis=0), mode, k)  # the good rows pass


def test_a_binary_prior_may_be_the_probability_of_one():
    p = np.array([0.2, 0.9], "float32")
    np.testing.assert_allclose(F.prior_matrix(p, "binary", 2), [[0.8, 0.2], [0.1, 0.9]], rtol=1e-6)
    np.testing.assert_allclose(F.prior_matrix(p[:, None], "binary", 2), [[0.8, 0.2], [0.1, 0.9]],
                               rtol=1e-6)
    with pytest.raises(ValueError, match=r"`prior` must have shape \(N, 3\)"):
        F.prior_matrix(p, "sparse", 3)
