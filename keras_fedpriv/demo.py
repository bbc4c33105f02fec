"""Demo: label DP and embedding DP in a two-party vertical (split) model.

The data is scikit-learn's bundled breast cancer data set (569 examples, 30
features, binary label; nothing is downloaded). Its features are split
between two parties:

* ``party_a``, the follower: the first 15 features. Its bottom model turns
  them into an embedding that it sends to the leader, through the
  protection layer (`keras_fedpriv.EmbeddingDPLayer`) when one is used.
* ``party_b``, the leader: the last 15 features and the labels. It
  concatenates the follower's embedding with its own and its top model
  predicts.

Each configuration (no protection, LabelDP at several eps, EmbeddingDP at
several eps, both) trains a fresh model with ``model.fit`` and reports the
test accuracy. Test labels are never randomized.

Usage::

    python -m keras_fedpriv demo [--epochs N] [--seed S] [--quick]

or, from Python, ``rows = run_demo(quick=True)``.
"""

from __future__ import annotations

import sys
import textwrap
import time

import keras
import numpy as np
import tensorflow as tf

from keras_fedpriv.layers.embedding_dp import EmbeddingDPLayer
from keras_fedpriv.privatize import privatize_labels

__all__ = ["DEFAULT_EPOCHS", "QUICK_EPOCHS", "configurations", "load_data", "build_model",
           "run_demo", "format_table"]

DEFAULT_EPOCHS = 25
QUICK_EPOCHS = 15
BATCH_SIZE = 32
LEARNING_RATE = 3e-3
EMBEDDING_DIM = 8
TEST_SIZE = 0.3
SPLIT_STATE = 42  # the train/test split is always the same
NUM_FOLLOWER_FEATURES = 15

LABEL_EPS = (0.5, 1.0, 2.0, 4.0)
EMBEDDING_EPS = (None, 1.0, 4.0, 16.0)
BOTH = (2.0, 4.0)  # (label eps, embedding eps)


def _eps_text(eps):
    if eps is None:
        return "-"
    return f"{eps:g}"


def _label_protected(eps):
    return f"leader's labels ({eps:g}-label-DP, each label released once)"


def _embedding_protected(eps, d):
    if eps is None:
        return "follower's embedding quantized to 1 bit (no DP guarantee)"
    return (f"follower's embedding ({eps / 2:g} per coordinate, d*eps/2 = {d * eps / 2:g} "
            f"per example per release, d={d})")


def configurations(quick=False, embedding_dim=EMBEDDING_DIM):
    """The table's configurations, as dicts.

    Keys: ``protection`` ("none", "LabelDP", "EmbeddingDP", "both"),
    ``label_eps`` (None or float), ``embedding`` (bool: is an
    EmbeddingDPLayer used), ``embedding_eps`` (None or float), ``eps`` (text
    for the table) and ``protected`` (what is protected, in words).
    """
    d = embedding_dim
    configs = [dict(protection="none", label_eps=None, embedding=False, embedding_eps=None,
                    eps="-", protected="nothing")]
    for eps in ((0.5, 2.0) if quick else LABEL_EPS):
        configs.append(dict(protection="LabelDP", label_eps=eps, embedding=False,
                            embedding_eps=None, eps=_eps_text(eps),
                            protected=_label_protected(eps)))
    for eps in ((4.0,) if quick else EMBEDDING_EPS):
        configs.append(dict(protection="EmbeddingDP", label_eps=None, embedding=True,
                            embedding_eps=eps, eps=_eps_text(eps),
                            protected=_embedding_protected(eps, d)))
    label_eps, emb_eps = BOTH
    configs.append(dict(protection="both", label_eps=label_eps, embedding=True,
                        embedding_eps=emb_eps,
                        eps=f"{label_eps:g} + {emb_eps:g}",
                        protected=(f"labels ({label_eps:g}-label-DP) + embedding "
                                   f"({emb_eps / 2:g} per coordinate, {d * emb_eps / 2:g} per "
                                   f"example per release)")))
    return configs


