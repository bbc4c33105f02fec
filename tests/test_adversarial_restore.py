"""Adversarial: no restore path rewinds a release count or replays noise.

The rule (docs/privacy.md, "Restoring never rewinds"): restoring into a live
protection takes, count by count, the larger of the live and the saved value
(random counters too), so a file saved earlier by the same layer changes
nothing and a new layer takes the saved counts; a layer that has released
refuses counts saved by another layer that released too. Host-side seeded
objects: a copy (deepcopy, pickle) is a fork with its own streams, and
``load_state_dict`` refuses a state behind the object or without its
per-client counts.

Each test below failed on the code before this rule (issue 18, cases 1 and 2).
"""

import copy
import math
import os
import pickle

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.callbacks import MagRR
from keras_fedpriv.federated.uploads import GaussianUpload
from keras_fedpriv.layers import release_counter as rc
from keras_fedpriv.optimizers import SignDSEncoder
from keras_fedpriv.privacy import privacy_report

pytestmark = [pytest.mark.jax]

#: tf.train.Checkpoint is TensorFlow's (the test of a restore by it is skipped on JAX).
CHECKPOINT = pytest.mark.tensorflow_only("tf.train.Checkpoint")


def _checkpoint_write(model, tmp_path):
    """Write ``model`` with a tf.train.Checkpoint under ``tmp_path``; returns its prefix."""
    import tensorflow as tf

    return tf.train.Checkpoint(model=model).write(os.path.join(tmp_path, "ckpt"))


def _checkpoint_read(model, prefix):
    """Read the tf.train.Checkpoint at ``prefix`` into ``model``; returns the load status."""
    import tensorflow as tf

    return tf.train.Checkpoint(model=model).read(prefix)

X = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")


def _embedding_model(seed=None):
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(32, kernel_initializer=keras.initializers.GlorotUniform(1))(inputs)
    return keras.Model(inputs, kf.EmbeddingDPLayer(2.0, seed=seed)(hidden))


def _releases(model):
    (row,) = privacy_report(model).releases
    return row.count


def _noise(model):
    return keras.ops.convert_to_numpy(model(X, training=True))


@pytest.mark.parametrize("seed", [None, 3])
@pytest.mark.parametrize("fmt", ["weights.h5", "keras"])
def test_load_weights_into_a_live_model_neither_replays_noise_nor_rewinds_the_count(
        tmp_path, fmt, seed):
    model = _embedding_model(seed)
    _noise(model)
    path = os.path.join(tmp_path, f"m.{fmt}")
    model.save_weights(path) if fmt == "weights.h5" else model.save(path)
    sent = [_noise(model), _noise(model)]  # released after the save
    model.load_weights(path)
    again = _noise(model)
    # 64 x 32 bits: a repeat by chance has probability 2**-2048
    assert not any(np.array_equal(again, s) for s in sent)
    assert _releases(model) == 4


def test_a_per_batch_label_layer_does_not_replay_after_load_weights(tmp_path):
    labels = keras.Input((1,))
    layer = kf.LabelDPLayer(0.5, per_batch=True)
    model = keras.Model(labels, layer(labels))
    y = (np.arange(512) % 2).astype("float32")[:, None]
    model(y, training=True)
    path = os.path.join(tmp_path, "w.weights.h5")
    model.save_weights(path)
    sent = keras.ops.convert_to_numpy(model(y, training=True))
    model.load_weights(path)
    assert not np.array_equal(keras.ops.convert_to_numpy(model(y, training=True)), sent)
    (row,) = privacy_report(model).releases
    assert row.count == 3


@CHECKPOINT
def test_checkpoint_restore_into_a_live_model_keeps_counting(tmp_path):
    model = _embedding_model()
    _noise(model)
    prefix = _checkpoint_write(model, tmp_path)
    layer = model.layers[-1]
    counter = layer.rng_counter.numpy().copy()
    sent = [_noise(model), _noise(model)]
    _checkpoint_read(model, prefix).assert_existing_objects_matched()
    assert _releases(model) == 3  # was 2 before: the restore rewound the count
    assert (layer.rng_counter.numpy() >= counter).all() and layer.noise_draws == 3
    again = _noise(model)
    assert not any(np.array_equal(again, s) for s in sent)
    assert _releases(model) == 4


