"""Integration of LabelDPLayer / EmbeddingDPLayer with Keras and TensorFlow machinery.

Sequential and functional models, `tf.data`, XLA (`jit_compile=True`),
`tf.distribute.MirroredStrategy` over the two logical CPUs that
`conftest.py` configures, `.keras` round trips and `model.export()`.
"""

import os

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from crosspath import assert_bits_are_the_sign  # noqa: E402

pytestmark = [pytest.mark.jax]

RNG = np.random.default_rng(20240601)


def _np(x):
    """A backend tensor as a numpy array."""
    return keras.ops.convert_to_numpy(x)


def _is_zero_one(a):
    a = np.asarray(a)
    return bool(np.all((a == 0) | (a == 1)))


def _bottom_top(eps, *, at_inference=True, seed=None, width=16, in_dim=6, ste="identity"):
    """A small vertical-FL style model: Dense bottom -> EmbeddingDPLayer -> Dense top."""
    return keras.Sequential([
        keras.Input((in_dim,)),
        keras.layers.Dense(width, name="bottom"),
        kf.EmbeddingDPLayer(eps, seed=seed, at_inference=at_inference, ste=ste, name="edp"),
        keras.layers.Dense(1, activation="sigmoid", name="top"),
    ])


def _easy_task(n=512, in_dim=6):
    x = np.random.default_rng(n).normal(size=(n, in_dim)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("float32")
    return x, y


def _label_model(eps, **kwargs):
    """Functional model: (labels, example_ids) -> LabelDPLayer."""
    labels = keras.Input((1,), name="labels", dtype=kwargs.pop("dtype", "float32"))
    ids = keras.Input((), name="example_ids", dtype="int64")
    out = kf.LabelDPLayer(eps, name="ldp", **kwargs)(labels, example_ids=ids)
    return keras.Model([labels, ids], out)


# --- 1. Sequential and functional models -----------------------------------------

def test_embedding_layer_in_sequential_and_functional_models():
    x = RNG.normal(size=(32, 5)).astype("float32")
    seq = keras.Sequential([keras.Input((5,)), keras.layers.Dense(64, name="bottom"),
                            kf.EmbeddingDPLayer(0.5)])
    inp = keras.Input((5,))
    bottom = keras.layers.Dense(64, name="bottom")
    func = keras.Model(inp, kf.EmbeddingDPLayer(0.5)(bottom(inp)))
    for model in (seq, func):
        sign = (_np(model.get_layer("bottom")(x)) > 0).astype("float32")
        for training in (True, False):
            out = _np(model(x, training=training))
            assert out.shape == (32, 64) and out.dtype == np.float32
            assert _is_zero_one(out)
            # eps=0.5: each bit flips with q = 1/(e^0.25 + 1) ~ 0.44, at training and inference.
            assert 0.3 < np.mean(out != sign) < 0.6
        # Fresh noise at every call.
        assert np.mean(_np(model(x, training=True)) != _np(model(x, training=True))) > 0.3


def test_embedding_at_inference_false_is_quantization_only_in_models():
    x = RNG.normal(size=(32, 5)).astype("float32")
    seq = keras.Sequential([keras.Input((5,)), keras.layers.Dense(64, name="bottom"),
                            kf.EmbeddingDPLayer(0.5, at_inference=False)])
    inp = keras.Input((5,))
    func = keras.Model(inp, kf.EmbeddingDPLayer(0.5, at_inference=False)(
        keras.layers.Dense(64, name="bottom")(inp)))
    for model in (seq, func):
        sign = (_np(model.get_layer("bottom")(x)) > 0).astype("float32")
        np.testing.assert_array_equal(_np(model(x, training=False)), sign)
        np.testing.assert_array_equal(_np(model(x)), sign)  # default is inference
        noisy = _np(model(x, training=True))
        assert _is_zero_one(noisy) and np.mean(noisy != sign) > 0.3


def test_label_layer_in_functional_model_with_example_ids():
    n = 400
    y = (np.arange(n) % 2).astype("float32").reshape(n, 1)
    ids = np.arange(n, dtype="int64")
    model = _label_model(0.1, seed=41)  # seeded: the band below is deterministic
    noisy = _np(model([y, ids], training=True))
    assert noisy.shape == (n, 1) and noisy.dtype == np.float32 and _is_zero_one(noisy)
    # eps = 0.1: flip probability 1 / (1 + e^0.1) ~ 0.475.
    assert 0.35 < np.mean(noisy != y) < 0.6
    # Same ids -> same noisy labels in every call (every epoch).
    np.testing.assert_array_equal(_np(model([y, ids], training=True)), noisy)
    # The noise follows the id, not the position in the batch.
    perm = RNG.permutation(n)
    np.testing.assert_array_equal(_np(model([y[perm], ids[perm]], training=True)), noisy[perm])
    # Inference / evaluation: labels pass unchanged.
    np.testing.assert_array_equal(_np(model([y, ids], training=False)), y)
    np.testing.assert_array_equal(_np(model([y, ids])), y)


@pytest.mark.tensorflow_only("JAX: Keras casts an int64 model input to int32 before the layer "
                             "sees it, so ids k and k + 2**32 get the same noise")
def test_ids_beyond_32_bits_in_a_functional_model_keep_their_own_noise():
    model = _label_model(0.0, num_classes=7, seed=3, dtype="int32")
    y = (np.arange(64) % 7).astype("int32").reshape(64, 1)
    ids = np.arange(64, dtype="int64")
    low = _np(model([y, ids], training=True))
    high = _np(model([y, ids + 2**32], training=True))
    # eps=0: each noisy label is uniform over 7 classes; all 64 equal by chance: 7**-64
    assert not np.array_equal(low, high)


def test_sparse_int_labels_in_functional_model_keep_dtype():
    n = 300
    y = (np.arange(n) % 5).astype("int32").reshape(n, 1)
    model = _label_model(0.5, num_classes=5, dtype="int32")
    out = np.asarray(model([y, np.arange(n)], training=True))
    assert out.dtype == np.int32 and out.shape == (n, 1)
    assert set(np.unique(out)) <= set(range(5)) and np.mean(out != y) > 0.3
    np.testing.assert_array_equal(np.asarray(model([y, np.arange(n)], training=False)), y)


def test_label_layer_in_sequential_model():
    y = (np.arange(300) % 2).astype("float32").reshape(-1, 1)
    # seeded (the bands below are deterministic): fresh noise per call comes from the counter
    per_batch = keras.Sequential([keras.Input((1,)),
                                  kf.LabelDPLayer(0.1, per_batch=True, seed=42)])
    a, b = _np(per_batch(y, training=True)), _np(per_batch(y, training=True))
    assert a.shape == (300, 1) and _is_zero_one(a) and _is_zero_one(b)
    assert np.mean(a != y) > 0.3 and np.mean(a != b) > 0.3  # fresh noise per call
    np.testing.assert_array_equal(_np(per_batch(y, training=False)), y)
    # Without ids and without per_batch there is no way to randomize once per example.
    once = keras.Sequential([keras.Input((1,)), kf.LabelDPLayer(0.1)])
    with pytest.raises(ValueError, match="example_ids"):
        once(y, training=True)
    np.testing.assert_array_equal(np.asarray(once(y, training=False)), y)


# --- 2. tf.data ----------------------------------------------------------------

@pytest.mark.tensorflow_only("tf.data maps")
def test_layers_inside_dataset_map():
    import tensorflow as tf

    n = 64
    x = RNG.normal(size=(n, 32)).astype("float32")
    y = (np.arange(n) % 2).astype("float32")
    emb = kf.EmbeddingDPLayer(0.5)
    emb.build((None, 32))
    lab = kf.LabelDPLayer(0.1, seed=43)  # seeded: 64 labels, the rate band is deterministic

    def fn(features, label, example_id):
        return (emb(features, training=True),
                lab(label, example_ids=example_id, training=True))

    ds = tf.data.Dataset.from_tensor_slices((x, y, np.arange(n, dtype="int64"))).batch(16).map(fn)
    counter0 = emb.noise_draws
    first = [(e.numpy(), l.numpy()) for e, l in ds]
    second = [(e.numpy(), l.numpy()) for e, l in ds]
    emb1, lab1 = (np.concatenate(parts) for parts in zip(*first))
    emb2, lab2 = (np.concatenate(parts) for parts in zip(*second))
    assert emb1.shape == (n, 32) and emb1.dtype == np.float32 and _is_zero_one(emb1)
    assert np.mean(emb1 != (x > 0)) > 0.3
    assert np.mean(emb1 != emb2) > 0.3  # the embedding is re-randomized every pass
    assert emb.noise_draws - counter0 == 8  # one draw per batch, 2 passes x 4
    assert lab1.shape == (n,) and _is_zero_one(lab1) and np.mean(lab1 != y) > 0.2
    np.testing.assert_array_equal(lab1, lab2)  # labels: a pure function of the id
    # ... and the same function as an eager call of the same layer.
    np.testing.assert_array_equal(lab1, lab(y, example_ids=np.arange(n), training=True).numpy())


@pytest.mark.tensorflow_only("privatize_dataset maps a tf.data.Dataset")
def test_privatize_dataset_is_stable_across_iterations():
    import tensorflow as tf

    n = 1000
    x = RNG.normal(size=(n, 3)).astype("float32")
    y = (np.arange(n) % 2).astype("float32")
    ds = kf.privatize_dataset(tf.data.Dataset.from_tensor_slices((x, y)), eps=0.1, seed=7)
    first = [(a.numpy(), b.numpy()) for a, b in ds]
    second = [(a.numpy(), b.numpy()) for a, b in ds]
    feats = np.stack([f for f, _ in first])
    noisy = np.array([l for _, l in first])
    np.testing.assert_array_equal(feats, x)  # features untouched, order kept
    np.testing.assert_array_equal(noisy, [l for _, l in second])
    assert noisy.dtype == np.float32 and _is_zero_one(noisy)
    assert 0.35 < np.mean(noisy != y) < 0.6  # flip probability ~0.475 at eps=0.1
    # Keyed by position: the same as privatize_labels on the array with the same seed.
    np.testing.assert_array_equal(noisy, kf.privatize_labels(y, 0.1, seed=7))
    # A fresh secret per call without seed=.
    other = np.array([l.numpy() for _, l in kf.privatize_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)), eps=0.1)])
    # independent labels differ with probability 2 q (1 - q) = 0.499: below 0.3 of 1000 has
    # probability 2.4e-37
    assert np.mean(other != noisy) > 0.3


