"""The bad-input table of docs/bad_inputs.md: every row raises a clear error.

Each error must name the argument (or the layer and the bad row/value) and
say what is allowed; never a silent clamp.
"""

import math

import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv import mechanisms as M

pytestmark = [pytest.mark.jax]

BAD_EPS = [
    (-1.0, ValueError, ">= 0"),
    (-1e-9, ValueError, ">= 0"),
    (float("nan"), ValueError, "finite"),
    (float("inf"), ValueError, "finite"),
    (-float("inf"), ValueError, "finite"),
    (True, TypeError, "bool"),
    (np.bool_(False), TypeError, "bool"),
    ("1.0", TypeError, "str"),
    ([1.0], TypeError, "list"),
]


@pytest.mark.parametrize("eps,err,fragment", BAD_EPS)
@pytest.mark.parametrize("make", [
    lambda e: kf.LabelDPLayer(e),
    lambda e: kf.EmbeddingDPLayer(e),
    lambda e: M.flip_probability(e),
    lambda e: M.binary_randomized_response([0, 1], e),
    lambda e: M.kary_randomized_response([0, 1], 3, e),
    lambda e: M.quantize_rr(np.ones(3, "float32"), e),
    lambda e: kf.privatize_labels(np.array([0, 1]), e),
])
def test_bad_eps_everywhere(make, eps, err, fragment):
    with pytest.raises(err) as info:
        make(eps)
    message = str(info.value)
    assert "`eps`" in message and fragment in message and "finite real number" in message


def test_none_eps_only_where_allowed():
    with pytest.raises(TypeError, match="`eps`.*got None"):
        kf.LabelDPLayer(None)
    assert kf.EmbeddingDPLayer(None).eps is None  # quantization only
    np.testing.assert_array_equal(np.asarray(M.quantize_rr(np.array([-1.0, 2.0]), None)), [0.0, 1.0])


def test_eps_is_not_clamped():
    assert kf.LabelDPLayer(1000.0).eps == 1000.0  # the reference clamps to 100; we keep it
    assert M.flip_probability(1000.0) == pytest.approx(0.0, abs=1e-300)
    assert kf.LabelDPLayer(np.float32(0.5)).eps == 0.5
    assert kf.LabelDPLayer(3).eps == 3.0


@pytest.mark.parametrize("labels,fragment", [
    (np.array([[1, 1, 0], [0, 0, 1]], "float32"), "row 0 has 2 ones"),
    (np.array([[1, 0, 0], [0, 0, 0]], "float32"), "row 1 has no 1 (a row of zeros)"),
    (np.array([[1, 0, 0], [0, 0.5, 0.5]], "float32"), "row 1 has values other than 0 and 1"),
    (np.array([[0, 1], [2, -1]], "float32"), "row 1 has values other than 0 and 1"),
    (np.array([0, 1, 0.5], "float32"), "row 2 has value 0.5"),
    (np.array([0, 2, 1]), "row 1 has value 2"),
    (np.array([[0], [1], [np.nan]], "float32"), "row 2 has value nan"),
    (np.array([-1, 0]), "row 0 has value -1"),
])
def test_bad_labels_name_the_row(labels, fragment):
    with pytest.raises(ValueError) as info:
        kf.privatize_labels(labels, 1.0)
    assert "LabelDPLayer" in str(info.value) and fragment in str(info.value)


def test_bad_label_shapes():
    with pytest.raises(ValueError, match=r"rank 3"):
        kf.privatize_labels(np.zeros((2, 2, 2)), 1.0)
    with pytest.raises(ValueError, match=r"rank 0"):
        kf.LabelDPLayer(1.0)(np.float32(1.0), example_ids=np.arange(1), training=True)
    with pytest.raises(ValueError, match=r"mode='onehot'.*shape \(N, K\)"):
        kf.privatize_labels(np.zeros(4), 1.0, mode="onehot")
    with pytest.raises(ValueError, match=r"mode='binary'.*shape \(N,\) or \(N, 1\)"):
        kf.privatize_labels(np.eye(3), 1.0, mode="binary")
    with pytest.raises(ValueError, match=r"num_classes=4 but one-hot labels have 3 columns"):
        kf.privatize_labels(np.eye(3), 1.0, num_classes=4)