def test_a_new_model_takes_the_saved_counts_by_every_path(tmp_path):
    model = _embedding_model()
    for _ in range(3):
        _noise(model)
    model.save(os.path.join(tmp_path, "m.keras"))
    model.save_weights(os.path.join(tmp_path, "w.weights.h5"))
    loaded = keras.models.load_model(os.path.join(tmp_path, "m.keras"))
    fresh = _embedding_model()
    fresh.load_weights(os.path.join(tmp_path, "w.weights.h5"))
    unpickled = pickle.loads(pickle.dumps(model))
    copies = [loaded, fresh, unpickled]
    if keras.backend.backend() == "tensorflow":
        restored = _embedding_model()
        _checkpoint_read(restored, _checkpoint_write(model, tmp_path))
        copies.append(restored)
    for copy_ in copies:
        assert _releases(copy_) == 3
        # each has its own key: its noise is not the original's next
        assert not np.array_equal(_noise(copy_), _noise(model))


@pytest.mark.parametrize("path_kind", ["weights.h5", pytest.param("checkpoint", marks=CHECKPOINT)])
def test_a_released_layer_refuses_another_layers_counts(tmp_path, path_kind):
    other = _embedding_model()
    for _ in range(5):
        _noise(other)
    live = _embedding_model()
    _noise(live)
    before = live.layers[-1]._release_totals().copy()
    with pytest.raises(ValueError, match="already released.*another layer"):
        if path_kind == "weights.h5":
            other.save_weights(os.path.join(tmp_path, "w.weights.h5"))
            live.load_weights(os.path.join(tmp_path, "w.weights.h5"))
        else:
            _checkpoint_read(live, _checkpoint_write(other, tmp_path))
    np.testing.assert_array_equal(live.layers[-1]._release_totals(), before)


def test_saved_counts_from_before_lineages_and_malformed_counts():
    layer = kf.EmbeddingDPLayer(1.0)
    layer.build((None, 4))
    old = np.array([2, 0, 0, 0, 0, 0, 0, 4], np.int64)  # 8 slots: no lineage
    layer.load_own_variables({"rng_counter": np.zeros(3, np.int64), "release_totals": old,
                              "release_id_slots": np.array([1, 5]),
                              "release_id_values": np.array([2, 1])})
    assert layer._release_totals()[rc.FRESH_IDS] == 2
    assert layer._release_totals()[rc.LINEAGE] != 0  # keeps its own
    layer(np.ones((1, 4), "float32"), training=True)
    # now it has released: an old file (unknown lineage) that released too is refused
    with pytest.raises(ValueError, match="another layer"):
        layer.load_own_variables({"release_totals": old})
    fresh = kf.EmbeddingDPLayer(1.0)
    fresh.build((None, 4))
    with pytest.raises(ValueError, match="malformed"):
        fresh.load_own_variables({"release_totals": np.array([-1, 0, 0, 0, 0, 0, 0, 4, 7])})
    with pytest.raises(ValueError, match="malformed"):
        fresh.load_own_variables({"release_totals": np.zeros(9, np.int64),
                                  "release_id_slots": np.array([3]),
                                  "release_id_values": np.array([-2])})
    assert not rc._released(fresh._release_totals())


# --- host-side seeded objects -----------------------------------------------------------------
DELTA = np.linspace(-1.0, 1.0, 1000).astype(np.float32)


def _gaussian_message(upload):
    return upload.client_message(DELTA, 10, client_id=4).message


def _signds_message(encoder):
    message = encoder.encode(DELTA, client_id=4)
    return (int(message.sign), tuple(message.indices.tolist()))


# The copy's streams are keyed by a fresh random fork id, so these draws are independent of the
# original's: a Gaussian message (1000 floats) repeats with probability 0; a SignDS message at
# k=0.2, eps=10 on d=1000 has a sign and 13 indices, and two independent ones are equal with
# probability sum_m P(m)**2 = 2.7e-27 (at eps=2 it has one index: 1.1e-3, and 9 pairs failed
# about once in 100 runs).
@pytest.mark.parametrize("make, draw", [
    (lambda: GaussianUpload(1.0, 1.0, seed=11), _gaussian_message),
    (lambda: SignDSEncoder(k=0.2, eps=10.0, seed=11), _signds_message),
])
@pytest.mark.parametrize("how", ["deepcopy", "pickle", "copy"])
def test_a_copy_of_a_seeded_object_never_draws_the_originals_noise(make, draw, how):
    original = make()
    draw(original)
    clone = {"deepcopy": copy.deepcopy, "copy": copy.copy,
             "pickle": lambda o: pickle.loads(pickle.dumps(o))}[how](original)
    # the copy keeps counting what was released before
    assert clone.num_releases == original.num_releases == 1
    assert privacy_report(clone).epsilon == privacy_report(original).epsilon
    ours, theirs = [draw(clone) for _ in range(3)], [draw(original) for _ in range(3)]
    for a in ours:
        assert not any(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
                       for b in theirs)
    # a state_dict of the copy continues the copy's own streams
    restored = make()
    restored.load_state_dict(clone.state_dict())
    after = draw(restored)
    assert np.array_equal(after, draw(clone)) if isinstance(after, np.ndarray) \
        else after == draw(clone)


