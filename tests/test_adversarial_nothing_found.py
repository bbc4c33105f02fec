"""Adversarial: a report that finds no protection never reads as private (issue 18, case 0).

A user who forgets the layer, or passes the wrong object, must not be told
the run was perfectly private: by every way of asking (the model, its History,
an optimizer, a list, EpsilonLogger, `privacy_ledger`, `protects=`), finding
nothing gives inf and says what was searched.
"""

import math

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.privacy import EpsilonLogger, privacy_ledger, privacy_report

pytestmark = [pytest.mark.jax]

X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("float32")


def _plain_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")],
                             name="plain")
    model.compile("sgd", "binary_crossentropy")
    return model


@pytest.fixture(scope="module")
def fitted():
    model = _plain_model()
    history = model.fit(X, Y, epochs=1, verbose=0)
    return model, history


def test_a_plain_model_and_its_history_report_inf(fitted):
    model, history = fitted
    for obj in (model, history, model.optimizer, [model, history]):
        report = privacy_report(obj)
        assert math.isinf(report.epsilon) and not report.private
        assert "no protection found" in str(report)
    assert "Sequential 'plain'" in str(privacy_report(model))


@pytest.mark.parametrize("secret", ["labels", "features", "client data"])
def test_every_secret_of_a_plain_model_is_inf(fitted, secret):
    assert math.isinf(privacy_report(fitted[0], protects=secret).epsilon)


def test_the_ledger_and_the_epsilon_logger_say_so_too(fitted):
    ledger = privacy_ledger(fitted[0])
    assert len(ledger.kinds) == 3
    logger = EpsilonLogger()
    model = _plain_model()
    history = model.fit(X, Y, epochs=2, verbose=0, callbacks=[logger])
    assert all(math.isinf(e) for e in history.history["epsilon"])


def test_a_protected_model_before_any_release_is_still_zero():
    """Finding a protection that has not released yet is not 'nothing found'."""
    labels = keras.Input((1,))
    model = keras.Model(labels, kf.LabelDPLayer(1.0)(labels))
    assert privacy_report(model).epsilon == 0.0
    model.layers[-1](Y[:, None], training=True, example_ids=np.arange(len(Y)))
    assert 0 < privacy_report(model).epsilon < math.inf
