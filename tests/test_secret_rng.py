"""The layers' secret keys: drawn from OS entropy, never replayable, never saved.

Without ``seed=`` a layer's 64-bit key comes from `secrets`, is not affected
by `keras.utils.set_random_seed`, and is left out of every checkpoint format
(`.keras`, `.weights.h5`, `tf.train.Checkpoint`, `model.export()`), so a
reloaded model draws fresh noise. With ``seed=`` the key is reproducible and
saved, and a reloaded model replays the original noise exactly.
"""

import io
import json
import os
import zipfile

import h5py
import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.mechanisms import random as R

pytestmark = [pytest.mark.jax]

ON_TENSORFLOW = keras.backend.backend() == "tensorflow"
#: Files hold the counter as TensorFlow's Philox state, ``[draws * 256, 0, 0]``, on every
#: backend (RngReadAndSkip advances it by 256 per draw).
SKIP = 256

N = 256
X = np.random.default_rng(7).normal(size=(8, 6)).astype("float32")
Y = np.zeros((N, 1), "float32")
IDS = np.arange(N, dtype="int64")
SEEDED = 0xDEADBEEF12345  # an explicit seed whose key has two non-zero words


def _model(seed=None):
    """x -> Dense -> EmbeddingDPLayer, and (labels, ids) -> LabelDPLayer; eps=0: fair coins."""
    x = keras.Input((6,), name="x")
    y = keras.Input((1,), name="y")
    ids = keras.Input((), dtype="int64", name="ids")
    emb = kf.EmbeddingDPLayer(0.0, seed=seed, name="edp")(keras.layers.Dense(64, name="bottom")(x))
    lab = kf.LabelDPLayer(0.0, seed=seed, name="ldp")(y, example_ids=ids)
    return keras.Model([x, y, ids], [emb, lab])


def _noise(model):
    """One training-mode release of both layers (advances the embedding counter by one)."""
    emb, lab = model([X, Y, IDS], training=True)
    return keras.ops.convert_to_numpy(emb), keras.ops.convert_to_numpy(lab)


def _dp_layers(model):
    return [model.get_layer("edp"), model.get_layer("ldp")]


def _emb_noise(layer):
    return keras.ops.convert_to_numpy(layer(np.ones((4, 64), "float32"), training=True))


def _label_noise(layer):
    return keras.ops.convert_to_numpy(layer(Y, example_ids=IDS, training=True))


def _key_patterns(keys):
    """Byte patterns a stored key would show up as (little-endian int64 words and pairs, and
    the pair as 32-bit words, as a backend without 64-bit integers stores it)."""
    patterns = []
    for key in keys:
        key = np.asarray(key, "<i8")[:2]  # the two key words (the third is the 'set' flag)
        patterns.append(key.tobytes())
        patterns.append(key.astype("<u4").tobytes())
        patterns.extend(np.asarray([w], "<i8").tobytes() for w in key)
    return patterns


def _assert_no_key_bytes(blobs, keys):
    for name, blob in blobs.items():
        for pattern in _key_patterns(keys):
            assert pattern not in blob, f"secret key bytes found in {name}"


def _files_under(path):
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.join(root, f)] = fh.read()
    return out


