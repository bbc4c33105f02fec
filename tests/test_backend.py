"""The layers' secret random stream and release counts, on every backend.

A minimal layer built on the two mixins (`SecretRandomMixin`,
`ReleaseCounterMixin`) checks what the backend interface promises, on
TensorFlow and on JAX alike: the key, counter and counts are never weights
(``get_weights`` / ``set_weights`` never carry or rewind them), a `.keras`
file holds the counter and the counts but never an unseeded key, a reloaded
layer has a fresh key and continues the counter, a jit-compiled ``fit``
advances the counter once per batch and counts every release, and the
per-call words are uniform and fresh.
"""

import numpy as np
import pytest

import keras
from keras import ops

from keras_fedpriv.backend import impl
from keras_fedpriv.layers import local_state
from keras_fedpriv.layers.release_counter import FRESH_ANON, FRESH_IDS, ReleaseCounterMixin
from keras_fedpriv.layers.secret_rng import SecretRandomMixin
from tests.stats import SIGMAS, assert_rate, assert_uniform

pytestmark = [pytest.mark.jax]


@keras.saving.register_keras_serializable(package="test_backend_state")
class _Flip(ReleaseCounterMixin, SecretRandomMixin, keras.layers.Layer):
    """Negates each input with probability 1/2, from the layer's per-call words (also the
    protection layer of tests/test_horizontal_parties.py and tests/test_jax.py)."""

    _rng_salt = 0x7E57

    def __init__(self, seed=None, **kwargs):
        super().__init__(**kwargs)
        self._init_rng(seed)
        self._init_release_counter()

    def call(self, x, ids=None):
        rows = ops.shape(x)[0]
        words = self._next_words(ops.shape(x))
        self._count_key_generation(rows)
        if ids is not None:
            self._count_release(FRESH_IDS, rows, ids)
        else:  # without ids, a release of every example
            self._count_release(FRESH_ANON, rows)
        return ops.where(ops.less(words, np.uint32(2**31)), -x, x)

    def get_config(self):
        return {**super().get_config(), "seed": self.seed}


def _model(seed=None):
    x = keras.Input((4,))
    ids = keras.Input((), dtype="int32")
    flip = _Flip(seed=seed, name="flip")
    out = keras.layers.Dense(1)(flip(keras.layers.Dense(4)(x), ids))
    return keras.Model([x, ids], out), flip


def _data(n=64):
    rng = np.random.default_rng(0)
    return [rng.random((n, 4)).astype("float32"), np.arange(n, dtype="int32")], rng.random((n, 1))


def test_the_key_counter_and_counts_are_no_weights():
    model, flip = _model()
    assert [w.path for w in model.weights] == [w.path for w in model.trainable_weights]
    assert len(model.get_weights()) == 4  # two Dense layers: kernel and bias
    inputs, _ = _data(8)
    model(inputs)
    before = flip.noise_draws
    model.set_weights(model.get_weights())  # what FL code does between rounds
    assert flip.noise_draws == before == 1
    assert flip.release_calls()["fresh_with_ids"] == 1


