"""The loop of leader-driven vertical FL (keras_fedpriv/federated/vertical/loop.py):
several batches per message on the wire, and what a follower refuses."""

import numpy as np
import pytest

from keras_fedpriv.federated.malformed import MalformedMessage
from keras_fedpriv.federated.vertical.loop import (
    FeatureTable,
    FollowerRequest,
    serve_request,
    validate_batches_per_message,
)
from vertical_stubs import COLUMNS, model_fn, vertical_data

pytestmark = [pytest.mark.jax]


@pytest.fixture(scope="module")
def table():
    return FeatureTable(vertical_data()["features"][:, COLUMNS["f1"]])


def _ids(*sizes):
    starts = np.cumsum([0, *sizes])
    return [np.arange(a, a + n, dtype=np.int64) for a, n in zip(starts, sizes)]


def test_a_request_of_k_batches_round_trips_through_its_wire_arrays():
    grads = [{"gradient": np.ones((n, 4), np.float32)} for n in (3, 2)]
    request = FollowerRequest(gradients=grads, example_ids=_ids(3, 2, 1), training=False)
    ids, gradients = request.to_arrays()
    assert sorted(ids) == ["0/ids", "1/ids", "2/ids"] and sorted(gradients) == [
        "0/gradient", "1/gradient"]
    back = FollowerRequest.from_arrays(ids, gradients, training=False, max_batches=3)
    assert [len(i) for i in back.example_ids] == [3, 2, 1] and not back.training
    assert [g["gradient"].shape for g in back.gradients] == [(3, 4), (2, 4)]
    assert FollowerRequest().to_arrays() == (None, None)


@pytest.mark.parametrize("ids, match", [
    ({"0/ids": np.arange(2), "2/ids": np.arange(2)}, "numbered 0 .. 1"),
    ({"ids": np.arange(2)}, "'<batch>/<name>'"),
    ({"0/ids": np.arange(4.0)}, "1-D integers"),
    ({"0/ids": np.zeros((2, 2), np.int64)}, "1-D integers"),
    ({"0/ids": np.arange(2), "0/x": np.arange(2)}, "exactly"),
    ({"0/ids": [0, 1]}, "numpy array"),
    ({f"{i}/ids": np.arange(2) for i in range(4)}, "holds 4 batches; at most 3"),
])
def test_malformed_ids_messages_are_refused(ids, match):
    with pytest.raises(MalformedMessage, match=match):
        FollowerRequest.from_arrays(ids, None, training=True, max_batches=3)


def test_a_follower_refuses_more_batches_than_it_allows_and_releases_nothing(table):
    follower = model_fn().split_parties().followers["f1"]
    with pytest.raises(MalformedMessage, match="at most 2 batches per message"):
        serve_request(follower, FollowerRequest(example_ids=_ids(4, 4, 4)), table, max_batches=2)
    assert int(follower.protection.release_totals.numpy()[0]) == 0
    with pytest.raises(MalformedMessage, match="unknown to this party"):  # checked before any
        serve_request(follower, FollowerRequest(example_ids=[np.arange(4), np.array([10**6])]),
                      table)
    assert int(follower.protection.release_totals.numpy()[0]) == 0 and not follower.pending
    reply = serve_request(follower, FollowerRequest(example_ids=_ids(4, 3)), table)
    assert sorted(reply) == ["0/bits", "1/bits"] and reply["1/bits"].shape == (3, 1)
    assert follower.pending_batches == 2


def test_gradients_that_do_not_match_the_waiting_batches_apply_nothing(table):
    follower = model_fn().split_parties().followers["f1"]
    serve_request(follower, FollowerRequest(example_ids=_ids(4, 3)), table)
    before = [v.numpy().copy() for v in follower.trainable_variables]
    good = {"gradient": np.ones((4, 4), np.float32)}
    for grads, match in [([good], "1 gradients for 2 batches"),
                         ([good, {"gradient": np.ones((4, 4), np.float32)}], "shape"),
                         ([good, {"gradient": np.full((3, 4), np.nan, np.float32)}],
                          "non-finite")]:
        with pytest.raises(MalformedMessage, match=match):
            serve_request(follower, FollowerRequest(gradients=grads), table)
        assert follower.pending_batches == 2
    for a, b in zip(before, follower.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())
    assert serve_request(follower, FollowerRequest(
        gradients=[good, {"gradient": np.ones((3, 4), np.float32)}]), table) == {}
    assert not follower.pending
    assert not np.array_equal(before[0], follower.trainable_variables[0].numpy())


def test_k_is_validated():
    assert validate_batches_per_message(8, maximum=8) == 8
    with pytest.raises(ValueError, match=r"`batches_per_message` must be an integer >= 1; got 0"):
        validate_batches_per_message(0)
    with pytest.raises(TypeError, match="`batches_per_message` must be an integer"):
        validate_batches_per_message(2.0)
    with pytest.raises(ValueError, match=r"in \[1, 64\]; got 65"):
        validate_batches_per_message(65, maximum=64)
    with pytest.raises(TypeError, match="`example_ids` must be None or a list"):
        FollowerRequest(example_ids=np.arange(3))
