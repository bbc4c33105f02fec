"""VerticalStep (keras_fedpriv.federated.vertical.step): a VerticalModel's protocol steps.

Every ``fit`` and ``evaluate`` of tests/test_vertical_model.py runs `VerticalStep.train` and
`VerticalStep.test` through the backend; here, without a training run: the step object a
model holds, the wire bytes it counts per message, one evaluation step called directly, and
the sample-weight refusal that ``fit`` and the step share.

Backend-neutral: the module runs again under ``KERAS_BACKEND=jax``.
"""

import re

import keras
import numpy as np
import pytest

from vertical_stubs import compile_model, two_party

import keras_fedpriv as kf
from keras_fedpriv.federated import with_example_ids
from keras_fedpriv.federated.vertical.step import SAMPLE_WEIGHT_REFUSAL, VerticalStep

pytestmark = [pytest.mark.jax]

ROWS = 6


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    x = {p: rng.normal(size=(ROWS, 15)).astype("float32") for p in ("party_a", "party_b")}
    return x, rng.integers(0, 2, size=(ROWS, 1)).astype("float32")


def test_a_model_holds_one_step_over_its_parties():
    model = two_party()
    step = model.protocol_step
    assert isinstance(step, VerticalStep) and step.model is model
    assert model.protocol_step is step  # built once with the model, never per call
    assert step.parties == model.parties == ("party_a", "party_b")
    assert step.followers == model.followers == ("party_a",)
    # what fit sets before it traces the training step
    assert (step.class_weight, step.label_free_sample_weight, step.capture_messages) == (
        None, False, False)


@pytest.mark.parametrize("protection", [None, "bits"])
def test_wire_bytes_are_the_wire_format_times_the_rows(protection):
    keras.utils.set_random_seed(0)
    layer = kf.EmbeddingDPLayer(eps=4.0, seed=1) if protection else None
    model = two_party(embedding_dp=layer)
    x, _ = _batch()
    sent = model.party_embeddings("party_a", x)
    up, down = model.protocol_step.wire_bytes("party_a", sent)
    wire = model.wire_format["party_a"]
    assert wire["up_bytes_per_example"] == (1 if protection else 8 * 4)
    assert float(up) == ROWS * wire["up_bytes_per_example"]
    assert float(down) == ROWS * wire["down_bytes_per_example"]


def test_an_evaluation_step_counts_the_messages_up_and_none_down():
    keras.utils.set_random_seed(1)
    model = compile_model(two_party(embedding_dp=kf.EmbeddingDPLayer(eps=4.0, seed=2)))
    x, y = _batch(1)
    logs = model.protocol_step.test((with_example_ids(x), y))
    assert {"loss", "accuracy"} <= set(logs)
    assert np.isfinite(float(logs["loss"]))
    traffic = {name: float(metric.result()) for name, metric in model.traffic.items()}
    assert traffic == {"bytes_up": ROWS, "bytes_up_party_a": ROWS,
                       "bytes_down": 0, "bytes_down_party_a": 0}


def test_fit_refuses_sample_weights_with_the_steps_reason():
    model = compile_model(two_party(label_dp=kf.LabelDPLayer(eps=2.0, seed=3)))
    x, y = _batch(2)
    with pytest.raises(ValueError, match=re.escape(SAMPLE_WEIGHT_REFUSAL)):
        model.fit(with_example_ids(x), y, sample_weight=np.ones(ROWS), epochs=1, verbose=0)
