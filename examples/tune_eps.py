"""Tune the label-DP eps of a vertical model with keras-tuner; plot the privacy-utility frontier.

Breast cancer (scikit-learn, bundled), features split between a follower
(first 15) and the leader (last 15, and the labels), as in the demo. Each
trial builds a `VerticalModel` whose `LabelDPLayer` uses the trial's eps
(log-uniform in [0.25, 16]); `PrivacyUtility(budget=...)` scores a trial by its
validation accuracy if its eps is within the budget, else -1; RandomSearch
picks the best. With ``--figure PATH`` it also plots every trial (eps,
validation accuracy), the Pareto frontier and the budget (PNG; this needs
matplotlib, which the ``[flower]`` install lacks: ``pip install matplotlib``
or ``pip install -e ".[bench]"`` in the clone). By default it writes no file.

Validation here is a split of the private training data, so the search
itself leaks: every execution of every trial released the labels
(`keras_fedpriv.tuning.track_search` records them, `search_epsilon`
composes them); tune on public or proxy data to avoid that. Each trial is
trained twice (``executions_per_trial=2``) and its validation accuracy
averaged, because 140 validation rows are noisy.

Usage::

    .venv/bin/python examples/tune_eps.py [--trials 16] [--budget 2] [--figure PATH]
    .venv/bin/python examples/tune_eps.py --figure docs/tuning_frontier.png   # the docs' figure

TensorFlow's start-up logs are hidden (KERAS_FEDPRIV_TF_LOGS=1 shows them).
"""

from __future__ import annotations

import argparse
import collections
import tempfile

from keras_fedpriv.logs import quiet_tensorflow

quiet_tensorflow()

import keras  # noqa: E402
import keras_tuner as kt  # noqa: E402
import numpy as np  # noqa: E402

from keras_fedpriv import LabelDPLayer  # noqa: E402
from keras_fedpriv.datasets import breast_cancer_vertical as load_data  # noqa: E402
from keras_fedpriv.federated import VerticalModel, with_example_ids  # noqa: E402
from keras_fedpriv.tuning import (  # noqa: E402
    PrivacyUtility,
    eps_hyperparameter,
    privacy_objective,
    search_epsilon,
    track_search,
)

# keras-tuner scores a trial by its best epoch under the objective; for the plot we want the
# last epoch of every execution. The tuner deep-copies callbacks, so they write here.
FINAL = collections.defaultdict(list)


class RecordFinal(keras.callbacks.Callback):
    """Record (eps, last-epoch validation accuracy) of every execution."""

    def on_epoch_end(self, epoch, logs=None):
        self._last = (logs or {}).get("val_accuracy")

    def on_train_end(self, logs=None):
        FINAL[self.model.label_dp.eps].append(self._last)


def build(hp):
    eps = eps_hyperparameter(hp, min_value=0.25, max_value=16.0)

    def bottom(n):
        return keras.Sequential([keras.Input((n,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(8)])

    top = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dense(1, activation="sigmoid")])
    model = VerticalModel({"party_a": bottom(15), "party_b": bottom(15)}, top, leader="party_b",
                          label_dp=LabelDPLayer(eps=eps))
    model.compile(keras.optimizers.Adam(3e-3), "binary_crossentropy", metrics=["accuracy"])
    return model


def frontier(points):
    """The (eps, accuracy) points not dominated by a smaller-eps, higher-accuracy point."""
    best, out = -np.inf, []
    for eps, acc in sorted(points):
        if acc > best:
            out.append((eps, acc))
            best = acc
    return out


def plot_frontier(points, best, budget, path):
    """Write the trials, their Pareto frontier, the budget and the chosen trial to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    e, a = zip(*points)
    ax.scatter(e, a, color="tab:blue", label="trial")
    fe, fa = zip(*frontier(points))
    ax.step(fe, fa, where="post", color="tab:orange", label="Pareto frontier")
    ax.axvline(budget, color="gray", ls=":", label=f"budget eps = {budget:g}")
    ax.scatter([best[0]], [best[1]], s=120,
               facecolors="none", edgecolors="tab:red", label="chosen")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("label-DP eps (per trial)")
    ax.set_ylabel("validation accuracy, last epoch")
    ax.set_title("Tuning LabelDPLayer's eps (breast cancer, vertical)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def have_matplotlib():
    """Whether matplotlib can be imported (only ``--figure`` needs it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def parse_args(argv=None):
    """The command line; ``--figure`` without matplotlib is refused before the search."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--budget", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure", "--out", dest="figure", default=None, metavar="PATH",
                        help="write the privacy-utility figure to PATH (PNG; needs matplotlib; "
                             "default: no figure)")
    args = parser.parse_args(argv)
    if args.figure and not have_matplotlib():
        parser.error("--figure needs matplotlib, which is not installed (the [flower] install "
                     "lacks it): pip install matplotlib")
    return args


def main(argv=None):
    args = parse_args(argv)
    xa, xb, y, *_ = load_data()  # training split only: the test split stays untouched
    rng = np.random.default_rng(args.seed)
    idx = rng.permutation(len(y))
    tr, va = idx[: int(0.75 * len(y))], idx[int(0.75 * len(y)):]
    x_train = with_example_ids({"party_a": xa[tr], "party_b": xb[tr]})
    x_val = {"party_a": xa[va], "party_b": xb[va]}

    keras.utils.set_random_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tuner = kt.RandomSearch(build, objective=privacy_objective(), max_trials=args.trials,
                                executions_per_trial=2, directory=tmp, project_name="eps",
                                seed=args.seed)
        track_search(tuner)
        tuner.search(x_train, y[tr], validation_data=(x_val, y[va]), epochs=args.epochs,
                     batch_size=32, verbose=0,
                     callbacks=[PrivacyUtility(budget=args.budget, protects="labels"),
                                RecordFinal()])
        best = tuner.oracle.get_best_trials(1)[0]
        spent = search_epsilon(tuner, protects="labels")
    points = [(eps, float(np.mean(accs))) for eps, accs in FINAL.items()]
    best_eps = best.hyperparameters.get("eps")
    best_acc = float(np.mean(FINAL[best_eps]))
    print(f"{len(points)} trials; best under eps <= {args.budget:g}: eps = {best_eps:.3g}, "
          f"final val accuracy {best_acc:.3f} (the tuner scored it by its best epoch: "
          f"{best.score:.3f})")
    for eps, acc in sorted(points):
        print(f"  eps {eps:7.3f}  final val accuracy {acc:.3f} (mean of 2 runs)")
    print(f"The chosen model's labels were released at eps = {best_eps:.3g}, but the search "
          f"released them in every execution of every trial: eps = {spent:.3g} in all.")
    if args.figure:
        print(f"wrote {plot_frontier(points, (best_eps, best_acc), args.budget, args.figure)}")
    else:
        print("no figure written (--figure PATH writes one; it needs matplotlib)")


if __name__ == "__main__":
    main()
