"""What the vertical-FL party tests share: breast cancer split among two followers and a leader."""

import functools

import keras
import numpy as np

import keras_fedpriv as kf
from keras_fedpriv.datasets import breast_cancer_vertical
from keras_fedpriv.federated import VerticalModel

COLUMNS = {"f1": slice(0, 8), "f2": slice(8, 15)}  # the two followers' share of the 15


@functools.lru_cache(maxsize=1)
def vertical_data():
    """Followers' features (every row, train then test), the leader's xb / y, and example ids."""
    xa, xb, y, xa_t, xb_t, y_t = breast_cancer_vertical()
    n = len(y)
    return {"features": np.concatenate([xa, xa_t]),  # followers hold every row, train and test
            "xb": xb, "y": y, "ids": np.arange(n), "xb_t": xb_t, "y_t": y_t,
            "ids_t": np.arange(n, n + len(y_t))}


def follower_data(data):
    return {p: data["features"][:, c] for p, c in COLUMNS.items()}


def model_fn(embedding_dp="bits", label_dp=True, f2=None):
    """Leader 'lead' with a bottom of its own, followers f1 and f2, LabelDP + EmbeddingDP."""
    keras.utils.set_random_seed(0)

    def bottom(k, name):
        return keras.Sequential([keras.Input((k,)), keras.layers.Dense(8, activation="relu"),
                                 keras.layers.Dense(4)], name=name)

    top = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                            keras.layers.Dense(1, activation="sigmoid")])
    protection = {"bits": kf.EmbeddingDPLayer(eps=4.0, seed=3), None: None}[embedding_dp]
    model = VerticalModel({"f1": bottom(8, "b1"), "f2": f2 or bottom(7, "b2"),
                           "lead": bottom(15, "b3")}, top, leader="lead",
                          embedding_dp=protection,
                          label_dp=kf.LabelDPLayer(eps=2.0, seed=4) if label_dp else None)
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
    return model
