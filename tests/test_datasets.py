"""keras_fedpriv.datasets: the bundled splits the demos, benchmarks and tests use."""

import numpy as np
import pytest

from keras_fedpriv import datasets

pytestmark = [pytest.mark.jax]


def test_breast_cancer_vertical_split():
    xa, xb, y, xa_t, xb_t, y_t = datasets.breast_cancer_vertical()
    assert xa.shape[1] == 15 and xb.shape[1] == 15 and len(xa) == len(xb) == len(y)
    assert len(y) + len(y_t) == 569 and y.shape[1] == 1 and set(np.unique(y)) == {0.0, 1.0}
    assert abs(float(y.mean()) - 212 / 569) < 0.02  # 1 = malignant, the minority
    assert np.allclose(np.concatenate([xa, xb], 1).mean(0), 0, atol=1e-5)  # train-standardized
    again = datasets.breast_cancer_vertical()
    assert np.array_equal(again[0], xa)  # the same split every call
    xa5, xb5, *_ = datasets.breast_cancer_vertical(num_follower_features=5)
    assert xa5.shape[1] == 5 and xb5.shape[1] == 25


def test_digits_clients_split():
    clients, (x_t, y_t) = datasets.digits_clients(num_clients=10, alpha=0.5, seed=0)
    assert len(clients) == 10
    assert sum(len(x) for x, _ in clients) + len(x_t) == 1797
    assert all(x.dtype == np.float32 and x.max() <= 1.0 for x, _ in clients)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_follower_features=30), ValueError, "num_follower_features"),
    (dict(num_follower_features=0), ValueError, "num_follower_features"),
    (dict(test_size=1.0), ValueError, "test_size"),
])
def test_breast_cancer_vertical_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        datasets.breast_cancer_vertical(**kwargs)


def test_digits_mlp_is_the_compiled_model_for_digits_clients():
    from keras_fedpriv.datasets import digits_clients, digits_mlp

    clients, (x_test, y_test) = digits_clients(4, seed=0)
    model = digits_mlp(0.1)
    assert model.count_params() == 64 * 128 + 128 + 128 * 10 + 10
    assert float(model.optimizer.learning_rate) == pytest.approx(0.1)
    assert model.predict(x_test[:3], verbose=0).shape == (3, 10)
    with pytest.raises(ValueError, match="learning_rate"):
        digits_mlp(0.0)
