"""What the parties agree on: the model's layout, the parties' names and the example ids.

Every party builds the same `VerticalModel` and keeps only its half
(`split_parties`). The split is public: which party holds which columns, the
bottoms' shapes, the eps of each protection. The data and the protections'
secret keys are not: each party loads its own columns and draws its own keys
(no seeds here: fresh OS entropy in each party's process, kept in its node
state).
"""

import keras
import numpy as np

import keras_fedpriv as kf
from keras_fedpriv.datasets import breast_cancer_vertical
from keras_fedpriv.federated import VerticalModel

FOLLOWERS = {"f1": slice(0, 8), "f2": slice(8, 15)}  # the followers' columns of the 15
LEADER = "leader"
LABEL_EPS, EMBEDDING_EPS = 2.0, 4.0
# what a run sets (the run config of pyproject.toml overrides them per run)
EPOCHS, BATCH_SIZE, BATCHES_PER_MESSAGE, LEARNING_RATE = 2, 32, 13, 0.01


def model_fn(seed=None):
    """The whole model's layout; each party keeps its own half of it.

    Args:
        seed: None (a deployment: every protection draws its secret key from OS entropy) or
            an int that seeds the protections and the initial weights (reproducible runs in
            one process, e.g. bench/vertical_k.py).
    """
    base = 0 if seed is None else 1000 * (int(seed) + 1)
    seeds = iter(range(base, base + 100))  # public initial weights: the same in every process

    def dense(units, **kwargs):
        return keras.layers.Dense(units, kernel_initializer=keras.initializers.GlorotUniform(
            seed=next(seeds)), **kwargs)

    def bottom(k, name):
        return keras.Sequential([keras.Input((k,)), dense(8, activation="relu"), dense(4)],
                                name=name)

    bottoms = {"f1": bottom(8, "bottom_f1"), "f2": bottom(7, "bottom_f2"),
               LEADER: bottom(15, "bottom_leader")}
    top = keras.Sequential([keras.Input((12,)), dense(8, activation="relu"),
                            dense(1, activation="sigmoid")], name="top")
    model = VerticalModel(bottoms, top, leader=LEADER,
                          embedding_dp=kf.EmbeddingDPLayer(eps=EMBEDDING_EPS, seed=seed),
                          label_dp=kf.LabelDPLayer(eps=LABEL_EPS, seed=seed))
    model.compile(keras.optimizers.Adam(LEARNING_RATE), "binary_crossentropy")
    return model


def _data():
    # breast_cancer_vertical: (follower features, leader features, labels) x (train, test)
    return breast_cancer_vertical()


def example_ids():
    """The ids all parties use for the training and the test rows (a public index)."""
    x_a, _, _, x_a_test, _, _ = _data()
    n, m = len(x_a), len(x_a_test)
    return np.arange(n), np.arange(n, n + m)


def follower_features(party):
    """A follower's own columns of every row it may be asked for (training and test ids)."""
    x_a, _, _, x_a_test, _, _ = _data()
    return np.concatenate([x_a, x_a_test])[:, FOLLOWERS[party]]


def leader_data():
    """The leader's training examples: ids, its own features and the labels."""
    _, x_b, y, _, _, _ = _data()
    return example_ids()[0], x_b, y


def leader_validation():
    """The leader's held-out examples, scored after every epoch."""
    _, _, _, _, x_b_test, y_test = _data()
    return example_ids()[1], x_b_test, y_test
