"""The leader's half of vertical FL (keras_fedpriv/federated/vertical/leader.py)."""

import numpy as np
import pytest

from keras_fedpriv.federated.malformed import MalformedMessage
from keras_fedpriv.federated.vertical.leader import VerticalLeader
from vertical_stubs import model_fn, vertical_data

pytestmark = [pytest.mark.jax]


@pytest.fixture(scope="module")
def data():
    return vertical_data()


def test_bad_arguments_raise_clear_errors(data):
    model = model_fn()
    parties = model.split_parties()
    f1, leader = parties.followers["f1"], parties.leader
    with pytest.raises(TypeError, match="`followers` must be a non-empty dict"):
        VerticalLeader(model.top, {}, loss="mse")
    with pytest.raises(TypeError, match=r"`followers\['f1'\]` must be an EmbeddingSpec"):
        VerticalLeader(model.top, {"f1": (4,)}, loss="mse")
    with pytest.raises(ValueError, match="`loss` is required"):
        VerticalLeader(model.top, {"f1": f1.spec, "f2": f1.spec}, bottom=model.bottoms["lead"],
                       name="lead")
    with pytest.raises(ValueError, match="`name`"):
        VerticalLeader(model.top, {"f1": f1.spec}, bottom=model.bottoms["lead"], loss="mse")
    with pytest.raises(ValueError, match="last dimension 12"):
        VerticalLeader(model.top, {"f1": f1.spec}, loss="mse")
    received = {"f1": np.zeros((2, 4), np.float32), "f2": np.zeros((2, 4), np.float32)}
    with pytest.raises(ValueError, match=r"missing \['f2'\]"):
        leader.step({"f1": received["f1"]}, np.zeros((2, 1), np.float32), [0, 1],
                    x=data["xb"][:2])
    with pytest.raises(ValueError, match="`x` .* is required"):
        leader.step(received, np.zeros((2, 1), np.float32), [0, 1])
    with pytest.raises(ValueError, match=r"`received\['f1'\]` must be float32"):
        leader.step({**received, "f1": np.zeros((2, 4))}, np.zeros((2, 1), np.float32),
                    [0, 1], x=data["xb"][:2])
    with pytest.raises(ValueError, match="needs example ids"):
        leader.step(received, np.zeros((2, 1), np.float32), x=data["xb"][:2])
    with pytest.raises(ValueError, match="row 1 has value 2"):
        leader.step(received, np.array([[0.0], [2.0]], np.float32), [0, 1], x=data["xb"][:2])
    with pytest.raises(ValueError, match="`sample_weight` with label_dp"):
        leader.step(received, np.zeros((2, 1), np.float32), [0, 1], x=data["xb"][:2],
                    sample_weight=np.ones(2))
    with pytest.raises(MalformedMessage, match="not a follower"):
        leader.receive("lead", {"bits": np.zeros((2, 1), np.uint8)}, rows=2)
