"""Adversarial: a hyperparameter search reports what it spent, not the best epoch's figure.

Issue 18, case 7: keras-tuner keeps a trial's best epoch, averaged over its executions; with 2
trials x 2 executions x 4 epochs the search's eps said 5.52 where the trials released 40.2.
Every trial, every execution and every epoch released about the same examples: the search's
figure must compose all of them (and a trial's figure all of its executions).
"""

import keras
import keras_tuner as kt
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.federated import VerticalModel, with_example_ids
from keras_fedpriv.mechanisms import randomized_response_dp_event
from keras_fedpriv.tuning import (
    PrivacyUtility,
    eps_hyperparameter,
    privacy_objective,
    search_epsilon,
    track_search,
    trial_epsilon,
)

from ledger_cases import by_hand

EPOCHS, EXECUTIONS, TRIALS = 4, 2, 2


def _data():
    rng = np.random.default_rng(0)
    xa = rng.normal(size=(96, 6)).astype("float32")
    xb = rng.normal(size=(96, 4)).astype("float32")
    y = (xa[:, 0] + xb[:, 0] > 0).astype("float32")
    train = (with_example_ids({"party_a": xa[:64], "party_b": xb[:64]}), y[:64])
    val = ({"party_a": xa[64:], "party_b": xb[64:]}, y[64:])
    return train, val


def _build(hp):
    """Labels re-randomized every epoch (per_batch=True): one release per example and epoch."""
    eps = eps_hyperparameter(hp, min_value=0.5, max_value=4.0)
    bottom = lambda n: keras.Sequential([keras.Input((n,)), keras.layers.Dense(4)])  # noqa: E731
    top = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")])
    model = VerticalModel({"party_a": bottom(6), "party_b": bottom(4)}, top, leader="party_b",
                          label_dp=kf.LabelDPLayer(eps=eps, per_batch=True, seed=0))
    model.compile(keras.optimizers.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    return model


def _search(tmp_path, track=True, trials=TRIALS, executions=EXECUTIONS, epochs=EPOCHS):
    (x, y), val = _data()
    keras.utils.set_random_seed(0)
    tuner = kt.RandomSearch(_build, objective=privacy_objective(), max_trials=trials,
                            executions_per_trial=executions, directory=str(tmp_path),
                            project_name="t", overwrite=True, seed=0)
    spent = track_search(tuner) if track else None
    tuner.search(x, y, validation_data=val, epochs=epochs, batch_size=32, verbose=0,
                 callbacks=[PrivacyUtility(budget=100.0, protects="labels")])
    return tuner, spent


def test_case7_the_search_composes_every_trial_execution_and_epoch(tmp_path):
    tuner, spent = _search(tmp_path)
    trials = list(tuner.oracle.trials.values())
    assert len(trials) == TRIALS
    events = {t.trial_id: randomized_response_dp_event(t.hyperparameters.get("eps"), 2)
              for t in trials}
    # every epoch of every execution of every trial released each label once
    expected = by_hand([(e, EPOCHS * EXECUTIONS) for e in events.values()])
    assert search_epsilon(tuner, protects="labels") == pytest.approx(expected, rel=2e-3)
    assert spent.report(protects="labels").epsilon == pytest.approx(expected, rel=2e-3)
    assert search_epsilon(trials, protects="labels") == pytest.approx(expected, rel=2e-3)
    for t in trials:
        assert len(spent.executions[t.trial_id]) == EXECUTIONS
        alone = by_hand([(events[t.trial_id], EPOCHS * EXECUTIONS)])
        assert trial_epsilon(t, protects="labels") == pytest.approx(alone, rel=2e-3)
    # what keras-tuner kept (the best epoch, averaged over executions) is far below it
    kept = sum(t.metrics.get_best_value("epsilon") for t in trials)
    assert expected > 1.5 * kept
    # the followers' embeddings were sent without DP: the whole search is not private
    assert search_epsilon(tuner) == float("inf")


def test_case7_an_untracked_search_is_refused_not_under_counted(tmp_path):
    tuner, _ = _search(tmp_path, track=False, trials=1, executions=1, epochs=1)
    with pytest.raises(ValueError, match="track_search"):
        search_epsilon(tuner, protects="labels")
    trial = next(iter(tuner.oracle.trials.values()))
    with pytest.raises(ValueError, match="best epoch"):
        trial_epsilon(trial)
    with pytest.raises(ValueError, match="track_search"):
        search_epsilon([trial])
