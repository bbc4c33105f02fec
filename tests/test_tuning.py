"""eps as a keras-tuner hyperparameter, the privacy-utility objective, with three tuners."""

import pathlib
import re

import keras
import keras_tuner as kt
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.mechanisms import randomized_response_dp_event
from keras_fedpriv.privacy import compose_epsilon
from keras_fedpriv.tuning import (
    PrivacyUtility,
    eps_hyperparameter,
    privacy_objective,
    search_epsilon,
    track_search,
    trial_epsilon,
)

from tuning_cases import vertical_data, vertical_trial_model

pytestmark = [pytest.mark.jax]


def _data():
    return vertical_data(192, 64)


def _build(hp):
    eps = eps_hyperparameter(hp, min_value=0.25, max_value=8.0)
    return vertical_trial_model(kf.LabelDPLayer(eps=eps))


@pytest.mark.parametrize("tuner_cls", ["RandomSearch", "BayesianOptimization", "Hyperband"])
def test_each_tuner_maximizes_utility_under_an_eps_budget(tuner_cls, tmp_path):
    (x, y), val = _data()
    common = dict(objective=privacy_objective(), directory=str(tmp_path), project_name="t",
                  overwrite=True, seed=0)
    if tuner_cls == "Hyperband":
        tuner = kt.Hyperband(_build, max_epochs=3, factor=3, hyperband_iterations=1, **common)
    else:
        # each trial builds and traces a new model: the trial count sets this test's time
        tuner = getattr(kt, tuner_cls)(_build, max_trials=3, **common)
    tuner.search(x, y, validation_data=val, epochs=2, batch_size=64, verbose=0,
                 callbacks=[PrivacyUtility(budget=2.0, protects="labels")])
    trials = [t for t in tuner.oracle.trials.values() if t.status == "COMPLETED"]
    assert len(trials) >= 2
    for t in trials:
        eps = t.hyperparameters.get("eps")
        assert 0.25 <= eps <= 8.0
        logged_eps = t.metrics.get_last_value("epsilon")
        # labels randomized once per secret key: one release at the trial's eps, or more
        # where Hyperband resumed the trial from a checkpoint into a new model (a fresh key
        # re-randomizes every label: the ledger counts a new release)
        generations = [compose_epsilon([(randomized_response_dp_event(eps, 2), g)], 1e-5)
                       for g in (1, 2, 3)]
        assert any(logged_eps == pytest.approx(g, rel=2e-3) for g in generations)
        if tuner_cls != "Hyperband":
            assert logged_eps == pytest.approx(eps, rel=1e-3)
        score = t.metrics.get_last_value("privacy_utility")
        # the budget applies to what the trial spent, not to its eps setting: a Hyperband
        # trial at eps <= 2 that was resumed into a fresh key spent more and scores the penalty
        if logged_eps > 2.0:
            assert score == -1.0
        else:
            assert score == pytest.approx(t.metrics.get_last_value("val_accuracy"))
    best = tuner.oracle.get_best_trials(1)[0]
    spent = [t.metrics.get_last_value("epsilon") for t in trials]
    assert best.metrics.get_last_value("epsilon") <= 2.0 or all(e > 2.0 for e in spent)


def test_weighted_mode_and_search_epsilon():
    cb = PrivacyUtility(weight=0.1)
    assert cb.mode == "weighted"
    assert cb.score(0.9, 2.0) == pytest.approx(0.7)
    assert search_epsilon([1.5] * 10) == 15.0
    with pytest.raises(ValueError, match="trial_epsilons"):
        search_epsilon([])


