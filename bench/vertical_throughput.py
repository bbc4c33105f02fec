"""VerticalModel training speed against one plain Keras model of the same architecture.

`VerticalModel.fit` runs the protocol (a forward pass and a gradient per
party, the cut gradients, the traffic counters) inside Keras' compiled
training step. The baseline is one functional `keras.Model` with the same
layers (each party's bottom, the concatenation, the top) trained by plain
``fit``. Both on the backend Keras runs on (``KERAS_BACKEND``), the same
data (synthetic: three parties with 16 float features each, a leader with its
own bottom, binary labels), batch 256, no protection layers (their cost is
the layer benchmarks'). Reported: training rows per second after a warm-up
epoch (which compiles the step), the best of several epochs (the two models'
epochs interleaved), and the ratio.
Target: VerticalModel >= 0.9x the plain model.

Usage::

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/vertical_throughput.py          # updates docs
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/vertical_throughput.py --quick  # no docs
    KERAS_BACKEND=jax .venv/bin/python bench/vertical_throughput.py               # on JAX

A full run writes the section ``vertical_throughput_<backend>`` of docs/benchmarks.md.
"""

from __future__ import annotations

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
from keras_fedpriv.federated import VerticalModel  # noqa: E402

PARTIES = ("alice", "bob", "carol")
LEADER = "carol"
FEATURES = 16
WIDTH = 64
EMBEDDING = 16
TARGET = 0.9


def data(rows, seed=0):
    rng = np.random.default_rng(seed)
    x = {p: rng.normal(size=(rows, FEATURES)).astype("float32") for p in PARTIES}
    y = (sum(v[:, 0] for v in x.values()) > 0).astype("float32")
    return x, y


def bottom(party):
    inputs = keras.Input((FEATURES,), name=party)
    h = keras.layers.Dense(WIDTH, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(EMBEDDING, activation="relu")(h))


def top():
    inputs = keras.Input((EMBEDDING * len(PARTIES),))
    h = keras.layers.Dense(WIDTH, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))


def vertical_model():
    keras.utils.set_random_seed(0)
    return VerticalModel({p: bottom(p) for p in PARTIES}, top(), leader=LEADER)


def plain_model():
    keras.utils.set_random_seed(0)
    bottoms = {p: bottom(p) for p in PARTIES}
    inputs = {p: keras.Input((FEATURES,), name=p) for p in PARTIES}
    merged = keras.layers.Concatenate()([bottoms[p](inputs[p]) for p in sorted(PARTIES)])
    return keras.Model(inputs, top()(merged))


def rows_per_second(models, x, y, batch_size, epochs):
    """Training rows per second of each model: the best of ``epochs`` epochs after a warm-up
    epoch, the models' epochs interleaved (a busy machine slows both alike)."""
    for model in models:
        model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy")
        model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
    best = [0.0] * len(models)
    for _ in range(epochs):
        for i, model in enumerate(models):
            start = time.perf_counter()
            model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
            best[i] = max(best[i], len(y) / (time.perf_counter() - start))
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (small data)")
    args = parser.parse_args(argv)
    rows, epochs = (8192, 2) if args.quick else (65536, 10)
    batch_size = 256
    x, y = data(rows)
    plain, vertical = rows_per_second([plain_model(), vertical_model()], x, y, batch_size,
                                      epochs)
    ratio = vertical / plain
    backend = keras.backend.backend()
    setup = (f"Keras backend {backend}, {rows} rows, batch {batch_size}, {len(PARTIES)} parties "
             f"(leader {LEADER!r} with a bottom), best of {epochs} epochs after a warm-up epoch")
    table = _report.markdown_table(
        ["model", "training rows/s"],
        [["plain keras.Model", f"{plain:,.0f}"], ["VerticalModel", f"{vertical:,.0f}"],
         ["ratio", f"{ratio:.2f} (target >= {TARGET})"]])
    print(setup)
    print(table)
    if not args.quick:
        command = ("KERAS_BACKEND=jax " if backend == "jax" else "TF_CPP_MIN_LOG_LEVEL=3 ") + \
            ".venv/bin/python bench/vertical_throughput.py"
        body = (f"## VerticalModel training speed ({backend})\n\n"
                f"`{command}` ({_report.today()}; {_report.machine()}). {setup}. "
                f"VerticalModel.fit against one keras.Model of the same layers, same data.\n\n"
                f"{table}\n")
        print(f"updated {_report.update_section(f'vertical_throughput_{backend}', body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
