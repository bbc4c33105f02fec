"""Gradient inversion (DLG) against horizontal-FL uploads.

Writes docs/results/gradient_inversion.md and its figure.

The server of `keras_fedpriv.federated.HorizontalFL` knows the global weights
and receives each client's upload. A client holding one digit (batch 1) or
four (batch 4) trains one local SGD step (lr 0.1) with
`HorizontalFL.train_client` and uploads its update through:

* FedAvg: the dense update (the server knows the local learning rate, so the
  L2 distance of DLG applies; the cosine distance of Geiping et al. is run too);
* Gaussian: clip to L2 norm 0.1 (every update here is larger, so the clip
  binds and the noise-to-signal ratio is z * sqrt(d)) + N(0, (z * 0.1)^2)
  per coordinate, z in {0.01, 0.1, 1}; attacked with the cosine distance;
* SignDS: `SignDSEncoder(k=0.2, eps)` for eps in {1, 10, 100}; the server
  decodes the message into the dense sparse +-1 vector (it does not know the
  step size) and attacks it with the cosine distance, as if it were the
  update's direction.

`keras_fedpriv.attacks.gradient_inversion` (Adam on the dummy inputs in
[0, 1], 300 steps for one example and iDLG labels, 1000 steps with optimized
soft labels for four) is run on each upload. Metric: relative MSE of the
reconstruction (1.0 = no better than predicting the mean pixel value of the
true image; a uniform-noise image scores about 1.9), and label accuracy.
Two global models: at initialization (round 0) and after training on 1000
public examples (test accuracy reported). For SignDS a second, direct attack
is measured: which pixels the released indices of the first layer point to
(an index in the top-k set needs a non-zero pixel, see the docs).

Usage::

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/gradient_inversion.py          # full, writes docs
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/gradient_inversion.py --quick  # smoke, no docs

``--save FILE`` pickles the raw results; ``--load FILE`` re-renders the docs
from them without re-running the attacks.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import pickle
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import _report  # noqa: E402
from keras_fedpriv.attacks.gradient_inversion import (  # noqa: E402
    InversionResult,
    gradient_inversion,
)
from keras_fedpriv.federated import HorizontalFL  # noqa: E402
from keras_fedpriv.federated.uploads import (  # noqa: E402
    FedAvgUpload,
    GaussianUpload,
    SignDSUpload,
)
from keras_fedpriv.optimizers.signds import SignDSEncoder, decode  # noqa: E402

DOC = _report.RESULTS / "gradient_inversion.md"
PNG = _report.RESULTS / "gradient_inversion.png"

HIDDEN = 32
LOCAL_LR = 0.1
SEEDS = (0, 1, 2)
EXAMPLES = 10          # batch-1 clients per seed and model
BATCHES = 5            # batch-4 clients per seed and model
ITER = {1: 300, 4: 1000}
GAUSS_CLIP = 0.1
GAUSS_Z = (0.01, 0.1, 1.0)
SIGNDS_K = 0.2
SIGNDS_EPS = (100.0, 10.0, 1.0)
PUBLIC = 1000          # examples the "trained" global model was trained on
TRAIN_EPOCHS = 30
DELTA = 1e-5


# --------------------------------------------------------------------------- set-up

def make_model(seed):
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(HIDDEN, activation="relu", kernel_initializer=init(seed)),
        keras.layers.Dense(10, kernel_initializer=init(seed + 1)),
    ])
    model.compile(keras.optimizers.SGD(LOCAL_LR),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def schemes():
    """(name, make_upload(seed), distance, is_signds)."""
    out = [("FedAvg (L2, lr known)", lambda s: FedAvgUpload(), "l2"),
           ("FedAvg (cosine)", lambda s: FedAvgUpload(), "cosine")]
    for z in GAUSS_Z:
        out.append((f"Gaussian z={z:g}",
                    lambda s, z=z: GaussianUpload(GAUSS_CLIP, z, seed=s), "cosine"))
    for eps in SIGNDS_EPS:
        out.append((f"SignDS eps={eps:g}",
                    lambda s, e=eps: SignDSUpload(SignDSEncoder(k=SIGNDS_K, eps=e, seed=s)),
                    "cosine"))
    return out


def as_target(message):
    if isinstance(message, np.ndarray):
        return message
    return decode(message)  # a SignDSMessage: the dense sparse sign vector


def analytic_gaussian_eps(z, delta):
    """Exact eps of one Gaussian release, L2 sensitivity 2C and std zC (Balle & Wang 2018)."""
    from scipy.optimize import brentq
    from scipy.special import log_ndtr

    mu = 2.0 / z

    def excess(eps):
        la = log_ndtr(-eps / mu + mu / 2)
        lb = eps + log_ndtr(-eps / mu - mu / 2)
        return np.exp(la) * -np.expm1(lb - la) - delta

    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return brentq(excess, 0.0, hi, xtol=1e-6)


def support_attack(message, num_pixels, hidden, on_value, off_value):
    """Which pixels the SignDS indices in the first kernel point to; a mask image.

    The first kernel (num_pixels x hidden) comes first in the flat update; its
    entry (p, j) has update -lr * x_p * delta_j, exactly 0 when pixel p is 0.
    A released index in the top-k set therefore names a non-zero pixel.
    """
    idx = message.indices[message.indices < num_pixels * hidden]
    flagged = np.zeros(num_pixels, bool)
    flagged[idx // hidden] = True
    return np.where(flagged, on_value, off_value), flagged


# --------------------------------------------------------------------------- run

def load():
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def split(seed, n):
    perm = np.random.default_rng(seed).permutation(n)
    return perm[:PUBLIC], perm[PUBLIC:]


def client_groups(private, bsz, examples, batches):
    """Row indices of the attacked clients: `examples` singletons, then `batches` groups of bsz."""
    count = examples if bsz == 1 else batches
    offset = 0 if bsz == 1 else examples
    return [private[offset + i * bsz: offset + (i + 1) * bsz] for i in range(count)]


def noise_reference(seeds, examples, batches, bsz):
    """Relative MSE of a uniform-noise "reconstruction" (matched like the attack's)."""
    x, _ = load()
    out = []
    for seed in seeds:
        for c, g in enumerate(client_groups(split(seed, len(x))[1], bsz, examples, batches)):
            u = np.random.default_rng(1000 * seed + c).uniform(size=x[g].shape)
            empty = np.empty(0)
            fake = InversionResult(u.astype(np.float32), np.zeros(len(g), np.int64), empty, 0.0,
                                   empty, empty, "optimize", "l2", 0)
            out.append(fake.reconstruction_mse(x[g]))
    return np.asarray(out)


def run(seeds, examples, batches, batch_sizes, keep_images):
    x, y = load()
    rows = {}          # (state, B, scheme) -> list of (rel_mse, label_acc)
    support = {}       # (state, eps) -> list of (rel_mse, precision, base_rate, n_flagged)
    accuracy = {}
    norms = {}         # (state, B) -> L2 norms of the clients' updates
    images = {}
    timing = {}
    for seed in seeds:
        public, private = split(seed, len(x))
        on_value = float(x[public][x[public] > 0].mean())
        off_value = 0.0
        for state in ("init", "trained"):
            keras.utils.set_random_seed(seed)
            model = make_model(seed)
            if state == "trained":
                model.fit(x[public], y[public], batch_size=32, epochs=TRAIN_EPOCHS, verbose=0,
                          shuffle=True)
            acc = model.evaluate(x[private], y[private], verbose=0, return_dict=True)["accuracy"]
            accuracy.setdefault(state, []).append(acc)
            global_weights = [v.numpy() for v in model.trainable_variables]
            for bsz in batch_sizes:
                groups = client_groups(private, bsz, examples, batches)
                fl = HorizontalFL(model, [(x[g], y[g]) for g in groups], batch_size=bsz,
                                  seed=seed)
                for c, g in enumerate(groups):
                    delta, _ = fl.train_client(c, global_weights, local_epochs=1)
                    for v, w in zip(model.trainable_variables, global_weights):
                        v.assign(w)
                    x_true, y_true = x[g], y[g]
                    norms.setdefault((state, bsz), []).append(float(np.linalg.norm(delta)))
                    for name, make_upload, dist in schemes():
                        upload = make_upload(1000 * seed + c)
                        message = upload.client_message(delta, bsz).message
                        t0 = time.perf_counter()
                        res = gradient_inversion(
                            model, as_target(message), bsz, lr_local=LOCAL_LR, distance=dist,
                            iterations=ITER[bsz], bounds=(0.0, 1.0), seed=1000 * seed + c)
                        timing.setdefault(bsz, []).append(time.perf_counter() - t0)
                        rel = res.reconstruction_mse(x_true)
                        lab = res.label_accuracy(y_true, x_true)
                        rows.setdefault((state, bsz, name), []).append((rel, lab))
                        if keep_images and bsz == 1 and state == "init" and seed == seeds[0]:
                            images.setdefault(c, {"true": x_true[0]})[name] = \
                                res.x_reconstructed[0]
                        if bsz == 1 and name.startswith("SignDS"):
                            eps = float(name.split("=")[1])
                            img, flagged = support_attack(message, 64, HIDDEN, on_value,
                                                          off_value)
                            on = x_true[0] > 0
                            rel_s = float(((img - x_true[0]) ** 2).sum()
                                          / ((x_true[0] - x_true[0].mean()) ** 2).sum())
                            prec = float(on[flagged].mean()) if flagged.any() else np.nan
                            support.setdefault((state, eps), []).append(
                                (rel_s, prec, float(on.mean()), int(flagged.sum())))
                            if keep_images and state == "init" and seed == seeds[0]:
                                images[c][f"support eps={eps:g}"] = img
                    print(f"seed {seed} {state:7s} B={bsz} client {c}: " + ", ".join(
                        f"{n.split(' (')[0] if 'cosine' not in n else 'FedAvg cos'} "
                        f"{rows[(state, bsz, n)][-1][0]:.2f}" for n, _, _ in schemes()),
                        flush=True)
    return {"rows": rows, "support": support, "accuracy": accuracy, "norms": norms,
            "images": images, "timing": timing,
            "config": {"seeds": tuple(seeds), "examples": examples, "batches": batches,
                       "batch_sizes": tuple(batch_sizes)}}


def config(res):
    return res.get("config", {"seeds": SEEDS, "examples": EXAMPLES, "batches": BATCHES,
                              "batch_sizes": (1, 4)})


# --------------------------------------------------------------------------- report

def fmt(values):
    v = np.asarray(values, float)
    return f"{v.mean():.2f} ± {v.std():.2f}"


def tables(res, batch_sizes):
    cfg = config(res)
    out = {}
    for bsz in batch_sizes:
        noise = noise_reference(cfg["seeds"], cfg["examples"], cfg["batches"], bsz)
        body = []
        for name, _, dist in schemes():
            cells = [name, dist]
            for state in ("init", "trained"):
                vals = np.array(res["rows"][(state, bsz, name)])
                cells += [fmt(vals[:, 0]), f"{np.median(vals[:, 0]):.2f}",
                          f"{(vals[:, 0] < 0.2).mean():.0%}", f"{100 * vals[:, 1].mean():.0f}%"]
            body.append(cells)
        ref = [fmt(noise), f"{np.median(noise):.2f}", f"{(noise < 0.2).mean():.0%}", "10%"]
        body.append(["*uniform noise (no attack)*", "", *ref, *ref])
        header = ["upload", "distance"]
        for state in ("round 0", "trained"):
            header += [f"rel. MSE, {state}", "median", "< 0.2", "labels"]
        out[bsz] = _report.markdown_table(header, body)
    return out


def support_table(res):
    body = []
    for eps in SIGNDS_EPS:
        cells = [f"{eps:g}", str(SignDSEncoder(k=SIGNDS_K, eps=eps, seed=0).output_dim(
            64 * HIDDEN + HIDDEN + HIDDEN * 10 + 10))]
        for state in ("init", "trained"):
            v = np.array(res["support"][(state, eps)], float)
            cells += [f"{v[:, 3].mean():.1f}", f"{100 * np.nanmean(v[:, 1]):.0f}%",
                      f"{100 * v[:, 2].mean():.0f}%", fmt(v[:, 0])]
        body.append(cells)
    header = ["eps", "h"]
    for state in ("round 0", "trained"):
        header += [f"pixels flagged, {state}", "of them non-zero", "base rate", "mask rel. MSE"]
    return _report.markdown_table(header, body)


def plot(images, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = ["true", "FedAvg (L2, lr known)", "Gaussian z=0.01", "Gaussian z=0.1",
            "Gaussian z=1", "SignDS eps=100", "SignDS eps=10", "SignDS eps=1",
            "support eps=100"]
    titles = ["original", "FedAvg", "Gauss\nz=0.01", "Gauss\nz=0.1", "Gauss\nz=1",
              "SignDS\neps=100", "SignDS\neps=10", "SignDS\neps=1", "SignDS eps=100\nindex mask"]
    keys = sorted(images)[:6]
    fig, axes = plt.subplots(len(keys), len(cols), figsize=(1.25 * len(cols), 1.35 * len(keys)))
    for r, k in enumerate(keys):
        for c, col in enumerate(cols):
            ax = axes[r, c]
            ax.imshow(images[k][col].reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(titles[c], fontsize=7)
    fig.suptitle("DLG on one client's update (batch 1, global model at round 0)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_docs(res, meta):
    cfg = config(res)
    t = tables(res, (1, 4))
    acc = {s: 100 * np.mean(v) for s, v in res["accuracy"].items()}
    d = 64 * HIDDEN + HIDDEN + HIDDEN * 10 + 10
    med = {k: float(np.median(v)) for k, v in res["norms"].items()}
    noise = {b: noise_reference(cfg["seeds"], cfg["examples"], cfg["batches"], b) for b in (1, 4)}

    def ratio(z, state):
        # median over the one-example clients of ||noise|| / ||clipped update||
        n = np.asarray(res["norms"][(state, 1)])
        return float(np.median(z * GAUSS_CLIP * np.sqrt(d) / np.minimum(n, GAUSS_CLIP)))

    eps_rows = _report.markdown_table(
        ["z", "noise / signal, round 0", "noise / signal, trained",
         "local-DP eps per upload (delta 1e-5)"],
        [(f"{z:g}", f"{ratio(z, 'init'):.1f}", f"{ratio(z, 'trained'):.1f}",
          f"{analytic_gaussian_eps(z, DELTA):,.0f}") for z in GAUSS_Z])
    rows = res["rows"]

    def m(state, bsz, name):
        return np.array(rows[(state, bsz, name)])[:, 0].mean()

    def ok(state, bsz, name):
        return 100 * (np.array(rows[(state, bsz, name)])[:, 0] < 0.2).mean()

    def lab(state, bsz, name):
        return 100 * np.array(rows[(state, bsz, name)])[:, 1].mean()

    sup = {k: np.array(v, float) for k, v in res["support"].items()}
    n1 = len(cfg["seeds"]) * cfg["examples"]
    n4 = len(cfg["seeds"]) * cfg["batches"]
    fl2, fcos = "FedAvg (L2, lr known)", "FedAvg (cosine)"
    worst_signds = min(m(s, b, f"SignDS eps={e:g}") for s in ("init", "trained") for b in (1, 4)
                       for e in SIGNDS_EPS)
    text = f"""# Gradient inversion (DLG) against horizontal-FL uploads

Produced by `bench/gradient_inversion.py` (run {meta['date']}, {meta['seconds']:.0f} s on
{meta['machine']}):

```
TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/gradient_inversion.py
```

ALGORITHMS.md section 7: "Gradient inversion (DLG) against uploaded client updates in horizontal
FL; metric: MSE of the reconstruction. SignDS uploads only indices and a sign: the attack has
almost nothing to invert." This page measures that claim, and the same attack against plain FedAvg
and Gaussian-noised uploads.

## The attack

```python
from keras_fedpriv.attacks.gradient_inversion import gradient_inversion

global_weights = [v.numpy() for v in model.trainable_variables]
delta, _ = fl.train_client(client, global_weights)       # what the client uploads (FedAvg)
for v, w in zip(model.trainable_variables, global_weights):
    v.assign(w)                          # train_client leaves the client's weights in the model
res = gradient_inversion(model, delta, num_examples=1,   # the model holds the global weights
                         lr_local=0.1, bounds=(0, 1))    # distance="l2" (DLG) by default
res.x_reconstructed, res.labels_reconstructed            # (1, 64) image, iDLG label
res.reconstruction_mse(x_client)                         # 1.0 = no better than the mean
```

`gradient_inversion(model, target_update, num_examples=1, *, labels=None, label_mode="auto",
num_classes=None, from_logits=None, lr_local=None, distance="l2", learning_rate=0.1,
iterations=300, init="uniform", x_shape=None, bounds=None, restarts=1, seed=0)` is Deep Leakage
from Gradients (Zhu, Liu and Han, NeurIPS 2019) for Keras classifiers with a softmax
cross-entropy loss, in TensorFlow. The server knows the global weights (the model's current
weights, which the attack does not change) and the client's upload `target_update`: a flat vector
of all trainable weights in `model.trainable_variables` order (`HorizontalFL.train_client`'s
output, an upload's `.message`, `decode(signds_message)`), or a list of per-variable arrays; its
length is checked against the model. The attack creates dummy inputs (and soft dummy labels),
and minimizes with Adam (two nested `tf.GradientTape`s: through the gradient) the distance between
the dummy batch's gradient, or its one-step update `-lr_local * grad` when `lr_local` is given
(one local SGD step on one batch: DLG's setting), and the target.

- `distance="l2"`: DLG's sum of squared differences, divided by the constant `||target||^2`
  (same minimizer; readable: 0 = exact, 1 = no closer than a zero update). Needs the scale: the
  client's learning rate.
- `distance="cosine"`: 1 - cosine similarity (Geiping et al., NeurIPS 2020, "Inverting
  gradients"): scale-free, so it needs neither the learning rate nor the norm, survives clipping,
  and works on a decoded SignDS vector or a direction of any length. It is also the one to use on
  a trained model (see the results: L2 fails there).
- Labels: `labels=` if known; otherwise, for one example, iDLG (Zhao et al. 2020): with softmax
  cross-entropy the output bias's gradient is `p - onehot(y)`, negative only at the true class
  (`infer_label_idlg`, also usable alone; ties, e.g. an all-zero output layer in a sparse
  upload, are broken at random); for several examples soft labels are optimized with the images
  (`label_mode="optimize"`).
- `bounds=(0, 1)` clips the dummies to the pixel range after every step; the learning rate is
  divided by 10 at 50/75/90% of the steps; `restarts` repeats from fresh dummies and keeps the
  smallest distance (the attacker sees the distance, not the error).
- `InversionResult`: `x_reconstructed`, `labels_reconstructed`, `label_probabilities`,
  `gradient_distance` (a value near 0 means the attack found inputs that explain the upload; a
  large one flags a local minimum), `history` / `history_steps`, and
  `reconstruction_mse(x_true, baseline=None)` = SSE of the reconstruction / SSE of predicting the
  mean of `x_true` (or a given baseline image), after matching reconstructions to true examples
  by the Hungarian assignment (a batch gradient does not say which example is which);
  `assignment(x_true)`, `label_accuracy(y_true, x_true=None)`.
- Limits: the model is run with `training=False` (no dropout noise; BatchNormalization statistics
  are not modelled); several local steps or an adaptive local optimizer are matched only
  approximately (use the cosine distance); one model input.

## Benchmark set-up

digits (8x8, pixels / 16 in [0, 1]); MLP 64-{HIDDEN}(ReLU)-10 logits, d = {d:,} weights; each
attacked client holds 1 (or 4) held-out examples and runs one local SGD step (lr {LOCAL_LR},
batch = all its examples) with `HorizontalFL.train_client`. Two global models: **round 0** (fresh
Glorot initialization; test accuracy {acc['init']:.0f}%) and **trained** ({TRAIN_EPOCHS} epochs
of SGD on {PUBLIC} public examples; test accuracy {acc['trained']:.0f}%).
{cfg['examples']} one-example and {cfg['batches']} four-example clients per seed and model,
seeds {list(cfg['seeds'])}: {n1} and {n4} attacks per cell. Attack: {ITER[1]} Adam steps (lr
0.1) for one example (iDLG label), {ITER[4]} for four (optimized labels); one random start;
dummies in [0, 1]. One attack takes {np.mean(res['timing'][1]):.1f} s (one example) /
{np.mean(res['timing'][4]):.1f} s (four) here.

Uploads:
- **FedAvg**: the dense float32 update. Attacked with L2 (the server knows the local learning
  rate) and with cosine.
- **Gaussian** (`GaussianUpload(clip_norm={GAUSS_CLIP}, z)`), attacked with cosine. The
  one-example updates have median L2 norm {med[('init', 1)]:.3f} at round 0 (the clip binds) and
  {med[('trained', 1)]:.3f} on the trained model (below the clip: a well-classified example has a
  small gradient), so the same z buries the trained model's updates ~{min(med[('init', 1)], GAUSS_CLIP) / med[('trained', 1)]:.0f}x
  deeper. Median ratio of the
  noise's norm (z * C * sqrt(d)) to the clipped update's:

{eps_rows}

  (eps from the analytic Gaussian mechanism, sensitivity 2C, one upload, no composition.)
- **SignDS** (`SignDSEncoder(k={SIGNDS_K}, eps)`, h indices, capped at 100): the server decodes
  the message into the dense sparse +-1 vector (`decode(message)`; it does not know the step size)
  and attacks it with cosine, as if it were the direction of the update.

**Metric.** relative MSE (`reconstruction_mse`): 0 = exact, 1.0 = no better than a flat grey
image of the true mean brightness, above 1 = worse than that. The attack starts from uniform
noise, which scores {noise[1].mean():.2f} (one example; {noise[4].mean():.2f} for four, where
the matching picks the best pairing): the *uniform noise* row is "learned nothing, moved
nothing". "< 0.2": share of attacks with relative MSE below 0.2 (the digit is plainly legible).
labels: share of labels recovered (chance 10%). Mean ± std over attacks.

![original, and DLG reconstructions from each upload](gradient_inversion.png)

## One example per client (batch 1)

{t[1]}

## Four examples per client (batch 4, labels optimized)

{t[4]}

## SignDS: what the indices themselves say

DLG treats the decoded SignDS vector as a (very poor) update. A more direct attacker reads the
indices: the first {64 * HIDDEN:,} coordinates of the update are the first kernel, entry
(pixel p, unit j) = -lr * x_p * delta_j, which is exactly 0 when pixel p is 0. The top-k set
(the {SIGNDS_K:.0%} largest entries of one sign) therefore holds only non-zero pixels, and an
index drawn from it names one (the other h - t indices are uniform over the rest). The attacker
flags every pixel with a released index in its row and draws a mask image (flagged pixels = the
public mean of the non-zero pixels, the others 0). One example per client:

{support_table(res)}

## Reading

- **FedAvg gives the example away.** One example, round 0: relative MSE
  {m('init', 1, fl2):.2f} (L2) / {m('init', 1, fcos):.2f} (cosine), legible in
  {ok('init', 1, fl2):.0f}% / {ok('init', 1, fcos):.0f}% of attacks; iDLG's label is right
  {lab('init', 1, fl2):.0f}% of the time (it is exact for one example: it needs no optimization).
  On the trained model the **cosine** attack still recovers every digit
  ({m('trained', 1, fcos):.2f}, {ok('trained', 1, fcos):.0f}% legible), while **L2 mostly
  fails** ({m('trained', 1, fl2):.2f}): a well-classified example has a tiny gradient, the random
  start has a large one, and L2 descends to a confidently classified dummy whose update is nearly
  zero (final distance near 1, visible to the attacker) instead of the example. At round 0 L2
  also sticks in a local minimum now and then ({100 - ok('init', 1, fl2):.0f}% of attacks).
- **Four examples per client** are still recovered at round 0 ({m('init', 4, fl2):.2f} L2,
  {m('init', 4, fcos):.2f} cosine; labels {lab('init', 4, fl2):.0f}%), only partly on the trained
  model ({m('trained', 4, fcos):.2f} cosine, {ok('trained', 4, fcos):.0f}% legible; labels
  {lab('trained', 4, fcos):.0f}%). One local SGD step on a tiny batch is DLG's best case; more
  examples and more local steps make it harder.
- **Gaussian noise protects once the noise drowns the update, and not before.** Round 0, one
  example: z = 0.01 (noise 0.5x the clipped update, eps ~ 20,000 per upload) leaks the digit
  ({m('init', 1, 'Gaussian z=0.01'):.2f}, {ok('init', 1, 'Gaussian z=0.01'):.0f}% legible);
  z = 0.1 (noise 5x, eps ~ 280) leaves blurred fragments ({m('init', 1, 'Gaussian z=0.1'):.2f},
  none legible) but still the label ({lab('init', 1, 'Gaussian z=0.1'):.0f}%: the 10 output-bias
  coordinates carry the label with a large signal); z = 1 (eps ~ 10) leaves nothing
  ({m('init', 1, 'Gaussian z=1'):.2f}, labels {lab('init', 1, 'Gaussian z=1'):.0f}%). On the
  trained model the smaller updates make every z relatively noisier, yet z = 0.01 still leaks
  {ok('trained', 1, 'Gaussian z=0.01'):.0f}% of the digits (the misclassified examples, which
  have large updates). Clipping alone does nothing against the cosine distance.
- **SignDS leaves DLG almost nothing to invert**, as the design says: relative MSE above 1 in
  every cell (lowest {worst_signds:.2f}), no reconstruction below 0.2, at eps = 100, 10 and 1,
  for both models and both batch sizes. The upload has h <= 100 non-zero coordinates out of
  {d:,}, all of one sign, without magnitudes. Labels, though, are not at chance at eps = 100:
  {lab('init', 1, 'SignDS eps=100'):.0f}% / {lab('trained', 1, 'SignDS eps=100'):.0f}% (round 0 /
  trained, one example; chance 10%), because an output-bias coordinate of the true class is among
  the released indices now and then (with four examples, {lab('init', 4, 'SignDS eps=100'):.0f}% /
  {lab('trained', 4, 'SignDS eps=100'):.0f}%); at eps = 10 and 1 (round 0, one example) they are
  {lab('init', 1, 'SignDS eps=10'):.0f}% and {lab('init', 1, 'SignDS eps=1'):.0f}%, near chance
  for {n1} attacks.
- **"Almost nothing" is not nothing at eps = 100.** Reading the indices directly (previous
  section), the flagged pixels are non-zero {100 * np.nanmean(sup[('init', 100.0)][:, 1]):.0f}%
  / {100 * np.nanmean(sup[('trained', 100.0)][:, 1]):.0f}% of the time against a base rate of
  {100 * sup[('init', 100.0)][:, 2].mean():.0f}%: the upload reveals part of where the ink is
  (~{sup[('init', 100.0)][:, 3].mean():.0f} of 64 pixels flagged). The mask is still no digit
  (relative MSE {sup[('init', 100.0)][:, 0].mean():.2f} / {sup[('trained', 100.0)][:, 0].mean():.2f}),
  and eps = 100 is no guarantee at all; at eps = 10 the precision is
  {100 * np.nanmean(sup[('init', 10.0)][:, 1]):.0f}% / {100 * np.nanmean(sup[('trained', 10.0)][:, 1]):.0f}%
  on ~{sup[('init', 10.0)][:, 3].mean():.0f} pixels, at eps = 1 one index and chance.
- **Limits of this measurement**: one small model, one data set, one local step, 8x8 images, a
  fixed attack budget and one random start; an attacker with image priors, restarts, or the
  SignDS structure built into the loss can only do better. The numbers are empirical evidence
  about this attack; each mechanism's eps is the guarantee.
"""
    DOC.write_text(text)
    return DOC


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one seed, one one-example client, one noise level "
                             "per scheme, 10 attack iterations, no batch 4, no docs")
    parser.add_argument("--save", metavar="FILE",
                        help="also pickle the raw results (and run time) to FILE")
    parser.add_argument("--load", metavar="FILE",
                        help="skip the attacks: re-render the docs from a --save FILE")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    started = time.time()
    if args.load:
        with open(args.load, "rb") as f:
            res = pickle.load(f)
        seconds = res["seconds"]
    else:
        if args.quick:
            global ITER, TRAIN_EPOCHS, GAUSS_Z, SIGNDS_EPS
            ITER, TRAIN_EPOCHS, GAUSS_Z, SIGNDS_EPS = {1: 10}, 1, (0.1,), (10.0,)
            res = run((0,), 1, 0, (1,), keep_images=False)
        else:
            res = run(SEEDS, EXAMPLES, BATCHES, (1, 4), keep_images=True)
        seconds = res["seconds"] = time.time() - started
        if args.save:
            with open(args.save, "wb") as f:
                pickle.dump(res, f)
    for bsz, table in tables(res, (1,) if args.quick else (1, 4)).items():
        print(f"\nbatch {bsz}\n{table}")
    print(support_table(res))
    print(f"\n{seconds:.0f} s")
    if args.quick:
        return
    plot(res["images"], PNG)
    meta = {"date": _report.today(), "machine": _report.machine(), "seconds": seconds,
            "seeds": list(SEEDS)}
    print("wrote", write_docs(res, meta), PNG)


if __name__ == "__main__":
    main()
