"""Tune eps with keras-tuner: eps as a hyperparameter and a privacy-utility objective.

The pieces:

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

A run that cannot be scored (its scored eps is inf, e.g. ``protects=None``
when only the labels are protected) raises a `ValueError`; that and this
package's other bad-input errors stop a tracked search (`track_search`) at
its first trial with their own message (keras-tuner's fatal errors, still
`ValueError` / `TypeError`), instead of a penalty in every trial or
keras-tuner's retries and "consecutive failures exceeded". Once a trial of
the search has completed, such an error depends on the failing trial's
hyperparameters: that trial fails alone, as keras-tuner decides.

Hyperparameter search on private data leaks too. Every trial trains on the
same private data, every execution of a trial (``executions_per_trial``)
trains a new model on it, and every epoch of each releases again; the
tuner's choice depends on the results. The eps that `PrivacyUtility` logs is
that of ONE execution's training run, and keras-tuner keeps only a trial's
best epoch, averaged over its executions: neither is what the search spent.

* `track_search(tuner)`, called before ``tuner.search``, records the full
  release ledger of every execution of every trial (whatever was released
  about the data, every epoch, evaluation included) as a `SearchLedger`,
  saved in the tuner's project folder so that a resumed search counts what
  earlier processes released.
* `search_epsilon(tuner)` composes all of them for the worst example
  (dp-accounting, as `privacy_report` does); `trial_epsilon(trial)` one
  trial's executions. Papernot and Steinke, "Hyperparameter tuning with Renyi
  differential privacy", ICLR 2022, give much better bounds for random search
  with a random number of trials; we do not implement them.

The sound ways out: tune on public or proxy data and train once on the
private data, or report the search's eps.

Example::

    def build(hp):
        eps = eps_hyperparameter(hp, min_value=0.5, max_value=8.0)
        model = VerticalModel(bottoms, top, leader="party_b", label_dp=LabelDPLayer(eps=eps))
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
        return model

    x = with_example_ids(x)          # the layer randomizes each label once, keyed by id
    tuner = keras_tuner.RandomSearch(build, objective=privacy_objective(), max_trials=10)
    spent = track_search(tuner)
    tuner.search(x, y, validation_data=(xv, yv), epochs=20,
                 callbacks=[PrivacyUtility(budget=2.0, protects="labels")])
    print(spent.report(protects="labels"))         # the whole search, every release composed
"""

from __future__ import annotations

import functools
import glob
import inspect
import json
import math
import numbers
import os
from typing import Any

import keras

from keras_fedpriv.mechanisms.ledger import (
    EXAMPLE,
    SECRETS,
    ReleaseKind,
    ReleaseLedger,
    non_private_event,
)
from keras_fedpriv.mechanisms.validation import validate_eps
from keras_fedpriv.privacy.report import PrivacyReport, privacy_ledger, privacy_report

__all__ = ["PrivacyUtility", "SearchLedger", "eps_hyperparameter", "privacy_objective",
           "search_epsilon", "track_search", "trial_epsilon"]

OBJECTIVE_NAME = "privacy_utility"


