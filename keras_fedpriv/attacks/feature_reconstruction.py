"""Feature reconstruction from embeddings (UnSplit-style model inversion).

In vertical FL the leader receives a follower's embedding of every example.
If the leader also knows the follower's raw features for some *auxiliary*
rows (a leaked or public subset, or examples both parties hold), it can train
an inverse decoder ``embedding -> features`` on those rows and apply it to
every other embedding it receives. `feature_reconstruction` runs that attack
and measures how much better the decoder does than the trivial guess (the
per-column mean of the auxiliary features).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.attacks.label_inference import as_float_matrix
from keras_fedpriv.mechanisms.validation import (
    validate_int_sequence,
    validate_positive_int,
    validate_seed,
)

__all__ = ["ReconstructionResult", "feature_reconstruction"]


@dataclasses.dataclass(frozen=True, eq=False)
class ReconstructionResult:
    """Outcome of `feature_reconstruction` on the held-out test rows.

    Attributes:
        relative_mse: ``sum of squared errors of the decoder / sum of squared
            errors of predicting the aux per-column mean``, both summed over
            all test rows and all feature columns. 1.0 = the decoder learned
            nothing beyond the mean; 0.0 = exact reconstruction; lower = more
            leakage. Because the sums run over all columns, columns with a
            larger scale weigh more: standardize the features first if every
            feature should count the same (or read ``per_feature_relative_mse``,
            which is scale-free column by column). Can exceed 1 (a decoder
            worse than the mean).
        mse: mean squared error of the reconstruction (over rows and columns,
            on the caller's scale).
        baseline_mse: mean squared error of predicting the aux per-column mean.
        per_feature_relative_mse: float64 (f,) array, column ``j``'s decoder
            SSE / baseline SSE; NaN for a column whose baseline SSE is 0 (every
            test value equals the aux mean).
        reconstruction: float32 (N_test, f) array, the decoder's output on the
            test embeddings (read only).
        epochs_trained: epochs run before early stopping (or ``epochs``).
    """

    relative_mse: float
    mse: float
    baseline_mse: float
    per_feature_relative_mse: np.ndarray
    reconstruction: np.ndarray
    epochs_trained: int

    def __float__(self):
        return float(self.relative_mse)


def _standardizer(array):
    mean = array.mean(axis=0)
    std = array.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return mean, std


def _shuffled_batches(keras, x, y, batch_size, seed):
    """A `keras.utils.PyDataset` of ``(x, y)`` batches, the rows reshuffled every epoch by a
    numpy generator of ``seed`` (on any Keras backend; no global RNG)."""

    class ShuffledBatches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.rng = np.random.default_rng(seed)
            self.order = self.rng.permutation(len(x))

        def __len__(self):
            return -(-len(x) // batch_size)

        def __getitem__(self, index):
            rows = self.order[index * batch_size:(index + 1) * batch_size]
            return x[rows], y[rows]

        def on_epoch_end(self):
            self.order = self.rng.permutation(len(x))

    return ShuffledBatches()


def feature_reconstruction(embeddings_aux: ArrayLike, features_aux: ArrayLike,
                           embeddings_test: ArrayLike, features_test: ArrayLike,
                           hidden_units: Sequence[int] = (64, 64), epochs: int = 100,
                           batch_size: int = 64, seed: int | None = None, verbose: int = 0, *,
                           validation_split: float = 0.2, patience: int = 10,
                           learning_rate: float = 1e-3) -> ReconstructionResult:
    """Train an inverse decoder embeddings -> features on aux rows; score it on test rows.

    The attacker (the leader) knows the follower's features ``features_aux``
    for the auxiliary rows and sees the embeddings (protected or not) of all
    rows. It fits a Keras MLP decoder (ReLU hidden layers, linear output, MSE
    loss, Adam) on the aux rows, early-stopping on a random
    ``validation_split`` of them (the best weights are restored), then
    reconstructs ``features_test`` from ``embeddings_test``.

    Inside, inputs and targets are standardized with the aux rows' per-column
    mean and standard deviation (the attacker knows both; it only helps the
    optimizer); every reported number is on the caller's scale. Computation is
    float32; the metrics are accumulated in float64.

    Determinism: with an int ``seed`` the result is reproducible (on the same
    machine, Keras backend and build): the decoder's initializers, the
    train/validation split and the per-epoch shuffle of the training rows all
    take seeds derived from it explicitly. No global RNG is seeded, changed or
    read. ``seed=None`` draws a fresh seed.

    Args:
        embeddings_aux: (N_aux, e) embeddings of the auxiliary rows.
        features_aux: (N_aux, f) the follower's features of the same rows.
        embeddings_test: (N_test, e) embeddings of the held-out rows.
        features_test: (N_test, f) their true features (only for scoring).
        hidden_units: widths of the decoder's hidden layers; ``()`` gives a
            linear decoder.
        epochs: maximum number of training epochs (early stopping may stop
            sooner).
        batch_size: training batch size.
        seed: None or a non-negative int (see Determinism).
        verbose: passed to ``model.fit``.
        validation_split: fraction of the aux rows held out for early stopping,
            in (0, 1); at least one row is held out and one kept.
        patience: early-stopping patience in epochs (on the validation MSE).
        learning_rate: Adam learning rate.

    Returns:
        A `ReconstructionResult` (``relative_mse``: 1.0 = nothing learned,
        lower = more leakage).

    Raises:
        ValueError: non-rank-2 inputs, mismatched row counts or widths, NaN or
            inf, fewer than 2 aux rows, bad hyper-parameters, or test features
            that all equal the aux mean (the baseline is 0).
        TypeError: non-integer ``epochs``/``batch_size``/``seed``/``patience``.

    Example:
        >>> res = feature_reconstruction(h[:800], x[:800], h[800:], x[800:], seed=0)
        >>> res.relative_mse      # e.g. 0.05: the embeddings reveal the features
    """
    e_aux, f_aux, e_test, f_test = _check_rows(embeddings_aux, features_aux, embeddings_test,
                                               features_test)
    units = validate_int_sequence(hidden_units, "hidden_units", what="layer widths")
    epochs = validate_positive_int(epochs, "epochs")
    batch_size = validate_positive_int(batch_size, "batch_size")
    patience = validate_positive_int(patience, "patience", minimum=0)
    seed = validate_seed(seed)
    _check_rates(validation_split, learning_rate)

    # Baseline: the attacker's trivial guess, the aux per-column mean.
    base_col = ((f_test - f_aux.mean(axis=0)) ** 2).sum(axis=0)
    if base_col.sum() == 0:
        raise ValueError("`features_test`: every test value equals the aux per-column mean, so "
                         "the baseline error is 0 and the relative MSE is undefined.")

    import keras

    rng = np.random.default_rng(seed)
    layer_seeds = [int(s) for s in rng.integers(0, 2**31 - 1, size=len(units) + 1)]
    shuffle_seed = int(rng.integers(0, 2**31 - 1))
    order = rng.permutation(len(e_aux))
    n_val = min(len(e_aux) - 1, max(1, int(round(validation_split * len(e_aux)))))
    val_idx, train_idx = order[:n_val], order[n_val:]

    e_mean, e_std = _standardizer(e_aux)
    f_mean, f_std = _standardizer(f_aux)
    x_all = ((e_aux - e_mean) / e_std).astype(np.float32)
    y_all = ((f_aux - f_mean) / f_std).astype(np.float32)
    x_test = ((e_test - e_mean) / e_std).astype(np.float32)

    decoder = _decoder(keras, e_aux.shape[1], f_aux.shape[1], units, layer_seeds, learning_rate)
    train = _shuffled_batches(keras, x_all[train_idx], y_all[train_idx], batch_size,
                              shuffle_seed)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=patience,
                                         restore_best_weights=True)
    history = decoder.fit(train, validation_data=(x_all[val_idx], y_all[val_idx]),
                          validation_batch_size=max(batch_size, 256),
                          epochs=epochs, callbacks=[stop], verbose=verbose, shuffle=False)

    pred_std = np.asarray(decoder.predict(x_test, batch_size=max(batch_size, 256), verbose=0))
    return _scored(pred_std.astype(np.float64) * f_std + f_mean, f_test, base_col,
                   epochs_trained=len(history.history.get("loss", [])))


def _check_rows(embeddings_aux, features_aux, embeddings_test, features_test):
    """The four inputs as float64 matrices, with matching row counts and widths."""
    e_aux = as_float_matrix(embeddings_aux, "embeddings_aux")
    f_aux = as_float_matrix(features_aux, "features_aux")
    e_test = as_float_matrix(embeddings_test, "embeddings_test")
    f_test = as_float_matrix(features_test, "features_test")
    if f_aux.shape[0] != e_aux.shape[0]:
        raise ValueError(f"`features_aux` has {f_aux.shape[0]} rows but `embeddings_aux` has "
                         f"{e_aux.shape[0]}; they must describe the same examples.")
    if f_test.shape[0] != e_test.shape[0]:
        raise ValueError(f"`features_test` has {f_test.shape[0]} rows but `embeddings_test` has "
                         f"{e_test.shape[0]}; they must describe the same examples.")
    if e_test.shape[1] != e_aux.shape[1]:
        raise ValueError(f"`embeddings_test` has width {e_test.shape[1]} but `embeddings_aux` has "
                         f"{e_aux.shape[1]}; both must be (N, e) with the same e.")
    if f_test.shape[1] != f_aux.shape[1]:
        raise ValueError(f"`features_test` has width {f_test.shape[1]} but `features_aux` has "
                         f"{f_aux.shape[1]}; both must be (N, f) with the same f.")
    if e_aux.shape[0] < 2:
        raise ValueError(f"`embeddings_aux` must have at least 2 rows (one to train on, one for "
                         f"early stopping); got {e_aux.shape[0]}.")
    return e_aux, f_aux, e_test, f_test


def _check_rates(validation_split, learning_rate):
    if isinstance(validation_split, (bool, np.bool_)) or \
            not isinstance(validation_split, numbers.Real) or not 0 < validation_split < 1:
        raise ValueError(f"`validation_split` must be a number in (0, 1); got "
                         f"{validation_split!r}.")
    if isinstance(learning_rate, (bool, np.bool_)) or not isinstance(learning_rate, numbers.Real) \
            or not np.isfinite(learning_rate) or learning_rate <= 0:
        raise ValueError(f"`learning_rate` must be a finite number > 0; got {learning_rate!r}.")


def _decoder(keras, width_in, width_out, units, layer_seeds, learning_rate):
    """The compiled MLP decoder: ReLU hidden layers, linear output, MSE, Adam; seeded inits."""
    layers = [keras.Input((width_in,), dtype="float32")]
    for width, s in zip(units, layer_seeds):
        layers.append(keras.layers.Dense(
            width, activation="relu", dtype="float32",
            kernel_initializer=keras.initializers.GlorotUniform(seed=s)))
    layers.append(keras.layers.Dense(
        width_out, dtype="float32",
        kernel_initializer=keras.initializers.GlorotUniform(seed=layer_seeds[-1])))
    decoder = keras.Sequential(layers, name="inverse_decoder")
    decoder.compile(optimizer=keras.optimizers.Adam(learning_rate=float(learning_rate)),
                    loss="mse")
    return decoder


def _scored(reconstruction, f_test, base_col, epochs_trained):
    """The `ReconstructionResult` of a float64 reconstruction against the true test rows."""
    sse_col = ((reconstruction - f_test) ** 2).sum(axis=0)
    count = f_test.size
    with np.errstate(divide="ignore", invalid="ignore"):
        per_feature = np.where(base_col > 0, sse_col / np.where(base_col > 0, base_col, 1.0),
                               np.nan)
    per_feature.setflags(write=False)
    reconstruction = reconstruction.astype(np.float32)
    reconstruction.setflags(write=False)
    return ReconstructionResult(
        relative_mse=float(sse_col.sum() / base_col.sum()),
        mse=float(sse_col.sum() / count),
        baseline_mse=float(base_col.sum() / count),
        per_feature_relative_mse=per_feature,
        reconstruction=reconstruction,
        epochs_trained=epochs_trained,
    )
