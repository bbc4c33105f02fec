"""Demo, horizontal part: FedAvg vs SignDS (+ MagRR) on digits split among 100 clients.

scikit-learn's bundled digits (1797 8x8 images; nothing is downloaded), 20%
held out for testing, the rest split IID among 100 clients. A few rounds of
`keras_fedpriv.federated.HorizontalFL` per upload scheme; the table shows test
accuracy and how many bytes each client uploads per round.

Usage: part of ``python -m keras_fedpriv demo``, or
``rows = run_horizontal_demo(quick=True)``.
"""

from __future__ import annotations

import math
import sys
import textwrap
import time
from typing import Any, Mapping, Sequence, TextIO

import keras
import numpy as np

from keras_fedpriv.federated.magrr import MagRR
from keras_fedpriv.datasets import digits_clients, digits_mlp
from keras_fedpriv.federated.horizontal.driver import HorizontalFL
from keras_fedpriv.federated.uploads import GaussianUpload, SignDSUpload
from keras_fedpriv.mechanisms.gaussian import gaussian_epsilon
from keras_fedpriv.optimizers.signds import SignDSEncoder
from keras_fedpriv.privacy.report import privacy_report
from keras_fedpriv.text_table import text_table

__all__ = ["DEFAULT_ROUNDS", "QUICK_ROUNDS", "footnote", "format_horizontal_table",
           "run_horizontal_demo"]

DEFAULT_ROUNDS = 30
QUICK_ROUNDS = 5
NUM_CLIENTS = 100
CLIENTS_PER_ROUND = 20
LOCAL_EPOCHS = 5
LOCAL_LR = 0.05
DELTA = 1e-5


def _configs(seed):
    def sub(i):
        return None if seed is None else seed + 2000 + i

    gauss_eps = gaussian_epsilon(1.0, 1e-5)
    return [
        ("FedAvg", "-", lambda: ("fedavg", []), "nothing (dense float32 update)"),
        ("SignDS", "100", lambda: (SignDSUpload(SignDSEncoder(k=0.2, eps=100.0, seed=sub(1)),
                                                global_lr=0.2), []),
         "update: sign + h indices (eps-LDP index set)"),
        ("SignDS+MagRR", "100 + 5", lambda: (SignDSUpload(SignDSEncoder(k=0.2, eps=100.0,
                                                                        seed=sub(2))),
                                             [MagRR(eps_rr=5.0, seed=sub(3))]),
         "update, and its step size (1 RR bit)"),
        ("SignDS", "10", lambda: (SignDSUpload(SignDSEncoder(k=0.2, eps=10.0, seed=sub(4)),
                                               global_lr=0.2), []),
         "update: sign + h indices (eps-LDP index set)"),
        ("Gaussian", f"{gauss_eps:.0f}*", lambda: (GaussianUpload(1.0, 1.0, seed=sub(5)), []),
         "update: clipped to 1, + N(0, 1) noise"),
    ]


def footnote(rows: Sequence[Mapping[str, Any]]) -> str:
    """The table's footnote, naming only the configurations that ran.

    Args:
        rows: the rows of `run_horizontal_demo` (``upload`` and ``eps`` are read).

    Returns:
        One paragraph of text.
    """
    ran = {(r["upload"], r["eps"]) for r in rows}
    names = {name for name, _ in ran}
    parts = []
    if names & {"SignDS", "SignDS+MagRR"}:
        parts.append("eps: SignDS's local-DP parameter for the index set of each upload (the "
                     "sign is a fair coin).")
    if "SignDS+MagRR" in names:
        parts.append("MagRR adds one randomized-response bit per client and round (eps_rr).")
    if names - {"FedAvg"}:
        parts.append("Every round a client takes part in is a new release: run eps is what the "
                     f"busiest client spent over the whole run (privacy_report, delta={DELTA:g}).")
    if "Gaussian" in names:
        parts.append("*Gaussian: (eps, 1e-5)-local DP per round (clip 1, noise multiplier 1; "
                     "dp-accounting PLD).")
    if ("SignDS", "10") in ran:
        parts.append("SignDS at eps=10 uploads only ~14 indices per client: it needs far more "
                     "rounds (docs/results/hfl_signds.md).")
    if "FedAvg" in names:
        parts.append("FedAvg uploads the dense update without protection.")
    return " ".join(parts)