def _h5_datasets(source):
    found = {}
    with h5py.File(source, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return found


def _differ(a, b):
    return np.mean(np.asarray(a) != np.asarray(b))


# --- Entropy and keras.utils.set_random_seed -----------------------------------------

def test_set_random_seed_does_not_fix_the_secret():
    keras.utils.set_random_seed(123)
    e1, e2 = kf.EmbeddingDPLayer(0.0), kf.EmbeddingDPLayer(0.0)
    l1, l2 = kf.LabelDPLayer(0.0), kf.LabelDPLayer(0.0)
    assert _differ(_emb_noise(e1), _emb_noise(e2)) > 0.3
    assert _differ(_label_noise(l1), _label_noise(l2)) > 0.3

    keras.utils.set_random_seed(123)
    first_emb, first_lab = _emb_noise(kf.EmbeddingDPLayer(0.0)), _label_noise(kf.LabelDPLayer(0.0))
    first_keras = keras.ops.convert_to_numpy(
        keras.random.uniform((64,), seed=keras.random.SeedGenerator()))
    keras.utils.set_random_seed(123)  # "replay" everything
    again_emb, again_lab = _emb_noise(kf.EmbeddingDPLayer(0.0)), _label_noise(kf.LabelDPLayer(0.0))
    again_keras = keras.ops.convert_to_numpy(
        keras.random.uniform((64,), seed=keras.random.SeedGenerator()))
    # Control: ordinary Keras randomness IS replayed by set_random_seed ...
    np.testing.assert_array_equal(first_keras, again_keras)
    # ... the layers' noise is not.
    assert _differ(first_emb, again_emb) > 0.3
    assert _differ(first_lab, again_lab) > 0.3


def test_rng_key_holds_64_bits_of_os_entropy():
    layers = [kf.EmbeddingDPLayer(1.0) for _ in range(10)] + [kf.LabelDPLayer(1.0) for _ in range(10)]
    keys = []
    for layer in layers:
        if ON_TENSORFLOW:
            from keras_fedpriv.backend.tensorflow import SecretKeyVariable

            assert isinstance(layer.rng_key, SecretKeyVariable)
            assert layer.rng_key.keep_when_saved is False
            assert not layer.rng_key.trainable
        key = layer.rng_key.numpy()
        assert key.shape == (3,) and key.dtype == (np.int64 if ON_TENSORFLOW else np.uint32)
        key = key.astype(np.int64)
        assert key[2] == 1
        key = key[:2]
        assert np.all((key > 0) & (key < 2**32))  # both 32-bit words non-zero
        keys.append(key)
    words = np.concatenate(keys)
    assert len({tuple(k) for k in keys}) == len(layers)  # a repeat by chance: 190 / 2**64
    # Every word fresh: a key maker that reuses a word repeats it in every key (20 repeats). Two of
    # the 40 independent 32-bit words coincide with probability 780 / 2**32 = 1.8e-7, so one
    # coincidence is allowed; two or more have probability < (780 / 2**32)**2 = 3.3e-14.
    assert len(set(words.tolist())) >= words.size - 1
    # All 32 bits of the words are used (a 31-bit, int32-cast seed would never reach 2**31);
    # failing by chance has probability 2**-40.
    assert np.any(words >= 2**31)


def test_key_comes_from_the_secrets_module(monkeypatch):
    monkeypatch.setattr(R.secrets, "randbits", lambda bits: 0x0123456789ABCDEF)
    layer = kf.EmbeddingDPLayer(1.0)
    np.testing.assert_array_equal(layer.rng_key.numpy(), [0x89ABCDEF, 0x01234567, 1])


def test_explicit_seed_is_kept_when_saved():
    for layer in (kf.EmbeddingDPLayer(1.0, seed=SEEDED), kf.LabelDPLayer(1.0, seed=SEEDED)):
        if ON_TENSORFLOW:
            assert layer.rng_key.keep_when_saved is True
        np.testing.assert_array_equal(layer.rng_key.numpy(), _seeded_key(SEEDED))


# --- Explicit seeds ---------------------------------------------------------------

@pytest.mark.parametrize("seed", [
    1,
    SEEDED,
    2**64 - 1,
    0,
])
def test_same_explicit_seed_gives_identical_noise(seed):
    e1, e2 = kf.EmbeddingDPLayer(0.0, seed=seed), kf.EmbeddingDPLayer(0.0, seed=seed)
    for _ in range(2):  # and the same sequence over consecutive calls
        np.testing.assert_array_equal(_emb_noise(e1), _emb_noise(e2))
    l1, l2 = kf.LabelDPLayer(0.0, seed=seed), kf.LabelDPLayer(0.0, seed=seed)
    np.testing.assert_array_equal(_label_noise(l1), _label_noise(l2))
    np.testing.assert_array_equal(_label_noise(l1), _label_noise(l1))  # per id, every epoch
    np.testing.assert_array_equal(kf.privatize_labels(Y, 0.0, seed=seed),
                                  kf.privatize_labels(Y, 0.0, seed=seed))


@pytest.mark.parametrize("a, b", [(1, 2), (1, 2**32 + 1), (1, 2**32), (SEEDED, SEEDED ^ 2**63)])
def test_different_seeds_give_different_noise(a, b):
    # (1, 2**32 + 1) and (SEEDED, SEEDED ^ 2**63) differ only in the high key word.
    assert _differ(_emb_noise(kf.EmbeddingDPLayer(0.0, seed=a)),
                   _emb_noise(kf.EmbeddingDPLayer(0.0, seed=b))) > 0.3
    assert _differ(_label_noise(kf.LabelDPLayer(0.0, seed=a)),
                   _label_noise(kf.LabelDPLayer(0.0, seed=b))) > 0.3


def test_embedding_and_label_streams_are_separate_under_one_seed():
    e = _emb_noise(kf.EmbeddingDPLayer(0.0, seed=5)).ravel()[:N]
    lab = _label_noise(kf.LabelDPLayer(0.0, seed=5)).ravel()
    assert 0.3 < _differ(e, lab) < 0.7


# --- Checkpoint formats --------------------------------------------------------------

def _seeded_key(seed):
    return np.append(R.seed_to_key_words(seed), 1)


def _draws(counter_value):
    """Noise draws recorded in a stored counter."""
    return int(np.asarray(counter_value)[0]) // SKIP


def _scramble(model, key=True):
    """Give a restore target a wrong counter (and key), so a restore must overwrite them."""
    for layer in _dp_layers(model):
        if key:
            layer.rng_key.assign(np.array([3, 4, 1], np.int64))
        layer.rng_counter.assign(np.zeros(layer.rng_counter.shape, np.int64))


def _save_and_reload(model, fmt, tmp_path, seed):
    if fmt == "keras":
        path = os.path.join(tmp_path, "model.keras")
        model.save(path)
        with zipfile.ZipFile(path) as zf:
            blobs = {name: zf.read(name) for name in zf.namelist()}
        datasets = _h5_datasets(io.BytesIO(blobs["model.weights.h5"]))
        config = json.loads(blobs["config.json"])
        seeds = [layer["config"]["seed"] for layer in config["config"]["layers"]
                 if layer["class_name"] in ("EmbeddingDPLayer", "LabelDPLayer")]
        assert seeds == [seed, seed]
        return keras.models.load_model(path), blobs, datasets
    fresh = _model(seed)
    if seed is not None:
        # .keras / .weights.h5 never store the key (a seeded key comes from the config),
        # so only a TF checkpoint is expected to overwrite a wrong key.
        _scramble(fresh, key=fmt == "tf_checkpoint")
    if fmt == "weights_h5":
        path = os.path.join(tmp_path, "model.weights.h5")
        model.save_weights(path)
        fresh.load_weights(path)
        return fresh, _files_under(tmp_path), _h5_datasets(path)
    assert fmt == "tf_checkpoint"
    import tensorflow as tf

    prefix = tf.train.Checkpoint(model=model).write(os.path.join(tmp_path, "ckpt"))
    datasets = {name: tf.train.load_variable(prefix, name)
                for name, _ in tf.train.list_variables(prefix) if "rng_" in name}
    tf.train.Checkpoint(model=fresh).read(prefix).assert_existing_objects_matched()
    return fresh, _files_under(tmp_path), datasets


@pytest.mark.parametrize("fmt", ["keras", "weights_h5", pytest.param(
    "tf_checkpoint", marks=pytest.mark.tensorflow_only("tf.train.Checkpoint"))])
@pytest.mark.parametrize("seed", [None, SEEDED], ids=["secret", "seeded"])
def test_checkpoint_round_trip(fmt, seed, tmp_path):
    model = _model(seed)
    _noise(model)  # one release: counter 0 -> 1
    keys = [layer.rng_key.numpy().copy() for layer in _dp_layers(model)]
    reloaded, blobs, stored = _save_and_reload(model, fmt, tmp_path, seed)
    original_emb, original_lab = _noise(model)  # the original's release at counter 1

    # The counter is saved and restored (the label layer keyed by ids never advances it).
    assert [layer.noise_draws for layer in _dp_layers(reloaded)] == [1, 0]
    assert [layer.noise_draws for layer in _dp_layers(model)] == [2, 0]
    key_entries = {name: value for name, value in stored.items() if "rng_key" in name}
    counter_entries = [value for name, value in stored.items() if "rng_counter" in name]
    assert sorted(_draws(c) for c in counter_entries) == [0, 1]
    reloaded_emb, reloaded_lab = _noise(reloaded)  # the reloaded model's release at counter 1

    if seed is None:
        if fmt == "tf_checkpoint":  # written, as zeros
            assert len(key_entries) == 2
            for value in key_entries.values():
                np.testing.assert_array_equal(value, [0, 0, 0])
        else:  # not written at all
            assert key_entries == {}
        _assert_no_key_bytes(blobs, keys)
        for old, new in zip(_dp_layers(model), _dp_layers(reloaded)):
            assert not np.array_equal(old.rng_key.numpy(), new.rng_key.numpy())
            assert np.all(new.rng_key.numpy() != 0)
        assert _differ(reloaded_emb, original_emb) > 0.3
        assert _differ(reloaded_lab, original_lab) > 0.3
    else:
        if fmt == "tf_checkpoint":
            assert len(key_entries) == 2
            for value in key_entries.values():
                np.testing.assert_array_equal(value, _seeded_key(seed))
        else:  # re-derived from the config's seed, not stored
            assert key_entries == {}
        for layer in _dp_layers(reloaded):
            np.testing.assert_array_equal(layer.rng_key.numpy(), _seeded_key(seed))
        np.testing.assert_array_equal(reloaded_emb, original_emb)
        np.testing.assert_array_equal(reloaded_lab, original_lab)


@pytest.mark.parametrize("seed", [None, SEEDED], ids=["secret", "seeded"])
@pytest.mark.tensorflow_only("model.export() writes a TF SavedModel")
def test_exported_saved_model(seed, tmp_path):
    import tensorflow as tf

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(64, name="bottom"),
                              kf.EmbeddingDPLayer(0.0, seed=seed, name="edp")])
    layer = model.get_layer("edp")
    model(X)  # one inference release (randomized at inference): counter 0 -> 1
    key = layer.rng_key.numpy().copy()
    path = os.path.join(tmp_path, "sm")
    model.export(path, verbose=False)
    assert layer.noise_draws == 1  # exporting draws nothing
    original = model(X).numpy()  # the original's release at counter 1

    loaded = tf.saved_model.load(path)
    # Not model weights: Keras' export tracks them among the captured `_all_variables`.
    assert not [v for v in loaded.variables if "rng_" in v.name]
    key_vars = [v for v in loaded._all_variables if "rng_key" in v.name]
    counter_vars = [v for v in loaded._all_variables if "rng_counter" in v.name]
    assert len(key_vars) == 1 and len(counter_vars) == 1
    counter = counter_vars[0]
    assert _draws(counter.numpy()) == 1
    first = loaded.serve(X).numpy()
    assert first.shape == (8, 64) and np.all((first == 0) | (first == 1))
    counter.assign([SKIP, 0, 0])  # replay the same counter state
    replay = loaded.serve(X).numpy()

    if seed is None:
        # Saved as zeros; the load drew a fresh key (flag 1), not the original's.
        loaded_key = key_vars[0].numpy()
        assert loaded_key[2] == 1 and not np.array_equal(loaded_key[:2], key[:2])
        assert _differ(first, original) > 0.3
        # One key per load: the same counter state replays that load's own noise (the
        # counter advances at every call, so calls never repeat) ...
        np.testing.assert_array_equal(replay, first)
        # ... and set_random_seed does not make a fresh load replay it.
        keras.utils.set_random_seed(123)
        again = tf.saved_model.load(path)
        out_a = again.serve(X).numpy()
        keras.utils.set_random_seed(123)
        again_b = tf.saved_model.load(path)
        out_b = again_b.serve(X).numpy()
        assert _differ(out_a, out_b) > 0.3
    else:
        np.testing.assert_array_equal(key_vars[0].numpy(), _seeded_key(seed))
        np.testing.assert_array_equal(first, original)
        np.testing.assert_array_equal(replay, first)
        assert _differ(loaded.serve(X).numpy(), first) > 0.3  # counter advanced: fresh noise


@pytest.mark.tensorflow_only("model.export() writes a TF SavedModel")
def test_exported_saved_model_files_do_not_contain_the_key(tmp_path):
    import tensorflow as tf

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(64, name="bottom"),
                              kf.EmbeddingDPLayer(0.0, name="edp")])
    key = model.get_layer("edp").rng_key.numpy().copy()
    path = os.path.join(tmp_path, "sm")
    model.export(path, verbose=False)
    prefix = os.path.join(path, "variables", "variables")
    for name, shape in tf.train.list_variables(prefix):
        if shape == [3]:
            assert not np.array_equal(tf.train.load_variable(prefix, name), key), name
    _assert_no_key_bytes(_files_under(path), [key])


def test_weight_exchange_does_not_carry_the_secret():
    a, b = _model(), _model()
    a_keys = [layer.rng_key.numpy().copy() for layer in _dp_layers(a)]
    weights = a.get_weights()
    assert not any(np.shape(w) == (3,) and np.array_equal(w, k) for w in weights for k in a_keys)
    b.set_weights(weights)
    for old, new in zip(_dp_layers(a), _dp_layers(b)):
        assert not np.array_equal(old.rng_key.numpy(), new.rng_key.numpy())