def _stop_search(error: Exception) -> Exception:
    """``error`` as keras-tuner's fatal kind of the same class, which stops a search at once.

    keras-tuner retries a failed trial and starts the next ones, and after
    ``max_consecutive_failed_trials`` (3) raises "Number of consecutive
    failures exceeded the limit"; an error that every trial would hit the same
    way (bad inputs, an objective that cannot be scored) should stop the search
    at the first one, with its own message. The fatal error is still a
    `ValueError` / `TypeError` (not ``error``'s own subclass; ``error`` is its
    ``__cause__``); without keras-tuner, ``error`` is returned.
    """
    try:
        from keras_tuner import errors
    except ImportError:  # pragma: no cover - keras-tuner is a dependency
        return error
    if isinstance(error, errors.FatalError):
        return error
    fatal = errors.FatalTypeError if isinstance(error, TypeError) else errors.FatalValueError
    stopped = fatal(str(error))
    stopped.__cause__ = error
    return stopped


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _raised_here(error: BaseException) -> bool:
    """Whether ``error`` was raised by this package's code (its innermost frame is ours).

    Keras drops its own and TensorFlow's frames from a traceback by default, so
    an error that Keras or TensorFlow raised in a call from this package's code
    counts as ours too (the same for every trial, unless it depends on a
    hyperparameter: see `SearchLedger`).
    """
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(
        _PACKAGE_DIR + os.sep)


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

    Raises:
        ValueError: at an epoch's end, when the scored eps is inf (something
            it scores was released without DP, e.g. ``protects=None`` when
            only the labels are protected): no trial could be told from
            another. The message gives each secret's eps. A tracked search
            (`track_search`) stops there if no trial has completed yet;
            after one has, only this trial fails (its eps then depends on
            its hyperparameters, e.g. a choice without DP).
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
        if math.isinf(eps):
            raise ValueError(self._unscorable())
        logs["epsilon"] = eps
        logs[OBJECTIVE_NAME] = self.score(logs[self.utility], eps)

    def _unscorable(self) -> str:
        """Why an infinite eps cannot be scored, with each secret's eps and what to pass."""
        ledger = privacy_ledger(self.model)
        spent = {s: privacy_report(self.model, delta=self.delta, accountant=self.accountant,
                                   protects=s).epsilon
                 for s in SECRETS if len(ledger.only(s))}
        private = [s for s, e in spent.items() if math.isfinite(e)]
        if private and self.protects is None:
            hint = (f"pass `protects=` one of {private} to score that secret's eps alone (the "
                    f"others are then not private), or protect every secret the model releases")
        else:
            hint = "protect what the model releases, or score another secret with `protects=`"
        per_secret = ", ".join(f"{s} {e:.4g}" for s, e in spent.items()) or "none recorded"
        score = f"penalty {self.penalty:g}" if self.mode == "budget" else "-inf"
        return (f"PrivacyUtility(protects={self.protects!r}): the releases it scores compose to "
                f"eps = inf (something was released without DP; eps per secret: {per_secret}), "
                f"so every epoch of every trial would score {score} and the search could not "
                f"rank them; {hint}.")


# ------------------------------------------------------------------ what a search spent
_SEARCH = "_fedpriv_search"          # the SearchLedger of a tracked tuner / oracle
_LEDGER_DIR = "fedpriv_ledgers"      # in the tuner's project folder: one JSON file per trial


class _SeeModels(keras.callbacks.Callback):
    """Collects the models its copies are set on (keras-tuner deep-copies callbacks) and
    saves the trial's ledgers at the end of every epoch."""

    def __init__(self, models: list, save: Any) -> None:
        super().__init__()
        self._models = models
        self._save = save

    def __deepcopy__(self, memo: dict) -> _SeeModels:
        return _SeeModels(self._models, self._save)

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        if not any(m is model for m in self._models):
            self._models.append(model)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._save()


def _unknown_ledger(trial_id, what, why):
    """Releases that cannot be known: they count as released without DP (inf)."""
    ledger = ReleaseLedger()
    for secret in SECRETS:
        ledger.record(ReleaseKind(f"trial {trial_id!r} ({what})", secret, EXAMPLE,
                                  non_private_event(), why), units=None)
    return ledger


def _unseen_ledger(trial_id):
    """A trial that ended without a model we could see: its releases are unknown."""
    return _unknown_ledger(
        trial_id, "no model seen",
        "the trial ran without a fit that took the search's callbacks and returned no History: "
        "what it released is unknown, so it counts as released without DP")


def _takes_callbacks(run_trial):
    """Whether ``run_trial`` accepts a ``callbacks`` keyword (or any keyword)."""
    try:
        params = inspect.signature(run_trial).parameters.values()
    except (TypeError, ValueError):  # no signature to read: keras-tuner's own takes **kwargs
        return True
    return any(p.kind is p.VAR_KEYWORD or (p.name == "callbacks" and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) for p in params)


def _saved(ledger):
    try:
        return ledger.to_dict()
    except ValueError:  # an event the ledger cannot save: unknown after a reload
        return None


