"""The horizontal-FL wire format (keras_fedpriv/federated/horizontal/wire.py): what
each message holds, encoded and parsed back, and what is refused."""

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict  # noqa: E402

from keras_fedpriv.federated.horizontal import wire  # noqa: E402
from keras_fedpriv.federated.horizontal.loop import EvaluateRequest, TrainRequest  # noqa: E402
from keras_fedpriv.federated.horizontal.parties import HorizontalServer  # noqa: E402
from keras_fedpriv.federated.malformed import MalformedMessage  # noqa: E402
from keras_fedpriv.optimizers import SignDSEncoder  # noqa: E402
from keras_fedpriv.federated.uploads import SignDSUpload  # noqa: E402

from flower_stubs import Reply, model_fn  # noqa: E402

pytestmark = [pytest.mark.jax]


class _Msg:
    def __init__(self, content):
        self.content = content


@pytest.fixture(scope="module")
def server():
    return HorizontalServer(model_fn(), SignDSUpload(SignDSEncoder(k=0.2, eps=10.0, seed=0)))


def test_a_train_request_round_trips_and_a_user_setting_cannot_replace_the_protocols(server):
    weights = server.global_weights()
    request = TrainRequest(3, [0, 2], 2, weights, [np.ones(2, np.float32)], 0.25)
    content = wire.train_content(request, {"round": 99, "lr-note": 1.5})
    assert set(content.keys()) == {wire.WEIGHTS, wire.BATCH_NORM, wire.CONFIG}
    order = wire.read_train(_Msg(content))
    assert (order.round, order.local_epochs, order.magrr_cut) == (3, 2, 0.25)
    assert order.config["lr-note"] == 1.5 and order.max_rows is None
    for a, b in zip(order.weights, weights):
        np.testing.assert_array_equal(a, b)
    bare = wire.read_train(_Msg(wire.train_content(TrainRequest(0, [0], 1, weights, []))))
    assert bare.batch_norm == [] and bare.magrr_cut is None
    asked = wire.evaluate_content(EvaluateRequest(0, [0], weights, [], 7, 10))
    assert wire.read_train(_Msg(asked)).max_rows == 7


def test_a_train_reply_holds_exactly_what_the_protocol_releases_and_parses_back(server):
    scheme = server.upload
    delta = np.random.default_rng(0).normal(size=server.dim).astype(np.float32)
    upload = scheme.client_message(delta, 10)
    content = wire.train_reply_content(4, scheme.to_wire(upload), magrr_report=1)
    assert set(content.keys()) == {wire.UPLOAD, wire.CONFIG}
    assert set(content[wire.CONFIG].keys()) == {wire.CLIENT_ID, wire.MAGRR_REPORT}
    result = wire.parse_train_reply(Reply(content), server, True, "average")
    assert result.magrr_report == 1 and result.num_examples == 1 and result.batch_norm is None
    np.testing.assert_array_equal(scheme.to_wire(result.upload)["indices"],
                                  scheme.to_wire(upload)["indices"])
    assert not wire.extra_content(Reply(content), server, True, "average")
    # the same reply where the run has no MagRR: the bit is more than the protocol releases
    assert wire.extra_content(Reply(content), server, False, "average")
    with pytest.raises(MalformedMessage, match="exactly"):
        wire.parse_train_reply(Reply(content), server, False, "average")
    content[wire.CONFIG][wire.MAGRR_REPORT] = 2
    with pytest.raises(MalformedMessage, match="0 or 1"):
        wire.parse_train_reply(Reply(content), server, True, "average")


def test_a_query_reply_names_a_valid_client_id_or_none():
    assert wire.parse_client_id(Reply(wire.query_reply_content(3))) == 3
    for bad in ({"client-id": -1}, {"client-id": True}, {"client-id": "3"}, {}):
        assert wire.parse_client_id(Reply(RecordDict({"config": ConfigRecord(bad)}))) is None
    assert wire.parse_client_id(Reply(None)) is None
    assert set(wire.query_content().keys()) == {wire.CONFIG}


def test_a_report_is_bounded_before_it_is_read():
    good = wire.report_content(0, np.zeros((3, 10)))
    assert wire.parse_report(Reply(good), 10, max_rows=3).shape == (3, 10)
    with pytest.raises(MalformedMessage, match="more than"):
        wire.parse_report(Reply(good), 10, max_rows=2)
    big = RecordDict({"report": ArrayRecord({"report": Array(np.full((3, 10), 50.0))}),
                      "config": ConfigRecord({"client-id": 0})})
    with pytest.raises(MalformedMessage, match="beyond"):
        wire.parse_report(Reply(big), 10, bound=10.0)
