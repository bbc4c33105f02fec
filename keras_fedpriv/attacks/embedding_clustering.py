"""Label inference by clustering the forward embeddings.

A bottom model trained through the leader's gradients maps examples of the
same label to nearby embeddings: for a binary task the embeddings a follower
computes (and sends) tend to form two clouds, one per label. Clustering them
and naming each cluster's label steals the labels without any gradient
(Liu and Lyu, "Clustering Label Inference Attack against Practical Split
Learning", arXiv:2203.05222, 2022, who show it also works under label DP at
moderate eps: the bottom learns the randomized labels, which stay correlated
with the true ones).

`embedding_clustering` runs k-means (scikit-learn) on the embeddings and
names the clusters either from a few known labels or, with none, by the
minority prior: the smaller of two clusters is the positive class (clicks,
fraud, disease: the label worth stealing is usually the rarer one).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.attacks.known_labels import (
    LabelInferenceResult,
    choose_known_rows,
    known_and_fit_seeds,
    score_inference,
)
from keras_fedpriv.attacks.label_inference import binary_labels, as_float_matrix
from keras_fedpriv.mechanisms.validation import validate_positive_int

__all__ = ["embedding_clustering"]


def _positive_clusters(assignment, num_clusters, y, known_indices):
    """A bool per cluster: positive? From the known rows (enriched in positives), else the
    smaller of two clusters."""
    if known_indices.size == 0:
        sizes = np.bincount(assignment, minlength=2)
        return np.array([sizes[0] < sizes[1], sizes[1] <= sizes[0]])
    known_clusters, known_labels = assignment[known_indices], y[known_indices]
    overall = known_labels.mean()
    positive = np.zeros(num_clusters, dtype=bool)
    for c in range(num_clusters):
        members = known_labels[known_clusters == c]
        positive[c] = members.size > 0 and members.mean() > overall
    return positive


def embedding_clustering(embeddings: ArrayLike, labels: ArrayLike,
                         known: int | Sequence[int] | None = None, *, num_clusters: int = 2,
                         n_init: int = 10, seed: int | None = 0) -> LabelInferenceResult:
    """Cluster the embeddings (k-means) and name each cluster's label.

    The attacker sees the embeddings of every row (a follower its own bottom
    outputs; anyone on the wire the messages). It splits them into
    ``num_clusters`` k-means clusters and names each cluster's label:

    * ``known=None`` (no label known; only with 2 clusters): the smaller
      cluster is the positive class (the minority prior). With balanced
      classes this guess is a coin flip: read ``auc_best_sign`` then.
    * ``known`` given: a cluster is positive if its known rows hold a larger
      share of positives than all known rows together (a cluster without known
      rows is negative).

    Every row's guess is its cluster's label; its score (higher = positive) is
    ``d_neg - d_pos``, the squared distance to the nearest negative cluster's
    centre minus that to the nearest positive one (0 for every row when all
    clusters got the same label). ``labels`` holds the true labels of every
    row: the attack reads only the known rows' labels; the others score it.

    Args:
        embeddings: (N, d) embeddings (e.g. ``recorder.embeddings("party_a")``),
            or a list of per-step (B, d) arrays, concatenated in order.
        labels: true binary labels of the same N rows ((N,), (N, 1) or
            one-hot (N, 2)).
        known: None, how many rows' labels the attacker knows (an int k,
            drawn at random, stratified; see `choose_known_rows`), or their
            indices. The known rows are left out of the scores.
        num_clusters: k of k-means, an int >= 2 (more than 2 needs ``known``).
        n_init: k-means runs from different starts (the best is kept), >= 1;
            fewer run faster on millions of rows.
        seed: seeds k-means and the draw of the known rows (None: fresh
            entropy). With an int the result is reproducible.

    Returns:
        A `LabelInferenceResult` (``attack="embedding_clustering"``): ``auc``
        (0.5 = chance), ``accuracy`` beside ``majority_accuracy``.

    Raises:
        ValueError: bad shapes or values (as `norm_label_inference`),
            ``num_clusters`` < 2 or more than the rows, more than 2 clusters
            without ``known``, a ``known`` out of range, or only one class
            among the rows scored.
        TypeError: a ``known`` or ``num_clusters`` of the wrong type.

    Example:
        >>> result = embedding_clustering(recorder.embeddings("party_a"), recorder.labels())
        >>> result.auc, result.accuracy, result.majority_accuracy
        >>> embedding_clustering(h, y, known=40, num_clusters=4, seed=0).auc
    """
    from sklearn.cluster import KMeans

    x = as_float_matrix(embeddings, "embeddings", allow_list_of_batches=True)
    y = binary_labels(labels, x.shape[0], rows_name="embeddings")
    k = validate_positive_int(num_clusters, "num_clusters", minimum=2)
    n_init = validate_positive_int(n_init, "n_init")
    if k > x.shape[0]:
        raise ValueError(f"`num_clusters` must be at most the number of rows ({x.shape[0]}); "
                         f"got {k}.")
    if known is None and k != 2:
        raise ValueError(f"`num_clusters` must be 2 when no label is known (`known=None`: the "
                         f"smaller cluster is named positive); got {k}. Pass `known` to name "
                         f"more clusters.")
    draw_seed, fit_seed = known_and_fit_seeds(seed)
    known_indices = (np.zeros(0, dtype=np.int64) if known is None
                     else choose_known_rows(y, known, seed=draw_seed))
    kmeans = KMeans(n_clusters=k, n_init=n_init, random_state=fit_seed).fit(x)
    assignment = kmeans.labels_
    positive = _positive_clusters(assignment, k, y, known_indices)
    distances = kmeans.transform(x) ** 2
    if positive.all() or not positive.any():
        scores = np.zeros(x.shape[0])
    else:
        scores = distances[:, ~positive].min(axis=1) - distances[:, positive].min(axis=1)
    return score_inference(y, scores, positive[assignment].astype(np.int64), known_indices,
                           "embedding_clustering")
