"""Demo: label DP, embedding DP and a VAE bottom in a two-party vertical (split) model.

The data is scikit-learn's bundled breast cancer data set (569 examples, 30
features; label 1 = malignant, the 37% minority; nothing is downloaded). Its
features are split between two parties, trained with
`keras_fedpriv.federated.VerticalModel`:

* ``party_a``, the follower: the first 15 features. Its bottom model turns
  them into an embedding that it sends to the leader, through the
  protection layer (`keras_fedpriv.EmbeddingDPLayer`) when one is used, or
  as a sample of a `keras_fedpriv.VAEBottom`.
* ``party_b``, the leader: the last 15 features and the labels. Its top
  model takes the follower's embedding and its own.

Each configuration (no protection, LabelDP at several eps, EmbeddingDP at
several eps, both, VAEBottom) trains a fresh model with ``model.fit`` and
reports the test accuracy and what the follower could infer about the
labels from the gradients the leader sent it in the first epoch (ROC-AUC of
the norm and direction attacks of `keras_fedpriv.attacks`; 0.5 = chance).
Test labels are never randomized.

Usage::

    python -m keras_fedpriv demo [--epochs N] [--seed S] [--quick]

or, from Python, ``rows = run_demo(quick=True)``.
"""

from __future__ import annotations

import logging
import sys
import textwrap
import time
from typing import Any, Mapping, Sequence, TextIO

import keras
import numpy as np

from keras_fedpriv import backend
from keras_fedpriv.attacks import direction_label_inference, norm_label_inference
from keras_fedpriv.datasets import breast_cancer_vertical
from keras_fedpriv.federated import MessageRecorder, VerticalModel, with_example_ids
from keras_fedpriv.layers.embedding_dp import EmbeddingDPLayer
from keras_fedpriv.layers.vae_bottom import VAEBottom
from keras_fedpriv.privacy import deldp
from keras_fedpriv.privatize import privatize_labels
from keras_fedpriv.text_table import text_table

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


def configurations(quick: bool = False, embedding_dim: int = EMBEDDING_DIM) -> list[dict[str, Any]]:
    """The table's configurations, as dicts.

    Keys: ``protection`` ("none", "LabelDP", "EmbeddingDP", "both"),
    ``label_eps`` (None or float), ``embedding`` (bool: is an
    EmbeddingDPLayer used), ``embedding_eps`` (None or float), ``eps`` (text
    for the table) and ``protected`` (what is protected, in words).
    """
    d = embedding_dim
    configs = [dict(protection="none", label_eps=None, embedding=False, embedding_eps=None,
                    vae=False, eps="-", protected="nothing")]
    for eps in ((0.5, 2.0) if quick else LABEL_EPS):
        configs.append(dict(protection="LabelDP", label_eps=eps, embedding=False,
                            embedding_eps=None, vae=False, eps=_eps_text(eps),
                            protected=_label_protected(eps)))
    for eps in ((4.0,) if quick else EMBEDDING_EPS):
        configs.append(dict(protection="EmbeddingDP", label_eps=None, embedding=True,
                            embedding_eps=eps, vae=False, eps=_eps_text(eps),
                            protected=_embedding_protected(eps, d)))
    label_eps, emb_eps = BOTH
    configs.append(dict(protection="both", label_eps=label_eps, embedding=True,
                        embedding_eps=emb_eps, vae=False,
                        eps=f"{label_eps:g} + {emb_eps:g}",
                        protected=(f"labels ({label_eps:g}-label-DP) + embedding "
                                   f"({emb_eps / 2:g} per coordinate, {d * emb_eps / 2:g} per "
                                   f"example per release)")))
    configs.append(dict(protection="VAEBottom", label_eps=None, embedding=False,
                        embedding_eps=None, vae=True, eps="-",
                        protected=("follower's features, by the VAE's sampling (dELDP estimate "
                                   "below)")))
    return configs


def load_data() -> tuple[np.ndarray, ...]:
    """The demo's data: `keras_fedpriv.datasets.breast_cancer_vertical` with its split.

    Returns:
        ``(xa_train, xb_train, y_train, xa_test, xb_test, y_test)``.
    """
    return breast_cancer_vertical(NUM_FOLLOWER_FEATURES, TEST_SIZE, SPLIT_STATE)