@pytest.mark.tensorflow_only("privatize_dataset maps a tf.data.Dataset")
def test_privatize_dataset_label_index_and_onehot():
    import tensorflow as tf

    n = 200
    y = np.eye(4, dtype="float32")[np.arange(n) % 4]
    w = np.arange(n, dtype="float32")
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((n, 2), "float32"), y, w))
    out = list(kf.privatize_dataset(ds, eps=0.0))  # labels are element[1] (Keras convention)
    noisy = np.stack([e[1].numpy() for e in out])
    assert noisy.shape == (n, 4) and np.all(noisy.sum(axis=1) == 1) and _is_zero_one(noisy)
    assert np.mean(np.argmax(noisy, 1) != np.argmax(y, 1)) > 0.5  # eps=0: keep prob 1/4
    np.testing.assert_array_equal([e[2].numpy() for e in out], w)  # other components untouched


@pytest.mark.tensorflow_only("tf.data maps")
def test_parallel_dataset_map_never_reuses_embedding_noise():
    import tensorflow as tf

    emb = kf.EmbeddingDPLayer(0.0)  # eps=0: every bit is a fair coin, 128 bits per element
    emb.build((None, 128))
    x = RNG.normal(size=(1, 128)).astype("float32")
    n = 3000
    ds = tf.data.Dataset.from_tensors(x).repeat(n).map(
        lambda a: emb(a, training=True), num_parallel_calls=16, deterministic=True)
    counter0 = emb.noise_draws
    outs = np.stack([o.numpy().ravel() for o in ds])
    # Identical inputs: two equal outputs mean the same 128 noise bits were used twice
    # (chance 2**-128 per pair for independent noise).
    assert len(np.unique(outs, axis=0)) == n
    assert emb.noise_draws - counter0 == n


