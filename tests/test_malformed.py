"""MalformedMessage (keras_fedpriv/federated/malformed.py): one base for both protocols'
refusals."""

import numpy as np
import pytest

from keras_fedpriv.federated import MalformedUpload, SignDSUpload
from keras_fedpriv.federated.malformed import MalformedMessage
from keras_fedpriv.federated.vertical.wire import EmbeddingSpec, decode_embedding
from keras_fedpriv.optimizers import SignDSEncoder

pytestmark = [pytest.mark.jax]


def test_both_protocols_raise_a_malformed_message_that_is_a_value_error():
    assert issubclass(MalformedUpload, MalformedMessage)
    assert issubclass(MalformedMessage, ValueError)
    with pytest.raises(MalformedMessage):
        decode_embedding({"embedding": np.zeros((2, 3), np.float64)},
                         EmbeddingSpec((3,), "float32", False), rows=2)
    upload = SignDSUpload(SignDSEncoder(eps=1.0, seed=0))
    with pytest.raises(MalformedMessage):
        upload.from_wire({"bogus": np.zeros(3)}, dim=10)


def test_a_refusal_names_what_is_wrong_never_a_value():
    secret = np.full((2, 3), 0.123456789, np.float32)
    with pytest.raises(MalformedMessage) as caught:
        decode_embedding({"embedding": secret, "extra": secret},
                         EmbeddingSpec((3,), "float32", False), rows=2)
    assert "0.123" not in str(caught.value) and "embedding" in str(caught.value)
