"""Digits and a small MLP, for the horizontal-FL tests (faster than `keras_fedpriv.datasets`)."""

import keras
import numpy as np
from sklearn.datasets import load_digits


def digits():
    """All 1797 bundled digits: features scaled to [0, 1] (float32), labels 0-9 (int)."""
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y


def digits_model(seed=0, lr=0.1, optimizer=None):
    """A seeded 64-16-10 MLP (logits), compiled with ``optimizer`` or SGD(lr), with accuracy."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer or keras.optimizers.SGD(lr),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model
