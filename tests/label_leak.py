"""What the label-attack tests share: a split model whose follower can learn the labels only
from the leader's gradients, and the width of chance.

The follower's one feature is the example's own id (an id embedding, as for a user id); the
labels are drawn independently of it and the leader has no features. So the follower's features
say nothing about the labels: whatever its embeddings reveal, training put there, by
memorizing the labels the leader's gradients carried. Without protection the attacks find them;
with a protection at eps = 0 the embeddings are independent of the true labels (label DP: the
leader trains on coin flips; EmbeddingDP: every bit sent is a coin flip), and the attack is
exactly at chance.
"""

import functools
import math

import keras
import numpy as np

import keras_fedpriv as kf
from keras_fedpriv import backend
from keras_fedpriv.federated import MessageRecorder, VerticalModel, with_example_ids

N = 2000
EPOCHS = 4
SIGMAS = 6.5  # two-sided normal tail 8e-11


def _protections(name):
    return {"none": {}, "label_dp_eps0": {"label_dp": kf.LabelDPLayer(eps=0.0, seed=1)},
            "label_dp_eps1": {"label_dp": kf.LabelDPLayer(eps=1.0, seed=1)},
            "embedding_dp_eps0": {"embedding_dp": kf.EmbeddingDPLayer(eps=0.0, seed=2)}}[name]


@functools.lru_cache(maxsize=None)
def recorded(protection="none"):
    """(embeddings the follower sent in the last epoch, their true labels), read only."""
    rng = np.random.default_rng(0)
    y = (rng.random(N) < 0.25).astype("float32").reshape(-1, 1)  # independent of the ids
    ids = np.arange(N, dtype="int32").reshape(-1, 1)
    keras.utils.set_random_seed(0)
    bottom = keras.Sequential([keras.Input((1,), dtype="int32"), keras.layers.Embedding(N, 8),
                               keras.layers.Flatten(), keras.layers.Dense(8)])
    top = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")])
    model = VerticalModel({"party_a": bottom}, top, leader=None, **_protections(protection))
    model.compile(keras.optimizers.Adam(0.05), "binary_crossentropy",
                  jit_compile=not backend.is_tensorflow())
    recorder = MessageRecorder(epochs=(EPOCHS - 1,))
    model.fit(with_example_ids({"party_a": ids}), y, epochs=EPOCHS, batch_size=128,
              callbacks=[recorder], verbose=0)
    embeddings, labels = recorder.embeddings("party_a"), recorder.labels()
    embeddings.setflags(write=False)
    labels.setflags(write=False)
    return embeddings, labels


def auc_chance_margin(num_positives, num_negatives):
    """SIGMAS standard deviations of the ROC-AUC of a score independent of the labels (the
    Mann-Whitney statistic under a random labelling; ties only shrink it)."""
    n = num_positives + num_negatives
    return SIGMAS * math.sqrt((n + 1) / (12 * num_positives * num_negatives))


def accuracy_chance_margin(num_rows):
    """SIGMAS standard deviations of the accuracy of guesses independent of the labels (at most
    0.5 / sqrt(n)); its mean is at most the majority class's share."""
    return SIGMAS * 0.5 / math.sqrt(num_rows)


def assert_at_chance(result):
    """A `LabelInferenceResult` within the chance margins: AUC near 0.5, accuracy not above the
    majority share."""
    negatives = result.num_evaluated - result.num_positives
    assert abs(result.auc - 0.5) < auc_chance_margin(result.num_positives, negatives)
    assert result.accuracy < result.majority_accuracy + accuracy_chance_margin(
        result.num_evaluated)


def assert_deterministic(attack):
    """``attack`` (embeddings, labels, known=40, seed=3) gives the same result twice."""
    embeddings, labels = recorded("none")
    a, b = (attack(embeddings[:300], labels[:300], known=40, seed=3) for _ in range(2))
    for name in ("scores", "predictions", "known_indices"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


#: small inputs and the bad forms both attacks reject the same way
H, Y = np.random.default_rng(0).normal(size=(50, 3)), np.tile([0.0, 1.0], 25)
COMMON_BAD_INPUTS = [
    ((H[:, 0], Y), {}, ValueError, r"`embeddings` must have shape \(N, d\)"),
    ((H, Y[:49]), {}, ValueError, "`labels` has 49 rows but `embeddings` has 50"),
    ((H, Y * 2), {}, ValueError, "`labels` must be binary"),
    ((np.where(H > 2, np.inf, H), Y), {}, ValueError, "`embeddings` must contain only finite"),
    ((H, Y), {"known": 1}, ValueError, r"`known` must be an integer in \[2, N - 2\]"),
    ((H, Y), {"known": "all"}, TypeError, "`known` must be an int"),
    ((H, Y), {"seed": -1}, ValueError, "`seed`"),
]
