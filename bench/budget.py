"""PrivacyBudget.reserve: cost per release after N releases, against composing alone.

A party's budget file (`keras_fedpriv.privacy.PrivacyBudget`) is read, checked,
composed and rewritten under its lock at every release. This script builds a
file of N releases as an earlier version wrote it (one entry per release),
lets the first ``reserve`` fold it, and times the next ones against the
baseline of the same run: composing the same counts with the accountant
alone (`PrivacyBudget.epsilon` of an in-memory budget). The ratio is the
bookkeeping's cost on top of the accountant's.

Two workloads: a vertical follower (per-record budget, one embedding of a
batch of 32 rows per release, 1,000 records) and a horizontal client (one
Gaussian upload per release).

Usage:
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/budget.py            # writes docs/benchmarks.md
    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/budget.py --quick    # smoke run, no docs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import dp_accounting
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402

from keras_fedpriv.mechanisms import quantize_rr_dp_event  # noqa: E402
from keras_fedpriv.mechanisms.ledger import ReleaseKind, ReleaseLedger  # noqa: E402
from keras_fedpriv.privacy import PrivacyBudget  # noqa: E402
from keras_fedpriv.privacy.budget import _VERSION  # noqa: E402

BATCH, RECORDS = 32, 1000


def _workload(name):
    """(release(i) -> ReleaseLedger, per_record) of a workload."""
    if name == "vertical":
        kind = ReleaseKind("EmbeddingDPLayer 'f1'", "features", "example",
                           quantize_rr_dp_event(1.0, 4))

        def release(i):
            ledger = ReleaseLedger()
            ledger.record(kind, (np.arange(BATCH) + i * BATCH) % RECORDS)
            return ledger
        return release, True
    kind = ReleaseKind("Gaussian upload", "client data", "client",
                       dp_accounting.GaussianDpEvent(60.0))

    def release(i):
        ledger = ReleaseLedger()
        ledger.record(kind, [0])
        return ledger
    return release, False


def bench(name, n, repeats, folder):
    """(reserve s, compose-alone s) medians after ``n`` releases of workload ``name``."""
    release, per_record = _workload(name)
    path = os.path.join(folder, f"{name}-{n}.json")
    with open(path, "w") as f:
        json.dump({"version": _VERSION, "entries": [
            {"run": "1", "release": i, "ledger": release(i).to_dict()} for i in range(n)]}, f)
    budget = PrivacyBudget(1e9, path=path, per_record=per_record)
    budget.reserve(release(n), run_id="1")  # folds the file
    reserve, compose = [], []
    for k in range(repeats):
        t = time.perf_counter()
        budget.reserve(release(n + 1 + k), run_id="1")
        reserve.append(time.perf_counter() - t)
        whole = ReleaseLedger.merged(release(i) for i in range(n + 2 + k))
        t = time.perf_counter()
        PrivacyBudget(1e9, per_record=per_record).epsilon(whole)
        compose.append(time.perf_counter() - t)
    return statistics.median(reserve), statistics.median(compose)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (N = 50), no docs")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    sizes = (50,) if args.quick else (1000, 10000)
    repeats = 2 if args.quick else args.repeats
    started, rows = time.time(), []
    with tempfile.TemporaryDirectory() as folder:
        for name in ("vertical", "horizontal"):
            for n in sizes:
                reserve, compose = bench(name, n, repeats, folder)
                rows.append((name, n, f"{reserve * 1e3:.0f}", f"{compose * 1e3:.0f}",
                             f"{reserve / compose:.2f}"))
                print(f"{name:10s} N={n:6d}  reserve {reserve * 1e3:8.1f} ms  "
                      f"compose alone {compose * 1e3:8.1f} ms  ratio {reserve / compose:.2f}",
                      flush=True)
    if args.quick:
        return
    table = _report.markdown_table(
        ["workload", "releases N", "reserve ms", "compose alone ms", "ratio"], rows)
    _report.update_section("budget", f"""## PrivacyBudget.reserve (`bench/budget.py`)

Command (run {_report.today()}, {time.time() - started:.0f} s on {_report.machine()}):

```
TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python bench/budget.py
```

One `reserve` (read, check, fold, compose and rewrite the budget file under its lock) after N
releases, against composing the same counts with the accountant alone in the same run; medians
of {repeats}. Vertical: a follower's per-record budget, {BATCH} rows per release over {RECORDS}
records. Horizontal: one Gaussian upload per release.

{table}

Folding keeps one entry per run, so the file's size does not grow with N and the ratio stays
near 1: what remains is the accountant's cost of composing the busiest unit's releases.
""")


if __name__ == "__main__":
    main()