def test_jit_fit_advances_the_counter_once_per_batch_and_counts_every_release():
    model, flip = _model(seed=5)
    model.compile("adam", "mse", jit_compile=True)
    inputs, y = _data(64)
    model.fit(inputs, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    assert flip.noise_draws == 16
    calls = flip.release_calls()
    assert calls["fresh_with_ids"] == 16 and calls["key_generations"] == 1
    ids, counts = flip._release_id_counts_nonzero()
    np.testing.assert_array_equal(ids, np.arange(64))
    np.testing.assert_array_equal(counts, np.full(64, 2))
    assert flip.release_id_max() == 2


def test_a_keras_file_holds_the_counts_and_counter_but_never_an_unseeded_key(tmp_path):
    model, flip = _model()
    inputs, _ = _data(8)
    model(inputs)
    model(inputs)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    again = loaded.get_layer("flip")
    assert again.noise_draws == 2  # continues, never replays the original's calls
    assert again.release_calls()["fresh_with_ids"] == 2
    assert not np.array_equal(impl().to_numpy(again.rng_key)[:2],
                              impl().to_numpy(flip.rng_key)[:2])
    key = impl().to_numpy(flip.rng_key)[:2].astype(np.uint32).tobytes()
    assert key not in path.read_bytes()
    weights = tmp_path / "m.weights.h5"
    model.save_weights(weights)
    assert key not in weights.read_bytes()


def test_loading_an_older_file_never_rewinds_the_counter(tmp_path):
    model, flip = _model()
    inputs, _ = _data(8)
    model(inputs)
    path = tmp_path / "early.weights.h5"
    model.save_weights(path)
    for _ in range(3):
        model(inputs)
    model.load_weights(path)
    assert flip.noise_draws == 4


def test_a_snapshot_restores_the_counter_and_counts():
    model, flip = _model(seed=3)
    inputs, _ = _data(8)
    model(inputs)
    snap = local_state.snapshot([flip])
    first = ops.convert_to_numpy(model(inputs))
    local_state.restore([flip], snap)
    assert flip.noise_draws == 1
    assert flip.release_calls()["fresh_with_ids"] == 1
    np.testing.assert_allclose(ops.convert_to_numpy(model(inputs)), first, rtol=1e-6)
    state = local_state.local_state([flip])
    assert {"0/rng_key", "0/rng_counter", "0/release_totals", "0/release_id_slots"} <= set(state)


def test_per_call_words_are_uniform_and_fresh():
    flip = _Flip(seed=11)
    n = 200_000
    words = np.concatenate([ops.convert_to_numpy(flip._next_words((n // 4,)))
                            for _ in range(4)]).astype(np.uint64)
    assert flip.noise_draws == 4
    for bit in (0, 15, 31):
        assert_rate(int(((words >> np.uint64(bit)) & np.uint64(1)).sum()), n, 0.5,
                    f"bit {bit}")
    assert_uniform(np.bincount((words >> np.uint64(28)).astype(np.int64), minlength=16),
                   "top four bits")
    # two calls of 200k words: equal words by chance ~ 200k * 2**-32 < 1e-4 expected
    a, b = (ops.convert_to_numpy(flip._next_words((n,))) for _ in range(2))
    assert np.count_nonzero(a == b) < 10


def test_per_call_normal_noise_has_mean_zero_and_variance_one():
    flip = _Flip(seed=13)
    n = 200_000
    noise = ops.convert_to_numpy(flip._next_normal((n,), "float32")).astype(np.float64)
    assert abs(noise.mean()) < SIGMAS / np.sqrt(n)
    assert abs(noise.var() - 1.0) < SIGMAS * np.sqrt(2.0 / n)


def test_a_seeded_layer_draws_the_same_words_and_distinct_salts_differ():
    a, b = _Flip(seed=21), _Flip(seed=21)
    np.testing.assert_array_equal(ops.convert_to_numpy(a._next_words((64,))),
                                  ops.convert_to_numpy(b._next_words((64,))))

    class _Other(_Flip):
        _rng_salt = 0x0DD

    c = _Other(seed=21)
    assert np.count_nonzero(ops.convert_to_numpy(b._next_words((64,)))
                            == ops.convert_to_numpy(c._next_words((64,)))) < 4


def test_example_ids_key_the_same_words_in_every_call():
    flip = _Flip(seed=8)
    ids = np.array([3, 4, 3], np.int32)
    first = [ops.convert_to_numpy(w) for w in flip._words_for_ids(ids)]
    second = [ops.convert_to_numpy(w) for w in flip._words_for_ids(ids)]
    for u, v in zip(first, second):
        np.testing.assert_array_equal(u, v)
        assert u[0] == u[2] and u[0] != u[1]
    assert flip.noise_draws == 0  # id-keyed words draw nothing from the counter


def test_optimizer_step_applies_a_keras_optimizer_to_the_variables():
    """`optimizer_step` (the gradient-inversion attack's step): the gradients at the
    variables' values go through ``optimizer``, the variables and the step count move, and
    the aux comes back, on either backend."""
    x = keras.Variable(np.array([1.0, -2.0], np.float32))
    optimizer = keras.optimizers.SGD(learning_rate=0.5)

    def grads_and_aux(values, scale):
        return [values[0] * scale], ops.sum(values[0])

    step = impl().optimizer_step(optimizer, [x], grads_and_aux)
    one = ops.convert_to_tensor(np.float32(1.0))
    for expected_aux, expected_x in ((-1.0, [0.5, -1.0]), (-0.5, [0.25, -0.5])):
        aux = step(one)
        np.testing.assert_allclose(ops.convert_to_numpy(aux), expected_aux)
        np.testing.assert_allclose(ops.convert_to_numpy(x), expected_x)
    assert int(ops.convert_to_numpy(optimizer.iterations)) == 2