# --- 3. XLA ----------------------------------------------------------------------

def test_jit_compiled_fit_with_embedding_layer_trains():
    keras.utils.set_random_seed(1)
    x, y = _easy_task()
    model = _bottom_top(8.0, seed=44)  # seeded: the losses below are deterministic
    model.compile(keras.optimizers.Adam(0.03), "binary_crossentropy", metrics=["accuracy"],
                  jit_compile=True)
    assert model.jit_compile is True
    counter0 = model.get_layer("edp").noise_draws
    history = model.fit(x, y, epochs=4, batch_size=128, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] - 0.15, losses
    assert history.history["accuracy"][-1] > 0.8
    # One noise draw per training step, made on the device inside the XLA program.
    assert model.get_layer("edp").noise_draws - counter0 == 4 * 4


@pytest.mark.tensorflow_only("tf.function(jit_compile=True) and its HLO")
def test_jit_compiled_label_layer_matches_eager():
    import tensorflow as tf

    layer = kf.LabelDPLayer(0.3, num_classes=7)
    y = (np.arange(500) % 7).astype("int32")
    ids = (np.arange(500, dtype="int64") * 7919 + 2**40)  # ids beyond 32 bits
    fn = tf.function(lambda a, b: layer(a, example_ids=b, training=True), jit_compile=True)
    xla = fn(y, ids).numpy()
    eager = layer(y, example_ids=ids, training=True).numpy()
    np.testing.assert_array_equal(xla, eager)
    np.testing.assert_array_equal(fn(y, ids).numpy(), eager)  # again: a function of the id
    assert xla.dtype == np.int32 and np.mean(xla != y) > 0.3
    assert "HloModule" in fn.experimental_get_compiler_ir(y, ids)(stage="hlo")


