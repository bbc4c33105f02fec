"""Several batches per vertical-FL message, attacked from each side.

A malicious leader talking to a follower (gradients for batches never embedded, ids the
follower does not hold behind valid gradients, many tiny batches to make it keep state), a
malicious follower talking to the leader (odd batch keys, replies that are not arrays), and the
follower's own restores: the follower applies nothing from a refused message and says why
without data, its random counters never rewind, and the leader uses nothing malformed and
keeps one history entry per epoch.
"""

import keras
import numpy as np
import pytest

from keras_fedpriv.federated.vertical.driver import VerticalDriver
from keras_fedpriv.federated.malformed import MalformedMessage
from keras_fedpriv.federated.vertical.loop import (
    FeatureTable,
    FollowerRequest,
    serve_request,
)
from keras_fedpriv.layers.local_state import local_state
from keras_fedpriv.privacy.report import privacy_ledger
from vertical_stubs import COLUMNS, follower_data, model_fn, vertical_data

pytestmark = [pytest.mark.jax]


@pytest.fixture(scope="module")
def data():
    return vertical_data()


@pytest.fixture(scope="module")
def table(data):
    return FeatureTable(data["features"][:, COLUMNS["f1"]])


def _follower():
    return model_fn().split_parties().followers["f1"]


def _weights(follower):
    return [v.numpy().copy() for v in follower.trainable_variables]


def _counter(follower):
    return {k: v for k, v in local_state(follower.layers).items() if k.endswith("rng_counter")}