class SearchLedger:
    """What a keras-tuner search released: the ledger of every execution of every trial.

    Made by `track_search`. It wraps the tuner's ``run_trial``: every model
    an execution trains (found through the callbacks, which keras-tuner
    passes to each execution's ``fit``, and through the returned
    `History` objects) is read with `keras_fedpriv.privacy.privacy_ledger` when
    the trial's ``run_trial`` returns or fails, so every epoch, every
    execution and every retry counts, and the evaluation passes too. A
    trial that ends without a model in sight (a ``run_trial`` that takes no
    ``callbacks`` and returns no `History`, or trains in a custom loop)
    counts as released without DP (inf).

    A trial that fails with one of this package's `ValueError`/`TypeError`s
    (bad inputs, a run that cannot be scored) stops the search there with that
    message, as long as no trial has completed: every trial would fail alike.
    After a completed trial the error depends on the failing trial's
    hyperparameters, and only that trial fails. Either way, what it released
    is counted.

    The ledgers are also saved in the tuner's project folder
    (``fedpriv_ledgers/trial_<id>.json``: when a trial starts, after every
    epoch and when it ends), so a search resumed with ``overwrite=False``
    and tracked again counts what the earlier process released, a trial
    re-run after a crash included. A trial that was running when its process
    died counts its last saved ledgers plus a release without DP (what it
    released after its last saved epoch is unknown). A trial that ran before
    `track_search` (or in a process that did not track it) is refused for
    good, even if it runs again.

    The figures compose the merged ledgers for the worst example: the same
    example ids in every trial are the same examples. Protections shared by
    several trials' models (layers built outside the tuner's ``build``) are
    counted once per execution that used them, an over-count: build new
    protections in ``build``.

    Attributes:
        tuner: the tracked tuner.
        executions: trial id -> the `ReleaseLedger` of each of its executions.
    """

    def __init__(self, tuner: Any) -> None:
        run_trial = getattr(tuner, "run_trial", None)
        if not callable(run_trial) or getattr(tuner, "oracle", None) is None:
            raise TypeError(f"`tuner` must be a keras-tuner Tuner; got {type(tuner).__name__}.")
        self.tuner = tuner
        self.executions: dict[str, list[ReleaseLedger]] = {}
        self._training: dict[str, list] = {}  # trial id -> models of a trial still running
        self._attempts: dict[str, list[dict]] = {}  # trial id -> saved runs of the trial
        project = getattr(tuner, "project_dir", None)
        self._folder = None if project is None else os.path.join(str(project), _LEDGER_DIR)
        self._untracked = self._load()
        pass_callbacks = _takes_callbacks(run_trial)

        def tracked_run_trial(trial: Any, *args: Any, **kwargs: Any) -> Any:
            tid = trial.trial_id
            models = self._training.setdefault(tid, [])
            attempt = {"complete": False, "ledgers": []}
            self._attempts.setdefault(tid, []).append(attempt)
            save = functools.partial(self._save, tid, attempt, models)
            if pass_callbacks:
                kwargs["callbacks"] = list(kwargs.get("callbacks") or []) + [
                    _SeeModels(models, save)]
            executions = self.executions.setdefault(tid, [])
            object.__setattr__(trial, _SEARCH, self)
            save()
            result = None
            try:
                result = run_trial(trial, *args, **kwargs)
            except (ValueError, TypeError) as err:
                # this package's bad-input errors fail every trial alike: stop at the first;
                # after a completed trial such an error depends on this trial's hyperparameters
                if self._any_completed() or not _raised_here(err):
                    raise
                stopped = _stop_search(err)  # `err` is its cause
                if stopped is err:
                    raise
                raise stopped
            finally:
                results = result if isinstance(result, (list, tuple)) else [result]
                for item in results:
                    model = getattr(item, "model", None)
                    if isinstance(item, keras.callbacks.History) and model is not None and not any(
                            m is model for m in models):
                        models.append(model)
                ledgers = [privacy_ledger(m) for m in models] or [_unseen_ledger(tid)]
                executions.extend(ledgers)
                del self._training[tid]
                self._write(tid, attempt, ledgers, complete=True)
            return result

        tuner.run_trial = tracked_run_trial
        object.__setattr__(tuner, _SEARCH, self)
        object.__setattr__(tuner.oracle, _SEARCH, self)

    def _any_completed(self):
        """Whether a trial of the search has completed (this process's or a resumed one)."""
        trials = getattr(self.tuner.oracle, "trials", {})
        return any(getattr(t, "status", None) == "COMPLETED" for t in trials.values())

    # -- the saved ledgers -----------------------------------------------------------------
    def _path(self, trial_id):
        return os.path.join(self._folder, f"trial_{trial_id}.json")

    def _save(self, trial_id, attempt, models):
        """Save the ledgers of a running trial's models (not complete yet)."""
        self._write(trial_id, attempt, [privacy_ledger(m) for m in models], complete=False)

    def _write(self, trial_id, attempt, ledgers, complete):
        attempt["ledgers"] = [_saved(ledger) for ledger in ledgers]
        attempt["complete"] = complete
        if self._folder is None:
            return
        os.makedirs(self._folder, exist_ok=True)
        path = self._path(trial_id)
        with open(path + ".tmp", "w") as f:
            json.dump({"trial_id": trial_id, "attempts": self._attempts[trial_id]}, f)
        os.replace(path + ".tmp", path)  # atomic: a crash leaves the old file or the new one

    def _load(self):
        """Read the ledgers saved by earlier processes; return the trials run untracked."""
        saved = set()
        if self._folder is not None and os.path.isdir(self._folder):
            for name in sorted(os.listdir(self._folder)):
                if not (name.startswith("trial_") and name.endswith(".json")):
                    continue
                with open(os.path.join(self._folder, name)) as f:
                    state = json.load(f)
                tid = str(state["trial_id"])
                self._attempts[tid] = state["attempts"]
                self.executions[tid] = [ledger for attempt in state["attempts"]
                                        for ledger in self._reloaded(tid, attempt)]
                saved.add(tid)
        trials = getattr(self.tuner.oracle, "trials", {})
        for tid in saved & set(trials):
            object.__setattr__(trials[tid], _SEARCH, self)
        # Trials that ran: those the oracle reloaded, and every trial folder of the project
        # (keras-tuner reloads nothing when it was stopped before its first trial ended).
        ran = {t: getattr(trial, "status", None) for t, trial in trials.items()}
        if self._folder is not None:
            pattern = os.path.join(os.path.dirname(self._folder), "trial_*", "trial.json")
            for name in glob.glob(pattern):
                with open(name) as f:
                    state = json.load(f)
                ran.setdefault(str(state.get("trial_id")), state.get("status"))
        return {t for t, status in ran.items() if t not in saved and status != "IDLE"}

    @staticmethod
    def _reloaded(trial_id, attempt):
        out = []
        for state in attempt["ledgers"]:
            out.append(ReleaseLedger.from_dict(state) if state is not None else _unknown_ledger(
                trial_id, "a release the ledger file cannot hold",
                "an execution released with an event that could not be saved: unknown after a "
                "reload, so it counts as released without DP"))
        if not attempt["complete"]:
            out.append(_unknown_ledger(
                trial_id, "stopped while running",
                "the process stopped while the trial ran: what it released after its last "
                "saved epoch is unknown, so it counts as released without DP"))
        return out

    # -- the figures -------------------------------------------------------------------------
    def _ledgers(self, trial_id: str | None) -> list[ReleaseLedger]:
        """The recorded ledgers, and those of the models of trials still running."""
        trials = getattr(self.tuner.oracle, "trials", {})
        if trial_id is not None:
            if trial_id in self._untracked:
                raise ValueError(f"trial {trial_id!r} ran before track_search() or in another "
                                 f"process that did not track it: what it released is "
                                 f"unknown.")
            if trial_id not in self.executions:
                raise ValueError(f"`trial_id` {trial_id!r} has not run under this SearchLedger "
                                 f"(recorded: {sorted(self.executions)}).")
            ids = [trial_id]
        else:
            untracked = self._untracked | {
                t for t, trial in trials.items()
                if t not in self.executions and getattr(trial, "status", None) != "IDLE"}
            if untracked:
                raise ValueError(f"trials {sorted(untracked)} ran before track_search() or in "
                                 f"another process that did not track them: what they released "
                                 f"is unknown.")
            if not self.executions:
                raise ValueError("no trial has run under this SearchLedger yet.")
            ids = list(self.executions)
        return [ledger for t in ids
                for ledger in self.executions[t] + [privacy_ledger(m)
                                                   for m in self._training.get(t, [])]]

    def _recorded(self, trial_ids: list[str | None]) -> list[ReleaseLedger]:
        """`_ledgers` of several selections; refused if they record no release at all."""
        ledgers = [ledger for t in trial_ids for ledger in self._ledgers(t)]
        if not any(len(ledger) for ledger in ledgers):
            trials = getattr(self.tuner.oracle, "trials", {})
            ids = list(self.executions) if None in trial_ids else trial_ids
            statuses = {t: getattr(trials.get(t), "status", None) for t in ids}
            raise ValueError(
                f"the search recorded no release at all (trials and their status: {statuses}): "
                f"trials that failed before releasing anything have no eps to report, and "
                f"nothing recorded is never 'private'. Each trial's `message` says why it "
                f"failed.")
        return ledgers

    def privacy_ledger(self, trial_id: str | None = None) -> ReleaseLedger:
        """The merged ledger of every execution (of one trial with ``trial_id``).

        Args:
            trial_id: None (the whole search) or a trial's id.

        Returns:
            A `ReleaseLedger`; `privacy_report(search_ledger)` composes it.
        """
        return ReleaseLedger.merged(self._recorded([trial_id]))

    def report(self, trial_id: str | None = None, delta: float = 1e-5,
               accountant: str = "pld", protects: str | None = None) -> PrivacyReport:
        """The `PrivacyReport` of the whole search (or of one trial's executions).

        Args:
            trial_id: None (every trial) or a trial's id.
            delta, accountant, protects: as in `privacy_report`.

        Returns:
            The report; ``.epsilon`` is the worst example's composed eps.
        """
        if trial_id is None:
            return privacy_report(self, delta=delta, accountant=accountant, protects=protects)
        return privacy_report(_Ledgers(self._recorded([trial_id])), delta=delta,
                              accountant=accountant, protects=protects)


