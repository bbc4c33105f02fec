"""Label formats of LabelDPLayer (keras_fedpriv/layers/label_formats.py): detection, conversion,
row checks."""

import re

import keras
import numpy as np
import pytest
from keras import ops

import keras_fedpriv as kf
from keras_fedpriv.layers import label_formats as F

pytestmark = [pytest.mark.jax]


def backend_dtype(array):
    """The dtype ``array`` has as a tensor of the backend (JAX without x64: int64 -> int32)."""
    return np.asarray(ops.convert_to_tensor(array)).dtype


@pytest.mark.parametrize("labels,kwargs", [
    (np.array([0, 1, 1, 0], "float32"), {}),
    (np.array([[0], [1], [1], [0]], "int32"), {}),
    (np.array([0, 1, 1, 0], "int64"), {"mode": "binary"}),
    (np.eye(3, dtype="float32")[[0, 1, 2, 1]], {}),
    (np.eye(3, dtype="int32")[[0, 1, 2, 1]], {"mode": "onehot"}),
    (np.array([0, 4, 2, 3], "int64"), {"num_classes": 5}),
    (np.array([[0], [4], [2], [3]], "int32"), {"mode": "sparse", "num_classes": 5}),
    (np.eye(3, dtype=bool)[[0, 1, 2, 1]], {}),
    (np.array([True, False, False, True]), {}),
])
def test_label_formats_are_preserved(labels, kwargs):
    layer = kf.LabelDPLayer(0.0, **kwargs)
    out = np.asarray(layer(labels, example_ids=np.arange(4), training=True))
    assert out.shape == labels.shape and out.dtype == backend_dtype(labels)
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
    assert keras.backend.standardize_dtype(ids.dtype) == "int32" and ids.shape == (len(labels),)
    back = F.from_class_ids(ids, labels, mode, k)
    assert np.asarray(back).dtype == backend_dtype(labels)
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


def test_the_prior_is_checked_row_by_row_the_same_in_a_graph_and_eagerly():
    """Rows of class probabilities pass (a low-precision softmax sums within 0.01); NaN,
    values outside [0, 1] and sums other than 1 are named by row, never by value."""
    good = np.array([[0.2, 0.3, 0.5], [0.334, 0.333, 0.336], [1.0, 0.0, 0.0]], "float32")
    bad = np.array([[0.2, np.nan, 0.8], [1.2, -0.2, 0.0], [0.0, 0.0, 0.0], [0.4, 0.4, 0.4]],
                   "float32")
    p = np.concatenate([good, bad])
    np.testing.assert_array_equal(F.prior_rows_ok(ops.convert_to_tensor(p)), [True] * 3 + [False] * 4)
    out, ok, asserts = F.check_prior(good, "onehot", 3, 3, eager=True)
    assert ok is None and not asserts and out.shape == (3, 3)
    for row, what in [(0, "a NaN or infinite value"), (1, "a value outside"),
                      (2, "a sum other than 1"), (3, "a sum other than 1")]:
        with pytest.raises(ValueError, match=f"row 3 has {what}") as info:
            F.check_prior(np.concatenate([good, bad[row:row + 1]]), "onehot", 3, 4, eager=True)
        assert "0.4" not in str(info.value) and "1.2" not in str(info.value)
    with pytest.raises(ValueError, match=r"`prior` must have shape \(N, 3\) with one row per "
                                         r"label; got 3 rows for 4 labels"):
        F.check_prior(good, "onehot", 3, 4, eager=True)
    with pytest.raises(TypeError, match="`prior` must be a numeric array"):
        F.check_prior(np.array([["a", "b", "c"]]), "onehot", 3, 1, eager=True)


@pytest.mark.tensorflow_only("a batch whose size is known only when the graph runs (JAX's "
                             "shapes are static)")
def test_a_prior_of_the_wrong_length_in_a_graph_is_flagged_and_padded():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, 2]), tf.TensorSpec([], tf.int32)],
                 jit_compile=True)  # as under XLA: the asserts do not run
    def check(p, n):
        out, ok, _ = F.check_prior(p, "onehot", 2, n, eager=False)
        return out, ok

    p = np.array([[0.5, 0.5], [0.1, 0.9]], "float32")
    out, ok = check(p, 2)
    assert bool(ok) and out.shape == (2, 2)
    out, ok = check(p, 3)  # one row short: padded with a uniform row so shapes match
    assert not bool(ok) and out.shape == (3, 2)
    np.testing.assert_allclose(out[2], [0.5, 0.5])
    out, ok = check(p, 1)
    assert not bool(ok) and out.shape == (1, 2)
