"""Paths around the label and embedding mechanisms that must not leak (issue 11).

Each test fails on the code before the fix and names its case in its docstring.
"""

import os

import keras
import numpy as np
import pytest

import keras_fedpriv as kf

pytestmark = [pytest.mark.jax]

RNG = np.random.default_rng(11)


def _batches(arrays, size):
    """The batches of ``size`` rows of the structure ``arrays`` (a dataset of one epoch)."""
    rows = len(keras.tree.flatten(arrays)[0])
    for start in range(0, rows, size):
        yield keras.tree.map_structure(lambda a: a[start:start + size], arrays)


@pytest.mark.tensorflow_only("tf.data (privatize_dataset maps a tf.data.Dataset)")
def test_privatize_dataset_randomizes_y_not_sample_weight():
    """Case 1: (x, y, sample_weight) elements: y is randomized, the weights are untouched."""
    import tensorflow as tf

    n = 400
    x = np.zeros((n, 2), "float32")
    y = (np.arange(n) % 2).astype("float32")
    w = np.ones(n, "float32")
    out = list(kf.privatize_dataset(tf.data.Dataset.from_tensor_slices((x, y, w)), eps=0.0,
                                    seed=3))
    noisy = np.array([e[1].numpy() for e in out])
    np.testing.assert_array_equal([e[2].numpy() for e in out], w)
    assert 0.35 < np.mean(noisy != y) < 0.65  # eps=0: labels are coin flips


@pytest.mark.tensorflow_only("tf.data (privatize_dataset maps a tf.data.Dataset)")
def test_privatize_dataset_never_guesses_the_label_position():
    """Case 1: dicts and tuples of other lengths need an explicit label_key."""
    import tensorflow as tf

    n = 10
    d = tf.data.Dataset.from_tensor_slices({"x": np.zeros((n, 2), "float32"),
                                            "label": np.zeros(n, "float32")})
    with pytest.raises(ValueError, match="label_key"):
        kf.privatize_dataset(d, eps=1.0)
    out = list(kf.privatize_dataset(d, eps=0.0, seed=1, label_key="label"))
    assert set(out[0]) == {"x", "label"}
    four = tf.data.Dataset.from_tensor_slices((np.zeros(n), np.zeros(n), np.zeros(n),
                                               np.zeros(n)))
    with pytest.raises(ValueError, match="label_key"):
        kf.privatize_dataset(four, eps=1.0)
    with pytest.raises(ValueError, match="label_key"):
        kf.privatize_dataset(four, eps=1.0, label_key=-1)


# --------------------------------------------------------------------------- case 2


def _vertical(label_dp, seed=0, jit_compile=False, embedding_dp=None):
    init = keras.initializers.GlorotUniform
    bottom_a = keras.Sequential([keras.Input((6,)),
                                 keras.layers.Dense(8, activation="relu",
                                                    kernel_initializer=init(seed)),
                                 keras.layers.Dense(4, kernel_initializer=init(seed + 1))])
    bottom_b = keras.Sequential([keras.Input((2,)),
                                 keras.layers.Dense(4, kernel_initializer=init(seed + 2))])
    top = keras.Sequential([keras.Input((8,)),
                            keras.layers.Dense(1, kernel_initializer=init(seed + 3))])
    model = kf.federated.VerticalModel({"party_a": bottom_a, "party_b": bottom_b}, top,
                                       leader="party_b", label_dp=label_dp,
                                       embedding_dp=embedding_dp)
    model.compile(keras.optimizers.SGD(0.05),
                  keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=jit_compile)
    return model


def _vertical_data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    xa = rng.normal(size=(n, 6)).astype("float32")
    xb = rng.normal(size=(n, 2)).astype("float32")
    y = (xa[:, 0] + 0.3 * rng.normal(size=n) > 0.8).astype("float32")  # ~20% positives
    return {"party_a": xa, "party_b": xb}, y


def test_class_weight_is_applied_to_randomized_labels():
    """Case 2: with label_dp eps=0 and class_weight, the cut gradients do not reveal y."""
    from keras_fedpriv.attacks import norm_label_inference
    keras.utils.set_random_seed(0)
    x, y = _vertical_data()
    model = _vertical(kf.LabelDPLayer(eps=0.0, seed=5))
    recorder = kf.federated.MessageRecorder(epochs=(0,))
    model.fit(kf.federated.with_example_ids(x), y, epochs=1, batch_size=40, shuffle=False,
              class_weight={0: 1, 1: 3}, callbacks=[recorder], verbose=0)
    result = norm_label_inference(recorder.cut_gradients("party_a"), recorder.labels())
    assert result.num_evaluated == len(y)
    assert abs(result.auc - 0.5) < 0.1
    # The weights do follow the noisy labels (class 1 rows weigh 3x): the norm
    # attack recovers the noisy labels the leader trained on.
    assert norm_label_inference(recorder.cut_gradients("party_a"),
                                recorder.noisy_labels()).auc > 0.7


