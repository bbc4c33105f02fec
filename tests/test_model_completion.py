"""The model-completion label attack (keras_fedpriv/attacks/model_completion.py), run on the
embeddings a follower sent (`MessageRecorder`)."""

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

from keras_fedpriv.attacks import LabelInferenceResult, model_completion

pytestmark = [pytest.mark.jax]


def test_unprotected_follower_completes_the_model_from_40_labels():
    """The follower's id embeddings learned the labels from the gradients alone (its feature
    says nothing about them): 40 known labels suffice to read all the others."""
    embeddings, labels = recorded("none")
    result = model_completion(embeddings, labels, known=40, seed=0)
    assert isinstance(result, LabelInferenceResult) and result.attack == "model_completion"
    assert result.known_indices.size == 40 and result.num_evaluated == len(labels) - 40
    assert result.auc > 0.97
    assert result.accuracy > 0.95 > result.majority_accuracy
    mlp = model_completion(embeddings, labels, known=40, classifier="mlp", seed=0)
    assert mlp.auc > 0.97


@pytest.mark.parametrize("protection", ["label_dp_eps0", "embedding_dp_eps0"])
def test_protection_at_eps_0_leaves_the_attack_at_chance(protection):
    """Chance is the bound here, exactly. The labels are independent of the follower's feature
    (its id) and the leader has none. LabelDPLayer(eps=0) trains on coin flips independent of
    the true labels, so nothing in the run depends on them; EmbeddingDPLayer(eps=0) flips every
    bit sent with probability 1/2, so the messages are independent of everything. The known
    rows are drawn from the labels, independently of the embeddings, so the scores of the other
    rows are independent of their labels: the AUC is the Mann-Whitney statistic of a random
    labelling (mean 0.5) and the accuracy's mean is at most the majority share; the margins are
    6.5 standard deviations of each (failure probability < 1e-10 each)."""
    embeddings, labels = recorded(protection)
    for known, classifier in ((40, "logistic"), (400, "logistic"), (400, "mlp")):
        result = model_completion(embeddings, labels, known=known, classifier=classifier, seed=0)
        assert_at_chance(result)


def test_known_indices_and_a_custom_classifier():
    from sklearn.neighbors import KNeighborsClassifier

    embeddings, labels = recorded("none")
    known = np.concatenate([np.flatnonzero(labels[:, 0] == 1)[:10],
                            np.flatnonzero(labels[:, 0] == 0)[:30]])
    result = model_completion(embeddings, labels, known=known,
                              classifier=KNeighborsClassifier(5), seed=0)
    np.testing.assert_array_equal(result.known_indices, np.sort(known))
    assert result.auc > 0.95
    assert not result.scores.flags.writeable and not result.predictions.flags.writeable


def test_deterministic_given_seed():
    assert_deterministic(model_completion)


@pytest.mark.parametrize("args,kwargs,err,fragment", COMMON_BAD_INPUTS + [
    ((H, np.zeros(50)), {}, ValueError, "only class 0"),
    ((H, Y), {"known": 49}, ValueError, r"`known` must be an integer in \[2, N - 2\]"),
    ((H, Y), {"known": [1, 3, 5]}, ValueError, "only class 1"),
    ((H, Y), {"known": [1, 1]}, ValueError, "distinct"),
    ((H, Y), {"known": [0, 50]}, ValueError, r"in \[0, 50\)"),
    ((H, Y), {"known": 2.5}, TypeError, "`known` must be an int"),
    ((H, Y), {"known": True}, TypeError, "`known` must be an int"),
    ((H, Y), {"classifier": "forest"}, ValueError, "`classifier` must be one of"),
    ((H, Y), {"classifier": object()}, TypeError, "`classifier` must be one of"),
    ((H, Y), {"hidden_units": (0,)}, ValueError, "`hidden_units`"),
])
def test_bad_inputs(args, kwargs, err, fragment):
    with pytest.raises(err, match=fragment):
        model_completion(*args, **kwargs)
