"""Vertical FL with K batches per message: the accuracy cost of stale follower embeddings.

The leader asks each follower for the embeddings of K batches in one message
(`run_leader(batches_per_message=K)`); with K > 1 a follower embeds them all
with the same bottom weights, so its embeddings are up to K - 1 steps stale
and its gradients are applied as delayed gradients. This script trains the
vertical Flower example's model (breast cancer: two followers with
EmbeddingDP eps=4, a leader with LabelDP eps=2 and its own bottom) in one
process (`VerticalDriver`) for the same number of epochs at K = 1, 2, 4, 8
and all the steps of an epoch, and reports the validation AUC and loss (mean
and spread over seeds) against K = 1 in the same run, with the message rounds
per epoch. The ledgers count the same releases for every K (checked).

Usage:
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/vertical_k.py          # writes docs/benchmarks.md
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/vertical_k.py --quick  # smoke run, no docs
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import statistics
import sys

import keras
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"
                       / "flower_vertical"))
import _report  # noqa: E402
from flower_vertical import task  # noqa: E402

from keras_fedpriv.federated.vertical.driver import VerticalDriver  # noqa: E402
from keras_fedpriv.privacy import privacy_report  # noqa: E402


def run(k, seed, epochs, batch_size):
    """(val_auc, val_loss, message rounds per epoch, eps) of one seeded run at K = ``k``."""
    parties = task.model_fn(seed=seed).split_parties(metrics=[keras.metrics.AUC(name="auc")])
    driver = VerticalDriver(parties, {p: task.follower_features(p) for p in task.FOLLOWERS})
    rounds = [0]
    exchange = driver.exchange

    def counted(requests):
        rounds[0] += 1
        return exchange(requests)

    driver.exchange = counted
    ids, x, y = task.leader_data()
    v_ids, v_x, v_y = task.leader_validation()
    result = driver.fit(y, example_ids=ids, x=x, epochs=epochs, batch_size=batch_size,
                        batches_per_message=k, seed=seed, validation_data=(v_ids, v_y, v_x))
    assert result.rejected == [], result.rejected
    eps = privacy_report(driver, delta=1e-5).epsilon
    return (result.history["val_auc"][-1], result.history["val_loss"][-1],
            rounds[0] / epochs, eps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one seed, one epoch, K = 1 and 4, no docs")
    parser.add_argument("--epochs", type=int, default=None, help=f"default {task.EPOCHS}")
    parser.add_argument("--batch-size", type=int, default=task.BATCH_SIZE)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = 1 if args.quick else task.EPOCHS
    n = len(task.leader_data()[2])
    steps = math.ceil(n / args.batch_size)
    ks = [1, 4] if args.quick else sorted({1, 2, 4, 8, steps})
    seeds = args.seeds[:1] if args.quick else args.seeds
    rows, eps = [], {s: set() for s in seeds}
    for k in ks:
        runs = [run(k, s, args.epochs, args.batch_size) for s in seeds]
        aucs, losses = [r[0] for r in runs], [r[1] for r in runs]
        for s, r in zip(seeds, runs):
            eps[s].add(round(r[3], 9))
        rows.append((k, statistics.mean(aucs), min(aucs), max(aucs), statistics.mean(losses),
                     runs[0][2]))
    base_auc = rows[0][1]
    lines = ["| K (batches per message) | message rounds per epoch | val AUC, mean (min-max) "
             "| AUC - K=1 | val loss, mean |", "| --- | --- | --- | --- | --- |"]
    for k, auc, lo, hi, loss, rounds in rows:
        name = f"{k} (all {steps} steps)" if k == steps else str(k)
        lines.append(f"| {name} | {rounds:g} | {auc:.4f} ({lo:.4f}-{hi:.4f}) | "
                     f"{auc - base_auc:+.4f} | {loss:.4f} |")
    table = "\n".join(lines)
    print(f"vertical example, {n} training rows, batch {args.batch_size} ({steps} steps per "
          f"epoch), {args.epochs} epochs, seeds {seeds}")
    print(table)
    same = all(len(v) == 1 for v in eps.values())
    print(f"ledgers: the same eps for every K at each seed: {same}")
    if not args.quick:
        body = (f"Vertical FL, K batches per message (`bench/vertical_k.py`, {_report.today()}; "
                f"{_report.machine()}). The vertical Flower example's model and data in one "
                f"process (`VerticalDriver`): {n} training rows, batch {args.batch_size} "
                f"({steps} steps per epoch), {args.epochs} epochs, seeds {seeds} (batch order, "
                "protections' noise and initial weights); message rounds per epoch count the "
                "training and validation rounds (each round is one message to every follower "
                "and one reply). With K > 1 a follower's embeddings are up to K - 1 steps "
                "stale. The ledgers are the same for every K.\n\n" + table + "\n\n"
                "Command: `TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/vertical_k.py`.")
        _report.update_section("vertical_k", body)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