def _run_eps(row):
    eps = row.get("run_eps")
    if eps is None:
        return "?"
    return "inf" if math.isinf(eps) else f"{eps:.0f}"


def format_horizontal_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The demo's table: one line per configuration.

    Args:
        rows: the rows of `run_horizontal_demo`.

    Returns:
        The table as text.
    """
    headers = ("upload", "eps/upload", "run eps", "test acc", "bytes/client/round", "vs dense",
               "what is protected")
    cells = [(r["upload"], r["eps"], _run_eps(r), f"{r['accuracy']:.3f}",
              f"{r['upload_bytes']:.0f}",
              f"{r['dense_bytes'] / r['upload_bytes']:.0f}x smaller"
              if r["upload_bytes"] < r["dense_bytes"] else "1x", r["protected"]) for r in rows]
    return text_table(headers, cells, align=("<", "<", ">", ">", ">", ">", "<"))


def run_horizontal_demo(rounds: int | None = None, seed: int | None = None, quick: bool = False,
                        out: TextIO = sys.stdout) -> list[dict[str, Any]]:
    """Run the horizontal configurations; print progress and a table; return the rows.

    Args:
        rounds: federated rounds per configuration (default `DEFAULT_ROUNDS`,
            `QUICK_ROUNDS` with ``quick``).
        seed: None or an int (seeds the model, the split, client sampling and
            the mechanisms).
        quick: fewer rounds and configurations (for tests).
        out: text stream (None: silent).

    Returns:
        One dict per configuration: ``upload``, ``eps``, ``protected``,
        ``accuracy`` (test accuracy after the last round), ``upload_bytes``
        (mean bytes per client per round), ``dense_bytes`` (the float32
        model), ``run_eps`` (the busiest client's eps over the run, at
        `DELTA`), ``history`` (the Keras History dict).
    """
    rounds = rounds if rounds is not None else (QUICK_ROUNDS if quick else DEFAULT_ROUNDS)

    def say(text=""):
        if out is not None:
            print(text, file=out, flush=True)

    clients, (x_te, y_te) = digits_clients(NUM_CLIENTS, seed=seed)
    configs = _configs(seed)
    if quick:
        configs = configs[:3]
    say("keras-fedpriv demo, horizontal part: digits split among "
        f"{NUM_CLIENTS} clients (IID); {rounds} rounds of {CLIENTS_PER_ROUND} clients, "
        f"{LOCAL_EPOCHS} local epochs each; MLP 64-128-10.")
    rows = []
    start = time.perf_counter()
    for i, (name, eps, make, protected) in enumerate(configs):
        t0 = time.perf_counter()
        if seed is not None:
            keras.utils.set_random_seed(seed + 100 + i)
        model = digits_mlp(LOCAL_LR)
        upload, callbacks = make()
        fl = HorizontalFL(model, clients, upload=upload, seed=None if seed is None else seed + i)
        h = fl.fit(rounds, CLIENTS_PER_ROUND, LOCAL_EPOCHS, validation_data=(x_te, y_te),
                   callbacks=callbacks, verbose=0).history
        run_eps = privacy_report(fl, delta=DELTA, callbacks=callbacks).epsilon
        row = dict(upload=name, eps=eps, protected=protected, accuracy=h["val_accuracy"][-1],
                   upload_bytes=float(np.mean(h["upload_bytes_per_client"])),
                   dense_bytes=h["download_bytes_per_client"][0], run_eps=run_eps, history=h)
        rows.append(row)
        say(f"[{i + 1}/{len(configs)}] {name:<12} eps {eps:<7} test acc {row['accuracy']:.3f}  "
            f"upload {row['upload_bytes']:.0f} B/client/round  "
            f"({time.perf_counter() - t0:.1f} s)")
    say()
    say(format_horizontal_table(rows))
    say()
    for text in textwrap.wrap(footnote(rows), width=100):
        say(text)
    say(f"Horizontal part took {time.perf_counter() - start:.1f} s.")
    return rows
