"""Bundled data sets split for federated learning (scikit-learn's, nothing is downloaded).

* `breast_cancer_vertical`: vertical FL, two parties holding different features of the
  same patients (the leader also holds the labels).
* `digits_clients`: horizontal FL, the digits split among many clients (IID or with
  Dirichlet label skew) plus a held-out test set; `digits_mlp` is the model the
  horizontal demo and benchmarks train on it.

The demos, the benchmarks, the examples and the tests take their data from here. A synthetic
Criteo-like click workload of any size (generated, not bundled) is `keras_fedpriv.criteo_like`.

Example:
    >>> xa, xb, y, xa_test, xb_test, y_test = breast_cancer_vertical()
    >>> clients, (x_test, y_test) = digits_clients(num_clients=100, alpha=0.5, seed=0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_fedpriv.federated.partition import partition
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_real

__all__ = ["breast_cancer_vertical", "digits_clients", "digits_mlp"]


def breast_cancer_vertical(num_follower_features: int = 15, test_size: float = 0.3,
                           split_seed: int = 42) -> tuple[np.ndarray, ...]:
    """Breast cancer data for two parties: stratified split, standardized on the training split.

    Args:
        num_follower_features: how many of the 30 features the follower holds (the
            first ones; the leader holds the rest), in [1, 29].
        test_size: the test fraction, in (0, 1).
        split_seed: the train/test split's seed (the same split every call by default).

    Returns:
        ``(xa_train, xb_train, y_train, xa_test, xb_test, y_test)``: the follower's
        features, the leader's features (float32) and float32 labels of shape (N, 1),
        1 = malignant (the 37% minority class, the one label attacks look for).
    """
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    k = validate_positive_int(num_follower_features, "num_follower_features")
    if k > 29:
        raise ValueError(f"`num_follower_features` must be in [1, 29] (the leader keeps at least "
                         f"one of the 30 features); got {num_follower_features!r}.")
    test_size = validate_real(test_size, "test_size", low=0, high=1, low_open=True,
                              high_open=True)
    x, y = load_breast_cancer(return_X_y=True)
    y = 1 - y  # scikit-learn's 1 is benign; here 1 = malignant
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_size, stratify=y, random_state=split_seed)
    scaler = StandardScaler().fit(x_train)  # fitted on the training split only
    x_train = scaler.transform(x_train).astype("float32")
    x_test = scaler.transform(x_test).astype("float32")
    y_train = y_train.astype("float32").reshape(-1, 1)
    y_test = y_test.astype("float32").reshape(-1, 1)
    return (x_train[:, :k], x_train[:, k:], y_train, x_test[:, :k], x_test[:, k:], y_test)


def digits_clients(num_clients: int = 100, alpha: float | None = None, seed: int | None = None,
                   test_size: float = 0.2
                   ) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """Digits (pixels / 16, float32): a stratified test split, the rest among clients.

    Args:
        num_clients: number of clients (integer >= 1).
        alpha: None for an IID split, else Dirichlet(alpha) label skew (see
            `keras_fedpriv.federated.partition`).
        seed: seeds the split among clients (the test split is always the same).
        test_size: the test fraction, in (0, 1).

    Returns:
        ``(clients, (x_test, y_test))`` with ``clients`` a list of ``(x, y)`` pairs.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    test_size = validate_real(test_size, "test_size", low=0, high=1, low_open=True,
                              high_open=True)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, stratify=y,
                                              random_state=0)
    return partition(x_tr, y_tr, num_clients, alpha=alpha, seed=seed), (x_te, y_te)


def digits_mlp(learning_rate: float = 0.05) -> Any:
    """The MLP 64-128-10 (logits) for `digits_clients`, compiled with SGD (the local optimizer).

    Args:
        learning_rate: SGD's learning rate, > 0.

    Returns:
        A compiled `keras.Sequential` with an ``accuracy`` metric.
    """
    import keras

    learning_rate = validate_real(learning_rate, "learning_rate", low=0, low_open=True)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(learning_rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model
