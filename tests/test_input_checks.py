"""Input checks that never put user data in an error (keras_fedpriv/layers/input_checks.py)."""

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv import backend
from keras_fedpriv.layers import input_checks as C

pytestmark = [pytest.mark.jax]

SECRET = 0.8712345


def test_keras_does_not_append_the_call_arguments_to_a_layers_error():
    layer = kf.EmbeddingDPLayer(1.0, seed=1)
    x = np.full((2, 3), SECRET, np.float32)
    x[1, 2] = np.nan
    with pytest.raises(ValueError) as caught:
        layer(x, training=True)
    text = str(caught.value)
    assert "non-finite" in text and "Arguments received" not in text
    assert "0.871" not in text and "\x1b[" not in text


def test_the_decorator_passes_results_and_errors_through():
    class Owner:
        @C.private_errors
        def call(self, fail):
            if fail:
                raise KeyError("k")
            return 5

    assert Owner().call(False) == 5
    with pytest.raises(KeyError) as caught:
        Owner().call(True)
    assert caught.value._keras_call_info_injected is True


def test_eager_ids_are_one_per_label_and_unique_and_name_the_position():
    ids, ok, asserts = C.check_example_ids(np.array([5, 9, 2], np.uint8), 3, eager=True)
    assert keras.backend.standardize_dtype(ids.dtype) == backend.impl().EXAMPLE_ID_DTYPE
    assert np.asarray(ids).tolist() == [5, 9, 2] and ok is None
    assert asserts == []
    with pytest.raises(ValueError, match="`example_ids` has 2 entries but there are 3 labels"):
        C.check_example_ids(np.array([1, 2]), 3, eager=True)
    with pytest.raises(ValueError, match="position 3 repeats the id at position 1"):
        C.check_example_ids(np.array([4, 7, 1, 7]), 4, eager=True, owner="X")
    with pytest.raises(TypeError, match="X: `example_ids` must be integers; got dtype float32"):
        C.check_example_ids(np.zeros(2, np.float32), 2, eager=True, owner="X")


@pytest.mark.tensorflow_only("a batch whose size is known only when the graph runs")
def test_graph_ids_give_a_flag_and_asserts_instead_of_raising():
    import tensorflow as tf

    # Under XLA the asserts are compiled away: the flag is what the layer relies on.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int32)],
                 jit_compile=True)
    def flag(ids, n):
        _, ok, _ = C.check_example_ids(ids, n, eager=False)
        return ok

    assert bool(flag(tf.constant([1, 2, 3], tf.int64), 3))
    assert not bool(flag(tf.constant([1, 2, 1], tf.int64), 3))   # repeated
    assert not bool(flag(tf.constant([1, 2], tf.int64), 3))      # too few

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def checked(ids):
        _, _, asserts = C.check_example_ids(ids, tf.constant(3), eager=False)
        with tf.control_dependencies(asserts):
            return tf.identity(ids)

    with pytest.raises(tf.errors.InvalidArgumentError, match="first repeated position"):
        checked(tf.constant([1, 2, 1], tf.int64))


def test_unsigned_ids_stay_distinct_and_ids_too_wide_for_the_backend_are_refused():
    for big in [np.array([2 ** 32 - 1, 2 ** 31, 0], np.uint32),
                np.array([2 ** 64 - 1, 2 ** 63, 0], np.uint64)]:
        if big.dtype == np.uint64 and backend.impl().EXAMPLE_ID_DTYPE == "int32":
            # JAX without x64 compares ids as int32: a wider id would wrap onto another one.
            with pytest.raises(ValueError, match=r"`example_ids` must fit in int32 on Keras' jax "
                                                 r"backend .* position 0 holds an id outside"):
                C.check_example_ids(big, 3, eager=True)
            continue
        ids, _, _ = C.check_example_ids(big, 3, eager=True)
        assert len(set(np.asarray(ids).tolist())) == 3


def test_the_xla_error_counter_raises_once_on_the_host_and_resets():
    layer = kf.LabelDPLayer(1.0, seed=1)
    layer.check_input_errors()  # nothing counted: no error
    layer.input_errors.assign([2, 0])
    with pytest.raises(ValueError, match=r"LabelDPLayer .*invalid labels or prior \(2 call\(s\)\)\. "
                                         r"Those outputs were replaced"):
        layer.check_input_errors()
    layer.check_input_errors()  # reset by the first check
    assert layer.input_errors.numpy().tolist() == [0, 0]


def test_find_repeat_names_the_position_and_the_earlier_one():
    assert C.find_repeat(np.array([4, 1, 2])) is None
    assert C.find_repeat(np.array([7, 1, 2, 7, 1])) == (3, 0)
    assert C.find_repeat(np.array([5, 6, 6, 5])) == (2, 1)


@pytest.mark.tensorflow_only("tf.debugging.Assert: traced JAX code has no run-time assert")
def test_the_graph_assert_of_example_ids_gets_a_short_message():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int32)])
    def checked(ids, n):
        _, _, asserts = C.check_example_ids(ids, n, eager=False)
        with tf.control_dependencies(asserts):
            return tf.identity(ids)

    with pytest.raises(tf.errors.InvalidArgumentError) as repeated:
        checked(tf.constant([3, 9, 3], tf.int64), tf.constant(3))
    assert C.example_ids_assert_message(repeated.value) == (
        "LabelDPLayer: `example_ids` must be unique within a call (one id per example); "
        "position 2 of a batch repeats an earlier id.")
    with pytest.raises(tf.errors.InvalidArgumentError) as count:
        checked(tf.constant([3, 9], tf.int64), tf.constant(4))
    assert C.example_ids_assert_message(count.value) == (
        "LabelDPLayer: `example_ids` must hold exactly one id per label; a batch has 2 ids for "
        "4 labels.")
    assert C.example_ids_assert_message(ValueError("something else")) is None


@pytest.mark.tensorflow_only("tf.debugging.Assert: traced JAX code has no run-time assert")
def test_docs_quote_the_graph_error_of_a_repeated_id():
    """docs/bad_inputs.md quotes what a traced call with a repeated id raises."""
    import os
    import re

    import tensorflow as tf

    path = os.path.join(os.path.dirname(__file__), "..", "docs", "bad_inputs.md")
    text = open(path, encoding="utf-8").read()
    (quote,) = re.findall(r"``(assertion failed: \[LabelDPLayer: [^\n]*?)``", text)
    layer = kf.LabelDPLayer(1.0, seed=1)
    call = tf.function(lambda y, i: layer(y, example_ids=i, training=True),
                       input_signature=[tf.TensorSpec([None]), tf.TensorSpec([None], tf.int64)])
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        call(np.array([0, 1, 1, 0], "float32"), np.array([4, 5, 4, 6]))
    assert quote in str(caught.value)


def test_traced_check_message_shortens_the_finiteness_and_id_checks_only():
    """TensorFlow's text of a failed check (op name, stack) is cut to the layer's own rule."""
    finite = RuntimeError("{{function_node __inference_local_train_12}} EmbeddingDPLayer: "
                          f"{C.NOT_FINITE} : Tensor had NaN values\n\t [[{{node CheckNumerics}}]]")
    assert C.traced_check_message(finite) == f"EmbeddingDPLayer: {C.NOT_FINITE}."
    assert C.traced_check_message(RuntimeError("some other graph error")) is None
    ids = RuntimeError(f"assertion failed: [LabelDPLayer: {C._UNIQUE_RULE}; first repeated "
                       "position:] [3]")
    assert C.traced_check_message(ids) == C.example_ids_assert_message(ids)
    assert "position 3" in C.traced_check_message(ids)
