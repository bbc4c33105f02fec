"""The vertical-FL wire format (keras_fedpriv/federated/vertical/wire.py): packed bits,
floats, and what is refused."""

import numpy as np
import pytest

from keras_fedpriv.federated.vertical.wire import (
    EmbeddingSpec,
    MalformedMessage,
    decode_embedding,
    decode_gradient,
    encode_embedding,
    )

pytestmark = [pytest.mark.jax]


SPEC_BITS = EmbeddingSpec((12,), "float32", True)


SPEC_FLOAT = EmbeddingSpec((3,), "float32", False)


@pytest.mark.parametrize("arrays, spec, match", [
    ({"bits": np.zeros((5, 2), np.uint8), "x": np.zeros(1)}, SPEC_BITS, "exactly the array"),
    ({"embedding": np.zeros((5, 12), np.float32)}, SPEC_BITS, "exactly the array 'bits'"),
    ({"bits": np.zeros((5, 2), np.int8)}, SPEC_BITS, "uint8 of shape"),
    ({"bits": np.zeros((5, 3), np.uint8)}, SPEC_BITS, r"shape \(5, 2\)"),
    ({"bits": np.zeros((4, 2), np.uint8)}, SPEC_BITS, r"shape \(5, 2\)"),
    ({"bits": np.full((5, 2), 1, np.uint8)}, SPEC_BITS, "padding bits"),
    ({"bits": [[0, 0]] * 5}, SPEC_BITS, "numpy array"),
    ({"embedding": np.zeros((5, 3), np.float64)}, SPEC_FLOAT, "float32 of shape"),
    ({"embedding": np.zeros((5, 4), np.float32)}, SPEC_FLOAT, r"shape \(5, 3\)"),
    ({"embedding": np.full((5, 3), np.nan, np.float32)}, SPEC_FLOAT, "non-finite"),
    ({"embedding": np.full((5, 3), np.inf, np.float32)}, SPEC_FLOAT, "non-finite"),
])
def test_the_leader_refuses_a_malformed_embedding(arrays, spec, match):
    with pytest.raises(MalformedMessage, match=match):
        decode_embedding(arrays, spec, rows=5)


def test_packed_bits_round_trip_and_what_is_refused():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, size=(7, 12)).astype(np.float32)
    np.testing.assert_array_equal(decode_embedding(encode_embedding(bits, SPEC_BITS), SPEC_BITS,
                                                   7), bits)
    with pytest.raises(ValueError, match="other than 0.0 and 1.0"):
        encode_embedding(bits * 0.5, SPEC_BITS)  # never sends a raw embedding as "bits"
    for bad, match in [({"gradient": np.zeros((7, 12), np.float64)}, "float32"),
                       ({"gradient": np.zeros((6, 12), np.float32)}, "shape"),
                       ({"gradient": np.full((7, 12), np.nan, np.float32)}, "non-finite"),
                       ({"grad": np.zeros((7, 12), np.float32)}, "exactly the array")]:
        with pytest.raises(MalformedMessage, match=match):
            decode_gradient(bad, SPEC_BITS, 7)


def test_several_batches_pack_into_one_message_and_unpack_checked():
    from keras_fedpriv.federated.vertical.wire import pack_batches, unpack_batches

    messages = [encode_embedding(np.ones((n, 12), np.float32), SPEC_BITS) for n in (3, 1)]
    packed = pack_batches(messages)
    assert sorted(packed) == ["0/bits", "1/bits"]
    back = unpack_batches(packed, "an embedding message", count=2, max_count=2)
    assert [decode_embedding(b, SPEC_BITS, n).shape for b, n in zip(back, (3, 1))] == [
        (3, 12), (1, 12)]
    assert pack_batches([]) == {} and unpack_batches({}, "m", count=0) == []
    for arrays, kwargs, match in [
            (packed, {"count": 3}, "holds 2 batches; 3 were expected"),
            (packed, {"max_count": 1}, "at most 1"),
            ({"1/bits": packed["1/bits"]}, {}, r"numbered 0 \.\. 0"),
            ({"01/bits": packed["1/bits"]}, {}, "'<batch>/<name>'"),
            ({"0/bits/x": packed["0/bits"]}, {}, "'<batch>/<name>'"),
            ({"0/bits": [[1]]}, {}, "numpy array"),
            ([1], {}, "mapping")]:
        with pytest.raises(MalformedMessage, match=match):
            unpack_batches(arrays, "an embedding message", **kwargs)


def test_a_reply_is_read_within_its_byte_limit_before_it_is_decoded():
    """The limit: a float64 embedding of the rows asked for, plus 4096 bytes a batch; the
    transport's reader gets it, and whatever it raises becomes a reason (never the data)."""
    from keras_fedpriv.federated.vertical import wire

    ids = [np.arange(3), np.arange(3, 5)]
    assert wire.embedding_reply_limit(ids, SPEC_FLOAT) == 8 * 5 * 3 + 4096 * 2
    assert wire.embedding_reply_limit(None, SPEC_FLOAT) == 8 * 3 + 4096
    asked = []

    def read(record, what, max_bytes):
        asked.append((what, max_bytes))
        if record == "too big":
            raise MalformedMessage("too many bytes")
        if record == "garbled":
            raise OSError("secret 0.73")
        return {"0/embedding": record}

    assert wire.read_embedding_reply({"embedding": "ok"}, ids, SPEC_FLOAT, read) == \
        {"0/embedding": "ok"}
    assert asked == [("embedding", 8 * 5 * 3 + 4096 * 2)]
    assert wire.read_embedding_reply({"embedding": "too big"}, ids, SPEC_FLOAT, read) == \
        "malformed reply: too many bytes"
    assert wire.read_embedding_reply({"embedding": "garbled"}, ids, SPEC_FLOAT, read) == \
        "the reply's arrays do not decode (OSError)"
    assert wire.read_embedding_reply({"error": {}}, ids, SPEC_FLOAT, read) == \
        "the reply has no 'embedding' record"


def test_a_requests_numbers_round_trip_and_absent_ones_are_zero():
    import types

    from keras_fedpriv.federated.vertical import wire

    request = types.SimpleNamespace(epoch=2, step=8, message=5, answers=4)
    config = wire.request_numbers(request)
    assert config == {"epoch": 2, "step": 8, "message": 5, "answers": 4}
    assert wire.read_request_numbers(config) == config
    assert wire.read_request_numbers({}) == dict.fromkeys(wire.REQUEST_NUMBERS, 0)