class _Ledgers:
    """A protection-like holder of recorded ledgers (what `privacy_report` composes)."""

    def __init__(self, ledgers: list[ReleaseLedger]) -> None:
        self._ledgers = ledgers

    def privacy_ledger(self) -> ReleaseLedger:
        return ReleaseLedger.merged(self._ledgers)


def track_search(tuner: Any) -> SearchLedger:
    """Record what every trial of ``tuner``'s search releases; call before ``tuner.search``.

    Args:
        tuner: a keras-tuner tuner (``RandomSearch``, ``BayesianOptimization``,
            ``Hyperband``, or a subclass).

    Returns:
        The tuner's `SearchLedger` (the same one if it is already tracked).
    """
    return getattr(tuner, _SEARCH, None) or SearchLedger(tuner)


_UNTRACKED = ("keras-tuner keeps only a trial's best epoch, averaged over its executions, which "
              "under-counts what the trial released; call `track_search(tuner)` before "
              "`tuner.search` so every execution's ledger is recorded.")


def trial_epsilon(trial: Any, delta: float = 1e-5, accountant: str = "pld",
                  protects: str | None = None) -> float:
    """What one trial of a tracked search spent: every epoch of every execution, composed.

    Args:
        trial: a `keras_tuner.engine.trial.Trial` of a search tracked by
            `track_search` (e.g. from ``tuner.oracle.trials.values()``).
        delta, accountant, protects: as in `privacy_report`.

    Returns:
        The worst example's composed eps (``inf`` if anything was released
        without DP).

    Raises:
        ValueError: the trial did not run under `track_search` (its logged
            metrics cannot say what it spent), or it recorded no release (it
            failed before training).
    """
    search = getattr(trial, _SEARCH, None)
    if search is None:
        raise ValueError(f"trial_epsilon: trial {getattr(trial, 'trial_id', trial)!r} was not "
                         f"recorded by track_search(); {_UNTRACKED}")
    return search.report(trial.trial_id, delta=delta, accountant=accountant,
                         protects=protects).epsilon