def test_eps_hyperparameter_is_log_sampled_in_range():
    hp = kt.HyperParameters()
    value = eps_hyperparameter(hp, min_value=0.1, max_value=10.0)
    assert value == pytest.approx(1.0)  # default: the geometric mean
    spec = hp.space[0]
    assert spec.sampling == "log" and spec.min_value == 0.1 and spec.max_value == 10.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(min_value=0.0), "min_value"), (dict(min_value=5.0, max_value=1.0), "min_value"),
    (dict(max_value=float("inf")), "max_value"), (dict(sampling="reverse_log"), "sampling"),
])
def test_bad_hyperparameter_ranges(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        eps_hyperparameter(kt.HyperParameters(), **kwargs)


def test_missing_utility_metric_is_a_clear_error():
    (x, y), _ = _data()
    model = _build(kt.HyperParameters())
    with pytest.raises(ValueError, match="val_accuracy"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[PrivacyUtility(budget=1.0)])


def test_a_run_that_cannot_be_scored_stops_the_search_at_its_first_epoch(tmp_path):
    """Without ``protects=``, a model that protects only its labels composes to eps = inf (the
    embeddings go out without DP): every trial used to score the penalty -1, silently. The
    callback says so, with each secret's eps, and keras-tuner stops at the first trial."""
    (x, y), val = _data()
    tuner = kt.RandomSearch(_build, objective=privacy_objective(), max_trials=3,
                            directory=str(tmp_path), project_name="p", overwrite=True, seed=0)
    track_search(tuner)
    with pytest.raises(ValueError, match=r"protects=None.*eps = inf.*labels \d.*features inf"
                                         r".*`protects=` one of \['labels'\]") as raised:
        tuner.search(x, y, validation_data=val, epochs=2, batch_size=64, verbose=0,
                     callbacks=[PrivacyUtility(budget=2.0)])
    assert isinstance(raised.value, kt.errors.FatalError)  # not retried by keras-tuner
    assert len(tuner.oracle.trials) == 1
    # what the stopped trial released is still counted
    (trial,) = tuner.oracle.trials.values()
    assert search_epsilon(tuner, protects="labels") == pytest.approx(
        trial.hyperparameters.get("eps"), rel=2e-3)
    # a secret released without DP cannot be scored either, in a plain fit too
    model = vertical_trial_model(label_dp=None)
    with pytest.raises(ValueError, match="protects='labels'.*protect what the model releases"):
        model.fit(x, y, validation_data=val, epochs=1, verbose=0,
                  callbacks=[PrivacyUtility(weight=0.1, protects="labels")])


def test_after_a_completed_trial_a_failing_trial_fails_alone_and_still_counts(tmp_path):
    """Once a trial completed, our error in a later trial depends on that trial's
    hyperparameters (here: a choice without label DP, which scores eps = inf): keras-tuner
    goes on with the next trials instead of stopping, and the failed trials' releases count."""
    (x, y), val = _data()
    built = []

    def build(hp):  # the first trial protects the labels, the later ones (by "choice") do not
        eps = eps_hyperparameter(hp, min_value=0.25, max_value=8.0)
        built.append(eps)
        return vertical_trial_model(kf.LabelDPLayer(eps=eps) if len(built) == 1 else None)

    tuner = kt.RandomSearch(build, objective=privacy_objective(), max_trials=3,
                            directory=str(tmp_path), project_name="c", overwrite=True, seed=0)
    built.clear()  # keras-tuner builds once to read the search space
    track_search(tuner)
    tuner.search(x, y, validation_data=val, epochs=1, batch_size=64, verbose=0,
                 callbacks=[PrivacyUtility(budget=2.0, protects="labels")])
    statuses = [t.status for t in tuner.oracle.trials.values()]
    assert len(built) == 3 and statuses[0] == "COMPLETED"
    assert [s for s in statuses[1:] if s == "COMPLETED"] == []
    assert search_epsilon(tuner, protects="labels") == float("inf")  # labels without DP


# ------------------------------------------------------------ what a search spent
class _BlackBox(kt.RandomSearch):
    """A tuner whose trials train nothing the search can see (no fit with its callbacks)."""

    def run_trial(self, trial, *args, **kwargs):
        return {"privacy_utility": 0.5}


def test_a_trial_that_trains_out_of_sight_counts_as_not_private(tmp_path):
    tuner = _BlackBox(hypermodel=None, objective=privacy_objective(), max_trials=1,
                      directory=str(tmp_path), project_name="b", overwrite=True, seed=0)
    spent = track_search(tuner)
    assert track_search(tuner) is spent  # tracked once
    tuner.search(verbose=0)
    (trial,) = tuner.oracle.trials.values()
    assert trial_epsilon(trial) == float("inf")
    assert "no model seen" in str(spent.report())


def test_the_search_figure_counts_a_trial_while_it_trains(tmp_path):
    (x, y), val = _data()
    seen = []

    class Watch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(search_epsilon(tuner, protects="labels"))

    keras.utils.set_random_seed(0)
    tuner = kt.RandomSearch(_build, objective=privacy_objective(), max_trials=1,
                            directory=str(tmp_path), project_name="w", overwrite=True, seed=0)
    track_search(tuner)
    tuner.search(x, y, validation_data=val, epochs=2, batch_size=64, verbose=0,
                 callbacks=[PrivacyUtility(budget=8.0, protects="labels"), Watch()])
    (trial,) = tuner.oracle.trials.values()
    eps = trial.hyperparameters.get("eps")
    # labels randomized once per key: the first epoch already released them
    assert seen[0] == pytest.approx(eps, rel=2e-3)
    assert search_epsilon(tuner, protects="labels") == pytest.approx(eps, rel=2e-3)


def test_tracking_needs_a_tuner():
    with pytest.raises(TypeError, match="`tuner` must be a keras-tuner Tuner"):
        track_search(object())
    with pytest.raises(TypeError):
        search_epsilon([True])


def test_the_docs_snippet_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/tuning.md's example, with a small search: every trial trains, and the search's
    eps is printed (it once failed every trial silently and printed 0.0)."""
    text = (pathlib.Path(__file__).parents[1] / "docs" / "tuning.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    small = snippet.replace("max_trials=12", "max_trials=2").replace("epochs=20", "epochs=2")
    assert small.count("max_trials=2") == 1 and small.count("epochs=2,") == 1
    rng = np.random.default_rng(0)
    features = {p: rng.normal(size=(80, 15)).astype("float32") for p in ("party_a", "party_b")}
    labels = (features["party_a"][:, 0] > 0).astype("float32")
    namespace = {"x": {p: v[:64] for p, v in features.items()}, "y": labels[:64],
                 "x_val": {p: v[64:] for p, v in features.items()}, "y_val": labels[64:]}
    monkeypatch.chdir(tmp_path)  # keras-tuner's default project folder
    keras.utils.set_random_seed(0)
    exec(compile(small, "docs/tuning.md", "exec"), namespace)
    printed = float(capsys.readouterr().out.strip().splitlines()[-1])
    tuner = namespace["tuner"]
    assert [t.status for t in tuner.oracle.trials.values()] == ["COMPLETED"] * 2
    # each trial's labels were randomized once (a new key per trial), at its eps
    events = [(randomized_response_dp_event(t.hyperparameters.get("eps"), 2), 1)
              for t in tuner.oracle.trials.values()]
    assert printed == pytest.approx(compose_epsilon(events, 1e-5), rel=2e-3)
    assert printed > max(t.hyperparameters.get("eps") for t in tuner.oracle.trials.values())
