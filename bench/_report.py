"""Shared helpers of the benchmark scripts: machine description and docs/benchmarks.md sections.

Each script owns one section of ``docs/benchmarks.md``, delimited by
``<!-- BEGIN name -->`` / ``<!-- END name -->`` markers, and replaces only
that section, so the scripts can be re-run independently.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import re

REPO = pathlib.Path(__file__).resolve().parent.parent
# Each experiment's results page (with its figure and raw numbers) is docs/results/<script>.md,
# named after the bench script that writes it; docs/*.md are the guides (and benchmarks.md).
RESULTS = REPO / "docs" / "results"
DOC = REPO / "docs" / "benchmarks.md"

INTRO = """# Benchmarks

The scripts under `bench/` measure one thing each against a baseline computed
**in the same run**, and report the comparison (an accuracy difference or a
time ratio), never an absolute number on its own. They were run on small
shared 2-core CPU machines, where absolute timings swing by tens of percent
from one minute to the next; only the ratios and differences below are
meaningful, and each script prints its own table so the numbers can be
regenerated with the command given in each section (`make bench` runs them
all). Each section says when and on what machine it was produced.
"""


def machine():
    """A one-line description of the machine (CPU count, model, accelerators, versions), on
    the Keras backend of this process (TensorFlow is not imported under JAX: a GPU machine
    with JAX may have none)."""
    import keras

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if keras.backend.backend() == "jax":
        import jax

        gpus = [d.device_kind for d in jax.devices() if d.platform != "cpu"]
        device = f"{len(gpus)} GPU(s) ({gpus[0]})" if gpus else "no GPU"
        framework = f"JAX {jax.__version__}"
    else:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        device = f"{len(gpus)} GPU(s)" if gpus else "no GPU"
        framework = f"TensorFlow {tf.__version__}"
    return (f"{os.cpu_count()}-core CPU ({cpu}), {device}; Python {platform.python_version()}, "
            f"{framework}, Keras {keras.__version__}")


def today():
    return datetime.date.today().isoformat()


def update_section(name, body):
    """Replace (or append) the ``name`` section of docs/benchmarks.md with ``body``."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.strip()}\n{end}\n"
    text = DOC.read_text() if DOC.exists() else INTRO
    if not text.startswith("# Benchmarks"):
        text = INTRO + "\n" + text
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
    return DOC


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