def load_data():
    """Breast cancer data, stratified 70/30 split, standardized on the training split.

    Returns:
        ``(xa_train, xb_train, y_train, xa_test, xb_test, y_test)``: the
        follower's features (first 15), the leader's features (last 15) and
        float32 labels of shape (N, 1).
    """
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_SIZE, stratify=y, random_state=SPLIT_STATE)
    scaler = StandardScaler().fit(x_train)  # fitted on the training split only
    x_train = scaler.transform(x_train).astype("float32")
    x_test = scaler.transform(x_test).astype("float32")
    y_train = y_train.astype("float32").reshape(-1, 1)
    y_test = y_test.astype("float32").reshape(-1, 1)
    k = NUM_FOLLOWER_FEATURES
    return (x_train[:, :k], x_train[:, k:], y_train, x_test[:, :k], x_test[:, k:], y_test)


def build_model(num_a, num_b, embedding_dp=None, embedding_dim=EMBEDDING_DIM, num_train=None):
    """The vertical model: two bottom models, the protection layer, a top model.

    Args:
        num_a: number of the follower's features.
        num_b: number of the leader's features.
        embedding_dp: None (the follower's embedding is sent as is) or a
            layer applied to it before it reaches the leader.
        embedding_dim: size of each party's embedding.
        num_train: number of training examples; when given, one epoch runs
            in one call (``steps_per_execution``).

    Returns:
        A compiled functional `keras.Model` taking ``{"party_a": xa, "party_b": xb}``.
    """
    in_a = keras.Input(shape=(num_a,), name="party_a")
    in_b = keras.Input(shape=(num_b,), name="party_b")
    # Follower (party_a) bottom model; its output is what it sends.
    h_a = keras.layers.Dense(16, activation="relu", name="a_dense")(in_a)
    z_a = keras.layers.Dense(embedding_dim, name="a_embedding")(h_a)
    if embedding_dp is not None:
        z_a = embedding_dp(z_a)
    # Leader (party_b) bottom model.
    h_b = keras.layers.Dense(16, activation="relu", name="b_dense")(in_b)
    z_b = keras.layers.Dense(embedding_dim, activation="relu", name="b_embedding")(h_b)
    # Leader's top model.
    h = keras.layers.Concatenate(name="concat")([z_a, z_b])
    h = keras.layers.Dense(8, activation="relu", name="top_dense")(h)
    out = keras.layers.Dense(1, activation="sigmoid", name="prediction")(h)
    model = keras.Model({"party_a": in_a, "party_b": in_b}, out, name="vertical_model")
    steps = -(-num_train // BATCH_SIZE) if num_train else 1
    # One call per epoch (steps_per_execution) and no XLA: this tiny model is
    # dominated by per-step overhead and compile time on a CPU.
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE), loss="binary_crossentropy",
                  metrics=["accuracy"], steps_per_execution=steps, jit_compile=False)
    return model


def _dataset(xa, xb, y, seed=None):
    """Shuffled batches of ({"party_a": xa, "party_b": xb}, y), reshuffled every epoch."""
    data = tf.data.Dataset.from_tensor_slices(({"party_a": xa, "party_b": xb}, y))
    return (data.cache().shuffle(len(y), seed=seed, reshuffle_each_iteration=True)
            .batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE))


def format_table(rows):
    """An aligned text table of the rows (protection, eps, test accuracy, protected)."""
    headers = ("protection", "eps", "test acc", "what is protected")
    cells = [(r["protection"], r["eps"], f"{r['accuracy']:.3f}", r["protected"]) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    align = ("<", "<", ">", "<")

    def line(values):
        return "  ".join(f"{v:{a}{w}}" for v, a, w in zip(values, align, widths)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule] + [line(c) for c in cells])


def _check_epochs(epochs):
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)):
        raise TypeError(f"`epochs` must be an integer >= 1; got {epochs!r}.")
    if epochs < 1:
        raise ValueError(f"`epochs` must be an integer >= 1; got {epochs!r}.")
    return int(epochs)