# --- 4. MirroredStrategy ---------------------------------------------------------



@pytest.mark.tensorflow_only("tf.distribute.MirroredStrategy")
def test_mirrored_strategy_fit_with_embedding_layer(strategy):
    import tensorflow as tf

    from keras_fedpriv.backend.tensorflow import SecretKeyVariable

    assert strategy.num_replicas_in_sync == 2
    keras.utils.set_random_seed(2)
    x, y = _easy_task()
    with strategy.scope():
        model = _bottom_top(8.0, seed=45)  # seeded: the losses below are deterministic
        model.compile(keras.optimizers.Adam(0.03), "binary_crossentropy")
    layer = model.get_layer("edp")
    # One key shared by both replicas (not mirrored); replicas differ via the replica id.
    assert isinstance(layer.rng_key, SecretKeyVariable)
    assert not isinstance(layer.rng_key, tf.distribute.DistributedValues)
    assert not {id(layer.rng_key), id(layer.rng_counter)} & {id(w) for w in model.weights}
    losses = model.fit(x, y, epochs=3, batch_size=128, verbose=0).history["loss"]
    assert losses[-1] < losses[0] - 0.1, losses
    out = model.get_layer("edp")(model.get_layer("bottom")(x[:16]), training=True).numpy()
    assert out.shape == (16, 16) and _is_zero_one(out)


@pytest.mark.tensorflow_only("tf.distribute.MirroredStrategy")
def test_mirrored_replicas_never_share_noise(strategy):
    import tensorflow as tf

    with strategy.scope():
        emb = kf.EmbeddingDPLayer(0.0)
        emb.build((None, 64))
        lab = kf.LabelDPLayer(0.0, per_batch=True)
    x = tf.constant(RNG.normal(size=(4, 64)).astype("float32"))
    y = tf.zeros((256,), tf.float32)

    @tf.function
    def step(a, b):
        return strategy.run(lambda u, v: (emb(u, training=True), lab(v, training=True)),
                            args=(a, b))

    counter0 = emb.noise_draws
    for _ in range(2):
        emb_out, lab_out = step(x, y)
        e0, e1 = (t.numpy() for t in strategy.experimental_local_results(emb_out))
        l0, l1 = (t.numpy() for t in strategy.experimental_local_results(lab_out))
        assert _is_zero_one(e0) and _is_zero_one(e1) and e0.shape == e1.shape == (4, 64)
        # Same input on both replicas, eps = 0 (fair coins): equal noise would make equal outputs.
        assert np.mean(e0 != e1) > 0.3
        assert np.mean(l0 != l1) > 0.3
    # Both replicas draw from one shared counter, atomically: 2 steps x 2 replicas.
    assert emb.noise_draws - counter0 == 4


# --- 5. .keras round trip and model.export() ----------------------------------------