def test_a_seeded_copy_stays_reproducible_when_not_copied():
    a, b = GaussianUpload(1.0, 1.0, seed=5), GaussianUpload(1.0, 1.0, seed=5)
    np.testing.assert_array_equal(_gaussian_message(a), _gaussian_message(b))


@pytest.mark.parametrize("make", [
    lambda: GaussianUpload(1.0, 1.0, seed=11),
    lambda: SignDSEncoder(k=0.2, eps=2.0, seed=11),
    lambda: MagRR(eps_rr=2.0, seed=11),
])
def test_load_state_dict_refuses_a_state_without_per_client_counts(make):
    original = make()
    state = original.state_dict()
    del state["releases_by_unit"]
    with pytest.raises(ValueError, match="releases_by_unit"):
        make().load_state_dict(state)


def test_load_state_dict_refuses_a_state_behind_the_object():
    upload = GaussianUpload(1.0, 1.0, seed=11)
    stale = upload.state_dict()
    sent = _gaussian_message(upload)
    with pytest.raises(ValueError, match="behind"):
        upload.load_state_dict(stale)
    assert upload.num_releases == 1
    assert not np.array_equal(_gaussian_message(upload), sent)
    # a state without the counters cannot be checked: refused once the object has released
    with pytest.raises(ValueError, match="num_releases"):
        upload.load_state_dict({"ledger": GaussianUpload().state_dict()["ledger"]})
    assert sum(upload.privacy_ledger().total(k) for k in upload.privacy_ledger().kinds) == 2
    unseeded = GaussianUpload(1.0, 1.0)
    state = unseeded.state_dict()
    unseeded.client_message(DELTA, 10, client_id=1)
    with pytest.raises(ValueError, match="behind"):
        unseeded.load_state_dict(state)


def test_load_state_dict_refuses_a_state_whose_ledger_is_behind():
    """Counts that are not behind, with a ledger that holds fewer records than the object's:
    loading it would rewind what the privacy report counts. Refused; nothing changes."""
    upload = GaussianUpload(1.0, 1.0, seed=11)
    empty_ledger = GaussianUpload(1.0, 1.0, seed=11).state_dict()["ledger"]
    _gaussian_message(upload)
    state = upload.state_dict()
    state["ledger"] = empty_ledger
    with pytest.raises(ValueError, match="its ledger holds fewer releases"):
        upload.load_state_dict(state)
    ledger = upload.privacy_ledger()
    assert upload.num_releases == 1 and sum(ledger.total(k) for k in ledger.kinds) == 1
    upload.load_state_dict(upload.state_dict())  # its own state still loads


# --- vertical FL: the follower's state and the model's count of releases without DP ----------
def test_a_follower_refuses_a_state_behind_its_releases():
    from vertical_stubs import COLUMNS, model_fn, vertical_data

    data = vertical_data()
    follower = model_fn().split_parties().followers["f1"]
    ids = np.arange(16)
    x = data["features"][ids, COLUMNS["f1"]]
    follower.embed(x, example_ids=ids)
    follower.discard()
    stale = {k: np.array(v) for k, v in follower.state_dict().items()}
    sent = follower.embed(x, example_ids=ids)["bits"]
    follower.discard()
    before = privacy_report(follower).epsilon
    with pytest.raises(ValueError, match="behind"):
        follower.load_state_dict(stale)
    assert privacy_report(follower).epsilon == before
    assert not np.array_equal(follower.embed(x, example_ids=ids)["bits"], sent)
    # a new copy built the same way takes the state (what a Flower node does every message)
    copy_ = model_fn().split_parties().followers["f1"]
    copy_.load_state_dict(stale)


@pytest.mark.parametrize("how", ["weights.h5", pytest.param("checkpoint", marks=CHECKPOINT)])
def test_a_vertical_models_releases_without_dp_are_not_rewound(tmp_path, how):
    from vertical_stubs import compile_model, two_party, two_party_data

    data = two_party_data()
    model = compile_model(two_party(label_dp=kf.LabelDPLayer(2.0, per_batch=True)))
    prefix = _checkpoint_write(model, tmp_path) if how == "checkpoint" else None
    model.predict(data["test"], verbose=0)
    path = os.path.join(tmp_path, "early.weights.h5")
    model.save_weights(path)
    model.fit(data["train"], data["y"], epochs=1, batch_size=64, verbose=0)
    count = model.unprotected_releases.numpy().copy()
    if how == "weights.h5":
        model.load_weights(path)
    else:
        _checkpoint_read(model, prefix)
    np.testing.assert_array_equal(model.unprotected_releases.numpy(), count)
    assert math.isinf(privacy_report(model).epsilon)
