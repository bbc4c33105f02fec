"""split_parties (keras_fedpriv/federated/vertical/parties.py): a VerticalModel cut into its parties'
halves."""

import keras
import numpy as np
import pytest

from keras_fedpriv.federated import VerticalModel
from keras_fedpriv.federated.vertical.parties import split_parties
from keras_fedpriv.federated.vertical.wire import EmbeddingSpec
from vertical_stubs import COLUMNS, model_fn, vertical_data

pytestmark = [pytest.mark.jax]


@pytest.fixture(scope="module")
def data():
    return vertical_data()


def test_split_parties_share_the_layers_and_send_packed_bits(data):
    model = model_fn()
    parties = model.split_parties()
    f1, leader = parties.followers["f1"], parties.leader
    assert f1.bottom is model.bottoms["f1"] and f1.protection is model.protections["f1"]
    assert leader.top is model.top and leader.label_dp is model.label_dp
    assert leader.own.bottom is model.bottoms["lead"] and set(parties.followers) == {"f1", "f2"}
    assert f1.optimizer is not model.optimizer  # each party its own optimizer, same settings
    assert f1.optimizer.get_config()["learning_rate"] == pytest.approx(0.01)
    assert f1.spec == EmbeddingSpec((4,), "float32", True)
    assert f1.wire_format == model.wire_format["f1"]

    ids = np.arange(10, 30)
    message = f1.embed(data["features"][ids, COLUMNS["f1"]], example_ids=ids)
    # bits only: one uint8 array, ceil(4 / 8) = 1 byte per example
    assert set(message) == {"bits"}
    assert message["bits"].dtype == np.uint8 and message["bits"].shape == (20, 1)
    assert not np.any(message["bits"] & 0x0F)  # the 4 padding bits of every row are zero
    received = leader.receive("f1", message, rows=20)
    assert received.dtype == np.float32 and set(np.unique(received)) <= {0.0, 1.0}

    # unprotected: the float embedding, nothing else
    plain = split_parties(model_fn(embedding_dp=None)).followers["f1"]
    message = plain.embed(data["features"][ids, COLUMNS["f1"]], example_ids=ids)
    assert set(message) == {"embedding"} and message["embedding"].dtype == np.float32
    assert message["embedding"].shape == (20, 4)


def test_split_parties_refuses_bad_arguments():
    model = model_fn()
    with pytest.raises(TypeError, match="`model` must be a VerticalModel"):
        split_parties(keras.Sequential([keras.Input((2,))]))
    with pytest.raises(TypeError, match="`optimizer`"):
        split_parties(model, optimizer=3)
    with pytest.raises(ValueError, match="not compiled; pass `optimizer=`"):
        uncompiled = VerticalModel(dict(model.bottoms), model.top, leader="lead")
        split_parties(uncompiled)
    with pytest.raises(TypeError, match="`metrics` must hold keras.metrics.Metric"):
        split_parties(model, metrics=[lambda y, p: y])