@pytest.mark.tensorflow_only("slow on JAX (16 s on the shared CPU); nothing in it is JAX-specific")
def test_ids_unknown_to_the_follower_behind_valid_gradients_apply_nothing(table):
    """The gradients match the waiting batches, but the next ids are not the follower's: the
    message is refused whole (ids are looked up before any gradient is applied)."""
    follower = _follower()
    serve_request(follower, FollowerRequest(example_ids=[np.arange(4), np.arange(4, 7)]), table)
    before = _weights(follower)
    grads = [{"gradient": np.ones((n, 4), np.float32)} for n in (4, 3)]
    with pytest.raises(MalformedMessage, match="unknown to this party") as error:
        serve_request(follower, FollowerRequest(gradients=grads,
                                                example_ids=[np.array([10 ** 6])]), table)
    assert str(10 ** 6) not in str(error.value)
    assert follower.pending_batches == 2
    for a, b in zip(before, _weights(follower)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("gradients, match", [
    ([{"gradient": np.ones((4, 4), np.float32)}], "1 gradients for 0 batches"),
    ([], None),  # an empty list for an empty queue: nothing to apply
])
def test_gradients_for_batches_never_embedded_are_refused(table, gradients, match):
    follower = _follower()
    before = _weights(follower)
    if match is None:
        assert serve_request(follower, FollowerRequest(gradients=gradients), table) == {}
    else:
        with pytest.raises(MalformedMessage, match=match):
            serve_request(follower, FollowerRequest(gradients=gradients), table)
    for a, b in zip(before, _weights(follower)):
        np.testing.assert_array_equal(a, b)


def test_gradients_after_a_validation_request_are_refused(table):
    """A validation request without the waiting gradients drops the waiting batches (the
    leader skipped them): gradients sent for them afterwards match no batch."""
    follower = _follower()
    serve_request(follower, FollowerRequest(example_ids=[np.arange(4), np.arange(4, 8)]), table)
    serve_request(follower, FollowerRequest(example_ids=[np.arange(8, 12)], training=False),
                  table)
    assert not follower.pending
    before = _weights(follower)
    grads = [{"gradient": np.ones((4, 4), np.float32)}] * 2
    with pytest.raises(MalformedMessage, match="2 gradients for 0 batches"):
        serve_request(follower, FollowerRequest(gradients=grads), table)
    for a, b in zip(before, _weights(follower)):
        np.testing.assert_array_equal(a, b)


def test_repeated_ids_in_one_message_are_separate_releases_and_the_counter_never_rewinds(table):
    follower = _follower()
    ids = [np.array([0, 0, 1]), np.array([0, 1])]
    serve_request(follower, FollowerRequest(example_ids=ids), table)
    counted = privacy_ledger(follower).to_dict()["kinds"][0]["units"]
    assert counted == {"0": 3, "1": 2}
    embedded = _counter(follower)
    grads = [{"gradient": np.full((len(i), 4), 0.5, np.float32)} for i in ids]
    serve_request(follower, FollowerRequest(gradients=grads), table)  # two replays
    assert privacy_ledger(follower).to_dict()["kinds"][0]["units"] == counted
    for key, value in _counter(follower).items():
        np.testing.assert_array_equal(value, embedded[key])  # a replay is no new draw


def test_many_tiny_batches_keep_the_per_example_counts_once(table):
    """A leader asking for the most batches a follower allows, one example each, must not make
    the follower keep a copy of its per-example release counts per waiting batch (in memory
    or in the state it saves between messages)."""
    sizes = {}
    for history in (0, 500):
        follower = _follower()
        if history:  # earlier releases of `history` distinct examples
            follower.embed(table.rows(np.arange(history)), np.arange(history), training=False)
        serve_request(follower, FollowerRequest(
            example_ids=[np.array([i]) for i in range(64)]), table)
        assert follower.pending_batches == 64
        sizes[history] = sum(np.asarray(v).nbytes for v in follower.state_dict().values())
    # one copy of 500 (id, count) pairs is 8,000 bytes; one per waiting batch would be 64x that
    assert sizes[500] - sizes[0] <= 2 * 500 * 16


#: Slow on JAX (5-7 s each on the shared CPU) and host-side parsing only: two keys run there.
SLOW = pytest.mark.tensorflow_only("slow on JAX; the same host-side parsing as the keys run there")


@pytest.mark.parametrize("key", ["00/bits", *(pytest.param(k, marks=SLOW) for k in (
    "-1/bits", "1e0/bits", "+1/bits", " 1/bits", "1/bits ")), "\u0661/bits",
    pytest.param("1/bi-ts", marks=SLOW)])
def test_the_leader_uses_nothing_from_a_reply_with_odd_batch_keys(data, key):
    parties = model_fn().split_parties()
    driver = VerticalDriver(parties, follower_data(data))
    exchange = driver.exchange

    def odd(requests):
        replies = exchange(requests)
        if requests["f2"].training and requests["f2"].example_ids:
            reply = dict(replies["f2"])
            reply[key] = reply.pop("1/bits")
            replies["f2"] = reply
        return replies

    driver.exchange = odd
    result = driver.fit(data["y"], example_ids=data["ids"], x=data["xb"], epochs=1,
                        batch_size=128, batches_per_message=2, seed=0)
    assert result.history["steps"] == [0.0] and result.history["skipped"] == [4.0]
    assert {p for _, _, p, _ in result.rejected} == {"f2"}
    assert all("'<batch>/<name>'" in r for *_, r in result.rejected)
    assert all(np.isfinite(v.numpy()).all() for v in parties.leader.trainable_variables)


def test_a_reply_that_is_not_arrays_does_not_crash_the_leader(data):
    """An exchange (any runtime's) handing back ragged lists: refused, counted as no bytes."""
    parties = model_fn().split_parties()
    driver = VerticalDriver(parties, follower_data(data))
    exchange = driver.exchange

    def ragged(requests):
        replies = exchange(requests)
        if requests["f1"].example_ids:
            replies["f1"] = {"0/bits": [[1], [1, 2]]}
        return replies

    driver.exchange = ragged
    result = driver.fit(data["y"], example_ids=data["ids"], x=data["xb"], epochs=1,
                        batch_size=200, seed=0)
    assert result.history["steps"] == [0.0] and result.history["bytes_up_f1"] == [0.0]
    assert all("numpy array" in r for *_, r in result.rejected if _[1] == "f1")


@pytest.mark.tensorflow_only("slow on JAX (32 s on the shared CPU); nothing in it is JAX-specific")
def test_a_refused_validation_keeps_one_history_entry_per_epoch(data):
    """Epoch 0's validation reply of f2 is refused, epoch 1's is not: every logged figure
    (the leader's metrics too) has one entry per epoch, NaN where it was not measured."""
    parties = model_fn().split_parties(metrics=[keras.metrics.AUC(name="auc")])
    driver = VerticalDriver(parties, follower_data(data))
    exchange, seen = driver.exchange, {"n": 0}

    def refuse_first_validation(requests):
        replies = exchange(requests)
        if not requests["f2"].training:
            seen["n"] += 1
            if seen["n"] == 1:
                replies["f2"] = "error reply: refused"
        return replies

    driver.exchange = refuse_first_validation
    result = driver.fit(data["y"], example_ids=data["ids"], x=data["xb"], epochs=2,
                        batch_size=64, batches_per_message=3, seed=0,
                        validation_data=(data["ids_t"], data["y_t"], data["xb_t"]))
    assert {len(v) for v in result.history.values()} == {2}, {
        k: len(v) for k, v in result.history.items()}
    assert np.isnan(result.history["val_auc"][0]) and np.isnan(result.history["val_loss"][0])
    assert np.isfinite(result.history["val_auc"][1])
