"""The JAX implementation of the backend interface (`keras_fedpriv.backend.jax`).

Runs in the ``KERAS_BACKEND=jax`` pass of ``make test`` (skipped on TensorFlow).
What both backends promise is tested in tests/test_backend.py; here, what is
particular to JAX: the local slots, their int32 storage, the two-word call
counter, and distinct noise on every device under Keras' data parallelism.
"""

import numpy as np
import pytest

import keras

if keras.backend.backend() != "jax":
    pytest.skip("the JAX backend's own tests (KERAS_BACKEND=jax)", allow_module_level=True)

import jax  # noqa: E402

from keras_fedpriv.backend import jax as jax_backend  # noqa: E402
from tests.test_backend import _Flip  # noqa: E402

pytestmark = [pytest.mark.jax]


def test_a_local_slot_is_layer_state_but_no_weight_and_no_seed_generator():
    layer = keras.layers.Layer()
    layer.slot = jax_backend.local_variable(layer, np.arange(3, dtype=np.int64), "counts")
    assert layer.weights == [] and layer.get_weights() == []
    assert [v.name for v in layer.variables] == ["counts"]
    assert layer.slot.dtype == "int32"  # int64 kept as int32 (no x64)
    with pytest.raises(TypeError, match="no seed generator"):
        layer.slot.next()
    with pytest.raises(TypeError, match="never serialized"):
        layer.slot.get_config()


def test_a_value_that_does_not_fit_in_int32_is_refused_not_wrapped():
    with pytest.raises(ValueError, match="int32"):
        jax_backend.local_variable(None, np.array([2**31], np.int64), "too_big")


def test_the_call_counter_carries_into_its_high_word():
    flip = _Flip(seed=1)
    flip.rng_counter.assign(np.array([2**32 - 1, 0], np.uint32))
    before = flip.noise_draws
    flip._next_words((2,))
    assert flip.noise_draws == before + 1 == 2**32
    np.testing.assert_array_equal(flip.rng_counter.numpy(), [0, 1])


def test_a_traced_array_of_sizes_is_refused_as_a_shape():
    flip = _Flip(seed=1)

    @jax.jit
    def draw(sizes):
        return flip._next_words(sizes)

    with pytest.raises(TypeError, match="must be static"):
        draw(jax.numpy.array([2, 3]))


def test_every_device_draws_its_own_noise_under_data_parallelism():
    devices = jax.devices("cpu")
    if len(devices) < 2:
        pytest.skip("needs two CPU devices (tests/conftest.py sets XLA_FLAGS on JAX)")
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices[:2]))
    try:
        x = keras.Input((4,))
        model = keras.Model(x, _Flip(seed=3, name="flip")(x))
        out = model.predict(np.ones((8, 4), "float32"), batch_size=8, verbose=0)
    finally:
        keras.distribution.set_distribution(None)
    first, second = out[:4], out[4:]  # the two devices' shards of one batch
    assert np.all(np.abs(out) == 1.0)
    # 16 independent fair signs per shard: equal halves by chance with probability 2**-16;
    # seeded, so the outcome is fixed
    assert not np.array_equal(first, second)
    assert model.get_layer("flip").noise_draws == 1


def test_keras_state_tree_holds_no_usable_key_and_restoring_it_never_rewinds():
    """``get_state_tree`` / ``set_state_tree`` (what an Orbax checkpoint saves and restores)."""
    from tests.test_backend import _data, _model

    model, flip = _model()
    model.compile("sgd", "mse", jit_compile=True)
    inputs, y = _data(16)
    model.fit(inputs, y, batch_size=8, epochs=1, verbose=0)
    # as numpy arrays, as a checkpoint holds them (on a GPU the next fit donates, and so
    # frees, the backend tensors the default format would return)
    saved = model.get_state_tree(value_format="numpy_array")
    key = flip.rng_key.numpy()[:2]
    stored = [np.asarray(v) for v in jax.tree_util.tree_leaves(saved["non_trainable_variables"])]
    assert not any(np.array_equal(np.asarray(v).reshape(-1)[:2], key) for v in stored
                   if np.size(v) >= 2)  # the key is stored masked by this process's secret
    model.fit(inputs, y, batch_size=8, epochs=1, verbose=0)
    draws, calls = flip.noise_draws, flip.release_calls()
    model.set_state_tree(saved)  # an older state: the counter and counts stay where they are
    assert flip.noise_draws == draws == 4
    assert flip.release_calls() == calls
    np.testing.assert_array_equal(flip.rng_key.numpy()[:2], key)
    ids, counts = flip._release_id_counts_nonzero()
    np.testing.assert_array_equal(counts, np.full(16, 2))


def test_example_ids_beyond_int32_are_refused_before_keras_wraps_them():
    """JAX (no int64) would turn id 5 + 2**32 into 5: two examples would share their
    id-keyed noise (under binary randomized response, y1 XOR y2 would show)."""
    import keras_fedpriv as kf
    from keras_fedpriv.federated.vertical.party import as_example_ids
    from tests.vertical_stubs import compile_model, two_party, two_party_data

    data = two_party_data()
    x = {k: v[:2] for k, v in data["train"].items()}
    x["example_ids"] = np.array([5, 5 + 2**32], np.int64)
    model = compile_model(two_party(label_dp=kf.LabelDPLayer(eps=1.0, seed=1)))
    for call in (lambda: model.fit(x, data["y"][:2], batch_size=1, verbose=0),
                 lambda: model.evaluate(x, data["y"][:2], batch_size=1, verbose=0)):
        with pytest.raises(ValueError, match="`example_ids` must fit in int32.*position 1"):
            call()
    with pytest.raises(ValueError, match="must fit in int32"):
        as_example_ids(x["example_ids"], 2, "Follower.embed")
    np.testing.assert_array_equal(as_example_ids(np.array([5, 6], np.int64), 2, "f"), [5, 6])
