"""What the parties agree on: the model's layout, the parties' names and the example ids.

Every party builds the same `VerticalModel` and keeps only its half
(`split_parties`). The split is public: which party holds which columns, the
bottoms' shapes, the eps of each protection. The data and the protections'
secret keys are not: each party loads its own columns and draws its own keys
(no seeds here: fresh OS entropy in each party's process, kept in its node
state).

The run config's ``dataset`` picks the data: ``"breast-cancer"`` (the leader
and the followers f1, f2) or ``"criteo-like"`` (`keras_fedpriv.criteo_like`:
``rows`` training rows of the synthetic click data, the leader and one
follower named ``"follower"`` with its 13 categorical fields, the Wide&Deep
split model of `keras_fedpriv.wide_deep`). Each party of the Criteo-like run
generates the same rows from the same public seed and keeps its own columns
(a stand-in for its own table keyed by the same example ids).
"""

import keras
import numpy as np

import keras_fedpriv as kf
from keras_fedpriv.criteo_like import FOLLOWER, CriteoLike
from keras_fedpriv.datasets import breast_cancer_vertical
from keras_fedpriv.federated import VerticalModel
from keras_fedpriv.wide_deep import wide_deep_vertical

FOLLOWERS = {"f1": slice(0, 8), "f2": slice(8, 15)}  # the followers' columns of the 15
LEADER = "leader"  # (CriteoLike's leader has the same name)
LABEL_EPS, EMBEDDING_EPS = 2.0, 4.0
# what a run sets (the run config of pyproject.toml overrides them per run)
EPOCHS, BATCH_SIZE, BATCHES_PER_MESSAGE, LEARNING_RATE = 2, 32, 13, 0.01
DATASETS = ("breast-cancer", "criteo-like")
# the Criteo-like run: the rows' generator seed and the initial weights' seed (both public),
# Adam's rate (as bench/vertical_scale.py's in-process runs)
CRITEO_SEED, CRITEO_LEARNING_RATE = 0, 3e-3


def run_data(context=None):
    """The run config's data keys, checked: ``(dataset, rows, test_rows, protect)``.

    ``rows`` and ``test-rows`` (the next rows, scored after each epoch; 0: none) count for
    the Criteo-like data only; ``protect = false`` drops LabelDP and EmbeddingDP (only to
    measure what they cost: the labels and embeddings then go out without DP).
    """
    config = {} if context is None else context.run_config
    dataset = config.get("dataset", DATASETS[0])
    if dataset not in DATASETS:
        raise ValueError(f"run config `dataset` must be one of {', '.join(DATASETS)}; got "
                         f"{dataset!r}.")
    rows, test_rows = config.get("rows", 100_000), config.get("test-rows", 10_000)
    for key, value, least in (("rows", rows, 1), ("test-rows", test_rows, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"run config `{key}` must be an integer >= {least}; got {value!r}.")
    protect = config.get("protect", True)
    if not isinstance(protect, bool):
        raise ValueError(f"run config `protect` must be true or false; got {protect!r}.")
    return dataset, rows, test_rows, protect


def model_fn(seed=None, context=None):
    """The whole model's layout; each party keeps its own half of it.

    Args:
        seed: None (a deployment: every protection draws its secret key from OS entropy) or
            an int that seeds the protections and the initial weights (reproducible runs in
            one process, e.g. bench/vertical_k.py).
        context: None (the breast-cancer model, protected) or the Flower context, whose run
            config picks the data and the protections (`run_data`).
    """
    dataset, _, _, protect = run_data(context)
    label_dp = kf.LabelDPLayer(eps=LABEL_EPS, seed=seed) if protect else None
    embedding_dp = kf.EmbeddingDPLayer(eps=EMBEDDING_EPS, seed=seed) if protect else None
    if dataset == "criteo-like":
        model = wide_deep_vertical(_criteo(context), label_dp=label_dp,
                                   embedding_dp=embedding_dp, seed=CRITEO_SEED)
        model.compile(keras.optimizers.Adam(CRITEO_LEARNING_RATE), "binary_crossentropy")
        return model
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
    model = VerticalModel(bottoms, top, leader=LEADER, embedding_dp=embedding_dp,
                          label_dp=label_dp)
    model.compile(keras.optimizers.Adam(LEARNING_RATE), "binary_crossentropy")
    return model


def _data():
    # breast_cancer_vertical: (follower features, leader features, labels) x (train, test)
    return breast_cancer_vertical()


def _criteo(context):
    return CriteoLike(run_data(context)[1], seed=CRITEO_SEED)


def _criteo_rows(context, start, stop):
    """Rows ``[start, stop)`` of the Criteo-like data: ``(example ids, x, labels)``."""
    x, y = _criteo(context).parties(start, stop)
    return x["example_ids"], x, y


def example_ids():
    """The ids all parties use for the training and the test rows (a public index)."""
    x_a, _, _, x_a_test, _, _ = _data()
    n, m = len(x_a), len(x_a_test)
    return np.arange(n), np.arange(n, n + m)


def follower_features(party, context=None):
    """A follower's own columns of every row it may be asked for (training and test ids)."""
    dataset, rows, test_rows, _ = run_data(context)
    if dataset == "criteo-like":
        return _criteo_rows(context, 0, rows + test_rows)[1][FOLLOWER]
    x_a, _, _, x_a_test, _, _ = _data()
    return np.concatenate([x_a, x_a_test])[:, FOLLOWERS[party]]


def leader_data(context=None):
    """The leader's training examples: ids, its own features and the labels."""
    dataset, rows, _, _ = run_data(context)
    if dataset == "criteo-like":
        ids, x, y = _criteo_rows(context, 0, rows)
        return ids, x[LEADER], y
    _, x_b, y, _, _, _ = _data()
    return example_ids()[0], x_b, y


def leader_validation(context=None):
    """The leader's held-out examples, scored after every epoch (None: none)."""
    dataset, rows, test_rows, _ = run_data(context)
    if dataset == "criteo-like":
        if not test_rows:
            return None
        ids, x, y = _criteo_rows(context, rows, rows + test_rows)
        return ids, x[LEADER], y
    _, _, _, _, x_b_test, y_test = _data()
    return example_ids()[1], x_b_test, y_test
