"""FedAvg vs SignDS (with and without MagRR) vs a Gaussian baseline on digits.

Writes docs/results/hfl_signds.md, its figure and its JSON.

Digits (1797 8x8 images, 10 classes): 20% held out as the test set, the rest
split among 100 clients, IID and non-IID (Dirichlet(0.5) over labels). An MLP
64-128-10 (d = 9,738 weights). Every round 20 clients train E local epochs of
SGD from the global model and upload:

* FedAvg: the dense float32 update (no protection);
* SignDS at eps in {1, 10, 100} (k = 0.2, thr_ratio 0.6, h computed by the
  encoder), the server step either fixed (``global_lr``) or estimated by
  `MagRR` (eps_rr = 5);
* Gaussian: the update clipped to L2 norm C and N(0, (z C)^2) noise per
  coordinate (local DP; eps per round reported from dp-accounting).

Recorded: test accuracy per round, upload bytes per client per round.

Usage::

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/hfl_signds.py            # full, writes docs
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/hfl_signds.py --quick    # smoke run, no docs
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/hfl_signds.py --replot   # docs from the json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import _report  # noqa: E402
from keras_fedpriv.callbacks import MagRR  # noqa: E402
from keras_fedpriv.datasets import digits_clients as load_digits_clients  # noqa: E402
from keras_fedpriv.datasets import digits_mlp  # noqa: E402
from keras_fedpriv.federated import GaussianUpload, HorizontalFL, SignDSUpload  # noqa: E402
from keras_fedpriv.mechanisms.gaussian import gaussian_epsilon  # noqa: E402
from keras_fedpriv.optimizers import SignDSEncoder  # noqa: E402

NUM_CLIENTS = 100
CLIENTS_PER_ROUND = 20
LOCAL_EPOCHS = 5
LOCAL_LR = 0.05
SIGNDS_K = 0.2
# fixed server step without MagRR (picked from 0.01, 0.05, 0.2 on IID, eps=100, seed 0)
SIGNDS_LR = 0.2
GAUSS_CLIP, GAUSS_Z = 1.0, 1.0
ALPHA = 0.5


def digits_split(iid=True, seed=0):
    """(clients, (x_test, y_test)) for digits: 20% test, 100 clients (as in the demo)."""
    return load_digits_clients(NUM_CLIENTS, alpha=None if iid else ALPHA, seed=seed)


def make_model(seed=0):
    keras.utils.set_random_seed(seed)
    return digits_mlp(LOCAL_LR)


def configs():
    out = [("FedAvg", lambda s: ("fedavg", []))]
    for eps in (1.0, 10.0, 100.0):
        out.append((f"SignDS eps={eps:g}", lambda s, e=eps: (
            SignDSUpload(SignDSEncoder(k=SIGNDS_K, eps=e, seed=s), global_lr=SIGNDS_LR), [])))
        out.append((f"SignDS eps={eps:g} + MagRR", lambda s, e=eps: (
            SignDSUpload(SignDSEncoder(k=SIGNDS_K, eps=e, seed=s)), [MagRR(seed=s)])))
    out.append((f"Gaussian C={GAUSS_CLIP:g} z={GAUSS_Z:g}", lambda s: (
        GaussianUpload(GAUSS_CLIP, GAUSS_Z, seed=s), [])))
    return out


QUICK_CONFIGS = ("FedAvg", "SignDS eps=10 + MagRR", f"Gaussian C={GAUSS_CLIP:g} z={GAUSS_Z:g}")


def run(rounds, seeds, quick=False):
    results = {}
    for split in ("IID",) if quick else ("IID", "non-IID"):
        for name, make in configs():
            if quick and name not in QUICK_CONFIGS:
                continue
            curves, uploads = [], []
            for seed in seeds:
                clients, test = digits_split(iid=split == "IID", seed=seed)
                model = make_model(seed)
                upload, callbacks = make(seed)
                fl = HorizontalFL(model, clients, upload=upload, batch_size=32, seed=seed)
                t0 = time.time()
                hist = fl.fit(rounds, CLIENTS_PER_ROUND, LOCAL_EPOCHS, validation_data=test,
                              callbacks=callbacks, verbose=0)
                curves.append(hist.history["val_accuracy"])
                uploads.append(float(np.mean(hist.history["upload_bytes_per_client"])))
                dim = hist.history["download_bytes_per_client"][0] / 4
                print(f"{split:8s} {name:28s} seed {seed}: acc {curves[-1][-1]:.3f} "
                      f"(best {max(curves[-1]):.3f}) upload {uploads[-1]:.0f} B "
                      f"({time.time() - t0:.0f} s)", flush=True)
            results[f"{split}|{name}"] = {
                "split": split, "name": name, "curves": curves, "upload": float(np.mean(uploads)),
                "dim": int(dim)}
    return results


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    styles = {"FedAvg": ("k", "-"), "Gaussian": ("tab:gray", ":")}
    colors = {"1": "tab:red", "10": "tab:orange", "100": "tab:blue"}
    for ax, split in zip(axes, ("IID", "non-IID")):
        for key, r in results.items():
            if r["split"] != split:
                continue
            curve = np.mean(np.array(r["curves"]), axis=0)
            name = r["name"]
            if name.startswith("SignDS"):
                eps = name.split("eps=")[1].split()[0]
                color, ls = colors[eps], "-" if "MagRR" in name else "--"
            else:
                color, ls = styles[name.split()[0]]
            ax.plot(np.arange(1, len(curve) + 1), curve, color=color, ls=ls,
                    label=f"{name} ({r['upload']:.0f} B/client)")
        ax.set_title(f"digits, 100 clients, {split}")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def size_table():
    rows = []
    for d in (9_610, 266_084, 1_000_000, 10_000_000):
        for eps in (1.0, 10.0, 100.0):
            capped = SignDSEncoder(k=SIGNDS_K, eps=eps, seed=0).output_dim(d)
            free = SignDSEncoder(k=SIGNDS_K, eps=eps, max_dim_out=None, seed=0).output_dim(d)
            rows.append((f"{d:,}", f"{eps:g}", capped, f"{4 * capped + 1}",
                         f"{4 * d / (4 * capped + 1):,.0f}x", free,
                         f"{4 * d / (4 * free + 1):,.0f}x"))
    return _report.markdown_table(
        ["d", "eps", "h (cap 100)", "bytes", "less than float32", "h uncapped",
         "less than float32, uncapped"], rows)


def write_docs(results, meta):
    rows = []
    for key, r in results.items():
        curves = np.array(r["curves"])
        final = curves[:, -1]
        best = curves.max(axis=1)
        dense = 4 * r["dim"]
        rows.append((r["split"], r["name"],
                     f"{100 * final.mean():.1f} ± {100 * final.std():.1f}",
                     f"{100 * best.mean():.1f}", f"{r['upload']:.0f}",
                     f"{dense / r['upload']:.0f}x"))
    table = _report.markdown_table(
        ["split", "upload", f"test acc. after {meta['rounds']} rounds (%)", "best round (%)",
         "upload bytes / client / round", "less than dense float32"], rows)
    eps_g = gaussian_epsilon(GAUSS_Z, 1e-5)
    dim = next(iter(results.values()))["dim"]
    text = f"""# Horizontal FL: FedAvg vs SignDS vs Gaussian noise on digits