def build_model(num_a: int, num_b: int, embedding_dp: EmbeddingDPLayer | None = None,
                embedding_dim: int = EMBEDDING_DIM, vae: bool = False,
                vae_seed: int | None = None) -> VerticalModel:
    """The vertical model: the follower's and the leader's bottom models and the leader's top.

    Args:
        num_a: number of the follower's features.
        num_b: number of the leader's features.
        embedding_dp: None (the follower's embedding is sent as is) or a
            layer applied to it before it leaves the follower.
        embedding_dim: size of each party's embedding.
        vae: the follower's bottom is a `VAEBottom` (its embedding is a sample).
        vae_seed: seed of the VAE's sampling noise (None: a secret).

    Returns:
        A compiled `VerticalModel` taking ``{"party_a": xa, "party_b": xb}``.
    """
    if vae:
        layer = VAEBottom(embedding_dim, hidden_units=(16,), beta=1.0, seed=vae_seed, name="vae")
        bottom_a = keras.Sequential([keras.Input((num_a,)), layer], name="bottom_a")
    else:
        bottom_a = keras.Sequential([keras.Input((num_a,)),
                                     keras.layers.Dense(16, activation="relu"),
                                     keras.layers.Dense(embedding_dim)], name="bottom_a")
    bottom_b = keras.Sequential([keras.Input((num_b,)),
                                 keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(embedding_dim, activation="relu")],
                                name="bottom_b")
    top = keras.Sequential([keras.Input((2 * embedding_dim,)),
                            keras.layers.Dense(8, activation="relu"),
                            keras.layers.Dense(1, activation="sigmoid")], name="top")
    model = VerticalModel({"party_a": bottom_a, "party_b": bottom_b}, top, leader="party_b",
                          embedding_dp=embedding_dp, name="vertical_model")
    # TensorFlow without XLA: this tiny model is dominated by per-step overhead and compile
    # time on a CPU. JAX without jit would run every op eagerly: there it is compiled.
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE), loss="binary_crossentropy",
                  metrics=["accuracy"], jit_compile=not backend.is_tensorflow())
    return model


def _fit_data(xa, xb, y, seed=None):
    """``fit``'s arguments for ({"party_a": xa, "party_b": xb, "example_ids": row}, y).

    Shuffled batches, reshuffled every epoch: on TensorFlow a `tf.data`
    pipeline (seeded by ``seed``), elsewhere the arrays with Keras' own
    shuffling (seeded by ``keras.utils.set_random_seed``). The example ids
    (row numbers) let the attack evaluation match recorded messages to the
    true labels.
    """
    ids = np.arange(len(y), dtype="int64")
    x = {"party_a": xa, "party_b": xb, "example_ids": ids}
    if not backend.is_tensorflow():
        return dict(x=x, y=y, batch_size=BATCH_SIZE, shuffle=True)
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((x, y))
    data = (data.cache().shuffle(len(y), seed=seed, reshuffle_each_iteration=True)
            .batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE))
    return dict(x=data, shuffle=False)  # the dataset reshuffles itself


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """An aligned text table: protection, eps, test accuracy, label-attack AUCs, protected."""
    headers = ("protection", "eps", "test acc", "norm AUC", "direction AUC", "what is protected")
    cells = [(r["protection"], r["eps"], f"{r['accuracy']:.3f}", _auc_cell(r, "norm"),
              _auc_cell(r, "direction"), r["protected"]) for r in rows]
    return text_table(headers, cells, align=("<", "<", ">", ">", ">", "<"))


def _auc_cell(row, attack):
    """The attacker's AUC, with ``*`` when it reads the score reversed (raw AUC below 0.5)."""
    auc, raw = row[f"{attack}_auc"], row.get(f"{attack}_raw_auc", row[f"{attack}_auc"])
    return f"{auc:.2f}{' *' if raw < 0.5 else '  '}"


def _check_epochs(epochs):
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)):
        raise TypeError(f"`epochs` must be an integer >= 1; got {epochs!r}.")
    if epochs < 1:
        raise ValueError(f"`epochs` must be an integer >= 1; got {epochs!r}.")
    return int(epochs)


