"""In-graph release counting of the protection layers (keras_fedpriv/layers/release_counter.py)."""

import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.layers import release_counter as rc

pytestmark = [pytest.mark.jax]

X = np.ones((4, 3), "float32")


def _totals(layer):
    return dict(zip(rc.SLOTS, layer._release_totals().tolist()))


def test_fresh_releases_are_counted_per_example_id():
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    layer(X, training=True, example_ids=np.array([0, 1, 2, 3]))
    layer(X, training=True, example_ids=np.array([2, 3, 4, 5]))
    ids, counts = layer._release_id_counts_nonzero()
    assert dict(zip(ids.tolist(), counts.tolist())) == {0: 1, 1: 1, 2: 2, 3: 2, 4: 1, 5: 1}
    totals = _totals(layer)
    assert totals["fresh_with_ids"] == 2 and totals["fresh_without_ids"] == 0
    assert totals["max_coordinates"] == 3 and totals["folded"] == 0


def test_a_call_without_ids_counts_for_every_example():
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    layer(X, training=True)
    assert _totals(layer)["fresh_without_ids"] == 1
    assert layer._release_id_counts_nonzero()[0].size == 0
    ledger = layer.privacy_ledger()
    (kind,) = ledger.kinds
    assert ledger.total(kind) == 1 and ledger.units_seen(kind) == 0


@pytest.mark.tensorflow_only("a tf.function graph call with fewer ids than rows")
def test_ids_that_do_not_name_every_row_count_for_every_example():
    import tensorflow as tf

    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    tf.function(lambda x, i: layer(x, training=True, example_ids=i))(
        tf.constant(X), tf.constant([0, 1], tf.int64))
    totals = _totals(layer)
    assert totals["fresh_without_ids"] == 1 and totals["fresh_with_ids"] == 0
    assert layer._release_id_counts_nonzero()[0].size == 0


def test_ids_outside_the_capacity_fold_and_say_so():
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    big = rc.ID_CAPACITY + 7
    layer(X, training=True, example_ids=np.array([7, big, 8, 9], "int64"))
    assert _totals(layer)["folded"] == 1
    ids, counts = layer._release_id_counts_nonzero()
    assert dict(zip(ids.tolist(), counts.tolist())) == {7: 2, 8: 1, 9: 1}  # 7 and big share
    ledger = layer.privacy_ledger()
    (kind,) = ledger.kinds
    assert ledger.is_approximate(kind) and ledger.total(kind) == 2


def test_the_largest_row_size_is_kept():
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    for width in (5, 2, 9, 3):
        layer(np.ones((2, width), "float32"), training=True)
    assert _totals(layer)["max_coordinates"] == 9


@pytest.mark.tensorflow_only("tf.function(jit_compile=True) and tf.data maps")
def test_counting_runs_inside_xla_and_tf_data():
    import tensorflow as tf

    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    step = tf.function(lambda x, i: layer(x, training=True, example_ids=i), jit_compile=True)
    step(tf.constant(X), tf.constant([0, 1, 2, 3], tf.int64))
    ds = tf.data.Dataset.from_tensor_slices((X, np.arange(4, dtype="int64"))).batch(2)
    for _ in ds.map(lambda x, i: layer(x, training=True, example_ids=i)):
        pass
    ids, counts = layer._release_id_counts_nonzero()
    assert ids.tolist() == [0, 1, 2, 3] and counts.tolist() == [2, 2, 2, 2]
    assert _totals(layer)["fresh_with_ids"] == 3


def test_keyed_releases_count_one_key_generation_per_key():
    layer = kf.LabelDPLayer(1.0)
    y = np.array([0, 1, 1, 0], "float32")
    for _ in range(3):
        layer(y, example_ids=np.arange(4), training=True)
    totals = _totals(layer)
    assert totals["keyed_once"] == 3 and totals["key_generations"] == 1


def test_reset_forgets_every_count():
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    layer(X, training=True, example_ids=np.arange(4))
    lineage = _totals(layer)["lineage"]
    layer.reset_release_counts()
    totals = _totals(layer)
    assert totals.pop("lineage") not in (0, lineage)  # a new lineage: old files are another's
    assert not any(totals.values())
    assert layer._release_id_counts_nonzero()[0].size == 0
    assert len(layer.privacy_ledger()) == 0


@pytest.mark.parametrize("with_ids", [True, False])
def test_counts_travel_through_save_own_variables(with_ids):
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    layer(X, training=True, example_ids=np.arange(4) if with_ids else None)
    store = {}
    layer.save_own_variables(store)
    clone = kf.EmbeddingDPLayer(1.0, seed=1)
    clone.build((None, 3))
    clone.load_own_variables(store)
    ours, theirs = _totals(clone), _totals(layer)
    assert ours.pop("lineage") != theirs.pop("lineage")  # the clone keeps its own lineage
    assert ours == theirs
    np.testing.assert_array_equal(clone._release_id_counts_nonzero()[1],
                                  layer._release_id_counts_nonzero()[1])


