"""Shared helpers of the keras-tuner tests: small two-party data and the trial's vertical model."""

import keras
import numpy as np

from keras_fedpriv.federated import VerticalModel, with_example_ids


def vertical_data(n_train, n_val, seed=0):
    """``((x, y), (x_val, y_val))``: party_a holds 6 features, party_b 4 and the labels.

    The training inputs carry example ids (`with_example_ids`), the validation inputs none.
    """
    rng = np.random.default_rng(seed)
    n = n_train + n_val
    xa = rng.normal(size=(n, 6)).astype("float32")
    xb = rng.normal(size=(n, 4)).astype("float32")
    y = (xa[:, 0] + xb[:, 0] > 0).astype("float32")
    train = (with_example_ids({"party_a": xa[:n_train], "party_b": xb[:n_train]}), y[:n_train])
    val = ({"party_a": xa[n_train:], "party_b": xb[n_train:]}, y[n_train:])
    return train, val


def vertical_trial_model(label_dp, lr=0.05, run_eagerly=True):
    """A new compiled `VerticalModel` for one trial (bottoms of 4 units, a sigmoid top).

    Eager by default: the searches run a dozen tiny models, whose tracing would be most of
    the time; the releases counted per trial are the same either way."""
    bottom = lambda n: keras.Sequential([keras.Input((n,)), keras.layers.Dense(4)])  # noqa: E731
    top = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")])
    model = VerticalModel({"party_a": bottom(6), "party_b": bottom(4)}, top, leader="party_b",
                          label_dp=label_dp)
    model.compile(keras.optimizers.Adam(lr), "binary_crossentropy", metrics=["accuracy"],
                  run_eagerly=run_eagerly)
    return model