def plot_demo(rows: Sequence[Mapping[str, Any]], path: str) -> str:
    """Write the demo's privacy-utility and attack figure (PNG) to ``path``.

    Left: test accuracy against eps for LabelDP and EmbeddingDP (no protection
    and the VAE bottom as horizontal lines). Right: the follower's label
    attacks against the label eps, with the bound ``e^eps / (1 + e^eps)`` that
    randomized response puts on any attacker.

    Args:
        rows: the rows `run_demo` returns.
        path: the PNG file to write.

    Returns:
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, key, marker in (("LabelDP", "label_eps", "o"), ("EmbeddingDP", "embedding_eps",
                                                                "s")):
        pts = sorted((r[key], r["accuracy"]) for r in rows
                     if r["protection"] == name and r[key] is not None)
        if pts:
            left.plot(*zip(*pts), marker=marker, label=name)
    for name, style in (("none", "k--"), ("VAEBottom", "g:")):
        for r in rows:
            if r["protection"] == name:
                left.axhline(r["accuracy"], linestyle=style[1:], color=style[0],
                             label=f"{'no protection' if name == 'none' else name}")
    left.set(xscale="log", xlabel="eps", ylabel="test accuracy",
             title="Privacy-utility (breast cancer, vertical FL)")
    left.legend(fontsize=8)
    label_rows = sorted((r for r in rows if r["protection"] == "LabelDP"),
                        key=lambda r: r["label_eps"])
    if label_rows:
        eps = np.array([r["label_eps"] for r in label_rows])
        right.plot(eps, [r["norm_auc"] for r in label_rows], "o-", label="norm attack")
        right.plot(eps, [r["direction_auc"] for r in label_rows], "s-", label="direction attack")
        grid = np.geomspace(eps.min(), eps.max(), 50)
        right.plot(grid, np.exp(grid) / (1 + np.exp(grid)), "k:",
                   label="bound e^eps/(1+e^eps)")
    for r in rows:
        if r["protection"] == "none":
            right.axhline(r["direction_auc"], color="r", linestyle="--",
                          label="direction attack, no protection")
    right.set(xscale="log", xlabel="label eps", ylabel="attacker's AUC (0.5 = chance)",
              ylim=(0.45, 1.02), title="Label inference by the follower (epoch 1)")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class _NoRetracingWarning(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning: each configuration builds
    and traces a new model on purpose, which that warning would report as a problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


def _run_configuration(config, sub_seed, epochs, data):
    """Train one configuration, attack its first epoch's gradients; return its row."""
    xa_train, xb_train, y_train, xa_test, xb_test, y_test = data
    y_fit = y_train
    if config["label_eps"] is not None:
        # Randomized once, before training: every epoch sees the same noisy label.
        y_fit = privatize_labels(y_train, config["label_eps"], seed=sub_seed)
    layer = None
    if config["embedding"]:
        layer = EmbeddingDPLayer(eps=config["embedding_eps"], seed=sub_seed,
                                 name="embedding_dp")
    model = build_model(xa_train.shape[1], xb_train.shape[1], embedding_dp=layer,
                        vae=config["vae"], vae_seed=sub_seed)
    train = _fit_data(xa_train, xb_train, y_fit, seed=sub_seed)
    # Optimizer slots created up front: the train step is traced once, not twice.
    model.optimizer.build(model.trainable_variables)
    recorder = MessageRecorder(epochs=(0,))  # what crossed the wire in the first epoch
    history = model.fit(**train, epochs=epochs, verbose=0, callbacks=[recorder])
    # One forward pass on the test set, with the protection applied as at inference
    # (the follower's embedding goes through it; test labels are untouched). Test rows get
    # ids after the training rows', so the pass counts one release for each test row only.
    test = with_example_ids({"party_a": xa_test, "party_b": xb_test}, start=len(y_train))
    probabilities = model.predict(test, verbose=0)
    accuracy = float(np.mean((probabilities > 0.5) == (y_test > 0.5)))
    # The labels the leader trained on may be randomized: score the attacks against
    # the true labels of the recorded rows.
    gradients = recorder.cut_gradients("party_a")
    labels = y_train.reshape(-1)[recorder.example_ids()]
    known = int(np.flatnonzero(labels == 1)[0])  # one malignant example the attacker knows
    norm = norm_label_inference(gradients, labels)
    direction = direction_label_inference(gradients, labels, known)
    row = dict(config, accuracy=accuracy,
               norm_auc=norm.auc, norm_raw_auc=norm.raw_auc,
               direction_auc=direction.auc, direction_raw_auc=direction.raw_auc,
               bytes_up=float(history.history["bytes_up"][-1]))
    if config["label_eps"] is not None:
        row["labels_flipped"] = float(np.mean(y_fit != y_train))
    if config["vae"]:
        row["deldp"] = deldp(model.bottoms["party_a"].get_layer("vae"), xa_train, y_train)
    return row