def run_demo(epochs=None, seed=None, quick=False, out=sys.stdout):
    """Train every configuration and print the results table.

    Args:
        epochs: training epochs per configuration (an integer >= 1). Default
            `DEFAULT_EPOCHS`, or `QUICK_EPOCHS` when ``quick``.
        seed: None (default) or an integer in [0, 2**31). None: model
            initialization is not seeded and the privacy layers draw their
            secrets from OS entropy, so numbers vary a little from run to
            run. An int seeds Keras (`keras.utils.set_random_seed`), the
            shuffling and every privacy mechanism, so a run can be repeated.
        quick: fewer configurations and epochs (for tests).
        out: text stream for the progress lines and the table (None: silent).

    Returns:
        A list of dicts, one per configuration, with the keys of
        `configurations` plus ``accuracy`` (test accuracy, float),
        ``seconds`` (training and evaluation time) and, for rows with
        LabelDP, ``labels_flipped`` (the fraction of training labels that
        randomized response changed).
    """
    epochs = _check_epochs(QUICK_EPOCHS if quick and epochs is None else
                           DEFAULT_EPOCHS if epochs is None else epochs)
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"`seed` must be None or an integer in [0, 2**31); got {seed!r}.")
        if not 0 <= seed < 2**31:
            raise ValueError(f"`seed` must be None or an integer in [0, 2**31); got {seed!r}.")
        seed = int(seed)

    def say(text=""):
        if out is not None:
            print(text, file=out, flush=True)

    xa_train, xb_train, y_train, xa_test, xb_test, y_test = load_data()
    configs = configurations(quick=quick)
    say("keras-fedpriv demo: vertical (split) learning with label DP and embedding DP")
    say(f"Data: scikit-learn breast cancer ({len(y_train) + len(y_test)} examples, 30 features, "
        f"binary label), stratified {100 - int(TEST_SIZE * 100)}/{int(TEST_SIZE * 100)} split "
        f"({len(y_train)} train / {len(y_test)} test), standardized on the training split.")
    say(f"Parties: follower party_a holds features 1-{xa_train.shape[1]}; leader party_b holds "
        f"features {xa_train.shape[1] + 1}-30 and the labels.")
    say(f"Model: each party's bottom model makes an embedding of size {EMBEDDING_DIM}; the "
        f"follower's goes through the protection layer to the leader's top model.")
    say(f"Training: {epochs} epochs, batch {BATCH_SIZE}, {len(configs)} configurations, "
        + (f"seed {seed}." if seed is not None else "unseeded (secrets from OS entropy)."))
    say()

    rows = []
    start = time.perf_counter()
    for i, config in enumerate(configs):
        t0 = time.perf_counter()
        if seed is not None:
            keras.utils.set_random_seed(seed + i)
        sub_seed = None if seed is None else seed + 1000 + i
        y_fit = y_train
        if config["label_eps"] is not None:
            # Randomized once, before training: every epoch sees the same noisy label.
            y_fit = privatize_labels(y_train, config["label_eps"], seed=sub_seed)
        layer = None
        if config["embedding"]:
            layer = EmbeddingDPLayer(eps=config["embedding_eps"], seed=sub_seed,
                                     name="embedding_dp")
        model = build_model(xa_train.shape[1], xb_train.shape[1], embedding_dp=layer,
                            num_train=len(y_fit))
        train = _dataset(xa_train, xb_train, y_fit, seed=sub_seed)
        # Optimizer slots created up front: the train step is traced once, not twice.
        model.optimizer.build(model.trainable_variables)
        model.fit(train, epochs=epochs, verbose=0, shuffle=False)  # `train` reshuffles itself
        # One forward pass on the test set, with the layer applied as at inference
        # (the follower's embedding goes through it; test labels are untouched).
        probabilities = np.asarray(model({"party_a": xa_test, "party_b": xb_test},
                                         training=False))
        accuracy = float(np.mean((probabilities > 0.5) == (y_test > 0.5)))
        row = dict(config, accuracy=accuracy, seconds=time.perf_counter() - t0)
        if config["label_eps"] is not None:
            row["labels_flipped"] = float(np.mean(y_fit != y_train))
        rows.append(row)
        say(f"[{i + 1:2d}/{len(configs)}] {config['protection']:<11} eps {config['eps']:<7} "
            f"test acc {accuracy:.3f}  ({row['seconds']:.1f} s)")
    say()
    say(format_table(rows))
    say()
    footer = ("eps: for LabelDP, the label-DP parameter (each training label is randomized once, "
              "so the guarantee holds for any number of epochs; test labels are untouched). For "
              "EmbeddingDP, the local-DP parameter of the follower's 1-bit embedding: each "
              "coordinate is (eps/2)-DP, and every forward pass (each epoch, and inference) is "
              "a new release.")
    for text in textwrap.wrap(footer, width=100):
        say(text)
    say(f"Training and evaluation took {time.perf_counter() - start:.1f} s.")
    return rows
