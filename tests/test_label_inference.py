"""Label inference from cut gradients (keras_fedpriv/attacks/label_inference.py): norm and
direction attacks.

The headline test trains a small unprotected two-party split model on an
imbalanced binary task, records the cut gradients the follower receives, and
checks that the norm and direction attacks of Li et al. (ICLR 2022) recover
the labels (AUC > 0.9), and that randomized-response label noise at eps=0
brings the norm attack back to chance.
"""

import dataclasses

import keras
import numpy as np
import pytest
from keras import ops

import keras_fedpriv as kf
from keras_fedpriv.attacks import AttackResult, direction_label_inference, norm_label_inference

pytestmark = [pytest.mark.jax]

# --------------------------------------------------------------------------- split model


def _imbalanced_data(n=2000, d=10, positive_rate=0.1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    logit = x @ rng.normal(size=d) + 0.5 * rng.normal(size=n)
    y = (logit > np.quantile(logit, 1 - positive_rate)).astype("float32")
    return x, y


def _train_split_model(x, train_labels, *, epochs=1, batch_size=64, seed=0):
    """Follower bottom (x -> embedding) and leader top (embedding -> logit), sigmoid BCE.

    Two tapes, as in the protocol: the leader differentiates its loss with
    respect to the embedding it received (the cut gradient, which it sends
    back) and its own weights; the follower backpropagates the cut gradient
    through its bottom model. Returns the cut gradients of the first epoch and
    the example index of each row.
    """
    import tensorflow as tf

    init = keras.initializers.GlorotUniform
    bottom = keras.Sequential([
        keras.Input((x.shape[1],)),
        keras.layers.Dense(16, activation="relu", kernel_initializer=init(seed)),
        keras.layers.Dense(8, kernel_initializer=init(seed + 1)),
    ])
    # the leader's top: a logistic-regression head on the embedding
    top = keras.Sequential([keras.Input((8,)),
                            keras.layers.Dense(1, kernel_initializer=init(seed + 2))])
    opt_bottom, opt_top = keras.optimizers.Adam(1e-2), keras.optimizers.Adam(1e-2)
    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    rng = np.random.default_rng(seed)
    recorded, order = [], []
    for epoch in range(epochs):
        perm = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            idx = perm[start:start + batch_size]
            with tf.GradientTape() as follower_tape:
                embedding = bottom(tf.constant(x[idx]), training=True)
            received = tf.identity(embedding)  # what the leader gets
            with tf.GradientTape() as leader_tape:
                leader_tape.watch(received)
                loss = bce(tf.constant(train_labels[idx][:, None]), top(received, training=True))
            cut_grad, *top_grads = leader_tape.gradient(loss, [received] + top.trainable_variables)
            opt_top.apply_gradients(zip(top_grads, top.trainable_variables))
            bottom_grads = follower_tape.gradient(embedding, bottom.trainable_variables,
                                                  output_gradients=cut_grad)
            opt_bottom.apply_gradients(zip(bottom_grads, bottom.trainable_variables))
            if epoch == 0:  # record during the first epoch, as in the paper
                recorded.append(cut_grad)  # tf tensors, one (B, d) per step
                order.append(idx)
    return recorded, np.concatenate(order)


@pytest.fixture(scope="module")
def task():
    return _imbalanced_data()


@pytest.mark.tensorflow_only("the split model's cut gradients come from tf.GradientTape")
def test_unprotected_split_model_leaks_labels(task):
    x, y = task
    assert 0.08 < y.mean() < 0.12
    grads, order = _train_split_model(x, y)
    y_rows = y[order]
    norm = norm_label_inference(grads, y_rows)  # a list of per-step tensors
    assert norm.num_evaluated == len(x) and norm.num_positives == int(y.sum())
    assert norm.auc > 0.9
    known = int(np.flatnonzero(y_rows == 1)[0])
    direction = direction_label_inference(grads, y_rows, known)
    assert direction.auc > 0.9
    assert direction.num_evaluated == len(x) - 1
    assert direction.scores[known] == pytest.approx(1.0)


@pytest.mark.tensorflow_only("the split model's cut gradients come from tf.GradientTape")
def test_randomized_response_eps0_defeats_norm_attack(task):
    x, y = task
    noisy = kf.privatize_labels(y, 0.0, seed=1)  # flip probability 1/2: independent of y
    assert 0.45 < (noisy == y).mean() < 0.55
    grads, order = _train_split_model(x, noisy)
    y_rows = y[order]
    assert abs(norm_label_inference(grads, y_rows).auc - 0.5) < 0.1
    known = int(np.flatnonzero(y_rows == 1)[0])
    assert abs(direction_label_inference(grads, y_rows, known).auc - 0.5) < 0.1
    # What does leak is the *noisy* labels the leader trained on (balanced now): the direction
    # attack recovers them, the norm attack (which needs class imbalance) does not.
    noisy_rows = noisy[order]
    known_noisy = int(np.flatnonzero(noisy_rows == 1)[0])
    assert direction_label_inference(grads, noisy_rows, known_noisy).auc > 0.9
    assert abs(norm_label_inference(grads, noisy_rows).auc - 0.5) < 0.1


# --------------------------------------------------------------------------- synthetic


def _norm_separated(n=50, d=4, seed=0):
    rng = np.random.default_rng(seed)
    y = np.zeros(n, dtype=np.int64)
    y[::5] = 1
    directions = rng.normal(size=(n, d))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    magnitude = np.where(y == 1, rng.uniform(2, 3, n), rng.uniform(0.1, 1, n))
    return directions * magnitude[:, None], y


def test_norm_score_ordering():
    grads, y = _norm_separated()
    result = norm_label_inference(grads, y)
    assert isinstance(result, AttackResult) and result.attack == "norm"
    assert result.auc == result.raw_auc == result.auc_best_sign == 1.0
    assert result.direction == "higher score = positive"
    np.testing.assert_allclose(result.scores, np.linalg.norm(grads, axis=1))
    assert float(result) == result.auc


def test_reversed_score_is_reported_as_the_attackers_strength():
    """A raw AUC below 0.5 is an attacker who reads the score the other way round: `auc` is
    max(raw, 1 - raw), never a number below chance that would read as protection."""
    grads, y = _norm_separated()
    reversed_ = norm_label_inference(grads, 1 - y)  # the larger norms are now the negatives
    assert reversed_.raw_auc == 0.0 and reversed_.auc == reversed_.auc_best_sign == 1.0
    assert reversed_.direction == "lower score = positive"
    noisy = grads.copy()
    noisy[:, 0] += np.random.default_rng(4).normal(scale=2.0, size=len(y))
    partial = norm_label_inference(noisy, 1 - y)
    assert partial.raw_auc < 0.5 and partial.auc == pytest.approx(1.0 - partial.raw_auc)
    assert partial.direction == "lower score = positive"
    rng = np.random.default_rng(5)
    for _ in range(5):
        labels = rng.integers(0, 2, size=40)
        labels[:2] = (0, 1)
        for result in (norm_label_inference(rng.normal(size=(40, 3)), labels),
                       direction_label_inference(rng.normal(size=(40, 3)), labels, 1)):
            assert 0.5 <= result.auc <= 1.0
            assert result.auc == pytest.approx(max(result.raw_auc, 1.0 - result.raw_auc))


def test_norm_attack_input_forms_agree():
    grads, y = _norm_separated(seed=3)
    grads[:, 0] += np.random.default_rng(4).normal(scale=2.0, size=len(y))  # imperfect ordering
    reference = norm_label_inference(grads, y).auc
    assert 0.5 < reference < 1.0
    tensors = ops.convert_to_tensor(grads, "float32"), ops.convert_to_tensor(y)
    assert norm_label_inference(*tensors).auc == pytest.approx(reference)
    parts = [grads[:20], ops.convert_to_tensor(grads[20:])]
    assert norm_label_inference(parts, y[:, None]).auc == reference
    onehot = np.eye(2, dtype="float32")[y]
    assert norm_label_inference(grads, onehot).auc == reference
    assert norm_label_inference(grads, y.astype(bool)).auc == reference


def test_direction_attack_synthetic():
    rng = np.random.default_rng(0)
    y = (rng.uniform(size=60) < 0.3).astype(int)
    y[7] = 1
    v = rng.normal(size=5)
    grads = np.where(y[:, None] == 1, -1.0, 1.0) * v + 0.3 * rng.normal(size=(60, 5))
    grads *= rng.uniform(0.1, 5.0, size=(60, 1))  # norms carry no signal, directions do
    result = direction_label_inference(grads, y, 7)
    assert result.attack == "direction" and result.auc == 1.0
    assert result.num_evaluated == 59 and result.num_positives == int(y.sum()) - 1
    assert result.scores[7] == pytest.approx(1.0)
    assert np.all(np.abs(result.scores) <= 1.0)
    grads[3] = 0.0  # a zero gradient has cosine 0
    assert direction_label_inference(grads, y, 7).scores[3] == 0.0
    assert direction_label_inference(grads, y, np.int64(7)).auc == result.auc


def test_result_is_frozen():
    result = norm_label_inference(*_norm_separated())
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.auc = 0.5
    with pytest.raises(ValueError):
        result.scores[0] = 1.0  # read only


# --------------------------------------------------------------------------- bad inputs

G = np.ones((4, 3))
Y = np.array([0, 1, 0, 1])


@pytest.mark.parametrize("grads,labels,fragment", [
    (np.ones(4), Y, r"`cut_gradients` must have shape \(N, d\)"),
    (np.ones((4, 3, 2)), Y, r"got shape \(4, 3, 2\)"),
    (np.ones((0, 3)), np.zeros(0), "`cut_gradients` must have at least one row"),
    (G, np.array([0, 1, 0]), "`labels` has 3 rows but `cut_gradients` has 4"),
    (G, np.array([0, 1, 2, 1]), "`labels` must be binary.*row 2 has value 2"),
    (G, np.array([0, 1, 0.5, 1]), "row 2 has value 0.5"),
    (G, np.array([0, 1, np.nan, 1]), "`labels`.*row 2 has value nan"),
    (G, np.ones((4, 3)), r"`labels` must be binary.*got shape \(4, 3\)"),
    (G, np.array([[1, 0], [1, 1], [0, 1], [1, 0]]),
     r"`labels` looks one-hot.*row 1 is \[1.0, 1.0\]"),
    (G, np.zeros(4), r"`labels` contain only class 0 \(4 rows\).*both classes"),
    (G, np.ones(4), "`labels` contain only class 1"),
    (np.array([[1.0, np.nan, 0], [1, 1, 1], [0, 0, 1], [1, 0, 0]]), Y,
     r"`cut_gradients` must contain only finite.*entry \(0, 1\)"),
    (np.array([[1.0, np.inf, 0], [1, 1, 1], [0, 0, 1], [1, 0, 0]]), Y, "finite"),
    (np.array([["a", "b"]] * 4), Y, "`cut_gradients` must be a numeric array"),
    ([np.ones((2, 3)), np.ones((2, 4))], Y, "`cut_gradients`.*same width"),
])
@pytest.mark.parametrize("attack", ["norm", "direction"])
def test_label_attacks_bad_inputs(attack, grads, labels, fragment):
    with pytest.raises(ValueError, match=fragment):
        if attack == "norm":
            norm_label_inference(grads, labels)
        else:
            direction_label_inference(grads, labels, 1)


@pytest.mark.parametrize("index,err,fragment", [
    (4, ValueError, r"`known_positive_index` must be an integer in \[0, 4\).*got 4"),
    (-1, ValueError, "`known_positive_index`.*got -1"),
    (0, ValueError, "`known_positive_index` must name a positive example.*row 0 has label 0"),
    (1.0, TypeError, "`known_positive_index` must be an integer"),
    (True, TypeError, "`known_positive_index`.*bool"),
])
def test_direction_bad_index(index, err, fragment):
    with pytest.raises(err, match=fragment):
        direction_label_inference(np.arange(12.0).reshape(4, 3), Y, index)


def test_direction_degenerate_cases():
    with pytest.raises(ValueError, match="`known_positive_index`.*all zeros"):
        direction_label_inference(np.array([[1.0, 0], [0, 0], [1, 1], [2, 0]]), Y, 1)
    # the only other positive is the known one: one class left after excluding it
    with pytest.raises(ValueError, match=r"`labels` \(without the known example\) contain only"):
        direction_label_inference(G, np.array([0, 1, 0, 0]), 1)


