"""What each protection buys on a Criteo-like Wide&Deep split model, and what the protocol costs.

Writes docs/results/vertical_scale.md, its figure (vertical_scale.png) and its
raw results (vertical_scale.json). The workload is `keras_fedpriv.criteo_like.CriteoLike`
(13 dense + 26 hashed categorical fields, vocabulary 10,000 each, about 25%
positives, a hidden model with a known ceiling AUC), the model
`keras_fedpriv.wide_deep` (the follower embeds its 13 categorical fields and
sends a 16-wide Dense of them; the leader holds the dense fields, the other 13
categorical fields, the labels and the wide + deep top), batch 1024, Adam.

Three parts (``--part``), run separately or together (``flower`` only when named):

* ``throughput``: rows/s, CPU seconds per row and peak memory (max RSS) of
  `VerticalModel.fit` without protections, of `VerticalModel.fit` with label
  DP (RR, eps 2) and EmbeddingDP (eps 4) together, and of the same
  architecture as one plain `keras.Model`, at each of ``--sizes`` rows (one
  epoch each). Each measurement runs in its own child process (a fresh
  interpreter: the max RSS is that measurement's alone). The rows are held in
  memory up to 10^7 rows (about 2.5 GB of arrays) and streamed from the
  generator (`CriteoLike.batches`, a `keras.utils.PyDataset`, slower to feed)
  above. Tracing time: the
  first step's time minus the median step time (what the first step costs
  beyond a steady step: building and tracing the training function).
* ``privacy``: at ``--rows`` training rows, for each protection (none;
  `LabelDPLayer` RR; RR-with-prior; `EmbeddingDPLayer`; `VAEBottom`; label DP
  RR + EmbeddingDP at the same eps) and each eps of ``--eps``: the test AUC on
  the next 50,000 rows, the eps the run spent on the labels and on the
  follower's features (`privacy_report(..., protects=...)`), and the success
  of each attack: norm and direction scoring of the cut gradients the follower
  received in the first epoch (`norm_label_inference`,
  `direction_label_inference`; max(AUC, 1 - AUC)); model completion with 40
  and 400 known labels and embedding clustering on what the follower sent in
  the last epoch (`model_completion`, `embedding_clustering`; AUC read in the
  attacker's favour, ``auc_best_sign``); and the leader's feature
  reconstruction (`feature_reconstruction`) of the follower's fields.

* ``flower``: at ``--flower-rows`` training rows (10^5), batch 1024, one
  epoch, without protections and with label DP + EmbeddingDP: the same
  parties from ``examples/flower_vertical`` (run config ``dataset =
  "criteo-like"``: `wide_deep_vertical`'s halves, the same initial weights)
  three ways: `VerticalModel.fit` in a child process; the leader's message
  loop with K (``--ks``) batches per message in this process
  (`VerticalDriver`, no Flower); and on Flower's Deployment Engine
  (`LoopbackDeployment`: a SuperLink, the follower's SuperNode and its party
  worker as processes on 127.0.0.1). rows/s over the whole epoch (the first
  step's tracing included in all three), the ratio to ``fit``, the epoch's
  loss (staleness shows there), Flower's message bytes per example and the
  deployment's start-up apart from the epoch.

Resumable: each finished privacy point is appended to the JSON at once and a
later run skips the points it already holds (``--fresh`` starts over);
``--replot`` rewrites the docs from the JSON without training.

Usage::

    .venv/bin/python bench/vertical_scale.py             # full: 10^5..10^7 rows; 10^6 rows
    .venv/bin/python bench/vertical_scale.py --part privacy --rows 100000 --eps 0.5 2 8
    .venv/bin/python bench/vertical_scale.py --part throughput --sizes 100000 1000000
    .venv/bin/python bench/vertical_scale.py --part flower --ks 8 16 32
    .venv/bin/python bench/vertical_scale.py --part flower --json /tmp/flower.json  # no docs
    .venv/bin/python bench/vertical_scale.py --replot    # rewrite the docs from the JSON
    .venv/bin/python bench/vertical_scale.py --quick     # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import resource
import shlex
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import _report  # noqa: E402
from keras_fedpriv import EmbeddingDPLayer, LabelDPLayer  # noqa: E402
from keras_fedpriv.attacks import (  # noqa: E402
    direction_label_inference,
    embedding_clustering,
    feature_reconstruction,
    model_completion,
    norm_label_inference,
)
from keras_fedpriv.criteo_like import FOLLOWER, LEADER, CriteoLike  # noqa: E402
from keras_fedpriv.federated import MessageRecorder, with_example_ids  # noqa: E402
from keras_fedpriv.layers import VAEBottom  # noqa: E402
from keras_fedpriv.privacy import privacy_report  # noqa: E402
from keras_fedpriv.wide_deep import wide_deep_model, wide_deep_vertical  # noqa: E402

SIZES = (10**5, 10**6, 10**7)
ROWS = 10**6
EPS = (0.5, 1.0, 2.0, 4.0, 8.0)
PROTECTIONS = ("none", "label_rr", "label_prior", "embedding", "vae", "label_embedding")
WITH_EPS = ("label_rr", "label_prior", "embedding", "label_embedding")
MODELS = ("plain", "vertical", "vertical_label_embedding")
BATCH = 1024
EPOCHS = 2
LEARNING_RATE = 3e-3
BOTTOM_UNITS = 16
TEST_ROWS = 50_000
IN_MEMORY_ROWS = 10**7  # 250 bytes a row in memory; the generator's PyDataset is slower
THROUGHPUT_LABEL_EPS, THROUGHPUT_EMBED_EPS = 2.0, 4.0
KNOWN = (40, 400)
CLUSTER_ROWS = 200_000  # k-means on a random subset of the recorded rows (speed)
RECON_AUX, RECON_TEST = 20_000, 5_000
DELTA = 1e-6
SEED = 0
RESULTS = _report.RESULTS / "vertical_scale.json"
PNG = _report.RESULTS / "vertical_scale.png"
DOC = _report.RESULTS / "vertical_scale.md"


# --------------------------------------------------------------------------- part 1: throughput

class _StepTimes(keras.callbacks.Callback):
    """Wall time at the end of every training batch, and CPU time after the first one."""

    def __init__(self):
        super().__init__()
        self.ends, self.cpu_after_first = [], None

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())
        if self.cpu_after_first is None:
            self.cpu_after_first = _cpu_seconds()


def _cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _throughput_model(kind, data):
    if kind == "plain":
        return wide_deep_model(data, seed=SEED, bottom_units=BOTTOM_UNITS)
    if kind == "vertical":
        return wide_deep_vertical(data, seed=SEED, bottom_units=BOTTOM_UNITS)
    return wide_deep_vertical(data, seed=SEED, bottom_units=BOTTOM_UNITS,
                              label_dp=LabelDPLayer(THROUGHPUT_LABEL_EPS, seed=1),
                              embedding_dp=EmbeddingDPLayer(THROUGHPUT_EMBED_EPS, seed=2))


def measure(kind, rows, vocabulary_size=10_000, batch_size=BATCH):
    """Train ``kind`` for one epoch over ``rows`` rows; its speed, CPU time and memory."""
    keras.utils.set_random_seed(SEED)
    data = CriteoLike(rows, seed=SEED, vocabulary_size=vocabulary_size)
    with_ids = kind != "plain"
    streamed = rows > IN_MEMORY_ROWS
    if streamed:
        inputs = dict(x=data.batches(batch_size, example_ids=with_ids))
    else:
        x, y = data.parties(0, rows, example_ids=with_ids)
        inputs = dict(x=x, y=y, batch_size=batch_size, shuffle=False)
    model = _throughput_model(kind, data)
    model.compile(keras.optimizers.Adam(LEARNING_RATE), "binary_crossentropy")
    times = _StepTimes()
    start = time.perf_counter()
    history = model.fit(**inputs, epochs=1, verbose=0, callbacks=[times])
    epoch_s = time.perf_counter() - start
    cpu_end = _cpu_seconds()
    ends = np.asarray(times.ends)
    steps = np.diff(ends)
    steady = float(np.median(steps)) if steps.size else float("nan")
    rows_after_first = rows - min(batch_size, rows)
    wall = float(ends[-1] - ends[0]) if steps.size else float("nan")
    return {"kind": kind, "rows": rows, "streamed": streamed, "steps": int(ends.size),
            "rows_per_s": rows_after_first / wall if wall > 0 else float("nan"),
            "cpu_us_per_row": 1e6 * (cpu_end - times.cpu_after_first) / max(rows_after_first, 1),
            "first_step_s": float(ends[0] - start), "median_step_s": steady,
            "tracing_s": float(ends[0] - start) - steady,
            "epoch_s": epoch_s, "loss": float(history.history["loss"][-1]),
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure_in_child(kind, rows):
    """`measure` in a fresh interpreter (its max RSS is this measurement's alone)."""
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", kind, str(rows)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} at {rows} rows failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def run_throughput(sizes, saved, in_process=False, save=None, models=MODELS):
    for rows in sizes:
        for kind in models:
            key = f"{kind}@{rows}"
            if key in saved:
                continue
            r = measure(kind, rows, vocabulary_size=1000) if in_process else \
                measure_in_child(kind, rows)
            saved[key] = r
            print(f"{kind} at {rows:,} rows: {r['rows_per_s']:,.0f} rows/s, "
                  f"{r['cpu_us_per_row']:.1f} CPU us/row, tracing {r['tracing_s']:.1f} s, "
                  f"max RSS {r['max_rss_mib']:,.0f} MiB", flush=True)
            if save:
                save()


def throughput_table(results):
    header = ["rows", "model", "rows/s", "wall ratio to plain", "CPU us / row",
              "CPU-time ratio (plain / this)", "tracing (s)", "max RSS (MiB)", "data"]
    rows = []
    for size in sorted({r["rows"] for r in results.values()}):
        plain = results.get(f"plain@{size}")
        for kind in MODELS:
            r = results.get(f"{kind}@{size}")
            if r is None:
                continue
            wall = cpu = "n/a"
            if plain is not None:
                wall = f"{r['rows_per_s'] / plain['rows_per_s']:.2f}"
                cpu = f"{plain['cpu_us_per_row'] / r['cpu_us_per_row']:.2f}"
            rows.append([f"{size:,}", MODEL_NAMES[kind], f"{r['rows_per_s']:,.0f}", wall,
                         f"{r['cpu_us_per_row']:.1f}", cpu, f"{r['tracing_s']:.1f}",
                         f"{r['max_rss_mib']:,.0f}",
                         "streamed" if r["streamed"] else "in memory"])
    return _report.markdown_table(header, rows)


MODEL_NAMES = {"plain": "plain keras.Model", "vertical": "VerticalModel",
               "vertical_label_embedding": f"VerticalModel + LabelDP (eps "
                                           f"{THROUGHPUT_LABEL_EPS:g}) + EmbeddingDP (eps "
                                           f"{THROUGHPUT_EMBED_EPS:g})"}


# --------------------------------------------------------------------------- part 2: privacy

def leader_prior(data, x_leader, y_noisy, eps, fit_rows, prior_rows):
    """The leader's prior P(y=1) for ``prior_rows`` from its own dense fields.

    A logistic regression fitted on ``fit_rows``' RR labels (released at
    ``eps``), de-biased: with RR, P(noisy=1) = q + (1 - 2q) P(y=1), q =
    1 / (1 + e^eps). It reads only the leader's features and labels already
    released, never a row's own label.
    """
    from sklearn.linear_model import LogisticRegression

    dense = slice(0, data.num_dense)
    clf = LogisticRegression(max_iter=500).fit(x_leader[fit_rows, dense],
                                                y_noisy[fit_rows, 0].astype(int))
    noisy_p = clf.predict_proba(x_leader[prior_rows, dense])[:, 1]
    q = 1.0 / (1.0 + math.exp(eps))
    p = np.clip((noisy_p - q) / (1.0 - 2.0 * q), 1e-4, 1.0 - 1e-4)
    return np.stack([1.0 - p, p], axis=1)


def _privatize(layer, y, ids, prior=None):
    return np.asarray(layer(y, example_ids=ids, prior=prior, training=True)).astype("float32")


def _head_indicators(ids, heads):
    """Whether each of the follower's fields holds its most frequent id (the reconstruction
    target: what the leader learns about the follower's categorical features)."""
    return (ids == heads[None, :]).astype("float32")


def run_point(kind, eps, data, x, y, x_test, y_test, epochs, seed=SEED, recon_epochs=30):
    """Train one protection at one eps; test AUC, eps spent, attack success."""
    from sklearn.metrics import roc_auc_score

    keras.utils.set_random_seed(seed)
    n = len(y)
    label_dp = embedding_dp = vae = None
    layers, y_fit, privatized = [], y, False
    if kind in ("label_rr", "label_embedding"):
        label_dp = LabelDPLayer(eps, seed=1000 * seed + 7)
    if kind in ("embedding", "label_embedding"):
        embedding_dp = EmbeddingDPLayer(eps, seed=1000 * seed + 9)
    if kind == "vae":
        vae = VAEBottom(BOTTOM_UNITS, hidden_units=(64,), seed=seed, name="vae")
    if kind == "label_prior":
        # Half 1: plain RR (RR-with-prior under a uniform prior is binary RR); half 2:
        # RR-with-prior, the prior from the leader's own dense fields over half 1's released
        # labels. One layer, both calls with a prior and the rows' own ids: each label is
        # released once, and the layer's ledger counts both halves in one row, per id.
        layer = LabelDPLayer(eps, seed=1000 * seed + 7)
        ids = x["example_ids"]
        half = n // 2
        y1 = _privatize(layer, y[:half], ids[:half], np.full((half, 2), 0.5))
        prior = leader_prior(data, x[LEADER], y1, eps, slice(0, half), slice(half, n))
        y_fit = np.concatenate([y1, _privatize(layer, y[half:], ids[half:], prior)])
        layers, privatized = [layer], True
    model = wide_deep_vertical(data, seed=seed, bottom_units=BOTTOM_UNITS, label_dp=label_dp,
                               embedding_dp=embedding_dp, vae=vae, labels_privatized=privatized)
    model.compile(keras.optimizers.Adam(LEARNING_RATE), "binary_crossentropy")
    recorder = MessageRecorder(epochs=sorted({0, epochs - 1}), parties=(FOLLOWER,))
    start = time.perf_counter()
    model.fit(x, y_fit, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[recorder])
    out = {"train_s": time.perf_counter() - start}
    # What training spent, read before anything else releases (the test predictions and the
    # attacker's queries below are releases of their own rows).
    for protects in ("labels", "features"):
        report = privacy_report([model, *layers], delta=DELTA, protects=protects)
        out[f"eps_{protects}"] = float(report.epsilon)
        out[f"folded_{protects}"] = any("folded" in r.note for r in report.releases)
    test_x = with_example_ids({FOLLOWER: x_test[FOLLOWER], LEADER: x_test[LEADER]}, start=n)
    out["test_auc"] = float(roc_auc_score(y_test[:, 0],
                                          model.predict(test_x, batch_size=8192, verbose=0)[:, 0]))

    # The follower's label attacks, scored against the TRUE labels of the recorded rows.
    first, last = 0, epochs - 1
    truth = y[recorder.example_ids(first), 0].astype(int)
    grads = recorder.cut_gradients(FOLLOWER, first)
    out["norm_auc"] = norm_label_inference(grads, truth).auc
    out["direction_auc"] = direction_label_inference(
        grads, truth, int(np.flatnonzero(truth == 1)[0])).auc
    sent = recorder.embeddings(FOLLOWER, last)
    truth_last = y[recorder.example_ids(last), 0].astype(int)
    for k in KNOWN:
        out[f"completion_{k}_auc"] = model_completion(sent, truth_last, known=k,
                                                      seed=seed).auc_best_sign
    pick = np.random.default_rng(seed).permutation(len(sent))[:CLUSTER_ROWS]
    out["clustering_auc"] = embedding_clustering(sent[pick], truth_last[pick], known=KNOWN[0],
                                                 num_clusters=4, n_init=3,
                                                 seed=seed).auc_best_sign
    # The leader's feature reconstruction: from what the follower sends at inference (the
    # protection as deployed), whether each follower field holds its most frequent id.
    aux = slice(0, min(RECON_AUX, n))
    heads = np.array([np.bincount(col).argmax() for col in x[FOLLOWER][aux].T])
    sent_aux = np.asarray(model.party_embeddings(FOLLOWER, x[FOLLOWER][aux]))
    test = slice(0, min(RECON_TEST, len(y_test)))
    sent_test = np.asarray(model.party_embeddings(FOLLOWER, x_test[FOLLOWER][test]))
    out["recon_rel_mse"] = feature_reconstruction(
        sent_aux, _head_indicators(x[FOLLOWER][aux], heads), sent_test,
        _head_indicators(x_test[FOLLOWER][test], heads), epochs=recon_epochs, batch_size=256,
        seed=seed).relative_mse
    return out


def points(eps_values):
    yield ("none", None)
    for kind in WITH_EPS[:3]:
        for eps in eps_values:
            yield (kind, eps)
    yield ("vae", None)
    for eps in eps_values:
        yield ("label_embedding", eps)


def point_key(kind, eps, rows):
    return f"{kind}|{'-' if eps is None else f'{eps:g}'}|{rows}"


def run_privacy(rows, eps_values, epochs, saved, quick=False, save=None):
    data = CriteoLike(rows, seed=SEED, vocabulary_size=1000 if quick else 10_000)
    test_rows = 2000 if quick else TEST_ROWS
    x, y = data.parties(0, rows)
    x_test, y_test = data.parties(rows, rows + test_rows, example_ids=False)
    saved.setdefault("ceiling_auc", {})[str(rows)] = data.ceiling_auc(min(rows, 200_000))
    kinds = ("label_rr",) if quick else PROTECTIONS
    for kind, eps in points(eps_values):
        key = point_key(kind, eps, rows)
        if kind not in kinds or key in saved["points"]:
            continue
        r = run_point(kind, eps, data, x, y, x_test, y_test, epochs,
                      recon_epochs=5 if quick else 30)
        r.update(kind=kind, eps=eps, rows=rows, epochs=epochs)
        saved["points"][key] = r
        print(f"{describe(kind, eps)}: test AUC {r['test_auc']:.3f}, eps labels "
              f"{r['eps_labels']:.3g} features {r['eps_features']:.3g}; norm "
              f"{r['norm_auc']:.2f} direction {r['direction_auc']:.2f} completion-40 "
              f"{r['completion_40_auc']:.2f} completion-400 {r['completion_400_auc']:.2f} "
              f"clustering {r['clustering_auc']:.2f}; reconstruction {r['recon_rel_mse']:.2f} "
              f"({r['train_s']:.0f} s)", flush=True)
        if save:
            save()


NAMES = {"none": "no protection", "label_rr": "LabelDP RR", "label_prior": "RR-with-prior",
         "embedding": "EmbeddingDP", "vae": "VAEBottom",
         "label_embedding": "LabelDP RR + EmbeddingDP"}


def describe(kind, eps):
    return NAMES[kind] + ("" if eps is None else f", eps={eps:g}")


def rr_bound(eps):
    """The AUC of an attacker who learns each RR label exactly, against the true labels."""
    return math.exp(eps) / (1.0 + math.exp(eps))


def _eps_cell(value, folded):
    if math.isinf(value):
        return "inf"
    return f"{value:.3g}" + (" (upper bound: folded ids)" if folded else "")


def privacy_table(saved, rows):
    header = ["protection", "test AUC", "eps spent: labels", "eps spent: features",
              "RR bound", "norm", "direction", "completion 40", "completion 400",
              "clustering", "reconstruction rel. MSE"]
    out = []
    for kind, eps in points(sorted({p["eps"] for p in saved["points"].values()
                                    if p["eps"] is not None and p["rows"] == rows})):
        p = saved["points"].get(point_key(kind, eps, rows))
        if p is None:
            continue
        bound = f"{rr_bound(eps):.2f}" if kind.startswith("label") else ""
        out.append([describe(kind, eps), f"{p['test_auc']:.3f}",
                    _eps_cell(p["eps_labels"], p["folded_labels"]),
                    _eps_cell(p["eps_features"], p["folded_features"]), bound,
                    *(f"{p[k]:.2f}" for k in ("norm_auc", "direction_auc", "completion_40_auc",
                                              "completion_400_auc", "clustering_auc",
                                              "recon_rel_mse"))])
    return _report.markdown_table(header, out)


ATTACKS = (("norm_auc", "norm"), ("direction_auc", "direction"),
           ("completion_40_auc", "completion, 40 known"),
           ("completion_400_auc", "completion, 400 known"), ("clustering_auc", "clustering"))


def plot(saved, rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = {(p["kind"], p["eps"]): p for p in saved["points"].values() if p["rows"] == rows}
    eps_values = sorted({e for (_, e) in pts if e is not None})
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    ax_utility, ax_recon = axes[0, 0], axes[1, 2]
    panels = dict(zip(WITH_EPS, (axes[0, 1], axes[0, 2], axes[1, 0], axes[1, 1])))
    grid = np.geomspace(min(eps_values), max(eps_values), 100) if eps_values else []
    for kind, ax in panels.items():
        eps = [e for e in eps_values if (kind, e) in pts]
        for key, label in ATTACKS:
            ax.plot(eps, [pts[(kind, e)][key] for e in eps], marker="o", label=label)
        ax.plot(eps, [pts[(kind, e)]["test_auc"] for e in eps], color="black", ls="--",
                marker="s", label="test AUC")
        if kind.startswith("label"):  # EmbeddingDP's eps is about features, not labels
            ax.plot(grid, [rr_bound(e) for e in grid], color="gray", lw=2, alpha=0.6,
                    label="RR bound e^eps/(1+e^eps)")
        ax.set_ylim(0.45, 1.02)
        ax.set_title(f"{NAMES[kind]}: attack AUC")
    for kind in WITH_EPS:
        eps = [e for e in eps_values if (kind, e) in pts]
        ax_utility.plot(eps, [pts[(kind, e)]["test_auc"] for e in eps], marker="o",
                        label=NAMES[kind])
        if kind in ("embedding", "label_embedding"):
            ax_recon.plot(eps, [pts[(kind, e)]["recon_rel_mse"] for e in eps], marker="o",
                          label=NAMES[kind])
    for kind, style in (("none", "--"), ("vae", ":")):
        if (kind, None) in pts:
            ax_utility.axhline(pts[(kind, None)]["test_auc"], ls=style, color="gray",
                               label=NAMES[kind])
            ax_recon.axhline(pts[(kind, None)]["recon_rel_mse"], ls=style, color="gray",
                             label=NAMES[kind])
    ceiling = saved.get("ceiling_auc", {}).get(str(rows))
    if ceiling:
        ax_utility.axhline(ceiling, color="black", lw=0.8, label="ceiling (hidden model)")
    ax_utility.set_title("test AUC")
    ax_recon.set_title("feature reconstruction rel. MSE (1 = nothing)")
    span = (min(eps_values) / 1.3, max(eps_values) * 1.3) if eps_values else (0.4, 10.0)
    for ax in axes.ravel():
        ax.set_xscale("log", base=2)
        ax.set_xlim(*span)
        ax.set_xlabel("eps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Criteo-like Wide&Deep, {rows:,} training rows")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --------------------------------------------------------------------------- part 3: Flower

FLOWER_ROWS = 10**5
FLOWER_KS = (8, 16, 32)
FLOWER_KINDS = {False: "vertical", True: "vertical_label_embedding"}  # protect -> model kind
EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "flower_vertical"


def _example_task():
    """The vertical Flower example's task module (it serves the Criteo-like parties too)."""
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    from flower_vertical import task

    return task


def flower_run_config(rows, k, protect):
    """The example's run config for one epoch of the Criteo-like parties, no held-out rows."""
    return {"dataset": "criteo-like", "rows": rows, "test-rows": 0, "protect": protect,
            "num-epochs": 1, "batch-size": BATCH, "batches-per-message": k}


def driver_epoch(rows, k, protect):
    """One epoch of the example's Criteo-like parties through the leader's message loop in
    this process (`VerticalDriver`: the loop the ServerApp runs, K batches per exchange, no
    Flower): its seconds (tracing included) and loss."""
    from types import SimpleNamespace

    from keras_fedpriv.federated.vertical.driver import VerticalDriver

    task = _example_task()
    context = SimpleNamespace(run_config=flower_run_config(rows, k, protect))
    driver = VerticalDriver(task.model_fn(context=context).split_parties(),
                            {FOLLOWER: task.follower_features(FOLLOWER, context)})
    ids, x, y = task.leader_data(context)
    start = time.perf_counter()
    result = driver.fit(y, example_ids=ids, x=x, epochs=1, batch_size=BATCH,
                        batches_per_message=k, seed=SEED)
    return {"epoch_s": time.perf_counter() - start, "loss": result.history["loss"][0],
            "steps": result.history["steps"][0], "skipped": result.history["skipped"][0]}


def flower_epoch(rows, k, protect):
    """The same epoch on Flower's Deployment Engine: `LoopbackDeployment` (a SuperLink, the
    follower's SuperNode and its party worker as processes on 127.0.0.1), ``flwr run`` of
    the example. The epoch's seconds are the leader's (``epoch_time_s``: from its first
    message to the epoch's end); the start-up is apart: the deployment's (SuperLink,
    SuperNode, the worker importing TensorFlow) and the run's (the ServerApp's start, the
    parties' data and models, the followers' introduction, the last gradients, the end)."""
    import flower as flower_bench  # bench/flower.py

    run = flower_bench.vertical_deployment(flower_run_config(rows, k, protect),
                                           parties=(FOLLOWER,))
    h = run["history"]
    epoch = h["epoch_time_s"][0]
    return {"epoch_s": epoch, "loss": h["loss"][0], "steps": h["steps"][0],
            "skipped": h["skipped"][0], "wire_up_per_row": h["wire_bytes_up"][0] / rows,
            "wire_down_per_row": h["wire_bytes_down"][0] / rows,
            "payload_up_per_row": run["wire"][FOLLOWER]["bytes_per_example"],
            "deployment_up_s": run["up_s"], "run_startup_s": run["total_s"] - run["up_s"] - epoch,
            "eps": run["eps"]}


def run_flower(rows, ks, results, quick=False, save=None, protections=(False, True)):
    """For each protection: the in-process `VerticalModel.fit` epoch, then for each K the
    leader's message loop in process and (unless ``quick``) on the Deployment Engine."""
    runtimes = [("driver", driver_epoch)] + ([] if quick else [("flower", flower_epoch)])
    for protect in protections:
        kind = FLOWER_KINDS[protect]
        key = f"fit:{kind}@{rows}"
        if key not in results:
            r = measure(kind, rows) if quick else measure_in_child(kind, rows)
            results[key] = {"runtime": "fit", "kind": kind, "rows": rows, "k": None, **r}
        for k in ks:
            for runtime, fn in runtimes:
                key = f"{runtime}:{kind}:K={k}@{rows}"
                if key in results:
                    continue
                results[key] = {"runtime": runtime, "kind": kind, "rows": rows, "k": k,
                                **fn(rows, k, protect)}
                print(f"{runtime}, {kind}, K = {k}: {results[key]['epoch_s']:.1f} s per epoch",
                      flush=True)
                if save:
                    save()


RUNTIMES = {"fit": "`VerticalModel.fit`, one process",
            "driver": "the leader's message loop, one process (`VerticalDriver`)",
            "flower": "Deployment Engine, loopback, a party worker"}


def flower_table(results):
    header = ["rows", "protections", "runtime", "K", "message rounds", "epoch s", "rows/s",
              "ratio to fit", "loss", "wire bytes / example up, down (payload up)",
              "start-up s: deployment + run", "labels eps (leader's report)"]
    out = []
    for r in sorted(results.values(), key=lambda r: (r["rows"], r["kind"],
                                                     list(RUNTIMES).index(r["runtime"]),
                                                     r["k"] or 0)):
        fit = results.get(f"fit:{r['kind']}@{r['rows']}")
        wire = start = eps = "-"
        if r["runtime"] == "flower":  # no eps read from the report: inf, never less
            eps = "inf" if r["eps"] is None else f"{r['eps']:g}"
            wire = (f"{r['wire_up_per_row']:.1f}, {r['wire_down_per_row']:.1f} "
                    f"({r['payload_up_per_row']:g})")
            start = f"{r['deployment_up_s']:.0f} + {r['run_startup_s']:.0f}"
        steps = math.ceil(r["rows"] / BATCH)
        out.append([f"{r['rows']:,}", "none" if r["kind"] == "vertical" else
                    f"LabelDP (eps {THROUGHPUT_LABEL_EPS:g}) + EmbeddingDP (eps "
                    f"{THROUGHPUT_EMBED_EPS:g})", RUNTIMES[r["runtime"]],
                    "-" if r["k"] is None else str(r["k"]),
                    "-" if r["k"] is None else str(math.ceil(steps / r["k"])),
                    f"{r['epoch_s']:.1f}", f"{r['rows'] / r['epoch_s']:,.0f}",
                    "n/a" if fit is None else f"{fit['epoch_s'] / r['epoch_s']:.2f}",
                    f"{r['loss']:.4f}", wire, start, eps])
    return _report.markdown_table(header, out)


# --------------------------------------------------------------------------- report

def targets(saved):
    """The issue's targets beside what this run measured (lines of markdown)."""
    lines = []
    tp = saved["throughput"]
    for size in sorted({r["rows"] for r in tp.values()}):
        plain = tp.get(f"plain@{size}")
        if plain is None:
            continue
        for kind, target in (("vertical", 0.95), ("vertical_label_embedding", 0.9)):
            r = tp.get(f"{kind}@{size}")
            if r is not None:
                lines.append(f"- {size:,} rows, {MODEL_NAMES[kind]}: CPU-time ratio "
                             f"{plain['cpu_us_per_row'] / r['cpu_us_per_row']:.2f}, wall ratio "
                             f"{r['rows_per_s'] / plain['rows_per_s']:.2f} (target >= {target})")
        worst = max(r["tracing_s"] for k, r in tp.items() if k.endswith(f"@{size}"))
        lines.append(f"- {size:,} rows: tracing at most {worst:.1f} s per model (target <= 2 s)")
    for rows in sorted({p["rows"] for p in saved["points"].values()}):
        for kind in ("label_rr", "label_embedding"):
            gaps = [(max(p[key] for key, _ in ATTACKS) - rr_bound(p["eps"]), p["eps"])
                    for p in saved["points"].values()
                    if p["rows"] == rows and p["kind"] == kind and p["eps"] <= 1]
            if gaps:
                gap, eps = max(gaps)
                lines.append(f"- {rows:,} rows, {NAMES[kind]}, eps <= 1: the strongest label "
                             f"attack is {gap:+.3f} from the RR bound (at eps {eps:g}; target: "
                             f"at most +0.05)")
    return "\n".join(lines) or "- nothing measured yet"


def render(saved):
    commands = saved.get("commands", {})
    command = "\n".join(f"{c}   # {part}" for part, c in sorted(commands.items())) or "?"
    privacy_rows = sorted({p["rows"] for p in saved["points"].values()})
    parts = [f"""# What each protection buys at scale: a Criteo-like Wide&Deep split model

Produced by `bench/vertical_scale.py` (last run {saved.get('date', '?')}, on
{saved.get('machine', '?')}):

```
{command}
```

{saved.get('note', '')}

Workload: `CriteoLike` (13 dense + 26 categorical fields, vocabulary 10,000 per field, about
25% positives; the follower holds 13 categorical fields, the leader the rest, the labels and
the top), `wide_deep_vertical` (embedding 8 per field, bottoms of {BOTTOM_UNITS} units, top:
wide + deep (64, 32)), batch {BATCH}, Adam {LEARNING_RATE:g}.

## Throughput and memory

One epoch per measurement, each in a fresh child process. rows/s and CPU time per row after
the first step; tracing = first step minus the median step; max RSS = the child's peak
resident memory (Python, TensorFlow and the data included). Ratios: above 1 = faster than
plain Keras. Timings on a shared 2-core machine swing by tens of percent; only the ratios
within one size are meaningful.

"""]
    parts.append(throughput_table(saved["throughput"]) if saved["throughput"] else
                 "Not run (`--part throughput`).")
    parts.append("\n")
    for rows in sorted(privacy_rows, reverse=True):  # the largest first, with the figure
        epochs = {p["epochs"] for p in saved["points"].values() if p["rows"] == rows}
        ceiling = saved.get("ceiling_auc", {}).get(str(rows))
        lead = (f"{'/'.join(str(e) for e in sorted(epochs))} epoch(s), test AUC on the next "
                f"{TEST_ROWS:,} rows (the ceiling, the hidden model's own AUC: {ceiling:.3f}); "
                "one seed per point.")
        if rows != privacy_rows[-1]:
            parts.append(f"""
## Privacy and utility at {rows:,} training rows

{lead} The columns as above.

{privacy_table(saved, rows)}
""")
            continue
        parts.append(f"""
## Privacy and utility at {rows:,} training rows

{lead} eps spent: from
`privacy_report([model, ...], delta={DELTA:g}, protects="labels" / "features")` right after
`fit` (inf: released without DP): what training spent; the test predictions and the attacks'
queries are releases of their own rows, not in this column. Label attacks by the follower,
ROC-AUC against the true labels read in the attacker's favour (0.5 = chance): norm / direction
on the cut gradients of the first epoch; model completion (logistic top on 40 / 400 known
labels) and embedding clustering (k-means, 4 clusters named by 40 known labels, on
{CLUSTER_ROWS:,} rows at most) on what the follower sent in the last epoch. RR bound:
e^eps/(1+e^eps), the AUC of an attacker who learns each randomized label exactly and knows
nothing else. An attack that also reads what the model learned from all the rows (the size of a
cut gradient follows the model's prediction, which the features make good) can pass it a little:
that is inference from the population, which label DP allows, not more about the example's own
label than eps (RR-with-prior leans the released label towards the leader's prior, so there
the bound is a reference line). Reconstruction: the leader's decoder
(`feature_reconstruction`, {RECON_AUX:,} auxiliary rows) from what the follower sends at
inference to whether each follower field holds its most frequent id; 1.0 = no better than the
mean. RR-with-prior: half 1's labels by RR, half 2's with a prior from a logistic regression on
the leader's dense fields over half 1's released labels, de-biased (half 1 also through
RR-with-prior, with a uniform prior: binary RR, so that both halves are one ledger row and the
report counts each label once; a keyed-RR half 1 would be a second row, composed with the first
as if one example were in both: 2·eps, an over-count). "features" inf: the follower's
embedding goes up without DP (no EmbeddingDP; a VAE sample is no DP release either).
EmbeddingDP eps is per coordinate pair: the {BOTTOM_UNITS}-wide embedding composes to
{BOTTOM_UNITS // 2}·eps per release (the "features" column).

![attack and test AUC against eps per protection](vertical_scale.png)

{privacy_table(saved, rows)}
""")
    parts.append(f"""
## The issue's targets, as measured

{targets(saved)}
""")
    if saved.get("flower"):
        parts.append(f"""
## On Flower's Deployment Engine

The parties of `examples/flower_vertical` with the run config `dataset = "criteo-like"` (the
same `wide_deep_vertical` halves and initial weights as above), one epoch at batch {BATCH}, no
held-out rows; `bench/vertical_scale.py --part flower`. rows/s: the epoch's rows over its
seconds, the first step's tracing included in every runtime (on Flower: the leader's
`epoch_time_s`, from its first message to the epoch's end). Ratio: `fit`'s epoch seconds over
this one's. K: batches per message; a follower embeds all K with the same weights (up to
K - 1 steps stale), which the loss shows. Wire: Flower's serialized messages per training
example within the epoch (the payload up: what the follower's reply holds; down: the example
ids and the cut gradients, of which the last message's go after the epoch). Start-up, not in
the epoch: the deployment's (SuperLink, SuperNode, the party worker importing TensorFlow) +
the run's (the ServerApp's start and TensorFlow, the parties' data and models, the
introduction, the last gradients, the end).

{flower_table(saved["flower"])}
""")
    missing = ("" if saved.get("flower") else "\n- The Flower Deployment Engine row: not run "
               "here (`--part flower`).") + saved.get("missing", "")
    if missing.strip():
        parts.append(f"""
## Not measured here
{missing}
""")
    return "".join(parts)


def load_saved(path=RESULTS):
    if path.exists():
        return json.loads(path.read_text())
    return {"throughput": {}, "points": {}}


def write_docs(saved):
    rows = sorted({p["rows"] for p in saved["points"].values()})
    if rows:
        plot(saved, rows[-1], PNG)
    DOC.write_text(render(saved))
    print(f"wrote {DOC}" + (f" and {PNG}" if rows else ""))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 4,096 rows, in process, vocabulary 1,000, plain "
                             "and VerticalModel, LabelDP at eps 2, 1 epoch; the flower part's "
                             "message loop at K = 2 without Flower; writes nothing")
    parser.add_argument("--part", nargs="+", choices=("throughput", "privacy", "flower"),
                        default=["throughput", "privacy"])
    parser.add_argument("--flower-rows", type=int, default=FLOWER_ROWS,
                        help="flower: training rows")
    parser.add_argument("--ks", nargs="+", type=int, default=list(FLOWER_KS),
                        help="flower: batches per message (K) to try")
    parser.add_argument("--json", type=pathlib.Path, default=None,
                        help=f"keep the results in this file instead of {RESULTS.name}, and "
                             "write no docs")
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--eps", nargs="+", type=float, default=list(EPS))
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--note", default="", help="a line for the md (e.g. 'reduced run')")
    parser.add_argument("--fresh", action="store_true", help="forget the saved results")
    parser.add_argument("--replot", action="store_true",
                        help=f"rewrite the docs from {RESULTS.name} without training")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]))), flush=True)
        return 0
    if args.replot:
        write_docs(load_saved())
        return 0
    if args.quick:
        saved = {"throughput": {}, "points": {}}
        run_throughput([4096], saved["throughput"], in_process=True, models=MODELS[:2])
        run_privacy(4096, [2.0], 1, saved, quick=True)
        saved["flower"] = {}
        run_flower(4096, [2], saved["flower"], quick=True, protections=(False,))
        print(throughput_table(saved["throughput"]))
        print(privacy_table(saved, 4096))
        print(flower_table(saved["flower"]))
        return 0
    results = args.json or RESULTS
    saved = {"throughput": {}, "points": {}} if args.fresh else load_saved(results)
    given = list(argv if argv is not None else sys.argv[1:])
    if "--note" in given:  # the note goes into the md on its own
        del given[given.index("--note"):given.index("--note") + 2]
    command = ("TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/vertical_scale.py "
               + " ".join(shlex.quote(a) for a in given))
    saved.pop("command", None)  # written by an earlier version of this script
    saved.update(date=_report.today(), machine=_report.machine())
    saved.setdefault("commands", {}).update({part: command for part in args.part})
    if args.note:
        saved["note"] = args.note

    def save():
        results.write_text(json.dumps(saved, indent=1))

    if "throughput" in args.part:
        run_throughput(args.sizes, saved["throughput"], save=save)
        print(throughput_table(saved["throughput"]))
    if "privacy" in args.part:
        run_privacy(args.rows, args.eps, args.epochs, saved, save=save)
        print(privacy_table(saved, args.rows))
    if "flower" in args.part:
        run_flower(args.flower_rows, args.ks, saved.setdefault("flower", {}), save=save)
        print(flower_table(saved["flower"]))
    save()
    if args.json is None:
        write_docs(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
