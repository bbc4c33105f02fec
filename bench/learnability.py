"""Learnability: the accuracy each mechanism's per-release eps leaves, and where it stops learning.

Sweeps the per-release eps of the mechanisms that carry the training signal
and records the test accuracy on digits (10 classes, chance about 0.10):

* SignDS: `HorizontalFL` with `SignDSUpload(SignDSEncoder(k=0.2, eps))`,
  100 IID clients, 20 per round, 5 local epochs, server step 0.2 (the
  set-up of bench/hfl_signds.py: 100 rounds, seed 0);
* LabelDP: labels randomized once (`privatize_labels`, K = 10), the MLP
  64-128-10 trained centrally on them;
* EmbeddingDP: MLP 64-32 -> `EmbeddingDPLayer(eps)` (d = 32) -> 10, trained
  and tested through the layer (fresh noise at every call).

Next to each accuracy it prints the mechanism's signal measure
(`keras_fedpriv.mechanisms.registry.Mechanism.signal`). "Too small to learn" is the
signal of the largest swept eps whose accuracy stays within `MARGIN` of
chance: those are the thresholds `keras_fedpriv.privacy.plan` warns at
(`TooSmallToLearnWarning`). MagRR, Laplace evaluation and the Gaussian upload
are not swept (MagRR and Laplace do not carry the training signal; see
docs/privacy.md).

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/learnability.py           # writes docs
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/learnability.py --quick   # smoke run, no docs
"""

import argparse
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
import keras_fedpriv as kf  # noqa: E402
from keras_fedpriv.datasets import digits_clients, digits_mlp  # noqa: E402
from keras_fedpriv.federated import HorizontalFL, SignDSUpload  # noqa: E402
from keras_fedpriv.optimizers import SignDSEncoder  # noqa: E402
from keras_fedpriv.privacy.run_plan import signal  # noqa: E402

MARGIN = 0.05  # "within 5 points of chance"
SIGNDS_K, SIGNDS_LR, CLIENTS_PER_ROUND, LOCAL_EPOCHS = 0.2, 0.2, 20, 5
EMBEDDING_DIM = 32
SWEEPS = {
    "signds": (0.35, 1.0, 2.0, 3.0, 5.0, 7.0, 10.0),
    "label_dp": (0.05, 0.1, 0.25, 0.5, 1.0, 2.0),
    "embedding_dp": (0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
}
QUICK = {"signds": (0.35, 10.0), "label_dp": (0.1, 2.0), "embedding_dp": (0.01, 1.0)}


def _data():
    clients, test = digits_clients(100, seed=0)
    x = np.concatenate([c[0] for c in clients])
    y = np.concatenate([c[1] for c in clients])
    return clients, (x, y), test


def signds_accuracy(eps, clients, test, rounds, seed=0):
    keras.utils.set_random_seed(seed)
    upload = SignDSUpload(SignDSEncoder(k=SIGNDS_K, eps=eps, seed=seed), global_lr=SIGNDS_LR)
    fl = HorizontalFL(digits_mlp(0.05), clients, upload=upload, batch_size=32, seed=seed)
    history = fl.fit(rounds, CLIENTS_PER_ROUND, LOCAL_EPOCHS, validation_data=test, verbose=0)
    return float(history.history["val_accuracy"][-1])


def label_dp_accuracy(eps, train, test, epochs, seed=0):
    keras.utils.set_random_seed(seed)
    noisy = kf.privatize_labels(train[1], eps=eps, mode="sparse", num_classes=10, seed=seed)
    model = digits_mlp(0.1)
    model.fit(train[0], noisy, epochs=epochs, batch_size=32, verbose=0)
    return float(model.evaluate(*test, verbose=0)[1])


def embedding_dp_accuracy(eps, train, test, epochs, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(EMBEDDING_DIM)(keras.layers.Dense(64, activation="relu")(inputs))
    protected = kf.EmbeddingDPLayer(eps=eps, seed=seed)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10)(protected))
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(*train, epochs=epochs, batch_size=32, verbose=0)
    return float(model.evaluate(*test, verbose=0)[1])


