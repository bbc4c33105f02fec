"""Empirical privacy audit of every mechanism of the package (docs/results/audit.md).

For each mechanism, at eps in {0.5, 1, 2, 4}, `keras_fedpriv.privacy.audit`
runs it ``num_trials`` times on each of two neighbouring inputs and reports a
lower bound on eps next to the eps the mechanism claims for that output. The
table holds ~76 audits, so each runs at confidence ``1 - 0.05 / 76``
(Bonferroni): all the bounds of the table hold together with probability at
least 95%. (At 95% each, a correct, exactly tight mechanism is "refuted" by
chance in ~0.5-1% of audits, i.e. likely once somewhere in a table this big:
a quick run at 95% per audit showed exactly that once.)

A correct mechanism must give ``bound <= claimed``; a bound close to the claim
means the analysis is tight on that pair. Deliberately broken mechanisms must
give ``bound > claimed``:

* binary RR whose flip probability is computed with 2 eps (really 2 eps-DP);
* Laplace noise with half the scale (really 2 eps-DP);
* the original design's Laplace sensitivity 1 on probability vectors (really 2 eps-DP);
* LabelDPLayer re-randomizing the same label in 2 epochs (``per_batch=True``,
  the reference's behaviour), judged against the single-release eps it would
  claim without composition (really 2 eps).

Trials per input: 10^6 for everything (``--trials``), except SignDS through
`select_indices`, one Python call per run (~0.1-0.3 ms on these machines),
which gets ``--signds-trials`` (10^5); SignDS's exact law of (t_a, t_b)
is also audited at the full count (``sampler="distribution"``).

Usage::

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/audit.py            # full, updates
                                                                      # docs/results/audit.md
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/audit.py --quick    # eps 2 only, 10^5 / 4000
                                                                      # trials, no docs (seconds)
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import pathlib
import re
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import _report

from keras_fedpriv.layers.label_dp import LabelDPLayer
from keras_fedpriv.mechanisms.laplace import laplace_scale
from keras_fedpriv.mechanisms.randomized_response import binary_randomized_response
# Not ``from keras_fedpriv.privacy import audit``: that name is the `audit`
# function, which shadows the module of the same name in the package namespace.
A = importlib.import_module("keras_fedpriv.privacy.audit")

DOC = _report.RESULTS / "audit.md"
SECTION = "audit-bench"
EPS = (0.5, 1.0, 2.0, 4.0)


# ----------------------------------------------------------------------------
# Broken mechanisms (each returns an AuditResult with the false claim)
# ----------------------------------------------------------------------------


def broken_rr(eps, num_trials, seed, confidence):
    """Binary RR that flips with 1 / (1 + e^(2 eps)) but claims eps."""
    def mechanism(bit, n, rng):
        out = binary_randomized_response(np.full(n, bit, np.int32), 2 * eps,
                                         seed=int(rng.integers(0, 2**63)))
        return np.asarray(out)

    result = A.audit(mechanism, 1, 0, num_trials, seed=seed, confidence=confidence)
    return A._with_claim(result, eps, f"BROKEN binary RR, flip prob. with 2 eps (eps={eps:g})")


def broken_laplace_half_scale(eps, num_trials, seed, confidence):
    """Laplace with scale sensitivity / (2 eps), claiming eps."""
    b = laplace_scale(eps, 2.0)

    def mechanism(row, n, rng):
        return np.asarray(row, np.float64) + rng.laplace(0.0, b / 2, size=(n, 2))

    def loss(y):
        return np.clip(y[:, 0], 0.0, 1.0) - np.clip(y[:, 1], 0.0, 1.0)

    result = A.audit(mechanism, [1.0, 0.0], [0.0, 1.0], num_trials, statistic=loss, seed=seed,
                     confidence=confidence)
    return A._with_claim(result, eps, f"BROKEN Laplace, half the scale (eps={eps:g})")


def broken_laplace_sensitivity_1(eps, num_trials, seed, confidence):
    result = A.audit_laplace(eps, sensitivity=1.0, num_trials=num_trials, seed=seed,
                             confidence=confidence)
    return A._with_claim(result, eps, f"BROKEN Laplace, original sensitivity 1 (eps={eps:g})")


def broken_label_dp_two_epochs(eps, num_trials, seed, confidence):
    """The same label re-randomized in 2 epochs (per_batch=True), judged against eps."""
    layer = LabelDPLayer(eps, mode="binary", per_batch=True, seed=seed)

    def mechanism(label, n, rng):
        y = np.full(n, label, np.float32)
        first = np.asarray(layer(y, training=True))
        second = np.asarray(layer(y, training=True))
        return (first == 0).astype(np.int64) + (second == 0).astype(np.int64)

    result = A.audit(mechanism, 0, 1, num_trials, seed=seed, confidence=confidence)
    return A._with_claim(result, eps,
                         f"BROKEN LabelDPLayer per_batch, 2 epochs vs 1-release eps (eps={eps:g})")


# ----------------------------------------------------------------------------
# The runs
# ----------------------------------------------------------------------------


def jobs(trials, signds_trials, conf):
    """(label, callable(eps, seed) -> AuditResult, trials); every audit at confidence ``conf``."""
    return [
        ("binary RR", lambda e, s: A.audit_binary_rr(e, trials, s, conf), trials),
        ("10-ary RR", lambda e, s: A.audit_kary_rr(e, 10, trials, s, conf), trials),
        ("LabelDPLayer binary", lambda e, s: A.audit_label_dp_layer(
            e, "binary", num_trials=trials, seed=s, confidence=conf), trials),
        ("LabelDPLayer sparse K=10", lambda e, s: A.audit_label_dp_layer(
            e, "sparse", 10, num_trials=trials, seed=s, confidence=conf), trials),
        ("quantize+RR, 1 coordinate (claim eps/2)", lambda e, s: A.audit_quantize_rr(
            e, trials, s, conf), trials),
        ("EmbeddingDPLayer d=1 (claim eps/2)", lambda e, s: A.audit_embedding_dp_layer(
            e, 1, trials, s, conf), trials),
        ("EmbeddingDPLayer d=4 (claim 4 eps/2)", lambda e, s: A.audit_embedding_dp_layer(
            e, 4, trials, s, conf), trials),
        ("Laplace discrete, loss statistic", lambda e, s: A.audit_laplace(
            e, num_trials=trials, seed=s, confidence=conf), trials),
        ("Laplace discrete, y0 - y1", lambda e, s: A.audit_laplace(
            e, statistic="difference", num_trials=trials, seed=s, confidence=conf), trials),
        ("Laplace continuous, loss statistic", lambda e, s: A.audit_laplace(
            e, sampler="continuous", num_trials=trials, seed=s, confidence=conf), trials),
        ("MagRR client bit", lambda e, s: A.audit_magrr(e, trials, s, conf), trials),
        ("SignDS select_indices, loss", lambda e, s: A.audit_signds(
            e, num_trials=signds_trials, seed=s, confidence=conf), signds_trials),
        ("SignDS exact law, loss", lambda e, s: A.audit_signds(
            e, sampler="distribution", num_trials=trials, seed=s, confidence=conf), trials),
        ("SignDS exact law, h=10, loss", lambda e, s: A.audit_signds(
            e, h=10, sampler="distribution", num_trials=trials, seed=s, confidence=conf), trials),
        ("SignDS exact law, h=10, count t_a", lambda e, s: A.audit_signds(
            e, h=10, statistic="count", sampler="distribution", num_trials=trials, seed=s,
            confidence=conf), trials),
        ("BROKEN binary RR, flip with 2 eps", lambda e, s: broken_rr(e, trials, s, conf), trials),
        ("BROKEN Laplace, half the scale", lambda e, s: broken_laplace_half_scale(
            e, trials, s, conf), trials),
        ("BROKEN Laplace, sensitivity 1 (original design)", lambda e, s: broken_laplace_sensitivity_1(
            e, trials, s, conf), trials),
        ("BROKEN LabelDPLayer per_batch, 2 epochs", lambda e, s: broken_label_dp_two_epochs(
            e, trials, s, conf), trials),
    ]


def family_confidence(num_audits, family=0.95):
    """Per-audit confidence so that all ``num_audits`` bounds hold together w.p. ``family``."""
    return 1.0 - (1.0 - family) / num_audits


def run(trials, signds_trials, eps_values, seed):
    num_audits = len(jobs(trials, signds_trials, 0.95)) * len(eps_values)
    conf = family_confidence(num_audits)
    rows = []
    for j, (label, fn, n) in enumerate(jobs(trials, signds_trials, conf)):
        for i, eps in enumerate(eps_values):
            t0 = time.perf_counter()
            result = fn(eps, seed + 1000 * j + i)
            dt = time.perf_counter() - t0
            broken = label.startswith("BROKEN")
            ok = result.violates_claim if broken else not result.violates_claim
            rows.append({"label": label, "eps": eps, "result": result, "seconds": dt,
                         "trials": n, "broken": broken, "ok": ok})
            print(f"{dt:7.1f}s  {'ok ' if ok else 'BAD'}  {result}", flush=True)
    return rows


def _fmt(x):
    return "inf" if math.isinf(x) else f"{x:.3f}"


def table(rows):
    header = ["mechanism", "eps", "claimed eps", "trials / input", "lower bound",
              "point estimate", "bound / claimed", "verdict", "time (s)"]
    body = []
    for r in rows:
        res = r["result"]
        if r["broken"]:
            verdict = "caught" if res.violates_claim else "**missed**"
        else:
            verdict = "ok" if not res.violates_claim else "**REFUTED**"
        body.append([r["label"], f"{r['eps']:g}", f"{res.claimed_eps:g}", f"{r['trials']:,}",
                     _fmt(res.eps_lower_bound), _fmt(res.eps_point_estimate),
                     f"{res.ratio:.3f}", verdict, f"{r['seconds']:.1f}"])
    return _report.markdown_table(header, body)


def write_doc(rows, command, total_seconds):
    produced = (f"Produced by `{command}` on {_report.today()}, {_report.machine()}; "
                f"{total_seconds / 60:.1f} minutes in all. Seeds are fixed, so the run is "
                f"reproducible.")
    level = (f"{len(rows)} audits, each at confidence {rows[0]['result'].confidence:.5f} "
             f"(1 - 0.05 / {len(rows)}, Bonferroni): all lower bounds hold together with "
             f"probability >= 95%. \"verdict\": *ok* = bound <= claimed; *caught* = a broken "
             f"mechanism's bound exceeds its false claim.")
    body = "\n".join([
        produced,
        "",
        level,
        "",
        table(rows),
    ])
    begin, end = f"<!-- BEGIN {SECTION} -->", f"<!-- END {SECTION} -->"
    block = f"{begin}\n{body.strip()}\n{end}\n"
    text = DOC.read_text() if DOC.exists() else "# Empirical privacy auditing\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else \
        text.rstrip("\n") + "\n\n" + block
    DOC.write_text(text)
    return DOC


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: eps 2 only, 10^5 trials "
                        "(4000 for SignDS select_indices), no docs")
    parser.add_argument("--trials", type=int, default=10**6, help="runs per input")
    parser.add_argument("--signds-trials", type=int, default=100_000,
                        help="runs per input of SignDS through select_indices")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trials, signds_trials = (100_000, 4000) if args.quick else (args.trials, args.signds_trials)
    t0 = time.perf_counter()
    rows = run(trials, signds_trials, (2.0,) if args.quick else EPS, args.seed)
    total = time.perf_counter() - t0
    print()
    print(table(rows))
    bad = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows)} audits in {total:.0f} s; {len(bad)} unexpected verdict(s).")
    if not args.quick:
        command = "TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/audit.py"
        if args.trials != 10**6 or args.signds_trials != 100_000 or args.seed != 0:
            command += (f" --trials {args.trials} --signds-trials {args.signds_trials} "
                        f"--seed {args.seed}")
        print(f"wrote {write_doc(rows, command, total)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