def test_class_weight_one_hot_and_sparse_labels_follow_noisy_labels():
    """Case 2: class weights from the randomized one-hot / sparse labels (per-row loss ratio)."""
    keras.utils.set_random_seed(0)
    x, y = _vertical_data(n=64)
    for labels, layer in [(np.eye(2, dtype="float32")[y.astype(int)],
                           kf.LabelDPLayer(0.0, seed=2)),
                          (y.astype("int32"), kf.LabelDPLayer(0.0, mode="sparse", num_classes=2,
                                                              seed=2))]:
        base = _vertical(None)
        loss = (keras.losses.CategoricalCrossentropy(from_logits=True) if labels.ndim == 2 else
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        top = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model = kf.federated.VerticalModel(
            {"party_a": base.bottoms["party_a"], "party_b": base.bottoms["party_b"]}, top,
            leader="party_b", label_dp=layer)
        model.compile(keras.optimizers.SGD(0.0), loss)
        ids = kf.federated.with_example_ids(x)
        noisy = keras.ops.convert_to_numpy(
            layer(labels, example_ids=ids["example_ids"], training=True))
        noisy_class = noisy.argmax(1) if noisy.ndim == 2 else noisy.reshape(-1)
        logits = np.asarray(model.predict(x, verbose=0))
        per_row = np.asarray(loss.__class__(from_logits=True, reduction=None)(noisy, logits))
        weights = np.where(noisy_class == 1, 3.0, 1.0)
        history = model.fit(ids, labels, epochs=1, batch_size=64, shuffle=False, verbose=0,
                            class_weight={1: 3.0})
        np.testing.assert_allclose(history.history["loss"][0],
                                   np.sum(per_row * weights) / len(per_row), rtol=1e-4)


def test_sample_weight_with_label_dp_is_refused_unless_label_free():
    """Case 2: sample weights may be derived from the labels: refused with label_dp."""
    x, y = _vertical_data(n=40)
    model = _vertical(kf.LabelDPLayer(eps=1.0, seed=1))
    ids = kf.federated.with_example_ids(x)
    with pytest.raises(ValueError, match="sample_weight.*label_free_sample_weight"):
        model.fit(ids, y, sample_weight=1 + y, epochs=1, verbose=0)
    ds = _batches((ids, y, np.ones_like(y)), 20)
    with pytest.raises(ValueError, match="label_free_sample_weight"):
        model.fit(ds, epochs=1, verbose=0)
    model.fit(ids, y, sample_weight=np.ones_like(y), epochs=1, verbose=0,
              label_free_sample_weight=True)
    # Without label_dp Keras' behaviour is unchanged.
    _vertical(None).fit(x, y, sample_weight=1 + y, class_weight=None, epochs=1, verbose=0)


# --------------------------------------------------------------------------- case 4 / 5b


def test_repeated_example_ids_are_refused_eagerly():
    """Case 4: repeated ids in one call would share their noise; refused naming the position."""
    layer = kf.LabelDPLayer(eps=1.0, seed=1)
    y = np.array([0, 1, 1, 0, 1, 0], "float32")
    with pytest.raises(ValueError, match=r"`example_ids`.*position 3 repeats the id at position 0"):
        layer(y, example_ids=np.array([7, 1, 2, 7, 4, 5]), training=True)
    with pytest.raises(ValueError, match=r"`example_ids` has 1 entries but there are 6 labels"):
        layer(y, example_ids=np.array([3]), training=True)
    with pytest.raises(TypeError, match="`example_ids` must be integers"):
        layer(y, example_ids=np.arange(6.0), training=True)
    layer(y, example_ids=np.arange(-3, 3), training=True)  # negative ids are ids too


@pytest.mark.tensorflow_only("tf.function graph mode with unknown shapes")
def test_example_ids_are_checked_in_a_graph():
    """Case 4: a traced graph with unknown shapes asserts one id per label, all unique."""
    import tensorflow as tf

    layer = kf.LabelDPLayer(eps=1.0, seed=1)
    f = tf.function(lambda y, i: layer(y, example_ids=i, training=True),
                    input_signature=[tf.TensorSpec([None]), tf.TensorSpec([None], tf.int64)])
    y = np.array([0, 1, 1, 0], "float32")
    with pytest.raises(tf.errors.InvalidArgumentError, match="exactly one id per label"):
        f(y, np.array([3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="unique within a call"):
        f(y, np.array([0, 1, 0, 2]))
    assert f(y, np.arange(4)).shape == (4,)
    assert not layer.input_errors.numpy().any()


@pytest.mark.tensorflow_only("tf.function(jit_compile=True) around a layer")
def test_invalid_ids_or_labels_under_xla_output_noise_and_raise_on_host():
    """Case 4 and 5b: under XLA (asserts compiled away) the batch gets label-independent
    noise, and check_input_errors raises on the host."""
    import tensorflow as tf

    layer = kf.LabelDPLayer(eps=50.0, seed=1)  # eps 50: valid labels come out unchanged
    f = tf.function(lambda y, i: layer(y, example_ids=i, training=True), jit_compile=True,
                    input_signature=[tf.TensorSpec([None]), tf.TensorSpec([None], tf.int64)])
    n = 256
    y = (np.arange(n) % 2).astype("float32")
    np.testing.assert_array_equal(f(y, np.arange(n)).numpy(), y)
    layer.check_input_errors()  # nothing to report
    # One id for all labels: with a shared coin the output would be y itself (eps 50).
    out_a = f(y, np.array([5])).numpy()
    out_b = f(1 - y, np.array([5])).numpy()
    np.testing.assert_array_equal(out_a, out_b)  # does not depend on the labels
    with pytest.raises(ValueError, match="invalid example_ids"):
        layer.check_input_errors()
    layer.check_input_errors()  # reset after raising
    ids = np.arange(n)
    ids[1::2] = ids[::2]  # pairs share an id
    np.testing.assert_array_equal(f(y, ids).numpy(), f(1 - y, ids).numpy())
    with pytest.raises(ValueError, match="invalid example_ids"):
        layer.check_input_errors()
    # Case 5b: a label 2 in binary mode.
    bad = y.copy()
    bad[3] = 2.0
    out = f(bad, np.arange(n)).numpy()
    assert set(np.unique(out)) <= {0.0, 1.0}
    assert np.mean(out == y) < 0.8  # replaced by noise, not passed through
    with pytest.raises(ValueError, match="invalid labels"):
        layer.check_input_errors()


def test_vertical_model_jit_compile_refuses_bad_labels_and_ids():
    """Case 5b and 4: VerticalModel(jit_compile=True) raises on a binary label 2 and on
    repeated ids, after the step, from the host."""
    x, y = _vertical_data(n=64)
    model = _vertical(kf.LabelDPLayer(eps=1.0, seed=3), jit_compile=True)
    ids = kf.federated.with_example_ids(x)
    model.fit(ids, y, epochs=1, batch_size=32, verbose=0)
    bad = y.copy()
    bad[5] = 2.0
    # an array: checked eagerly before Keras starts (row and hint named)
    with pytest.raises(ValueError, match="row 5 has value 2"):
        model.fit(ids, bad, epochs=1, batch_size=32, verbose=0)
    # a dataset: the compiled step meets the bad label and the host raises after it
    dataset = _batches((ids, bad), 32)
    with pytest.raises(ValueError, match="invalid labels"):
        model.fit(dataset, epochs=1, verbose=0)
    ids_rep = dict(ids, example_ids=np.zeros(64, np.int64))
    with pytest.raises(ValueError, match="invalid example_ids"):
        model.fit(ids_rep, y, epochs=1, batch_size=32, verbose=0)
    model.fit(ids, y, epochs=1, batch_size=32, verbose=0)  # usable again


# --------------------------------------------------------------------------- case 5a


def _bad_embedding(n=8, d=6):
    x = RNG.normal(size=(n, d)).astype("float32")
    x[1, 2], x[4, 0], x[6, 5] = np.nan, np.inf, -np.inf
    return x


@pytest.mark.tensorflow_only("tf.function(jit_compile=True) around a layer")
def test_embedding_output_is_exactly_binary_under_xla_tf_function():
    """Case 5a: NaN/inf inputs under tf.function(jit_compile=True) still give exact 0/1."""
    import tensorflow as tf

    for eps in (None, 2.0):
        layer = kf.EmbeddingDPLayer(eps, seed=4)
        f = tf.function(lambda x: layer(x, training=True), jit_compile=True)
        out = f(_bad_embedding()).numpy()
        assert np.all((out == 0.0) | (out == 1.0))
        with pytest.raises(ValueError, match="non-finite"):
            layer.check_input_errors()


def test_embedding_output_is_exactly_binary_in_a_jit_compiled_keras_model():
    """Case 5a: the same inside a Keras model compiled with jit_compile=True; a
    VerticalModel raises on the host after the step."""
    layer = kf.EmbeddingDPLayer(2.0, seed=4)
    model = keras.Sequential([keras.Input((6,)), layer])
    model.compile(loss="mse", jit_compile=True)
    out = model.predict(_bad_embedding(), verbose=0)
    assert np.all((out == 0.0) | (out == 1.0))
    with pytest.raises(ValueError, match="non-finite"):
        layer.check_input_errors()
    x, y = _vertical_data(n=32)
    vertical = _vertical(None, jit_compile=True, embedding_dp=kf.EmbeddingDPLayer(2.0, seed=1))
    x["party_a"][3, 1] = np.nan  # the follower's embedding of row 3 is NaN
    with pytest.raises(ValueError, match="non-finite"):
        vertical.fit(x, y, epochs=1, batch_size=32, verbose=0)


# --------------------------------------------------------------------------- case 9


def test_label_error_does_not_dump_the_labels():
    """Case 9: a bad row among 1000 labels: the error names the argument and row only."""
    layer = kf.LabelDPLayer(eps=1.0, mode="onehot", seed=1)
    y = np.zeros((1000, 3), "float32")
    y[:, 0] = 1
    y[np.arange(1000) % 7 == 3] = [0, 0, 1]
    y[500] = [0.25, 0.75, 0.0]
    prior = np.full((1000, 3), 0.123456, "float32")
    with pytest.raises(ValueError) as info:
        layer(y, example_ids=np.arange(1000) * 3 + 987654, prior=prior, training=True)
    text = str(info.value)
    assert "row 500" in text and "onehot" in text
    assert "Arguments received" not in text
    assert "0.123456" not in text and "987657" not in text  # no prior, no ids


def test_embedding_error_does_not_dump_the_embedding():
    """Case 9: a NaN in a 1000-row embedding inside a model: only that one value is shown."""
    x = np.full((1000, 4), 12345.678, "float32")
    x[700, 2] = np.nan
    layer = kf.EmbeddingDPLayer(2.0, seed=1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Identity(), layer])
    for call in (lambda: layer(x, training=True), lambda: model(x, training=True)):
        with pytest.raises(ValueError) as info:
            call()
        text = str(info.value)
        assert "(700, 2)" in text and "non-finite" in text
        assert "12345" not in text and "Arguments received" not in text


# --------------------------------------------------------------------------- case 11

_SERVE = """
import sys, numpy as np, tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
serve = tf.function(loaded.serve, jit_compile=True)
out = serve(tf.ones((8, 6))).numpy()
print("BITS=" + "".join(str(int(b)) for b in out.reshape(-1)))
"""


@pytest.mark.tensorflow_only("SavedModel export")
def test_unseeded_export_gets_a_fresh_key_in_every_serving_process(tmp_path):
    """Case 11: two serving processes of one unseeded export (XLA-compiled serving
    function) must not send the same noise."""
    import subprocess
    import sys
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(64),
                              kf.EmbeddingDPLayer(0.0, name="edp")])
    path = os.path.join(tmp_path, "sm")
    model.export(path, verbose=False)
    root = os.path.dirname(os.path.dirname(os.path.abspath(kf.__file__)))
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3")
    outs = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", _SERVE, path], env=env, capture_output=True,
                             text=True, timeout=300, check=True)
        bits = [line for line in run.stdout.splitlines() if line.startswith("BITS=")][0][5:]
        outs.append(np.array([int(c) for c in bits]))
    assert outs[0].size == 8 * 64
    assert np.mean(outs[0] != outs[1]) > 0.3  # eps=0: independent fair coins differ half the time


@pytest.mark.tensorflow_only("SavedModel export")
def test_unseeded_export_key_is_set_at_load(tmp_path):
    """Case 11: the loaded key is set (flag 1, fresh words) before any call, differs per
    load, and a seeded export keeps its key."""
    import tensorflow as tf

    for seed in (None, 99):
        layer = kf.EmbeddingDPLayer(0.0, seed=seed, name="edp")
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(64), layer])
        path = os.path.join(tmp_path, f"sm_{seed}")
        model.export(path, verbose=False)
        keys = []
        for _ in range(2):
            loaded = tf.saved_model.load(path)
            keys.append([v.numpy() for v in loaded._all_variables if "rng_key" in v.name][0])
        if seed is None:
            assert keys[0][2] == 1 and keys[1][2] == 1
            assert not np.array_equal(keys[0][:2], keys[1][:2])
        else:
            np.testing.assert_array_equal(keys[0], layer.rng_key.numpy())
            np.testing.assert_array_equal(keys[1], layer.rng_key.numpy())