def run_demo(epochs: int | None = None, seed: int | None = None, quick: bool = False,
             out: TextIO = sys.stdout, figure: str | None = None) -> list[dict[str, Any]]:
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
        figure: None, or a path for the privacy-utility and attack figure
            (PNG, `plot_demo`); the table then says where it is.

    Returns:
        A list of dicts, one per configuration, with the keys of
        `configurations` plus ``accuracy`` (test accuracy, float),
        ``norm_auc`` and ``direction_auc`` (the strength of the follower's
        label attacks on the gradients it received in the first epoch: ROC-AUC
        against the true labels read in the attacker's favour,
        ``max(AUC, 1 - AUC)``), ``norm_raw_auc`` and ``direction_raw_auc``
        (the AUC with the higher score read as malignant), ``bytes_up``
        (bytes the follower sent in the last epoch), ``seconds`` (training
        and evaluation time), for rows with
        LabelDP ``labels_flipped`` (the fraction of training labels that
        randomized response changed), and for the VAEBottom row ``deldp``
        (the dELDP estimate, a `keras_fedpriv.privacy.DELDPReport`).
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
    say("keras-fedpriv demo: vertical (split) learning with label DP, embedding DP and a VAE "
        "bottom")
    say(f"Data: scikit-learn breast cancer ({len(y_train) + len(y_test)} examples, 30 features, "
        f"label 1 = malignant), stratified "
        f"{100 - int(TEST_SIZE * 100)}/{int(TEST_SIZE * 100)} split "
        f"({len(y_train)} train / {len(y_test)} test), standardized on the training split.")
    say(f"Parties: follower party_a holds features 1-{xa_train.shape[1]}; leader party_b holds "
        f"features {xa_train.shape[1] + 1}-30 and the labels.")
    say(f"Model: keras_fedpriv.federated.VerticalModel; each party's bottom model makes an "
        f"embedding of size {EMBEDDING_DIM}; the follower's goes through its protection to the "
        f"leader's top model, and the leader sends back the gradient.")
    say("Attacks: the follower scores each example of the first epoch by the gradient it "
        "received (norm attack; direction attack: cosine to a known malignant example) and we "
        "report the attacker's ROC-AUC against the true labels, max(AUC, 1 - AUC): a score "
        "ordered the wrong way round is read reversed (0.5 = chance, 1 = the labels leak).")
    say(f"Training: {epochs} epochs, batch {BATCH_SIZE}, {len(configs)} configurations, "
        + (f"seed {seed}." if seed is not None else "unseeded (secrets from OS entropy)."))
    say()

    rows = []
    start = time.perf_counter()
    data = (xa_train, xb_train, y_train, xa_test, xb_test, y_test)
    quiet = _NoRetracingWarning()
    logger = logging.getLogger("tensorflow")  # tf.get_logger(), without importing TensorFlow
    logger.addFilter(quiet)
    try:
        for i, config in enumerate(configs):
            t0 = time.perf_counter()
            if seed is not None:
                keras.utils.set_random_seed(seed + i)
            row = _run_configuration(config, None if seed is None else seed + 1000 + i,
                                     epochs, data)
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            say(f"[{i + 1:2d}/{len(configs)}] {config['protection']:<11} eps "
                f"{config['eps']:<7} test acc {row['accuracy']:.3f}  norm AUC "
                f"{_auc_cell(row, 'norm')}  direction AUC {_auc_cell(row, 'direction')}  "
                f"({row['seconds']:.1f} s)")
    finally:
        logger.removeFilter(quiet)
    say()
    say(format_table(rows))
    say()
    if figure is not None:
        say(f"Figure (accuracy and attack AUC against eps): {plot_demo(rows, figure)}")
        say()
    footer = ("eps: for LabelDP, the label-DP parameter (each training label is randomized once, "
              "so the guarantee holds for any number of epochs; test labels are untouched). For "
              "EmbeddingDP, the local-DP parameter of the follower's 1-bit embedding: each "
              "coordinate is (eps/2)-DP, and every forward pass (each epoch, and inference) is "
              "a new release. AUC: the follower's label inference from the gradients it "
              "received in epoch 1, max(AUC, 1 - AUC) (0.5 = chance; * = the attacker reads "
              "the score reversed, a lower score meaning malignant); with LabelDP at eps, an "
              "attacker who recovers each randomized label exactly reaches e^eps/(1+e^eps) at most.")
    for text in textwrap.wrap(footer, width=100):
        say(text)
    for row in rows:
        if "deldp" in row:
            say(f"VAEBottom: dELDP estimate eps = {row['deldp'].eps:.2f} at delta = 2^-32 "
                "(an empirical estimate over the training rows, not a DP guarantee).")
    say(f"Training and evaluation took {time.perf_counter() - start:.1f} s.")
    return rows
