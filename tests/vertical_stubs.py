"""What the vertical-FL party tests share: breast cancer split among two followers and a leader."""

import keras
import numpy as np

import keras_fedpriv as kf
from keras_fedpriv.datasets import breast_cancer_vertical
from keras_fedpriv.federated import VerticalModel

COLUMNS = {"f1": slice(0, 8), "f2": slice(8, 15)}  # the two followers' share of the 15


def vertical_data():
    """Followers' features (every row, train then test), the leader's xb / y, and example ids."""
    xa, xb, y, xa_t, xb_t, y_t = breast_cancer_vertical()
    n = len(y)
    return {"features": np.concatenate([xa, xa_t]),  # followers hold every row, train and test
            "xb": xb, "y": y, "ids": np.arange(n), "xb_t": xb_t, "y_t": y_t,
            "ids_t": np.arange(n, n + len(y_t))}


def two_party_data():
    """Breast cancer for two parties (party_a, party_b; party_b holds the labels)."""
    xa, xb, y, xa_test, xb_test, y_test = breast_cancer_vertical()  # 15/15 features, standardized
    return dict(train={"party_a": xa, "party_b": xb}, y=y,
                test={"party_a": xa_test, "party_b": xb_test}, y_test=y_test)


def bottom(n_in, d, name, hidden=16, **dense_kwargs):
    inp = keras.Input((n_in,), name=f"{name}_in")
    h = keras.layers.Dense(hidden, activation="relu", name=f"{name}_hidden")(inp)
    return keras.Model(inp, keras.layers.Dense(d, name=f"{name}_emb", **dense_kwargs)(h), name=name)


def top(d_in):
    return keras.Sequential([keras.Input((d_in,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1, activation="sigmoid")], name="top")


def two_party(embedding_dp=None, label_dp=None, d=8, leader="party_b", **kwargs):
    return VerticalModel({"party_a": bottom(15, d, "bottom_a"),
                          "party_b": bottom(15, d, "bottom_b")},
                         top(2 * d), leader=leader, embedding_dp=embedding_dp, label_dp=label_dp,
                         **kwargs)


def compile_model(model, lr=3e-3, **kwargs):
    model.compile(keras.optimizers.Adam(lr), "binary_crossentropy", metrics=["accuracy"], **kwargs)
    return model


def is_zero_one(a):
    """Whether every entry of ``a`` is exactly 0 or 1 (what EmbeddingDPLayer sends)."""
    return bool(np.all((a == 0) | (a == 1)))


def follower_data(data):
    return {p: data["features"][:, c] for p, c in COLUMNS.items()}


def model_fn(embedding_dp="bits", label_dp=True, f2=None):
    """Leader 'lead' with a bottom of its own, followers f1 and f2, LabelDP + EmbeddingDP."""
    keras.utils.set_random_seed(0)

    def party_bottom(k, name):
        return keras.Sequential([keras.Input((k,)), keras.layers.Dense(8, activation="relu"),
                                 keras.layers.Dense(4)], name=name)

    head = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1, activation="sigmoid")])
    protection = {"bits": kf.EmbeddingDPLayer(eps=4.0, seed=3), None: None}[embedding_dp]
    model = VerticalModel({"f1": party_bottom(8, "b1"), "f2": f2 or party_bottom(7, "b2"),
                           "lead": party_bottom(15, "b3")}, head, leader="lead",
                          embedding_dp=protection,
                          label_dp=kf.LabelDPLayer(eps=2.0, seed=4) if label_dp else None)
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
    return model
