"""Label attacks that guess every label: the few labels the attacker knows, and the score.

`model_completion` and `embedding_clustering` output a guess of each
example's binary label (and a score, higher = more likely positive). The
attacker may know the true labels of a few examples (``known``, as in Fu et
al., "Label Inference Attacks Against Vertical Federated Learning", USENIX
Security 2022, where 40 to a few hundred known labels suffice); those rows
are then left out of the scores, which measure what the attack *inferred*.

`choose_known_rows` picks the known rows (stratified: the attacker knows
some examples of each class) and `LabelInferenceResult` holds the outcome.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.attacks.label_inference import binary_labels, check_both_classes
from keras_fedpriv.mechanisms.validation import validate_seed

__all__ = ["LabelInferenceResult", "choose_known_rows", "known_and_fit_seeds"]


@dataclasses.dataclass(frozen=True, eq=False)
class LabelInferenceResult:
    """Outcome of a label attack that guesses every example's label.

    All metrics are computed on the rows the attacker did **not** know (the
    known rows are left out): what it inferred.

    Attributes:
        auc: ROC-AUC of ``scores`` against the true labels, read the way the
            attack itself reads its scores (higher = positive). The attack
            chose that reading (from its known labels or its prior), so an
            ``auc`` below 0.5 is an attack that misread, not a reversed
            success. 0.5 = chance, 1.0 = perfect recovery.
        accuracy: fraction of the inferred rows whose guessed label
            (``predictions``) is the true one.
        majority_accuracy: the accuracy of guessing the majority class of the
            inferred rows for every row: what accuracy means "nothing
            learned" (with 25% positives, 0.75).
        scores: float64 (N,), the attack's score of every row, higher = more
            likely positive (known rows included; read only).
        predictions: int64 (N,), the guessed label (0/1) of every row (read only).
        known_indices: int64 (k,), the rows whose labels the attacker used
            (sorted; empty if none; read only).
        num_evaluated: number of rows scored (N - k).
        num_positives: positives among them.
        attack: ``"model_completion"`` or ``"embedding_clustering"``.
    """

    auc: float
    accuracy: float
    majority_accuracy: float
    scores: np.ndarray
    predictions: np.ndarray
    known_indices: np.ndarray
    num_evaluated: int
    num_positives: int
    attack: str

    @property
    def auc_best_sign(self) -> float:
        """``max(auc, 1 - auc)``: the reading of `AttackResult.auc` (the norm and direction
        attacks), for tables that put every label attack side by side."""
        return max(self.auc, 1.0 - self.auc)

    def __float__(self):
        return float(self.auc)


def _readonly(array, dtype):
    array = np.array(array, dtype=dtype)
    array.setflags(write=False)
    return array


def known_and_fit_seeds(seed: int | None) -> tuple[int, int]:
    """Two seeds from an attack's ``seed`` (validated; None: fresh entropy): one for the
    draw of the known rows (`choose_known_rows`), one for fitting the attack's model.

    Example:
        >>> draw_seed, fit_seed = known_and_fit_seeds(0)   # the same pair for the same seed
    """
    rng = np.random.default_rng(validate_seed(seed))
    draw_seed, fit_seed = (int(s) for s in rng.integers(0, 2**31 - 1, size=2))
    return draw_seed, fit_seed


def choose_known_rows(labels: ArrayLike, known: Any, seed: int | None = 0) -> np.ndarray:
    """The rows whose labels the attacker knows: stratified, or as given.

    Args:
        labels: the true binary labels of the N rows ((N,), (N, 1) or one-hot
            (N, 2)); both classes must be present.
        known: an int k in ``[2, N - 2]``: k rows drawn at random, stratified
            (``round(k * positive rate)`` positives, at least one of each
            class, at most all but one of each class); or a sequence of
            distinct row indices in ``[0, N)`` (any classes).
        seed: seeds the draw (None: fresh entropy).

    Returns:
        The sorted int64 row indices.

    Raises:
        TypeError: ``known`` neither an int nor a sequence of ints.
        ValueError: k out of range, indices out of range or repeated.

    Example:
        >>> choose_known_rows(y_true, 40, seed=0)   # 40 rows, about 25% of them positive
    """
    y = binary_labels(labels, np.shape(labels)[0] if np.ndim(labels) else 0, rows_name="labels")
    n = y.size
    check_both_classes(y)
    seed = validate_seed(seed)
    if isinstance(known, (bool, np.bool_)):
        raise TypeError(f"`known` must be an int or a sequence of row indices; got {known!r}.")
    if isinstance(known, numbers.Integral):
        k = int(known)
        if not 2 <= k <= n - 2:
            raise ValueError(f"`known` must be an integer in [2, N - 2] = [2, {n - 2}] (at "
                             f"least one known row of each class, and rows left to infer); "
                             f"got {k}.")
        rng = np.random.default_rng(seed)
        positives, negatives = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
        k_pos = int(round(k * positives.size / n))
        k_pos = min(max(k_pos, 1, k - (negatives.size - 1)), positives.size - 1, k - 1)
        chosen = np.concatenate([rng.choice(positives, k_pos, replace=False),
                                 rng.choice(negatives, k - k_pos, replace=False)])
        return np.sort(chosen).astype(np.int64)
    try:
        indices = np.asarray(known)
    except Exception:  # ragged lists and the like
        indices = np.asarray([], dtype=object)
    if indices.ndim != 1 or indices.size == 0 or not np.issubdtype(indices.dtype, np.integer):
        raise TypeError(f"`known` must be an int or a non-empty 1-D sequence of integer row "
                        f"indices; got {type(known).__name__} of shape {np.shape(indices)} "
                        f"and dtype {indices.dtype}.")
    bad = np.flatnonzero((indices < 0) | (indices >= n))
    if bad.size:
        raise ValueError(f"`known`: every row index must be in [0, {n}); position "
                         f"{int(bad[0])} is {int(indices[bad[0]])}.")
    if np.unique(indices).size != indices.size:
        raise ValueError("`known`: the row indices must be distinct; some row appears twice.")
    if indices.size > n - 2:
        raise ValueError(f"`known` names {indices.size} of the {n} rows; leave at least 2 rows "
                         f"to infer.")
    return np.sort(indices).astype(np.int64)


def score_inference(y: np.ndarray, scores: np.ndarray, predictions: np.ndarray,
                    known_indices: np.ndarray, attack: str) -> LabelInferenceResult:
    """Score an attack's guesses on the rows it did not know (y: int64 (N,) true labels)."""
    from sklearn.metrics import roc_auc_score

    keep = np.ones(y.size, dtype=bool)
    keep[known_indices] = False
    positives = check_both_classes(y[keep], what=" (of the rows the attacker did not know)")
    evaluated = int(keep.sum())
    return LabelInferenceResult(
        auc=float(roc_auc_score(y[keep], scores[keep])),
        accuracy=float(np.mean(predictions[keep] == y[keep])),
        majority_accuracy=max(positives, evaluated - positives) / evaluated,
        scores=_readonly(scores, np.float64), predictions=_readonly(predictions, np.int64),
        known_indices=_readonly(known_indices, np.int64), num_evaluated=evaluated,
        num_positives=positives, attack=attack)
