"""Clear errors on common mistakes: label_dp vs labels and top size in VerticalModel, and
the wrong container type for partition / privatize_labels / privatize_dataset."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_fedpriv as kf
from keras_fedpriv.federated import VerticalModel, partition, with_example_ids


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
        model.fit(x, tf.constant(y), epochs=1, batch_size=16, verbose=0)


def test_fit_with_a_dataset_gives_a_short_error_with_the_hint():
    model = _model(3, kf.LabelDPLayer(eps=2.0, seed=0))
    model.compile("adam", "sparse_categorical_crossentropy")
    x, y = _data()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
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
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)


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
    return tf.data.Dataset.from_tensor_slices((np.zeros((6, 2), "float32"),
                                               np.array([0, 1] * 3)))


def test_partition_refuses_a_dataset():
    with pytest.raises(TypeError, match=r"partition: `x` must be an array .*got a "
                                        r"\w*Dataset.*Split the arrays"):
        partition(_dataset(), None, num_clients=2)
    with pytest.raises(TypeError, match="partition: `y` must be an array"):
        partition(np.zeros((6, 2)), _dataset(), num_clients=2)
    with pytest.raises(TypeError, match="`x` must be an array with one row per example; got a "
                                        "scalar of type int"):
        partition(3, np.zeros(3), num_clients=2)


def test_privatize_labels_refuses_a_dataset():
    with pytest.raises(TypeError, match=r"privatize_labels: `labels` must be an array .*got a "
                                        r"\w*Dataset.*use keras_fedpriv.privatize_dataset"):
        kf.privatize_labels(_dataset(), eps=1.0)


def test_privatize_dataset_refuses_an_array():
    with pytest.raises(TypeError, match="privatize_dataset: `dataset` must be a tf.data.Dataset; "
                                        "got a ndarray.*privatize_labels"):
        kf.privatize_dataset(np.array([0, 1, 1]), eps=1.0)
    with pytest.raises(TypeError, match="got a tuple"):
        kf.privatize_dataset((np.zeros((3, 2)), np.array([0, 1, 1])), eps=1.0)
