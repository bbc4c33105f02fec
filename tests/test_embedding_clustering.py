"""Label inference by clustering the embeddings (keras_fedpriv/attacks/embedding_clustering.py),
run on the embeddings a follower sent (`MessageRecorder`)."""

import math

import numpy as np
import pytest
from label_leak import (
    COMMON_BAD_INPUTS,
    H,
    Y,
    assert_at_chance,
    assert_deterministic,
    recorded,
)

from keras_fedpriv.attacks import LabelInferenceResult, embedding_clustering

pytestmark = [pytest.mark.jax]


def test_unprotected_embeddings_cluster_by_label():
    """The follower's id embeddings learned the labels from the gradients alone: two k-means
    clusters are the two classes, named right by the minority prior without any known label."""
    embeddings, labels = recorded("none")
    result = embedding_clustering(embeddings, labels, seed=0)
    assert isinstance(result, LabelInferenceResult) and result.attack == "embedding_clustering"
    assert result.known_indices.size == 0 and result.num_evaluated == len(labels)
    assert result.auc > 0.97
    assert result.accuracy > 0.95 > result.majority_accuracy
    with_known = embedding_clustering(embeddings, labels, known=40, num_clusters=4, seed=0)
    assert with_known.auc > 0.97 and with_known.num_evaluated == len(labels) - 40


@pytest.mark.parametrize("protection", ["label_dp_eps0", "embedding_dp_eps0"])
def test_protection_at_eps_0_leaves_the_attack_at_chance(protection):
    """Chance is the bound here, exactly. The labels are independent of the follower's feature
    (its id) and the leader has none. LabelDPLayer(eps=0) trains on coin flips independent of
    the true labels, so the embeddings do not depend on them; EmbeddingDPLayer(eps=0) flips
    every bit sent with probability 1/2, so the messages are independent of everything. The
    clusters, their names (from the cluster sizes, or from known rows drawn independently of the
    embeddings) and so the scores are independent of the labels of the rows scored: the AUC is
    the Mann-Whitney statistic of a random labelling (mean 0.5) and the accuracy's mean is at
    most the majority share; the margins are 6.5 standard deviations of each (failure
    probability < 1e-10 each)."""
    embeddings, labels = recorded(protection)
    for known, clusters in ((None, 2), (40, 2), (400, 4)):
        result = embedding_clustering(embeddings, labels, known=known, num_clusters=clusters,
                                      seed=0)
        assert_at_chance(result)


def test_label_dp_at_eps_1_holds_the_attack_to_the_randomized_response_bound():
    """With labels independent of the follower's feature, the run sees the true labels only
    through the randomized ones (y -> noisy y -> everything else), so no score computed from it
    has an expected AUC above that of the noisy labels themselves, q = e / (1 + e) = 0.731 (the
    ROC of randomized response dominates that of anything computed from its output). The
    margin is 6.5 standard deviations of an AUC near q (Var <= AUC (1 - AUC) / min(n_pos,
    n_neg)). The follower memorizes the noisy labels, so the attack comes close to q."""
    embeddings, labels = recorded("label_dp_eps1")
    result = embedding_clustering(embeddings, labels, seed=0)
    q = np.e / (1 + np.e)
    smaller = min(result.num_positives, result.num_evaluated - result.num_positives)
    assert result.auc < q + 6.5 * math.sqrt(q * (1 - q) / smaller)
    assert result.auc > q - 0.1


def test_naming_and_scores_on_separated_clouds():
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(30), np.zeros(90)]
    h = rng.normal(size=(120, 2)) * 0.1 + np.where(y[:, None] == 1, [3.0, 0.0], [0.0, 0.0])
    prior = embedding_clustering(h, y, seed=0)  # the smaller cloud (30 rows) is positive
    np.testing.assert_array_equal(prior.predictions, y)
    assert prior.auc == 1.0 and prior.accuracy == 1.0 and prior.majority_accuracy == 0.75
    assert np.all(prior.scores[y == 1] > 0) and np.all(prior.scores[y == 0] < 0)
    known = embedding_clustering(h, y, known=[0, 1, 50, 51], seed=0)
    np.testing.assert_array_equal(known.known_indices, [0, 1, 50, 51])
    assert known.accuracy == 1.0 and known.num_evaluated == 116
    flipped = embedding_clustering(h, 1 - y, seed=0)  # the prior names the wrong cloud
    assert flipped.auc == 0.0 and flipped.auc_best_sign == 1.0 and float(flipped) == 0.0
    same = embedding_clustering(h, y, known=[60, 61, 62, 0], num_clusters=2, seed=0)
    assert same.accuracy == 1.0  # the cluster of row 0 holds all the known positives


def test_one_name_for_every_cluster_gives_chance_scores():
    """Known rows all in one cloud: neither cluster holds a larger share of known positives than
    all known rows together, so both are named negative and every score is 0."""
    rng = np.random.default_rng(1)
    y = np.tile([0.0, 1.0, 0.0, 0.0], 30)
    h = rng.normal(size=(120, 2)) * 0.1 + np.where(np.arange(120)[:, None] < 60, 0.0, 3.0)
    result = embedding_clustering(h, y, known=[0, 1, 2, 3], seed=0)
    assert not result.predictions.any()
    assert result.auc == 0.5 and np.all(result.scores == 0)


def test_deterministic_given_seed():
    assert_deterministic(embedding_clustering)


@pytest.mark.parametrize("args,kwargs,err,fragment", COMMON_BAD_INPUTS + [
    ((H, np.ones(50)), {}, ValueError, "only class 1"),
    ((H, Y), {"num_clusters": 1}, ValueError, "`num_clusters`"),
    ((H, Y), {"n_init": 0}, ValueError, "`n_init`"),
    ((H, Y), {"num_clusters": 51, "known": 4}, ValueError, "`num_clusters` must be at most"),
    ((H, Y), {"num_clusters": 3}, ValueError, "`num_clusters` must be 2 when no label is known"),
    ((H, Y), {"num_clusters": 2.0}, TypeError, "`num_clusters`"),
    ((H, Y), {"known": 0}, ValueError, r"`known` must be an integer in \[2, N - 2\]"),
    ((H, Y), {"seed": 1.5}, TypeError, "`seed`"),
])
def test_bad_inputs(args, kwargs, err, fragment):
    with pytest.raises(err, match=fragment):
        embedding_clustering(*args, **kwargs)