def search_epsilon(trial_epsilons: Any, delta: float = 1e-5, accountant: str = "pld",
                   protects: str | None = None) -> float:
    """A valid eps for a whole search on the same private data.

    Args:
        trial_epsilons: a keras-tuner tuner or oracle tracked by
            `track_search` (every release of every execution of every trial,
            merged and composed for the worst example), a list of its trials
            (the same, for those trials), or a list of numbers, the eps each
            trial spent (basic composition: their sum).
        delta, accountant, protects: as in `privacy_report` (not used for a
            list of numbers).

    Returns:
        The search's eps (``inf`` if anything was released without DP).

    Raises:
        ValueError: a tuner, oracle or trial that was not tracked, a search
            that recorded no release at all (e.g. every trial failed before
            training), or an empty list.
    """
    search = getattr(trial_epsilons, _SEARCH, None)
    if search is not None:
        return search.report(delta=delta, accountant=accountant, protects=protects).epsilon
    if hasattr(trial_epsilons, "oracle") or hasattr(trial_epsilons, "trials"):
        raise ValueError(f"search_epsilon: the search was not recorded; {_UNTRACKED}")
    items = list(trial_epsilons)
    if not items:
        raise ValueError("`trial_epsilons` must list the eps of at least one trial.")
    if all(hasattr(t, "metrics") for t in items):
        missing = [getattr(t, "trial_id", t) for t in items if not hasattr(t, _SEARCH)]
        if missing:
            raise ValueError(f"search_epsilon: trials {missing} were not recorded by "
                             f"track_search(); {_UNTRACKED}")
        searches = {}
        for t in items:
            searches.setdefault(getattr(t, _SEARCH), set()).add(t.trial_id)
        ledgers = [ledger for search, ids in searches.items()
                   for ledger in search._recorded(sorted(ids))]
        return privacy_report(_Ledgers(ledgers), delta=delta, accountant=accountant,
                              protects=protects).epsilon
    values = [validate_eps(t, "trial_epsilons") for t in items]
    return float(sum(values))