def test_keras_round_trip_preserves_config_and_weights(tmp_path):
    x, y = _easy_task(64)
    emb_model = _bottom_top(2.5, at_inference=False, ste="hardtanh")
    emb_model.compile("adam", "binary_crossentropy")
    emb_model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    path = os.path.join(tmp_path, "emb.keras")
    emb_model.save(path)
    emb_back = keras.models.load_model(path)
    edp = emb_back.get_layer("edp")
    assert type(edp) is kf.EmbeddingDPLayer
    assert (edp.eps, edp.seed, edp.at_inference, edp.ste) == (2.5, None, False, "hardtanh")
    for name in ("bottom", "top"):
        for a, b in zip(emb_model.get_layer(name).weights, emb_back.get_layer(name).weights):
            np.testing.assert_array_equal(_np(a), _np(b))  # bit for bit
    assert edp.noise_draws == emb_model.get_layer("edp").noise_draws
    # Inference is deterministic here (quantization only): identical predictions.
    np.testing.assert_array_equal(_np(emb_back(x, training=False)),
                                  _np(emb_model(x, training=False)))

    label_model = _label_model(0.7, mode="sparse", num_classes=3, per_batch=False)
    path = os.path.join(tmp_path, "label.keras")
    label_model.save(path)
    label_back = keras.models.load_model(path)
    ldp = label_back.get_layer("ldp")
    assert type(ldp) is kf.LabelDPLayer
    assert (ldp.eps, ldp.mode, ldp.num_classes, ldp.seed, ldp.per_batch) == \
        (0.7, "sparse", 3, None, False)
    labels = (np.arange(30) % 3).astype("float32").reshape(-1, 1)
    out = _np(label_back([labels, np.arange(30)], training=True))
    assert out.shape == (30, 1) and set(np.unique(out)) <= {0, 1, 2}
    np.testing.assert_array_equal(_np(label_back([labels, np.arange(30)], training=False)),
                                  labels)


@pytest.mark.tensorflow_only("model.export() writes a TF SavedModel")
def test_exported_saved_model_randomizes_at_inference(tmp_path):
    import tensorflow as tf

    x = RNG.normal(size=(16, 6)).astype("float32")
    model = _bottom_top(0.5, width=32)
    bottom_only = keras.Model(model.inputs[0], model.get_layer("edp").output)
    path = os.path.join(tmp_path, "sm")
    bottom_only.export(path, verbose=False)
    served = tf.saved_model.load(path)
    a, b = served.serve(x).numpy(), served.serve(x).numpy()
    assert a.shape == b.shape == (16, 32) and a.dtype == np.float32
    assert _is_zero_one(a) and _is_zero_one(b)
    assert np.mean(a != b) > 0.3  # fresh noise at every call
    sign = (model.get_layer("bottom")(x).numpy() > 0)
    assert np.mean(a != sign) > 0.3


@pytest.mark.tensorflow_only("model.export() writes a TF SavedModel")
def test_exported_saved_model_without_inference_noise_is_the_sign(tmp_path):
    import tensorflow as tf

    x = RNG.normal(size=(16, 6)).astype("float32")
    model = _bottom_top(0.5, at_inference=False, width=32)
    bottom_only = keras.Model(model.inputs[0], model.get_layer("edp").output)
    path = os.path.join(tmp_path, "sm")
    bottom_only.export(path, verbose=False)
    loaded = tf.saved_model.load(path)  # keep a reference: it owns the variables
    served = loaded.serve(x).numpy()
    z = model.get_layer("bottom")(x).numpy()
    assert served.shape == (16, 32)
    # the sign, bit for bit, except where the pre-activation is within rounding of 0 (the
    # SavedModel's graph may compute it an ulp away from eager, e.g. with oneDNN)
    assert_bits_are_the_sign(served, z)
    # The top model on top of it: export the whole model too, inference is deterministic.
    full = os.path.join(tmp_path, "full")
    model.export(full, verbose=False)
    loaded_full = tf.saved_model.load(full)
    # Bits identical (above); the top's floats come from another execution path (graph vs eager).
    np.testing.assert_allclose(loaded_full.serve(x).numpy(), model(x, training=False).numpy(),
                               rtol=1e-5, atol=1e-6)