def test_release_calls_names_the_release_slots():
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    assert layer.release_calls() == {name: 0 for name in ("fresh_with_ids", "fresh_without_ids",
                                                          "keyed_once", "non_private", "prior",
                                                          "key_generations")}
    layer(X, training=True, example_ids=np.arange(4))
    layer(X, training=True)
    layer(X, training=True)
    calls = layer.release_calls()
    assert (calls["fresh_with_ids"], calls["fresh_without_ids"]) == (1, 2)
    assert "max_coordinates" not in calls and "lineage" not in calls


@pytest.mark.tensorflow_only("tf.function(jit_compile=True) and tf.data maps")
def test_the_running_maximum_follows_the_busiest_example_in_every_execution_path():
    """``release_id_max`` is updated by the counting call from its own ids (eager, XLA,
    tf.data), equals the table's maximum, and bounds the ledger within `busiest_bound`."""
    import tensorflow as tf

    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    assert layer.release_id_max() == 0
    layer(X, training=True, example_ids=np.array([0, 1, 2, 3]))
    assert layer.release_id_max() == 1
    step = tf.function(lambda x, i: layer(x, training=True, example_ids=i), jit_compile=True)
    step(tf.constant(X), tf.constant([2, 2, 5, 6], tf.int64))  # id 2 twice in one call
    assert layer.release_id_max() == 3
    ds = tf.data.Dataset.from_tensor_slices((X, np.array([7, 8, 9, 2], "int64"))).batch(4)
    for _ in ds.map(lambda x, i: layer(x, training=True, example_ids=i)):
        pass
    assert layer.release_id_max() == 4
    layer(X, training=True, example_ids=np.array([10, 11, 12, 13]))  # below the maximum
    assert layer.release_id_max() == 4 == int(layer._release_id_counts_nonzero()[1].max())
    layer(X, training=True)  # without ids: counted for every example, not in the maximum
    assert layer.release_id_max() == 4
    exact = layer.privacy_ledger()
    with rc.busiest_bound():
        bound = layer.privacy_ledger()
    (kind,) = exact.kinds
    assert bound.total(kind) == exact.total(kind) == 5 and bound.units_seen(kind) == 1
    assert exact.units_seen(kind) == 13
    layer.reset_release_counts()
    assert layer.release_id_max() == 0


def test_counts_loaded_from_a_file_raise_the_running_maximum():
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    for _ in range(3):
        layer(X, training=True, example_ids=np.arange(4))
    store = {}
    layer.save_own_variables(store)
    clone = kf.EmbeddingDPLayer(1.0, seed=1)
    clone.build((None, 3))
    assert clone.release_id_max() == 0
    clone.load_own_variables(store)
    assert clone.release_id_max() == 3
    clone(X, training=True, example_ids=np.arange(2, 6))
    assert clone.release_id_max() == 4


def test_a_snapshot_restored_into_a_copy_raises_its_running_maximum():
    """`restore` of a snapshot puts the per-example table in place from the host: the copy's
    maximum is the snapshot's at once (3), not 1 until the table is next read."""
    from keras_fedpriv.layers.local_state import restore, snapshot

    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    for _ in range(3):
        layer(X, training=True, example_ids=np.arange(4))
    taken = snapshot([layer])
    copy = kf.EmbeddingDPLayer(1.0, seed=2)
    copy(X, training=True, example_ids=np.arange(4, 8))
    restore([copy], taken)
    assert copy.release_id_max() == 3
    restore([copy], taken.to_state())  # the dict form (load_local_state) likewise
    assert copy.release_id_max() == 3


@pytest.mark.tensorflow_only("simulates a concurrent graph call through the variable's "
                             "numpy/read_value; a JAX variable changes on the host only, "
                             "between steps")
def test_raising_the_maximum_from_the_host_keeps_a_count_made_meanwhile():
    """The host-side raise is an ``assign_add`` of the excess: a call that counts between its
    read and its write (simulated: +5 right after the read) is kept, never overwritten by
    the smaller value (a read-compare-assign would leave 3, below the 6 counted)."""
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    layer(X, training=True, example_ids=np.arange(4))
    variable = layer._release_id_max
    reads = {"numpy": variable.numpy, "read_value": variable.read_value}

    def racing(name):
        def read(*args, **kwargs):
            value = reads[name](*args, **kwargs)
            variable.assign_add(5)  # a concurrent call's count, after this read
            return value
        return read

    variable.numpy = racing("numpy")
    variable.read_value = racing("read_value")
    try:
        layer._raise_id_max_to(3)
    finally:
        del variable.numpy, variable.read_value
    assert layer.release_id_max() >= 6


# -- id capacity --------------------------------------------------------------------------
def _counts(layer):
    ids, counts = layer._release_id_counts_nonzero()
    return dict(zip(ids.tolist(), counts.tolist()))


@pytest.mark.parametrize("cls,args", [(kf.EmbeddingDPLayer, (1.0,)), (kf.LabelDPLayer, (1.0,)),
                                      (kf.VAEBottom, (2,))])