def _signal(name, eps):
    if name == "signds":
        return signal(name, eps, k=SIGNDS_K)
    return signal(name, eps, num_classes=10)


def run(quick):
    clients, train, test = _data()
    chance = float(np.bincount(test[1]).max() / len(test[1]))
    rounds, epochs = (2, 1) if quick else (100, 20)
    if quick:
        global CLIENTS_PER_ROUND, LOCAL_EPOCHS
        CLIENTS_PER_ROUND, LOCAL_EPOCHS = 5, 1
    rows = []
    for name, sweep in (QUICK if quick else SWEEPS).items():
        for eps in sweep:
            t0 = time.time()
            if name == "signds":
                acc = signds_accuracy(eps, clients, test, rounds)
            elif name == "label_dp":
                acc = label_dp_accuracy(eps, train, test, epochs)
            else:
                acc = embedding_dp_accuracy(eps, train, test, epochs)
            rows.append((name, eps, _signal(name, eps), acc))
            print(f"{name:12s} eps {eps:<5g} signal {rows[-1][2]:.4f} acc {acc:.3f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    return rows, chance, rounds, epochs


def thresholds(rows, chance):
    """{mechanism: (largest eps within MARGIN of chance, its signal)} (None: none was)."""
    out = {}
    for name in dict.fromkeys(r[0] for r in rows):
        flat = [r for r in rows if r[0] == name and r[3] <= chance + MARGIN]
        out[name] = max(flat, key=lambda r: r[1])[1:3] if flat else None
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 eps per mechanism, 2 rounds / 1 epoch, no docs")
    args = parser.parse_args(argv)
    started = time.time()
    rows, chance, rounds, epochs = run(args.quick)
    limits = thresholds(rows, chance)
    table = _report.markdown_table(
        ["mechanism", "per-release eps", "signal", "test accuracy", "within 5 points of chance"],
        [(n, f"{e:g}", f"{s:.4f}", f"{a:.3f}", "yes" if a <= chance + MARGIN else "no")
         for n, e, s, a in rows])
    print(table)
    print(f"chance (most frequent test class): {chance:.3f}")
    for name, limit in limits.items():
        print(f"{name}: too small at eps <= "
              f"{'-' if limit is None else f'{limit[0]:g} (signal {limit[1]:.4f})'}")
    if args.quick:
        return
    body = f"""## Learnability: when a per-release eps is too small to learn

`bench/learnability.py` (run {_report.today()}, {time.time() - started:.0f} s on
{_report.machine()}; the machine was shared):

```
TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/learnability.py
```

Digits (10 classes, test set 20%, chance {chance:.3f}), seed 0. SignDS: 100 IID clients,
{CLIENTS_PER_ROUND} per round, {LOCAL_EPOCHS} local epochs, k = {SIGNDS_K}, server step
{SIGNDS_LR}, {rounds} rounds. LabelDP: labels randomized once (K = 10), MLP 64-128-10,
{epochs} epochs. EmbeddingDP: MLP 64-64-{EMBEDDING_DIM} -> `EmbeddingDPLayer` -> 10, {epochs}
epochs, tested through the layer. The signal is the formula of docs/privacy.md (`signal`);
SignDS's (one released index) nears 1 - k = 0.8 from eps 5 on, where the encoder releases more
indices (h > 1): it separates the small eps, where the threshold lies. What it covers: one data
set, one seed, one model per mechanism, {rounds} rounds / {epochs} epochs; a longer run may learn
at a somewhat smaller eps.

{table}

Too small to learn (the largest swept eps within {MARGIN:g} of chance, and its signal): """ + \
        "; ".join(f"{n}: " + ("none in the sweep" if v is None else
                               f"eps {v[0]:g}, signal {v[1]:.4f}")
                  for n, v in limits.items()) + \
        ". `keras_fedpriv.mechanisms.registry` holds these signals (`Mechanism.too_small`); a plan whose " \
        "per-release signal is at or below them warns `TooSmallToLearnWarning`."
    _report.update_section("learnability", body)
    print("wrote docs/benchmarks.md (learnability)")


if __name__ == "__main__":
    main()
