"""Clear errors on common mistakes: label_dp vs labels and top size in VerticalModel, what
VerticalModel.fit / evaluate / predict are given (a non-dict, swapped party arrays, repeated
example ids, evaluation without ids), checked against the quotes in docs/bad_inputs.md, and
the wrong container type for partition / privatize_labels / privatize_dataset."""

import os
import re
import warnings

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.federated import VerticalModel, partition, with_example_ids

pytestmark = [pytest.mark.jax]

#: Whether this process runs on TensorFlow (`tf.data` inputs are tested there only).
ON_TENSORFLOW = keras.backend.backend() == "tensorflow"
TF_DATA = "a tf.data.Dataset input"


def _tf_dataset(*tensors):
    """``tf.data.Dataset.from_tensor_slices(tensors)`` (TensorFlow imported here only)."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(tensors)


def _bottom(d):
    return keras.Sequential([keras.Input((d,)), keras.layers.Dense(4)])


def _model(outputs, label_dp, activation="softmax"):
    top = keras.Sequential([keras.Input((8,)), keras.layers.Dense(outputs, activation=activation)])
    return VerticalModel({"party_a": _bottom(3), "party_b": _bottom(2)}, top, leader="party_b",
                         label_dp=label_dp)


def _data(n=48, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = {"party_a": rng.normal(size=(n, 3)).astype("float32"),
         "party_b": rng.normal(size=(n, 2)).astype("float32")}
    y = np.arange(n) % classes
    return with_example_ids(x), y


# --- label_dp: multi-class labels without mode="sparse" -------------------------------------

def test_fit_with_array_labels_raises_the_eager_message_with_the_hint():
    model = _model(3, kf.LabelDPLayer(eps=2.0, seed=0))  # mode "auto", no num_classes: binary
    model.compile("adam", "sparse_categorical_crossentropy")
    x, y = _data()
    with pytest.raises(ValueError, match="mode='sparse' with num_classes") as info:
        model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    message = str(info.value)
    assert "row 2 has value 2" in message and len(message) < 400
    assert "Traceback" not in message and "node" not in message
    assert model.train_function is None  # nothing was traced: the check ran before Keras
    with pytest.raises(ValueError, match="mode='sparse' with num_classes"):
        model.fit(x, keras.ops.convert_to_tensor(y), epochs=1, batch_size=16, verbose=0)


@pytest.mark.tensorflow_only(TF_DATA)
def test_fit_with_a_dataset_gives_a_short_error_with_the_hint():
    model = _model(3, kf.LabelDPLayer(eps=2.0, seed=0))
    model.compile("adam", "sparse_categorical_crossentropy")
    x, y = _data()
    data = _tf_dataset(x, y).batch(16)
    with pytest.raises(ValueError, match="mode='sparse' with num_classes") as info:
        model.fit(data, epochs=1, verbose=0)
    message = str(info.value)
    assert message.startswith("VerticalModel.fit: LabelDPLayer(mode='binary')")
    assert "row 2 of a training batch" in message and len(message) < 400
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_sparse_labels_with_the_right_settings_train():
    model = _model(3, kf.LabelDPLayer(eps=2.0, mode="sparse", num_classes=3, seed=0))
    model.compile("adam", "sparse_categorical_crossentropy")
    x, y = _data()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    if ON_TENSORFLOW:
        model.fit(_tf_dataset(x, y).batch(16), epochs=1, verbose=0)


def test_array_labels_out_of_range_for_num_classes_are_refused_before_training():
    model = _model(3, kf.LabelDPLayer(eps=2.0, mode="sparse", num_classes=3, seed=0))
    model.compile("adam", "sparse_categorical_crossentropy")
    x, y = _data(classes=4)
    with pytest.raises(ValueError, match=r"integer class ids in \[0, 3\); row 3 has value 3"):
        model.fit(x, y, epochs=1, batch_size=16, verbose=0)


# --- label_dp: number of classes vs the top's outputs ---------------------------------------

def test_num_classes_larger_than_the_top_is_refused_at_construction():
    with pytest.raises(ValueError, match="label_dp has 5 classes but the top model has 3 "
                                         "output"):
        _model(3, kf.LabelDPLayer(eps=2.0, num_classes=5))
    with pytest.raises(ValueError, match="label_dp has 2 classes but the top model has 3 "
                                         r"output.*num_classes=3"):
        _model(3, kf.LabelDPLayer(eps=2.0, mode="binary"))
    with pytest.raises(ValueError, match="has 3 classes but the top model has 4"):
        _model(4, kf.LabelDPLayer(eps=2.0, mode="sparse", num_classes=3))


def test_matching_tops_are_accepted():
    _model(3, kf.LabelDPLayer(eps=2.0, num_classes=3))
    _model(3, kf.LabelDPLayer(eps=2.0, mode="onehot", num_classes=3))
    _model(1, kf.LabelDPLayer(eps=2.0), activation="sigmoid")
    _model(2, kf.LabelDPLayer(eps=2.0, mode="binary"))
    _model(1, kf.LabelDPLayer(eps=2.0, mode="sparse", num_classes=2), activation="sigmoid")
    _model(7, kf.LabelDPLayer(eps=2.0))  # auto without num_classes: checked at fit time


def test_one_hot_labels_wider_than_the_top_are_refused_at_fit():
    model = _model(3, kf.LabelDPLayer(eps=2.0, seed=0))
    model.compile("adam", "categorical_crossentropy")
    x, y = _data(classes=4)
    with pytest.raises(ValueError, match="mode='onehot'.* has 4 classes but the top model has 3"):
        model.fit(x, np.eye(4, dtype="float32")[y], epochs=1, batch_size=16, verbose=0)


# --- wrong containers ---------------------------------------------------------------------------

def _dataset():
    return _tf_dataset(np.zeros((6, 2), "float32"), np.array([0, 1] * 3))


@pytest.mark.tensorflow_only(TF_DATA)
def test_partition_refuses_a_dataset():
    with pytest.raises(TypeError, match=r"partition: `x` must be an array .*got a "
                                        r"\w*Dataset.*Split the arrays"):
        partition(_dataset(), None, num_clients=2)
    with pytest.raises(TypeError, match="partition: `y` must be an array"):
        partition(np.zeros((6, 2)), _dataset(), num_clients=2)
    with pytest.raises(TypeError, match="`x` must be an array with one row per example; got a "
                                        "scalar of type int"):
        partition(3, np.zeros(3), num_clients=2)


@pytest.mark.tensorflow_only(TF_DATA)
def test_privatize_labels_refuses_a_dataset():
    with pytest.raises(TypeError, match=r"privatize_labels: `labels` must be an array .*got a "
                                        r"\w*Dataset.*use keras_fedpriv.privatize_dataset"):
        kf.privatize_labels(_dataset(), eps=1.0)


@pytest.mark.tensorflow_only("privatize_dataset maps a tf.data.Dataset")
def test_privatize_dataset_refuses_an_array():
    with pytest.raises(TypeError, match="privatize_dataset: `dataset` must be a tf.data.Dataset; "
                                        "got a ndarray.*privatize_labels"):
        kf.privatize_dataset(np.array([0, 1, 1]), eps=1.0)
    with pytest.raises(TypeError, match="got a tuple"):
        kf.privatize_dataset((np.zeros((3, 2)), np.array([0, 1, 1])), eps=1.0)


# --- what VerticalModel.fit / evaluate / predict are given (docs/bad_inputs.md) ----------------

def _vertical(jit_compile=False, run_eagerly=False):
    top = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")])
    model = VerticalModel({"party_a": _bottom(3), "party_b": _bottom(2)}, top, leader="party_b",
                          embedding_dp=kf.EmbeddingDPLayer(eps=4.0, seed=1),
                          label_dp=kf.LabelDPLayer(eps=2.0, seed=0, name="label_dp_layer"))
    model.compile("adam", "binary_crossentropy", jit_compile=jit_compile,
                  run_eagerly=run_eagerly)
    return model


def _binary():
    x, y = _data(classes=2)
    return x, y.astype("float32")


def _repeated_ids():
    x, y = _binary()
    ids = np.arange(len(y))
    ids[1] = ids[0]
    return dict(x, example_ids=ids), y


def _raised(call):
    try:
        call()
    except (TypeError, ValueError) as error:
        return error
    raise AssertionError("no error raised")


def _fit(model, x, y=None, **kwargs):
    return lambda: model.fit(x, y, epochs=1, batch_size=16, verbose=0, **kwargs)


def _batched(x, y):
    return _tf_dataset(x, y).batch(16)


def _case_array():
    x, y = _binary()
    return _raised(_fit(_vertical(), np.concatenate([x["party_a"], x["party_b"]], 1), y))


def _case_dataset_of_arrays():
    x, y = _binary()
    return _raised(_fit(_vertical(), _batched(np.concatenate([x["party_a"], x["party_b"]], 1),
                                              y)))


def _case_swapped():
    x, y = _binary()
    return _raised(_fit(_vertical(), dict(x, party_a=x["party_b"], party_b=x["party_a"]), y))


def _case_repeated_ids():
    return _raised(_fit(_vertical(), *_repeated_ids()))


def _case_repeated_ids_dataset():
    return _raised(_fit(_vertical(), _batched(*_repeated_ids())))


def _case_repeated_ids_dataset_xla():
    return _raised(_fit(_vertical(jit_compile=True), _batched(*_repeated_ids())))


def _case_evaluate_without_ids():
    model = _vertical()
    x, y = _binary()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    features = {p: x[p] for p in ("party_a", "party_b")}
    with pytest.warns(UserWarning) as caught:
        model.evaluate(features, y, batch_size=16, verbose=0)
    assert len(caught) == 1  # once per call, not per batch
    return caught[0].message


# (start of the row's first column in docs/bad_inputs.md, the case that produces it)
VERTICAL_CASES = [
    ("`fit(x=<2-D array>)`", _case_array),
    ("a `tf.data.Dataset` of `(array, labels)`", _case_dataset_of_arrays),
    ("party arrays swapped", _case_swapped),
    ("repeated `example_ids` in arrays", _case_repeated_ids),
    ("repeated `example_ids` in a `tf.data.Dataset`", _case_repeated_ids_dataset),
    ("the same dataset with `jit_compile=True`", _case_repeated_ids_dataset_xla),
    ("`evaluate` / `predict` without `example_ids`", _case_evaluate_without_ids),
]


def _doc_rows():
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "bad_inputs.md")
    text = open(path, encoding="utf-8").read()
    table = text.split("<!-- vertical-inputs -->", 1)[1].strip().split("\n\n", 1)[0]
    rows = [line.strip("|").split(" | ") for line in table.splitlines()[2:]]
    return [(cells[0].strip(), cells[1].strip(), re.fullmatch(r"``(.*)``", cells[2].strip())[1])
            for cells in rows]


def test_every_documented_vertical_input_error_has_a_case():
    documented = [mistake for mistake, _, _ in _doc_rows()]
    assert len(documented) == len(VERTICAL_CASES)
    for mistake, (prefix, _) in zip(documented, VERTICAL_CASES):
        assert mistake.startswith(prefix), (mistake, prefix)


@pytest.mark.parametrize("row", [
    pytest.param(row, id=prefix, marks=[pytest.mark.tensorflow_only(TF_DATA)]
                 if "Dataset" in prefix or "same dataset" in prefix else [])
    for row, (prefix, _) in enumerate(VERTICAL_CASES)])
def test_the_docs_quote_what_a_vertical_model_raises(row):
    _, error_type, quote = _doc_rows()[row]
    raised = VERTICAL_CASES[row][1]()
    assert error_type.startswith(f"`{type(raised).__name__}`")
    message = str(raised)
    position = 0
    for part in filter(None, (p.strip() for p in quote.split("..."))):
        found = message.find(part, position)
        assert found >= 0, (part, message)
        position = found + len(part)
    assert position == len(message) or quote.rstrip().endswith("...")  # whole message quoted
    assert "Traceback" not in message and "node" not in message and len(message) < 700
    if isinstance(raised, Exception):
        assert raised.__cause__ is None


def test_wrong_inputs_are_refused_by_evaluate_and_predict_too():
    model = _vertical()
    x, y = _binary()
    swapped = dict(x, party_a=x["party_b"], party_b=x["party_a"])
    for call in (lambda: model.evaluate(swapped, y, verbose=0),
                 lambda: model.predict(swapped, verbose=0)):
        with pytest.raises(ValueError, match=r"\.(evaluate|predict): the features of party "
                                             r"'party_a' must have shape \(batch, 3\)"):
            call()
    with pytest.raises(TypeError, match=r"VerticalModel\.predict: a VerticalModel takes `x` as a "
                                        r"dict \{party name: array\}.*got a list of 2 items"):
        model.predict([x["party_a"], x["party_b"]], verbose=0)
    with pytest.raises(ValueError, match=r"fit \(validation_data\): the features of party"):
        model.fit(x, y, validation_data=(swapped, y), epochs=1, verbose=0)
    assert model.train_function is None  # every refusal came before Keras traced a step


def test_a_traced_step_checks_the_party_shapes_too():
    """Inputs that cannot be read up front (a generator) are checked when the step is traced;
    the eager call path checks them too."""
    model = _vertical()
    x, y = _binary()
    swapped = dict(x, party_a=x["party_b"], party_b=x["party_a"])

    def batches():
        for start in range(0, 48, 16):
            yield ({k: v[start:start + 16] for k, v in swapped.items()}, y[start:start + 16])

    with pytest.raises(ValueError, match="VerticalModel: the features of party 'party_a' must "
                                         r"have shape \(batch, 3\).*got shape \((None|16), 2\)"):
        model.fit(batches(), epochs=1, verbose=0)
    with pytest.raises(ValueError, match="party 'party_a' must have shape"):
        model({p: swapped[p] for p in ("party_a", "party_b")})


@pytest.mark.tensorflow_only(TF_DATA)
def test_repeated_ids_are_refused_when_run_eagerly():
    error = _raised(_fit(_vertical(run_eagerly=True), _batched(*_repeated_ids())))
    assert isinstance(error, ValueError)
    assert "`example_ids` must be unique within a call (one id per example); position 1 " \
           "repeats the id at position 0" in str(error)


def test_the_right_inputs_still_train_evaluate_and_predict_without_a_warning():
    model = _vertical(jit_compile=True)
    x, y = _binary()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    if ON_TENSORFLOW:
        model.fit(_batched(x, y), epochs=1, verbose=0)
    test = with_example_ids({p: x[p] for p in ("party_a", "party_b")}, start=48)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.evaluate(test, y, batch_size=16, verbose=0)
        assert model.predict(test, batch_size=16, verbose=0).shape == (48, 1)


def test_validation_without_ids_names_fit_and_its_fix():
    """fit's validation runs through evaluate: the warning names fit's validation_data and
    how to give it ids, not a model.evaluate call the user never made."""
    model = _vertical()
    x, y = _binary()
    features = {p: x[p] for p in ("party_a", "party_b")}
    with pytest.warns(UserWarning) as caught:
        model.fit(x, y, epochs=1, batch_size=16, verbose=0, validation_data=(features, y))
    (message,) = [str(w.message) for w in caught if "without example ids" in str(w.message)]
    assert message.startswith("VerticalModel.fit (validation_data) ran without example ids")
    assert "validation_data=(with_example_ids(x_val, start=N), y_val)" in message
    with pytest.warns(UserWarning, match=r"^VerticalModel.evaluate ran .*model.evaluate\("):
        model.evaluate(features, y, batch_size=16, verbose=0)  # the flag is reset after fit