def test_sparse_labels():
    with pytest.raises(ValueError, match="needs `num_classes`"):
        kf.LabelDPLayer(1.0, mode="sparse")
    with pytest.raises(ValueError, match=r"class ids in \[0, 3\); row 1 has value 3"):
        kf.privatize_labels(np.array([0, 3, 1]), 1.0, mode="sparse", num_classes=3)
    with pytest.raises(ValueError, match=r"row 0 has value 1.5"):
        kf.privatize_labels(np.array([1.5, 1.0]), 1.0, mode="sparse", num_classes=3)


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="`mode` must be one of"):
        kf.LabelDPLayer(1.0, mode="multilabel")
    with pytest.raises(ValueError, match="`num_classes` must be an integer >= 2"):
        kf.LabelDPLayer(1.0, num_classes=1)
    with pytest.raises(TypeError, match="`num_classes` must be an integer"):
        kf.LabelDPLayer(1.0, num_classes=2.5)
    with pytest.raises(TypeError, match="`per_batch` must be a bool"):
        kf.LabelDPLayer(1.0, per_batch="yes")
    with pytest.raises(ValueError, match="`ste` must be one of"):
        kf.EmbeddingDPLayer(1.0, ste="sigmoid")
    with pytest.raises(TypeError, match="`at_inference` must be a bool"):
        kf.EmbeddingDPLayer(1.0, at_inference=1)
    for seed, err in [(-1, ValueError), (2**64, ValueError), (1.5, TypeError), (True, TypeError),
                      ("7", TypeError)]:
        with pytest.raises(err, match="`seed`"):
            kf.LabelDPLayer(1.0, seed=seed)


def test_label_layer_needs_ids_or_per_batch():
    with pytest.raises(ValueError, match="needs `example_ids`.*per_batch=True"):
        kf.LabelDPLayer(1.0)(np.array([0, 1]), training=True)
    with pytest.raises(ValueError, match="`example_ids` has 3 entries but there are 2 labels"):
        kf.LabelDPLayer(1.0)(np.array([0, 1]), example_ids=np.arange(3), training=True)
    with pytest.raises(TypeError, match="`example_ids` must be integers"):
        kf.LabelDPLayer(1.0)(np.array([0, 1]), example_ids=np.array([0.0, 1.0]), training=True)


def test_bad_prior_shape():
    with pytest.raises(ValueError, match=r"`prior` must have shape \(N, 3\)"):
        kf.privatize_labels(np.eye(3), 1.0, prior=np.ones((3, 4)) / 4)


def test_embedding_with_nan_or_inf():
    x = np.ones((2, 3), "float32")
    x[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"non-finite.*index \(1, 2\)"):
        kf.EmbeddingDPLayer(1.0)(x, training=True)
    x[1, 2] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        kf.EmbeddingDPLayer(None)(x, training=True)
    with pytest.raises(TypeError, match="floating"):
        kf.EmbeddingDPLayer(1.0)(np.ones((2, 3), "int32"), training=True)


@pytest.mark.tensorflow_only("graph-mode asserts of a tf.function")
def test_graph_mode_label_validation_names_the_rule():
    """In a traced (non-XLA) graph the check is an assert with the same rule."""
    import tensorflow as tf

    layer = kf.LabelDPLayer(1.0, seed=1)

    @tf.function
    def f(y):
        return layer(y, example_ids=tf.range(2, dtype=tf.int64), training=True)

    with pytest.raises(tf.errors.InvalidArgumentError, match="exactly one 1"):
        f(tf.constant([[1.0, 1.0], [0.0, 1.0]]))
    assert f(tf.constant([[1.0, 0.0], [0.0, 1.0]])).shape == (2, 2)


@pytest.mark.tensorflow_only("graph-mode asserts of a tf.function")
def test_graph_mode_embedding_nan_is_caught():
    import tensorflow as tf

    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    f = tf.function(lambda x: layer(x, training=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or inf"):
        f(tf.constant([[1.0, math.nan]]))


def test_validate_int_sequence():
    from keras_fedpriv.mechanisms.validation import validate_int_sequence
    assert validate_int_sequence([3, np.int64(4)], "units") == (3, 4)
    assert validate_int_sequence(5, "units") == (5,)
    assert validate_int_sequence((), "units") == ()
    assert validate_int_sequence(range(3), "epochs", minimum=0) == (0, 1, 2)
    for bad, err in [("12", TypeError), (True, TypeError), ([1, 2.5], TypeError),
                     ([1, True], TypeError), ([1, 0], ValueError), (None, TypeError)]:
        with pytest.raises(err, match="`units`"):
            validate_int_sequence(bad, "units")
    with pytest.raises(TypeError, match="`units`"):
        validate_int_sequence(3, "units", allow_scalar=False)
