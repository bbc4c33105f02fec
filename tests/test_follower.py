"""A follower's half of vertical FL (keras_fedpriv/federated/vertical_parties/follower.py)."""

import numpy as np
import pytest

from keras_fedpriv.federated.vertical_driver import FeatureTable, FollowerRequest, serve_request
from keras_fedpriv.federated.vertical_parties import MalformedMessage, VerticalFollower
from vertical_stubs import COLUMNS, model_fn, vertical_data


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
    # applying did not count a second release, nor draw new noise
    assert int(first.protection.release_totals.numpy()[0]) == 1
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
        serve_request(follower, FollowerRequest(example_ids=np.array([0, 10 ** 6])), table)
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
