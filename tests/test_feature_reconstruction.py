"""Feature reconstruction from a follower's embeddings
(keras_fedpriv/attacks/feature_reconstruction.py)."""

import numpy as np
import pytest
from keras import ops

from keras_fedpriv.attacks import ReconstructionResult, feature_reconstruction

pytestmark = [pytest.mark.jax]


def _reconstruction_data(n=800, f=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, f)) * rng.uniform(0.5, 3.0, size=f)
    rotation, _ = np.linalg.qr(rng.normal(size=(f, f)))
    invertible = rotation * rng.uniform(0.5, 2.0, size=f)  # well conditioned
    return x.astype("float32"), (x @ invertible).astype("float32"), rng.normal(size=(n, f))


FAST = dict(hidden_units=(32,), epochs=20, batch_size=64, learning_rate=1e-2)


def test_reconstruction_from_invertible_embeddings():
    x, emb, _ = _reconstruction_data()
    result = feature_reconstruction(emb[:600], x[:600], ops.convert_to_tensor(emb[600:]), x[600:],
                                    seed=0, **FAST)
    assert isinstance(result, ReconstructionResult)
    assert result.relative_mse < 0.2
    assert result.relative_mse == pytest.approx(result.mse / result.baseline_mse)
    assert float(result) == result.relative_mse
    assert result.per_feature_relative_mse.shape == (6,)
    assert np.all(result.per_feature_relative_mse < 0.2)
    assert result.reconstruction.shape == (200, 6) and result.reconstruction.dtype == np.float32
    baseline = np.mean((x[600:] - x[:600].mean(axis=0)) ** 2)
    assert result.baseline_mse == pytest.approx(baseline, rel=1e-5)


def test_reconstruction_from_noise_learns_nothing():
    x, _, noise = _reconstruction_data()
    result = feature_reconstruction(noise[:600], x[:600], noise[600:], x[600:], seed=0, **FAST)
    assert result.relative_mse > 0.9
    assert result.epochs_trained < 20  # early stopping: validation loss never improves for long


def test_reconstruction_is_deterministic_given_seed():
    x, emb, _ = _reconstruction_data(n=300)
    kwargs = dict(hidden_units=(16,), epochs=5, batch_size=32)
    a = feature_reconstruction(emb[:200], x[:200], emb[200:], x[200:], seed=5, **kwargs)
    b = feature_reconstruction(emb[:200], x[:200], emb[200:], x[200:], seed=5, **kwargs)
    np.testing.assert_array_equal(a.reconstruction, b.reconstruction)
    assert a.relative_mse == b.relative_mse and a.epochs_trained == b.epochs_trained


E, X = np.ones((10, 3)), np.arange(20.0).reshape(10, 2)


@pytest.mark.parametrize("args,kwargs,err,fragment", [
    ((np.ones(10), X, E, X), {}, ValueError, r"`embeddings_aux` must have shape \(N, d\)"),
    ((E, X[:9], E, X), {}, ValueError, "`features_aux` has 9 rows but `embeddings_aux` has 10"),
    ((E, X, E, X[:9]), {}, ValueError, "`features_test` has 9 rows but `embeddings_test` has 10"),
    ((E, X, np.ones((10, 4)), X), {}, ValueError, "`embeddings_test` has width 4"),
    ((E, X, E, np.ones((10, 3))), {}, ValueError, "`features_test` has width 3"),
    ((E, np.where(X == 3, np.nan, X), E, X), {}, ValueError,
     "`features_aux` must contain only finite"),
    ((E[:1], X[:1], E, X), {}, ValueError, "`embeddings_aux` must have at least 2 rows"),
    ((E, X, E, np.tile(X.mean(0), (10, 1))), {}, ValueError, "`features_test`.*baseline"),
    ((E, X, E, X), {"hidden_units": (8, 0)}, ValueError, "`hidden_units`"),
    ((E, X, E, X), {"epochs": 0}, ValueError, "`epochs`"),
    ((E, X, E, X), {"batch_size": 2.5}, TypeError, "`batch_size`"),
    ((E, X, E, X), {"seed": -1}, ValueError, "`seed`"),
    ((E, X, E, X), {"validation_split": 1.0}, ValueError, r"`validation_split` must be .*\(0, 1\)"),
    ((E, X, E, X), {"learning_rate": 0.0}, ValueError, "`learning_rate`"),
])
def test_reconstruction_bad_inputs(args, kwargs, err, fragment):
    with pytest.raises(err, match=fragment):
        feature_reconstruction(*args, **kwargs)
