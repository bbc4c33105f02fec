"""Tune eps with keras-tuner: eps as a hyperparameter and a privacy-utility objective.

Three pieces:

* `eps_hyperparameter(hp, ...)`: ``hp.Float("eps", ..., sampling="log")`` with
  the package's eps validation on the bounds; use its value to build the
  layers (`LabelDPLayer(eps=...)`, `EmbeddingDPLayer(eps=...)`, SignDS, ...).
* `PrivacyUtility`: a callback that logs, every epoch, the composed
  ``epsilon`` of the model's privacy layers (`keras_fedpriv.privacy.privacy_report`)
  and a score ``privacy_utility`` that trades utility against it:
  ``mode="budget"``: the utility metric if eps <= ``budget``, else
  ``penalty`` (so the tuner maximizes utility under an eps budget);
  ``mode="weighted"``: ``utility - weight * eps``.
* `privacy_objective()`: the `keras_tuner.Objective` that maximizes it, for
  `RandomSearch`, `BayesianOptimization` and `Hyperband` alike.

Hyperparameter search on private data leaks too. Every trial trains on the
same private data and the tuner's choice depends on the trials' results; the
eps that `PrivacyUtility` logs is that of ONE trial's training run, not of the
search. By basic composition, a search costs the sum of its trials' eps
(`search_epsilon`; Papernot and Steinke, "Hyperparameter tuning with Renyi
differential privacy", ICLR 2022, give much better bounds for random search
with a random number of trials; we do not implement them). The sound ways
out: tune on public or proxy data and train once on the private data, or
report the search's eps.

Example::

    def build(hp):
        eps = eps_hyperparameter(hp, min_value=0.5, max_value=8.0)
        model = VerticalModel(bottoms, top, leader="party_b", label_dp=LabelDPLayer(eps=eps))
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
        return model

    tuner = keras_tuner.RandomSearch(build, objective=privacy_objective(), max_trials=10)
    tuner.search(x, y, validation_data=(xv, yv), epochs=20,
                 callbacks=[PrivacyUtility(budget=2.0)])
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import keras
import numpy as np

from keras_fedpriv.mechanisms.validation import validate_eps
from keras_fedpriv.privacy.report import privacy_report

__all__ = ["PrivacyUtility", "eps_hyperparameter", "privacy_objective", "search_epsilon",
           "trial_epsilon"]

OBJECTIVE_NAME = "privacy_utility"


def eps_hyperparameter(hp: Any, name: str = "eps", min_value: float = 0.1,
                       max_value: float = 10.0, sampling: str = "log",
                       default: float | None = None) -> float:
    """Register eps as a keras-tuner ``Float`` hyperparameter and return its value.

    Args:
        hp: the `keras_tuner.HyperParameters` of the trial.
        name: the hyperparameter's name.
        min_value, max_value: the range (finite, 0 < min_value < max_value).
        sampling: ``"log"`` (default; eps matters multiplicatively) or
            ``"linear"``.
        default: the default value (default: the geometric mean of the range).
    """
    lo = validate_eps(min_value, "min_value", lower_open=True)
    hi = validate_eps(max_value, "max_value", lower_open=True)
    if not lo < hi:
        raise ValueError(f"`min_value` must be below `max_value`; got {min_value!r} and "
                         f"{max_value!r}.")
    if sampling not in ("log", "linear"):
        raise ValueError(f"`sampling` must be 'log' or 'linear'; got {sampling!r}.")
    if default is None:
        default = math.sqrt(lo * hi) if sampling == "log" else (lo + hi) / 2
    return hp.Float(name, min_value=lo, max_value=hi, sampling=sampling, default=float(default))


def privacy_objective(name: str = OBJECTIVE_NAME) -> Any:
    """The keras-tuner objective that maximizes the `PrivacyUtility` score."""
    import keras_tuner

    return keras_tuner.Objective(name, direction="max")


class PrivacyUtility(keras.callbacks.Callback):
    """Log ``epsilon`` and a privacy-utility score ``privacy_utility`` every epoch.

    Args:
        utility: the logged metric that measures utility (default
            ``"val_accuracy"``; it must be in the logs at epoch end).
        budget: eps budget for ``mode="budget"``.
        mode: ``"budget"`` (default when ``budget`` is given): the score is
            the utility if eps <= budget, else ``penalty``; ``"weighted"``:
            ``utility - weight * eps``.
        weight: the weight of eps in ``mode="weighted"``.
        penalty: the score of a trial over budget.
        delta: delta of the composed eps.
        accountant: ``"pld"`` or ``"rdp"``.
        protects: None (every release of the run) or the secret whose eps
            counts, e.g. ``"labels"`` when only the labels are protected
            (see `keras_fedpriv.privacy.privacy_report`).
    """

    def __init__(self, utility: str = "val_accuracy", budget: float | None = None,
                 mode: str | None = None, weight: float = 0.01, penalty: float = -1.0,
                 delta: float = 1e-5, accountant: str = "pld",
                 protects: str | None = None) -> None:
        super().__init__()
        if not isinstance(utility, str):
            raise TypeError(f"`utility` must be the name of a logged metric; got {utility!r}.")
        mode = mode or ("budget" if budget is not None else "weighted")
        if mode not in ("budget", "weighted"):
            raise ValueError(f"`mode` must be 'budget' or 'weighted'; got {mode!r}.")
        if mode == "budget" and budget is None:
            raise ValueError("`mode='budget'` needs `budget` (the largest acceptable eps).")
        self.utility = utility
        self.mode = mode
        self.budget = None if budget is None else validate_eps(budget, "budget", lower_open=True)
        self.weight = validate_eps(weight, "weight")
        if isinstance(penalty, bool) or not isinstance(penalty, numbers.Real):
            raise TypeError(f"`penalty` must be a number; got {penalty!r}.")
        self.penalty = float(penalty)
        self.delta = validate_eps(delta, "delta", upper=1.0)
        self.accountant = accountant
        self.protects = protects

    def score(self, utility: float, eps: float) -> float:
        """The privacy-utility score of a utility value at eps."""
        if self.mode == "budget":
            return float(utility) if eps <= self.budget else self.penalty
        return float(utility) - self.weight * eps

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None:
            return
        if self.utility not in logs:
            raise ValueError(f"PrivacyUtility: the utility metric {self.utility!r} is not in the "
                             f"logs (have: {sorted(logs)}); pass validation data or another "
                             f"`utility=`.")
        eps = privacy_report(self.model, delta=self.delta, accountant=self.accountant,
                             protects=self.protects).epsilon
        logs["epsilon"] = eps
        logs[OBJECTIVE_NAME] = self.score(logs[self.utility], eps)


def trial_epsilon(trial: Any, name: str = "epsilon") -> float:
    """What a finished keras-tuner trial spent: the largest ``epsilon`` it logged.

    keras-tuner keeps a trial's *best* epoch (``trial.metrics.get_best_value``
    and the trial's score), but the trial trained on the data for all its
    epochs: its eps is that of its last epoch, the largest value in the
    ``epsilon`` history (`PrivacyUtility` logs the eps spent so far, which
    only grows).

    Args:
        trial: a `keras_tuner.engine.trial.Trial` (e.g. from
            ``tuner.oracle.trials.values()``).
        name: the logged metric (default ``"epsilon"``).

    Returns:
        The eps the trial spent (``inf`` if any epoch was not private).
    """
    metrics = getattr(trial, "metrics", None)
    if metrics is None or not metrics.exists(name):
        raise ValueError(f"trial_epsilon: the trial has no {name!r} history; train it with the "
                         f"PrivacyUtility callback.")
    values = [v for obs in metrics.get_history(name) for v in np.ravel(obs.value)]
    if not values:
        raise ValueError(f"trial_epsilon: the trial's {name!r} history is empty.")
    return float(max(values))


def search_epsilon(trial_epsilons: Any) -> float:
    """A valid eps for a whole search on the same private data: the sum of the trials' eps.

    Basic composition: each trial released the data once at its own eps (and,
    for trials with a delta, the deltas add up likewise). Loose, but valid
    for any tuner and any way it picks the next trial.

    Args:
        trial_epsilons: a keras-tuner tuner or oracle (every trial that ran
            is counted with `trial_epsilon`, what it spent, not its best
            epoch's figure), a list of trials, or a list of numbers (the
            eps each trial spent).
    """
    oracle = getattr(trial_epsilons, "oracle", trial_epsilons)
    trials = getattr(oracle, "trials", None)
    items = list(trials.values()) if isinstance(trials, dict) else list(trial_epsilons)
    values = [trial_epsilon(t) if hasattr(t, "metrics") else validate_eps(t, "trial_epsilons")
              for t in items]
    if not values:
        raise ValueError("`trial_epsilons` must list the eps of at least one trial.")
    return float(sum(values))
