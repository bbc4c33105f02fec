"""The rows a label attack knows and the result it reports
(keras_fedpriv/attacks/known_labels.py)."""

import numpy as np
import pytest

from keras_fedpriv.attacks import LabelInferenceResult, choose_known_rows
from keras_fedpriv.attacks.known_labels import score_inference

pytestmark = [pytest.mark.jax]

Y = (np.arange(1000) % 4 == 0).astype(float)  # 25% positives


@pytest.mark.parametrize("k,positives", [(40, 10), (400, 100), (2, 1), (3, 1), (998, 249)])
def test_stratified_draw(k, positives):
    rows = choose_known_rows(Y, k, seed=0)
    assert rows.dtype == np.int64 and rows.size == k and np.all(np.diff(rows) > 0)
    assert int(Y[rows].sum()) == positives
    assert 0 < Y[rows].sum() < k and Y[rows].sum() < 250 and k - Y[rows].sum() < 750


def test_draw_is_seeded_and_one_hot_labels_work():
    np.testing.assert_array_equal(choose_known_rows(Y, 40, seed=1), choose_known_rows(Y, 40, 1))
    assert not np.array_equal(choose_known_rows(Y, 40, seed=1), choose_known_rows(Y, 40, 2))
    one_hot = np.stack([1 - Y, Y], axis=1)
    np.testing.assert_array_equal(choose_known_rows(one_hot, 40, 1), choose_known_rows(Y, 40, 1))
    np.testing.assert_array_equal(choose_known_rows(Y, [5, 3, 9]), [3, 5, 9])


def test_score_leaves_the_known_rows_out():
    y = np.array([1, 0, 1, 0, 0, 0])
    scores = np.array([0.0, 1.0, 0.9, 0.1, 0.2, 0.3])  # rows 0 and 1 are known and misread
    result = score_inference(y, scores, (scores >= 0.5).astype(np.int64), np.array([0, 1]), "x")
    assert isinstance(result, LabelInferenceResult)
    assert result.auc == 1.0 and result.accuracy == 1.0 and result.majority_accuracy == 0.75
    assert result.num_evaluated == 4 and result.num_positives == 1
    assert result.auc_best_sign == 1.0 and float(result) == 1.0
    with pytest.raises(AttributeError):
        result.auc = 0.5
    with pytest.raises(ValueError):
        result.scores[0] = 1.0
    with pytest.raises(ValueError, match="only class 0"):
        score_inference(y, scores, y, np.array([0, 2]), "x")


@pytest.mark.parametrize("labels,known,err,fragment", [
    (Y, 1, ValueError, r"\[2, N - 2\] = \[2, 998\]"),
    (Y, 999, ValueError, r"\[2, N - 2\]"),
    (Y, [[1, 2]], TypeError, "1-D sequence"),
    (Y, [], TypeError, "non-empty"),
    (Y, [0.5], TypeError, "integer row indices"),
    (Y, [-1], ValueError, r"position 0 is -1"),
    (Y, list(range(999)), ValueError, "leave at least 2 rows"),
    (np.zeros(10), 4, ValueError, "only class 0"),
    (np.float64(1.0), 4, ValueError, r"`labels` must be binary 0/1 labels of shape \(N,\)"),
])
def test_bad_known(labels, known, err, fragment):
    with pytest.raises(err, match=fragment):
        choose_known_rows(labels, known)
