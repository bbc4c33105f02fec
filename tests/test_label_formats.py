"""Label formats of LabelDPLayer (keras_fedpriv/layers/label_formats.py): detection, conversion, row checks."""

import numpy as np
import pytest

import keras_fedpriv as kf


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