Produced by `bench/hfl_signds.py` (run {meta['date']}, {meta['seconds']:.0f} s on
{meta['machine']}):

```
TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/hfl_signds.py
```

Set-up: digits, 20% test set, the rest split among {NUM_CLIENTS} clients (IID, and
non-IID by Dirichlet({ALPHA}) over labels); MLP 64-128-10 (d = {dim:,}
weights, {4 * dim:,} bytes as float32); {meta['rounds']} rounds,
{CLIENTS_PER_ROUND} clients per round, {LOCAL_EPOCHS} local epochs of SGD (lr {LOCAL_LR}, batch 32);
mean ± std over seeds {meta['seeds']}. SignDS: k = {SIGNDS_K}, thr_ratio 0.6, h from the
encoder (capped at 100), server step {SIGNDS_LR} without MagRR; MagRR with its
defaults (eps_rr = 5, the seed's constants). Gaussian: clip {GAUSS_CLIP}, z = {GAUSS_Z},
local DP eps = {eps_g:.1f} per round at delta = 1e-5 (dp-accounting PLD), before
composition over rounds.

![accuracy per round](hfl_signds.png)

{table}

Upload size of SignDS alone (no training: `SignDSEncoder(k=0.2, eps).output_dim(d)`),
for this model, the seed's LeNet (d = 266,084) and larger models; h is capped at
100 by default (`max_dim_out`), "uncapped" is `max_dim_out=None`:

{size_table()}

{meta.get('reading', '')}
"""
    (_report.RESULTS / "hfl_signds.md").write_text(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: IID, 3 configurations, 2 rounds of 5 clients, no docs")
    parser.add_argument("--replot", action="store_true")
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args(argv)
    json_path = _report.RESULTS / "hfl_signds.json"
    if args.replot:
        saved = json.loads(json_path.read_text())
        saved["meta"]["reading"] = READING
        plot(saved["results"], _report.RESULTS / "hfl_signds.png")
        write_docs(saved["results"], saved["meta"])
        return
    seeds = [0] if args.quick else [0, 1]
    rounds = 2 if args.quick else args.rounds
    if args.quick:
        global CLIENTS_PER_ROUND, LOCAL_EPOCHS
        CLIENTS_PER_ROUND, LOCAL_EPOCHS = 5, 1
    started = time.time()
    results = run(rounds, seeds, quick=args.quick)
    if args.quick:
        return
    meta = {"date": _report.today(), "seconds": time.time() - started,
            "machine": _report.machine(), "rounds": rounds, "seeds": seeds, "reading": READING}
    json_path.write_text(json.dumps({"results": results, "meta": meta}))
    plot(results, _report.RESULTS / "hfl_signds.png")
    write_docs(results, meta)
    print("wrote docs/results/hfl_signds.md, docs/results/hfl_signds.png")


READING = """
## Reading (written after looking at the numbers above)

- **SignDS at eps = 100 is close to FedAvg, as the seed claims**: 93.2% vs
  94.3% (IID) and 93.3% vs 94.2% (non-IID) after 100 rounds, with a fixed
  server step of 0.2; with MagRR choosing the step, 90.3% / 90.8%. The label
  skew of Dirichlet(0.5) costs SignDS almost nothing here (sign updates of
  20 clients are averaged, and each client's top coordinates still point
  downhill).
- **Upload size: 96x smaller, not the seed's ~400x.** At eps = 100 the
  optimal h is 231 indices for this model and the encoder caps it at 100
  (the reference server's limit), so a client sends 401 bytes instead of
  38,440. The ratio is about d / h and this MLP has only d = 9,610 weights;
  the table above shows that for the seed's LeNet (d = 266,084) the same
  setting gives 2,654x (1,117x uncapped), so the seed's figure holds for
  models of its size, not for ours.
- **Smaller eps costs a great deal of accuracy.** At eps = 10 the optimal h
  is 14: after 100 rounds accuracy is 68% (IID) / 51% (non-IID) and still
  rising linearly; at eps = 1, h = 1 and the index is from the top-k set only
  ~40% of the time, so nothing is learned in 100 rounds (the accuracy stays
  at the initial model's ~5%). Each upload is a new eps-LDP release: a client
  sampled in ~20 of the 100 rounds spends 20 eps by basic composition.
- **MagRR is slower than a tuned fixed step here** (90% vs 93% at eps 100;
  37% vs 68% / 51% at eps 10). Its estimate settles at a smaller step than
  the best fixed one (0.0625-0.125 in our tuning runs vs 0.2): the contraction phase
  halves r_est whenever most clients report a step below it and never grows
  it again. Its value is that it needs no tuning of the server step and adds
  only one randomized-response bit (eps_rr = 5) per client and round; a
  tuned fixed step needs a grid search, which itself touches the data.
- **The Gaussian baseline** (clip 1, z = 1: about eps = 10 per round at
  delta = 1e-5 as local DP) reaches 66% / 63%: at a comparable per-round eps
  it is on par with SignDS at eps = 10 in accuracy but uploads the full dense
  update (674x more bytes).
"""

if __name__ == "__main__":
    main()
