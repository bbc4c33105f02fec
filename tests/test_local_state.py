"""Snapshot and restore of what calling a party's layers changes
(keras_fedpriv/layers/local_state.py)."""

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.layers.local_state import load_local_state, local_state, restore, snapshot

pytestmark = [pytest.mark.jax]

X = np.random.default_rng(3).normal(size=(6, 4)).astype("float32")
IDS = np.arange(6, dtype="int64")


def _bottom(seed=5):
    inputs = keras.Input((4,))
    h = keras.layers.Dense(8, kernel_initializer=keras.initializers.GlorotUniform(seed))(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Dropout(0.5, seed=seed)(h)
    return keras.Model(inputs, h)


def _party(seed=5):
    bottom, protection = _bottom(seed), kf.EmbeddingDPLayer(1.0, seed=seed)
    protection.build((None, 8))
    return bottom, protection


def _send(bottom, protection):
    return np.asarray(protection(bottom(X, training=True), training=True, example_ids=IDS))


@pytest.mark.parametrize("take, put", [(snapshot, restore), (local_state, load_local_state)])
def test_restoring_replays_the_same_noise_and_forgets_the_second_release(take, put):
    bottom, protection = _party()
    state = take([bottom, protection])
    first = _send(bottom, protection)
    put([bottom, protection], state)
    again = _send(bottom, protection)
    np.testing.assert_array_equal(first, again)  # same counters, same dropout mask and noise
    put([bottom, protection], state)
    assert protection._release_id_counts_nonzero()[0].size == 0  # back to before the release
    third = _send(bottom, protection)
    np.testing.assert_array_equal(third, first)
    assert not np.array_equal(_send(bottom, protection), first)  # no restore: new draws


def test_the_state_holds_no_trainable_weight_and_the_local_variables():
    bottom, protection = _party()
    _send(bottom, protection)
    state = local_state([bottom, None, protection])
    trainable = [np.asarray(w) for w in bottom.trainable_weights]
    for value in state.values():
        assert not any(value.shape == w.shape and np.array_equal(value, w) for w in trainable)
    suffixes = {name.split("/", 1)[1] for name in state if not name.startswith("keras/")}
    assert {"rng_key", "rng_counter", "release_totals", "key_used",
            "release_id_slots", "release_id_values"} <= suffixes
    moving = [v for v in bottom.non_trainable_weights if "moving_mean" in v.path]
    assert any(np.array_equal(value, np.asarray(moving[0])) for value in state.values())


def test_a_copy_built_elsewhere_loads_the_state_and_continues_the_same_stream():
    bottom, protection = _party(seed=5)
    _send(bottom, protection)
    state = {name: value.reshape(-1) if value.ndim == 0 else value  # a transport's (1,) arrays
             for name, value in local_state([bottom, protection]).items()}
    copy_bottom, copy_protection = _party(seed=99)
    copy_bottom.set_weights(bottom.get_weights())
    load_local_state([copy_bottom, copy_protection], state)
    np.testing.assert_array_equal(_send(copy_bottom, copy_protection), _send(bottom, protection))
    np.testing.assert_array_equal(copy_protection._release_id_counts_nonzero()[1],
                                  protection._release_id_counts_nonzero()[1])


def test_a_state_of_other_layers_is_refused_with_the_missing_name():
    bottom, protection = _party()
    state = local_state([bottom])
    with pytest.raises(ValueError,
                       match=r"load_local_state: the state has no '.*rng_key'.*another"):
        load_local_state([bottom, protection], state)


def test_a_snapshot_does_not_follow_later_updates_and_converts_to_the_dict_format():
    bottom, protection = _party()
    shot = snapshot([bottom, protection])
    before = local_state([bottom, protection])
    _send(bottom, protection)
    converted = shot.to_state()
    assert set(converted) == set(before)
    for name, value in before.items():
        np.testing.assert_array_equal(converted[name], value)


def test_restore_gives_the_variables_their_own_arrays_so_a_snapshot_restores_twice():
    """On JAX a variable holds the array it is assigned and a compiled party step donates
    (frees) its variables' buffers: a restore that handed over the snapshot's own arrays
    would leave the snapshot deleted after the next step."""
    bottom, protection = _party()
    _send(bottom, protection)
    state = snapshot([bottom, protection])
    first = _send(bottom, protection)
    for _ in range(2):
        restore([bottom, protection], state)
        held = {id(a) for a in state.values.values()} | {id(a) for a in state.counts.values()}
        variables = list(bottom.variables) + list(protection.variables)
        assert not {id(getattr(v, "value", v)) for v in variables} & held
        np.testing.assert_array_equal(_send(bottom, protection), first)


def _vae_state_saved_before_it_counted(seed):
    """A VAEBottom's `local_state` as saved before the layer kept release counts."""
    from keras_fedpriv import VAEBottom

    old = VAEBottom(2, hidden_units=(3,), seed=seed)
    old(np.ones((4, 5), "float32"))
    state = local_state([old])
    del state["0/release_totals"], state["0/key_used"]
    return state


def test_a_state_saved_before_a_vae_bottom_counted_loads_into_one_that_has_not_released():
    """No `release_totals` / `key_used`: they load as zero (the new layer's are), and the
    random counter is loaded (the noise goes on from where the saved layer stopped)."""
    from keras_fedpriv import VAEBottom

    state = _vae_state_saved_before_it_counted(seed=4)
    fresh = VAEBottom(2, hidden_units=(3,), seed=4)
    fresh.build((None, 5))
    load_local_state([fresh], state)
    assert not any(fresh.release_calls().values())
    assert np.array_equal(fresh.rng_counter.numpy(), np.reshape(state["0/rng_counter"],
                                                                 fresh.rng_counter.shape))


def test_a_state_without_release_counts_is_refused_by_a_layer_that_has_released():
    """Loading it would zero the counts of a VAEBottom that has released: refused, naming
    the missing entry and the layer, and nothing is changed; another missing entry is
    still a structure mismatch."""
    from keras_fedpriv import VAEBottom

    state = _vae_state_saved_before_it_counted(seed=4)
    used = VAEBottom(2, hidden_units=(3,), seed=5, name="used_vae")
    used(np.ones((4, 5), "float32"))
    counter = used.rng_counter.numpy().copy()
    with pytest.raises(ValueError, match="no '0/release_totals'.*'used_vae' has released"):
        load_local_state([used], state)
    assert used.release_calls()["fresh_without_ids"] == 1
    assert np.array_equal(used.rng_counter.numpy(), counter)
    del state["0/rng_counter"]
    with pytest.raises(ValueError, match="another structure"):
        load_local_state([VAEBottom(2, hidden_units=(3,), seed=4)], state)


def test_a_snapshot_without_the_id_counts_leaves_the_table_as_it_is():
    """What a follower's replay takes (it counts nothing per example): the random state and
    totals, never a copy of the per-example table, which restore then leaves alone."""
    bottom, protection = _party()
    _send(bottom, protection)
    state = snapshot([bottom, protection], id_counts=False)
    assert state.counts == {} and "1/release_id_slots" not in state.to_state()
    first = _send(bottom, protection)
    restore([bottom, protection], state)
    np.testing.assert_array_equal(_send(bottom, protection), first)  # the same draws again
    ids, counts = protection._release_id_counts_nonzero()
    assert ids.tolist() == IDS.tolist() and counts.tolist() == [3] * 6  # nothing rewound
