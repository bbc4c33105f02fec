"""The vertical leader on Flower as one class (keras_fedpriv/federated/flower/vertical_strategy.py):
its settings and the run config's overrides, the request messages and how replies are read.

A whole run over Flower is tests/test_flower_vertical.py's (through `vertical_server_app`, which
builds a `VerticalStrategy` per run).
"""

import types

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Message, Metadata, RecordDict  # noqa: E402

from keras_fedpriv.federated.flower.vertical_strategy import (  # noqa: E402
    VerticalStrategy,
    positive_seconds,
    request_message,
    write_result,
)
from keras_fedpriv.federated.records import arrays_record  # noqa: E402
from keras_fedpriv.federated.vertical import wire  # noqa: E402
from keras_fedpriv.federated.vertical.loop import FollowerRequest  # noqa: E402

from vertical_stubs import compile_model, two_party  # noqa: E402

pytestmark = pytest.mark.flower


@pytest.fixture(scope="module")
def leader():
    model = compile_model(two_party(leader="party_b"))
    model.build({"party_a": (None, 15), "party_b": (None, 15)})
    return model.split_parties().leader


def _reply(content):
    metadata = Metadata(run_id=1, message_id="", src_node_id=7, dst_node_id=0,
                        reply_to_message_id="m", group_id="1", created_at=0.0, ttl=60.0,
                        message_type="train")
    return Message(content, metadata=metadata)


def test_the_run_config_overrides_the_settings_and_each_is_checked_by_name(leader):
    strategy = VerticalStrategy(leader, epochs=2, batch_size=16, batches_per_message=2,
                                party_nodes={"party_a": 5})
    run = strategy.settings({"num-epochs": 3, "round-timeout": 9.5, "party-node.party_a": "5"})
    assert (run.epochs, run.batch_size, run.batches_per_message) == (3, 16, 2)
    assert run.round_timeout == 9.5 and run.follower_deadline == 600.0
    assert run.pins == {"party_a": 5}
    with pytest.raises(ValueError, match="round-timeout"):
        strategy.settings({"round-timeout": 0})
    with pytest.raises(ValueError, match="follower-deadline"):
        strategy.settings({"follower-deadline": "soon"})
    with pytest.raises(ValueError, match="already pinned to node 5"):
        strategy.settings({"party-node.party_a": 6})
    with pytest.raises(TypeError, match="must return a VerticalLeader; got str"):
        VerticalStrategy("leader")
    with pytest.raises(ValueError, match="`poll_interval` must be a number of seconds > 0"):
        VerticalStrategy(leader, poll_interval=float("inf"))
    assert positive_seconds(3, "x") == 3.0


def test_a_request_travels_as_the_records_of_the_vertical_wire(in_a_run):
    request = FollowerRequest(gradients=[{"gradient": np.zeros((2, 4), np.float32)}],
                              example_ids=[np.array([3, 1])], training=True, epoch=1, step=4,
                              message=2, answers=1)
    message = request_message(request, node=12)
    assert message.metadata.dst_node_id == 12 and message.metadata.message_type == "train"
    content = message.content
    assert dict(content[wire.CONFIG]) == {"epoch": 1, "step": 4, "message": 2, "answers": 1}
    assert wire.read_request_numbers(content[wire.CONFIG]) == wire.request_numbers(request)
    np.testing.assert_array_equal(content[wire.IDS]["0/ids"].numpy(), [3, 1])
    assert content[wire.GRADIENT]["0/gradient"].numpy().shape == (2, 4)


def test_replies_are_read_within_their_byte_limit_and_refused_with_a_reason(leader):
    strategy = VerticalStrategy(leader)
    strategy.roster = types.SimpleNamespace(timeout=7.0)
    request = FollowerRequest(example_ids=[np.arange(4)], training=True)
    spec = leader.follower_specs["party_a"]
    good = {"0/embedding": np.zeros((4,) + spec.shape, spec.dtype)}
    got = strategy._reply(_reply(RecordDict({wire.EMBEDDING: arrays_record(good)})), request,
                          "party_a")
    assert set(got) == {"0/embedding"} and strategy.traffic["up"] > 0
    huge = {"0/embedding": np.zeros((4 * 1000,) + spec.shape, np.float64)}
    refused = strategy._reply(_reply(RecordDict({wire.EMBEDDING: arrays_record(huge)})),
                              request, "party_a")
    assert refused.startswith("malformed reply:") and "bytes the protocol sends" in refused
    assert strategy._reply(None, request, "party_a") == "no reply within 7 s"
    failed = _reply(RecordDict({wire.ERROR: ConfigRecord({"reason": "ValueError"})}))
    assert strategy._reply(failed, request, "party_a") == "error reply: ValueError"
    empty = strategy._reply(_reply(RecordDict({})), request, "party_a")
    assert empty == "the reply has no 'embedding' record"


def test_a_result_is_written_as_history_and_the_leaders_weights(leader, tmp_path):
    result = types.SimpleNamespace(history={"loss": [1.0]}, rejected=[], wire={"up": 3},
                                   leader=leader)
    write_result(str(tmp_path / "out"), result)
    assert (tmp_path / "out" / "history.json").read_text().startswith('{"history"')
    weights = np.load(tmp_path / "out" / "leader.npz")
    assert len(weights.files) == len(leader.trainable_variables)
