"""Label inference from cut-layer gradients in binary vertical FL (Li et al., ICLR 2022).

In split learning / vertical FL the leader holds the labels and the top model;
a follower sends its embedding ``h`` and receives back ``dL/dh``, the gradient
of the (batch) loss with respect to its embedding: the *cut gradient*. For a
sigmoid binary cross-entropy loss, ``dL/dh = (p - y) * dlogit/dh / B``, so the
label leaks through both the **norm** (with imbalanced classes, the minority
positives have ``|p - y|`` close to 1 while the negatives have it close to 0)
and the **direction** (``p - y`` changes sign with the label).

Both attacks here are run by the follower on the gradients it received; their
metric is the ROC-AUC of the attack score against the true labels, read in the
attacker's favour (``max(AUC, 1 - AUC)``: a reversed score is as informative):
0.5 is chance, 1.0 is perfect recovery (see ``docs/attacks.md``).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["AttackResult", "norm_label_inference", "direction_label_inference"]


@dataclasses.dataclass(frozen=True, eq=False)
class AttackResult:
    """Outcome of a label-inference attack.

    Attributes:
        auc: the attacker's strength, ``max(raw_auc, 1 - raw_auc)``: 0.5 is
            chance, 1.0 means the score splits the classes perfectly. An
            attacker who sees a score ordered the "wrong" way round just reads
            it the other way, so an ``raw_auc`` of 0.18 is an attack of
            strength 0.82, not protection. ``direction`` says which reading
            gives it.
        raw_auc: ROC-AUC of ``scores`` against the true labels (positive class
            = label 1) with the paper's convention that a *higher* score means
            "positive" (for the norm attack: the positive, minority class has
            the larger gradients). Below 0.5 the ordering is reversed.
        direction: ``"higher score = positive"`` when ``raw_auc >= 0.5``,
            else ``"lower score = positive"``: the reading that reaches
            ``auc``. (Knowing it needs a few labels or a guess; with
            ``raw_auc`` close to 0.5 either reading is chance.)
        scores: float64 array (N,), the attack score of every row (read only).
        num_evaluated: number of rows used in the AUC (N, or N - 1 for the
            direction attack, which leaves out the known example).
        num_positives: number of positive rows among those evaluated.
        attack: ``"norm"`` or ``"direction"``.
    """

    auc: float
    raw_auc: float
    direction: str
    scores: np.ndarray
    num_evaluated: int
    num_positives: int
    attack: str

    @property
    def auc_best_sign(self) -> float:
        """Same as ``auc`` (``max(raw_auc, 1 - raw_auc)``); kept for older code."""
        return self.auc

    def __float__(self):
        return float(self.auc)


# --------------------------------------------------------------------------- validation


def _shape_str(shape):
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _to_numpy(value, name):
    """numpy array of ``value`` (numpy, tf tensor, nested list); numeric dtypes only."""
    try:
        array = np.asarray(value)
    except Exception as exc:  # ragged lists, symbolic tensors, ...
        raise ValueError(f"`{name}` must be a numeric array or tensor; could not convert a "
                         f"{type(value).__name__}: {exc}") from None
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number)
                                     or array.dtype == np.bool_):
        raise ValueError(f"`{name}` must be a numeric array or tensor; got dtype {array.dtype}.")
    return array


def _check_finite(array, name):
    if not np.all(np.isfinite(array)):
        bad = np.argwhere(~np.isfinite(array))[0]
        raise ValueError(f"`{name}` must contain only finite numbers (no NaN or inf); "
                         f"entry {tuple(int(i) for i in bad)} is {array[tuple(bad)].item()!r}.")


def as_float_matrix(value: Any, name: str, *, allow_list_of_batches: bool = False) -> np.ndarray:
    """Validate a rank-2 numeric, finite, non-empty input and return it as float64 (N, d).

    With ``allow_list_of_batches``, a list/tuple of per-step (B_i, d) arrays or
    tensors is concatenated along the first axis (in order).
    """
    if allow_list_of_batches and isinstance(value, (list, tuple)) and len(value) > 0 \
            and all(np.ndim(v) == 2 for v in value):
        parts = [_to_numpy(v, name) for v in value]
        widths = sorted({p.shape[1] for p in parts})
        if len(widths) > 1:
            raise ValueError(f"`{name}`: the per-step batches must all have the same width d; "
                             f"got widths {widths}.")
        array = np.concatenate(parts, axis=0)
    else:
        array = _to_numpy(value, name)
    if array.ndim != 2:
        extra = (" or a list of per-step (B, d) arrays" if allow_list_of_batches else "")
        raise ValueError(f"`{name}` must have shape (N, d){extra}; got shape "
                         f"{_shape_str(array.shape)} (rank {array.ndim}). Reshape higher-rank "
                         f"embeddings or gradients to (N, -1) first.")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"`{name}` must have at least one row and one column; got shape "
                         f"{_shape_str(array.shape)}.")
    array = array.astype(np.float64)
    _check_finite(array, name)
    return array


def binary_labels(labels, num_rows, rows_name="cut_gradients"):
    """Validate binary labels ((N,), (N, 1) 0/1 or one-hot (N, 2)) and return int64 (N,)."""
    name = "labels"
    allowed = "binary 0/1 labels of shape (N,) or (N, 1), or one-hot labels of shape (N, 2)"
    array = _to_numpy(labels, name)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim == 2 and array.shape[1] == 2:
        onehot = True
    elif array.ndim == 1:
        onehot = False
    else:
        raise ValueError(f"`{name}` must be {allowed}; got shape {_shape_str(array.shape)}.")
    if array.shape[0] != num_rows:
        raise ValueError(f"`{name}` has {array.shape[0]} rows but `{rows_name}` has {num_rows}; "
                         f"they must describe the same examples in the same order.")
    values = array.astype(np.float64)
    if not np.all(np.isfinite(values)):
        row = int(np.argwhere(~np.isfinite(values))[0][0])
        raise ValueError(f"`{name}` must be {allowed}; row {row} has value {array[row].item()!r}.")
    if onehot:
        bad = np.flatnonzero(~np.all((values == 0) | (values == 1), axis=1)
                             | (values.sum(axis=1) != 1))
        if bad.size:
            row = int(bad[0])
            raise ValueError(f"`{name}` looks one-hot (shape {_shape_str(array.shape)}): every "
                             f"row must be [1, 0] or [0, 1]; row {row} is {values[row].tolist()}.")
        return values[:, 1].astype(np.int64)
    bad = np.flatnonzero((values != 0) & (values != 1))
    if bad.size:
        row = int(bad[0])
        raise ValueError(f"`{name}` must be {allowed} (the attacks are binary); row {row} has "
                         f"value {array[row].item()!r}.")
    return values.astype(np.int64)


def check_both_classes(y, what=""):
    """The number of positives in 0/1 labels ``y``, or a ValueError when only one class is
    present (an AUC needs both). Example: ``check_both_classes(np.array([0, 1, 1]))`` is 2."""
    positives = int(y.sum())
    if positives == 0 or positives == y.size:
        only = 1 if positives else 0
        raise ValueError(f"`labels`{what} contain only class {only} ({y.size} rows); the AUC is "
                         f"undefined unless both classes 0 and 1 are present.")
    return positives


def _auc(y, scores):
    from sklearn.metrics import roc_auc_score

    raw = float(roc_auc_score(y, scores))
    direction = "higher score = positive" if raw >= 0.5 else "lower score = positive"
    return {"auc": max(raw, 1.0 - raw), "raw_auc": raw, "direction": direction}


def _freeze(array):
    array = np.array(array, dtype=np.float64)
    array.setflags(write=False)
    return array


# --------------------------------------------------------------------------- attacks


def norm_label_inference(cut_gradients: ArrayLike, labels: ArrayLike) -> AttackResult:
    """Norm-based label inference (Li et al., ICLR 2022).

    The attacker is a follower in binary vertical FL that records, for each
    example, the gradient it receives at the cut layer. It scores each example
    by the L2 norm of that gradient: with imbalanced classes the minority
    positives get much larger gradients. It needs no labels at all; the
    labels here are only for measuring the attack.

    Args:
        cut_gradients: (N, d) array or tensor, row ``i`` the gradient of the
            loss with respect to the follower's embedding of example ``i``;
            or a list of per-step (B, d) arrays/tensors, concatenated in order.
        labels: true labels of the same N examples: binary 0/1 of shape (N,)
            or (N, 1), or one-hot (N, 2) (column 1 = positive).

    Returns:
        An `AttackResult` with ``scores`` = the row norms, ``raw_auc`` =
        ROC-AUC of the norms against the labels (higher norm = positive),
        ``auc`` = ``max(raw_auc, 1 - raw_auc)`` (the attacker's strength) and
        ``direction`` (which reading of the norms reaches ``auc``).

    Raises:
        ValueError: wrong shapes, mismatched lengths, NaN/inf, labels other
            than 0/1, or only one class present (the AUC is undefined).

    Example:
        >>> result = norm_label_inference(recorded_grads, y_true)
        >>> result.auc   # 0.5 = chance, 1.0 = the labels leak completely
        >>> result.raw_auc, result.direction   # the score as ordered, and how to read it
    """
    grads = as_float_matrix(cut_gradients, "cut_gradients", allow_list_of_batches=True)
    y = binary_labels(labels, grads.shape[0])
    positives = check_both_classes(y)
    scores = np.linalg.norm(grads, axis=1)
    aucs = _auc(y, scores)
    return AttackResult(**aucs, scores=_freeze(scores),
                        num_evaluated=int(y.size), num_positives=positives, attack="norm")


def direction_label_inference(cut_gradients: ArrayLike, labels: ArrayLike,
                              known_positive_index: int) -> AttackResult:
    """Direction-based label inference (Li et al., ICLR 2022).

    The attacker is a follower that knows the label of **one** positive
    example (``known_positive_index``). It scores every example by the cosine
    similarity of its cut gradient to that example's gradient: gradients of
    same-label examples point the same way, those of the other class the
    opposite way. Rows with a zero gradient get cosine 0.

    The known example is left out of the AUC (its cosine to itself is 1 and
    its label is not something the attacker infers); its entry in ``scores``
    is still returned (1.0).

    Args:
        cut_gradients: (N, d) array or tensor, or a list of per-step (B, d)
            arrays/tensors (concatenated in order), as in `norm_label_inference`.
        labels: true binary labels of the same N rows ((N,), (N, 1) or
            one-hot (N, 2)).
        known_positive_index: integer in ``[0, N)``, the row whose label (1)
            the attacker knows; it must be positive and have a non-zero
            gradient.

    Returns:
        An `AttackResult` with ``scores`` = cosine similarities (N,),
        ``raw_auc`` over the other N - 1 rows (higher cosine = positive),
        ``auc`` = ``max(raw_auc, 1 - raw_auc)`` (the attacker's strength) and
        ``direction``.

    Raises:
        TypeError: if ``known_positive_index`` is not an integer.
        ValueError: bad shapes or values (as `norm_label_inference`), an index
            out of range, a known row that is not positive or has a zero
            gradient, or only one class among the other rows.

    Example:
        >>> idx = int(np.flatnonzero(y_true == 1)[0])
        >>> direction_label_inference(recorded_grads, y_true, idx).auc
    """
    grads = as_float_matrix(cut_gradients, "cut_gradients", allow_list_of_batches=True)
    y = binary_labels(labels, grads.shape[0])
    n = grads.shape[0]
    check_both_classes(y)
    idx = known_positive_index
    if isinstance(idx, (bool, np.bool_)) or not isinstance(idx, numbers.Integral):
        raise TypeError(f"`known_positive_index` must be an integer in [0, {n}); got {idx!r} "
                        f"of type {type(idx).__name__}.")
    idx = int(idx)
    if not 0 <= idx < n:
        raise ValueError(f"`known_positive_index` must be an integer in [0, {n}) (a row of "
                         f"`cut_gradients`); got {idx}.")
    if y[idx] != 1:
        raise ValueError(f"`known_positive_index` must name a positive example (label 1); "
                         f"row {idx} has label {int(y[idx])}.")
    reference = grads[idx]
    ref_norm = np.linalg.norm(reference)
    if ref_norm == 0:
        raise ValueError(f"`known_positive_index`: the gradient of row {idx} is all zeros, so no "
                         f"direction can be compared with it; pick another positive example.")
    norms = np.linalg.norm(grads, axis=1)
    dots = grads @ (reference / ref_norm)
    scores = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
    scores = np.clip(scores, -1.0, 1.0)
    keep = np.ones(n, dtype=bool)
    keep[idx] = False
    positives = check_both_classes(y[keep], what=" (without the known example)")
    aucs = _auc(y[keep], scores[keep])
    return AttackResult(**aucs, scores=_freeze(scores),
                        num_evaluated=int(n - 1), num_positives=positives, attack="direction")
