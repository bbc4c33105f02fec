"""A follower's half of vertical FL (keras_fedpriv/federated/vertical/follower.py)."""

import numpy as np
import pytest

from keras_fedpriv.federated.vertical.driver import FeatureTable, FollowerRequest, serve_request
from keras_fedpriv.federated.malformed import MalformedMessage
from keras_fedpriv.federated.vertical.follower import VerticalFollower
from vertical_stubs import COLUMNS, model_fn, vertical_data

pytestmark = [pytest.mark.jax]


@pytest.fixture(scope="module")
def data():
    return vertical_data()


def test_a_follower_state_moves_to_another_process(data):
    """What a follower keeps between messages (Flower's node state) is enough to apply the
    gradient in a fresh copy: the same update as the original."""
    ids = np.arange(40, 72)
    x = data["features"][ids, COLUMNS["f1"]]
    first = model_fn().split_parties().followers["f1"]
    first.embed(x, example_ids=ids)
    state = first.state_dict()
    gradient = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)

    copy = model_fn().split_parties().followers["f1"]  # "another process": built the same way
    copy.load_state_dict({k: np.array(v) for k, v in state.items()})
    assert copy.pending
    copy.apply_gradients(gradient)
    first.apply_gradients(gradient)
    for a, b in zip(first.trainable_variables, copy.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(first.protection.release_totals.numpy(),
                                  copy.protection.release_totals.numpy())
    # applying did not count a second release (per example id too), nor draw new noise
    assert int(first.protection.release_totals.numpy()[0]) == 1
    for follower in (first, copy):
        counted, counts = follower.protection._release_id_counts_nonzero()
        assert counted.tolist() == ids.tolist() and set(counts.tolist()) == {1}
    np.testing.assert_array_equal(first.protection.rng_counter.numpy(),
                                  copy.protection.rng_counter.numpy())


def test_a_follower_refuses_a_malformed_gradient_and_updates_nothing(data):
    follower = model_fn().split_parties().followers["f1"]
    with pytest.raises(MalformedMessage, match="no batch awaits"):
        follower.apply_gradients(np.zeros((4, 4), np.float32))
    ids = np.arange(4)
    follower.embed(data["features"][ids, COLUMNS["f1"]], example_ids=ids)
    before = [v.numpy().copy() for v in follower.trainable_variables]
    for bad in (np.zeros((3, 4), np.float32), np.zeros((4, 4), np.float64),
                np.full((4, 4), np.inf, np.float32)):
        with pytest.raises(MalformedMessage):
            follower.apply_gradients(bad)
    assert follower.pending  # still waiting for a good one
    for a, b in zip(before, follower.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())
    table = FeatureTable(data["features"][:, COLUMNS["f1"]])
    with pytest.raises(MalformedMessage, match="unknown to this party"):
        serve_request(follower, FollowerRequest(example_ids=[np.array([0, 10 ** 6])]), table)
    with pytest.raises(MalformedMessage, match="integer"):
        table.rows(np.array([0.5]))


def test_bad_arguments_raise_clear_errors(data):
    model = model_fn()
    f1 = model.split_parties().followers["f1"]
    with pytest.raises(ValueError, match="identifiers"):
        VerticalFollower("a b", model.bottoms["f1"])
    with pytest.raises(TypeError, match=r"`bottoms\['f9'\]` must be a Keras"):
        VerticalFollower("f9", "dense")
    with pytest.raises(TypeError, match="`training` must be a bool"):
        f1.embed(data["features"][:2, COLUMNS["f1"]], training="yes")
    with pytest.raises(ValueError, match="`example_ids` has 3 entries for 2 rows"):
        f1.embed(data["features"][:2, COLUMNS["f1"]], example_ids=[0, 1, 2])
    with pytest.raises(TypeError, match="`example_ids` must be integers"):
        f1.embed(data["features"][:2, COLUMNS["f1"]], example_ids=[0.0, 1.0])


def test_a_queue_of_batches_moves_to_another_process_in_the_middle_of_a_group(data):
    """Three batches embedded with the same weights (one message of K = 3); the first gradient
    applied, then the follower's state moves to a fresh copy: the other two batches keep the
    weights they were embedded with (the replay is checked bit for bit, so a wrong weight would
    raise), and both copies end with the same weights and counts."""
    rng = np.random.default_rng(1)
    batches = [np.arange(0, 16), np.arange(16, 40), np.arange(40, 48)]
    grads = [rng.normal(size=(len(b), 4)).astype(np.float32) for b in batches]
    first = model_fn().split_parties().followers["f1"]
    sent = [first.embed(data["features"][b, COLUMNS["f1"]], example_ids=b, queue=True)
            for b in batches]
    assert first.pending_batches == 3
    first.apply_gradients(grads[0])
    state = {k: np.array(v) for k, v in first.state_dict().items()}
    assert any(k.startswith("pending_weights/0/") for k in state)  # stored once for both
    assert not any(k.startswith("pending_weights/1/") for k in state)

    copy = model_fn().split_parties().followers["f1"]
    copy.load_state_dict(state)
    assert copy.pending_batches == 2
    for follower in (first, copy):
        for g in grads[1:]:
            follower.apply_gradients(g)
        assert not follower.pending
    for a, b in zip(first.trainable_variables, copy.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(first.protection.release_totals.numpy(),
                                  copy.protection.release_totals.numpy())
    assert int(first.protection.release_totals.numpy()[0]) == 3  # three releases, no more
    assert all(set(m) == {"bits"} for m in sent)

    # the delayed gradients: the same update as computing all three at the weights the batches
    # were embedded with (here: applied in one process, without a state move)
    again = model_fn().split_parties().followers["f1"]
    for b in batches:
        again.embed(data["features"][b, COLUMNS["f1"]], example_ids=b, queue=True)
    for g in grads:
        again.apply_gradients(g)
    for a, b in zip(first.trainable_variables, again.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_embed_without_queue_drops_the_waiting_batches(data):
    follower = model_fn().split_parties().followers["f1"]
    ids = np.arange(8)
    x = data["features"][ids, COLUMNS["f1"]]
    follower.embed(x, example_ids=ids, queue=True)
    follower.embed(x, example_ids=ids, queue=True)
    assert follower.pending_batches == 2
    follower.embed(x, example_ids=ids)
    assert follower.pending_batches == 1
    with pytest.raises(TypeError, match="`queue` must be a bool"):
        follower.embed(x, example_ids=ids, queue=1)
    with pytest.raises(MalformedMessage, match="for batch 1 but 1 await one"):
        follower.receive_gradient({"gradient": np.zeros((8, 4), np.float32)}, 1)


def test_a_state_with_a_broken_queue_loads_nothing(data):
    """A saved queue missing the weights its batches were embedded with is refused before
    anything is loaded (the weights, the counters and the queue stay as they were)."""
    batches = [np.arange(0, 8), np.arange(8, 16)]
    source = model_fn().split_parties().followers["f1"]
    for b in batches:
        source.embed(data["features"][b, COLUMNS["f1"]], example_ids=b, queue=True)
    source.apply_gradients(np.ones((8, 4), np.float32))  # batch 1 keeps its older weights
    state = {k: np.array(v) for k, v in source.state_dict().items()
             if not k.startswith("pending_weights/")}
    target = model_fn().split_parties().followers["f1"]
    before = [v.numpy().copy() for v in target.trainable_variables]
    with pytest.raises(ValueError, match="the state lacks 'pending_weights/0/0'"):
        target.load_state_dict(state)
    for a, v in zip(before, target.trainable_variables):
        np.testing.assert_array_equal(a, v.numpy())
    assert not target.pending and int(target.protection.release_totals.numpy()[0]) == 0
