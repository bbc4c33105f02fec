"""The pieces every vertical party runs (keras_fedpriv/federated/vertical/party.py).

Backend-neutral (runs again under ``KERAS_BACKEND=jax``)."""

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.federated.vertical import party as P

pytestmark = [pytest.mark.jax]

IDS_DTYPE = "int64" if keras.backend.backend() == "tensorflow" else "int32"  # JAX: no x64


def test_party_seeds_are_deterministic_distinct_and_in_range():
    a, b = P.derive_party_seed(7, "f1"), P.derive_party_seed(7, "f2")
    assert a == P.derive_party_seed(7, "f1") and a != b and a != P.derive_party_seed(8, "f1")
    assert 0 <= a < 2 ** 64 and 0 <= P.derive_party_seed(7, "f1", bits=31) < 2 ** 31


@pytest.mark.parametrize("name", ["a b", "1x", "", None, 3, "x-y"])
def test_party_names_must_be_identifiers(name):
    with pytest.raises(ValueError, match=r"Owner: party names must be identifiers.*got"):
        P.validate_party_name(name, "Owner")


def test_the_example_ids_key_is_not_a_party_name():
    with pytest.raises(ValueError, match="reserved input key"):
        P.validate_party_name(P.EXAMPLE_IDS_KEY, "Owner")
    assert P.validate_party_name("party_2", "Owner") == "party_2"


def test_a_copied_protection_gets_the_partys_own_seed_and_name():
    layer = kf.EmbeddingDPLayer(2.0, seed=5, at_inference=False, name="emb", id_capacity=3000)
    copy = P.copy_protection(layer, "f1", "Owner")
    assert type(copy) is kf.EmbeddingDPLayer and copy is not layer and copy.name == "emb_f1"
    assert (copy.eps, copy.at_inference, copy.id_capacity) == (2.0, False, 3000)
    assert copy.seed == P.derive_party_seed(5, "f1") != P.copy_protection(layer, "f2", "O").seed
    keras_layer = keras.layers.GaussianNoise(0.1, seed=5)
    assert P.copy_protection(keras_layer, "f1", "O").seed == P.derive_party_seed(5, "f1", 31)
    assert P.copy_protection(kf.EmbeddingDPLayer(1.0), "f1", "O").seed is None


def test_which_protections_send_bits_and_take_example_ids():
    assert P.is_bit_protection(kf.EmbeddingDPLayer(1.0))
    assert not P.is_bit_protection(keras.layers.GaussianNoise(0.1))
    assert P.takes_example_ids(kf.EmbeddingDPLayer(1.0))
    assert not P.takes_example_ids(keras.layers.Dense(2))


def test_a_bottom_without_an_input_shape_is_refused_with_the_fix():
    assert P.bottom_input_spec("f1", keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
                               "Owner").shape == (None, 3)
    with pytest.raises(ValueError, match="party 'f1' has no known input shape.*keras.Input"):
        P.bottom_input_spec("f1", keras.Sequential([keras.layers.Dense(2)]), "Owner")
    spec = P.batch_signature(keras.KerasTensor((8, 3), dtype="float32"))
    assert (spec.shape, spec.dtype) == ((None, 3), "float32")


@pytest.mark.tensorflow_only("a TensorFlow graph assertion's error")
def test_a_label_assert_is_shortened_to_its_rule_and_row():
    import tensorflow as tf

    error = tf.errors.InvalidArgumentError(
        None, None, "long trace ... assertion failed: [LabelDPLayer(mode='binary'): labels must "
        "be exactly 0 or 1; first bad row:] [3] ... more trace")
    text = P.label_assert_message(error)
    assert text.startswith("LabelDPLayer(mode='binary'): labels must be exactly 0 or 1; row 3")
    assert "trace" not in text
    assert P.label_assert_message(ValueError("something else")) is None


def test_losses_are_summed_as_keras_adds_them():
    assert P.sum_losses([]) is None
    ops = keras.ops
    total = P.sum_losses([ops.convert_to_tensor([1.0, 2.0]), ops.convert_to_tensor(3, "int32")])
    assert float(total) == 6.0 and keras.backend.standardize_dtype(total.dtype) == "float32"
    mse = keras.losses.MeanSquaredError()
    y, p = ops.zeros((2, 1)), ops.ones((2, 1))
    assert float(P.leader_loss(mse, y, p, None, [ops.convert_to_tensor(0.5)])) == \
        pytest.approx(1.5)
    with pytest.raises(ValueError, match="No loss to compute"):
        P.leader_loss(None, y, p, None, [])


@pytest.mark.parametrize("class_weight, error, match", [
    ([1.0, 2.0], TypeError, "`class_weight` must be a non-empty dict"),
    ({}, TypeError, "`class_weight` must be a non-empty dict"),
])
def test_class_weight_is_validated(class_weight, error, match):
    with pytest.raises(error, match=match):
        P.validate_class_weight(class_weight, "Owner")
    assert P.validate_class_weight({0: 1, 1: 2.5}, "Owner") == {0: 1.0, 1: 2.5}


def _dense(k=3):
    return keras.Sequential([keras.Input((k,)), keras.layers.Dense(2)])


def test_an_unprotected_follower_counts_each_send_as_a_release_without_dp():
    follower = P.PartyBottom("f1", _dense())
    z, sent, losses = follower.forward(np.zeros((4, 3), np.float32))
    assert sent is z and losses == [] and follower.unprotected_count() == 1
    follower.forward(np.zeros((4, 3), np.float32), count=False)  # a replay is not a release
    assert follower.unprotected_count() == 1
    leader = P.PartyBottom("lead", _dense(), sends=False)
    leader.forward(np.zeros((4, 3), np.float32))
    assert leader.unprotected_count() == 0


def test_a_protected_follower_sends_the_protections_output():
    follower = P.PartyBottom("f1", _dense(), protection=kf.EmbeddingDPLayer(1.0, seed=1))
    z, sent, _ = follower.forward(np.zeros((4, 3), np.float32), training=True,
                                  example_ids=keras.ops.arange(4, dtype=IDS_DTYPE))
    assert set(np.unique(np.asarray(sent))) <= {0.0, 1.0} and follower.unprotected_count() == 0
    ids, counts = follower.protection._release_id_counts_nonzero()
    assert ids.tolist() == [0, 1, 2, 3] and counts.tolist() == [1, 1, 1, 1]
    assert follower.build_spec().shape == (None, 2) and follower.spec.bits


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(bottom="dense"), TypeError, r"`bottoms\['p'\]` must be a Keras model or layer"),
    (dict(protection="rr"), TypeError, r"`embedding_dp\['p'\]` must be a Keras layer or None"),
    (dict(protection=kf.EmbeddingDPLayer(1.0), sends=False), ValueError,
     "is the leader, whose embedding never leaves it"),
    (dict(bottom=keras.Sequential([keras.layers.Dense(2)])), ValueError, "is not built"),
])
def test_bad_party_pieces_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        P.PartyBottom("p", **{"bottom": _dense(), **kwargs})