def test_id_capacity_is_checked_by_every_counting_layer(cls, args):
    for bad, error in [("big", TypeError), (1.5, TypeError), (True, TypeError), (0, ValueError),
                       (-5, ValueError), (rc.MAX_ID_CAPACITY + 1, ValueError)]:
        with pytest.raises(error, match=r"`id_capacity` must be an integer in \[1, 268435456\]"):
            cls(*args, id_capacity=bad)
    layer = cls(*args, id_capacity=np.int64(1000))
    assert layer.id_capacity == 1000 and layer.get_config()["id_capacity"] == 1000
    assert cls.from_config(layer.get_config()).id_capacity == 1000
    old = layer.get_config()
    del old["id_capacity"]  # a config saved before the argument existed: today's default
    assert cls.from_config(old).id_capacity == rc.ID_CAPACITY == 2**20
    assert rc.validate_id_capacity(10**8) == 10**8 <= rc.MAX_ID_CAPACITY


def test_the_table_holds_four_bytes_per_id_of_the_capacity():
    """The memory the docs state: ``id_capacity`` int32 slots (4 bytes per id), one table."""
    layer = kf.EmbeddingDPLayer(1.0, seed=1, id_capacity=1000)
    layer(X, training=True, example_ids=np.array([0, 1, 2, 999]))
    table = layer._release_id_counts
    values = np.asarray(table.numpy())
    assert tuple(table.shape) == (1000,) and values.dtype == np.int32 and values.nbytes == 4000


def test_ids_near_a_large_capacity_are_counted_exactly():
    """A 2**24 + 3 capacity (64 MiB, the largest a test allocates; 10**8 takes 400 MB and
    counts the same way): ids just below it count exactly, the next one folds and says so."""
    capacity = 2**24 + 3
    layer = kf.EmbeddingDPLayer(1.0, seed=1, id_capacity=capacity)
    top = capacity - 1
    for ids in ([top - 3, top - 2, top - 1, top], [top, top - 1, 0, 5], [top, 7, 8, 9]):
        layer(X, training=True, example_ids=np.array(ids, "int64"))
    assert _counts(layer) == {top - 3: 1, top - 2: 1, top - 1: 2, top: 3, 0: 1, 5: 1, 7: 1, 8: 1,
                              9: 1}
    assert _totals(layer)["folded"] == 0 and layer.release_id_max() == 3
    (kind,) = layer.privacy_ledger().kinds
    assert not layer.privacy_ledger().is_approximate(kind)
    layer(X, training=True, example_ids=np.array([capacity, 1, 2, 3], "int64"))  # onto slot 0
    assert _totals(layer)["folded"] == 1 and _counts(layer)[0] == 2
    ledger = layer.privacy_ledger()
    assert ledger.is_approximate(kind) and ledger.total(kind) == 3


def test_a_capacity_travels_through_a_keras_file(tmp_path):
    import keras

    layer = kf.EmbeddingDPLayer(1.0, seed=1, id_capacity=5000)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, layer(inputs))
    layer(X, training=True, example_ids=np.array([4999, 4998, 0, 17]))
    path = str(tmp_path / "m.keras")
    model.save(path)
    back = keras.models.load_model(path).layers[-1]
    assert back.id_capacity == 5000 and _counts(back) == {4999: 1, 4998: 1, 0: 1, 17: 1}


def test_counts_saved_with_the_old_2_20_layout_load_exactly_into_a_larger_table():
    old = kf.EmbeddingDPLayer(1.0, seed=1)  # the default: ids in [0, 2**20)
    old(X, training=True, example_ids=np.array([0, 2**20 - 1, 5, 6]))
    store = {}
    old.save_own_variables(store)
    assert store[rc._ID_SLOTS].tolist() == [0, 5, 6, 2**20 - 1]  # sparse: nonzero only
    new = kf.EmbeddingDPLayer(1.0, seed=1, id_capacity=2**21)
    new.build((None, 3))
    new.load_own_variables(store)
    assert _counts(new) == {0: 1, 5: 1, 6: 1, 2**20 - 1: 1} and _totals(new)["folded"] == 0


@pytest.mark.tensorflow_only("tf.function(jit_compile=True), tf.data maps, 64-bit ids in graphs")
def test_a_capacity_counts_inside_xla_and_tf_data():
    import tensorflow as tf

    layer = kf.EmbeddingDPLayer(1.0, seed=1, id_capacity=1000)
    step = tf.function(lambda x, i: layer(x, training=True, example_ids=i), jit_compile=True)
    step(tf.constant(X), tf.constant([996, 997, 998, 999], tf.int64))
    ds = tf.data.Dataset.from_tensor_slices((X, np.array([999, 998, 3, 4], "int64"))).batch(4)
    for _ in ds.map(lambda x, i: layer(x, training=True, example_ids=i)):
        pass
    assert _counts(layer) == {996: 1, 997: 1, 998: 2, 999: 2, 3: 1, 4: 1}
    assert _totals(layer)["folded"] == 0
    step(tf.constant(X), tf.constant([1000 * 2**33 + 999, 5, 6, 7], tf.int64))  # -> slot 999
    assert _totals(layer)["folded"] == 1 and _counts(layer)[999] == 3
