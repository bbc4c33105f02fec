"""One-bit quantization + randomized response (keras_fedpriv/mechanisms/quantize.py): output
frequencies against the formula."""

import math
import numpy as np
import pytest

from keras_fedpriv import mechanisms as M
from stats import EPS_VALUES, N, assert_rate, assert_rejects

pytestmark = [pytest.mark.jax]


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_quantize_rr_rates(eps):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N // 8, 8)).astype("float32")
    out = np.asarray(M.quantize_rr(x, eps, seed=13))
    assert set(np.unique(out)) <= {0.0, 1.0}
    ones, zeros = x > 0, x <= 0
    p = M.quantize_keep_probability(eps)
    q = M.quantize_turn_on_probability(eps)
    assert p == pytest.approx(math.exp(eps / 2) / (math.exp(eps / 2) + 1))
    assert q == pytest.approx(1 / (math.exp(eps / 2) + 1))
    assert_rate(int(out[ones].sum()), int(ones.sum()), p, f"keep 1 eps={eps}")
    assert_rate(int(out[zeros].sum()), int(zeros.sum()), q, f"0 -> 1 eps={eps}")
    if eps < 20:
        # eps (not eps/2) per coordinate would be a different mechanism.
        assert_rejects(int(out[zeros].sum()), int(zeros.sum()),
                       1 / (math.exp(eps) + 1) if eps > 0 else 0.3, "quantize q with eps")


def test_quantize_only_is_sign():
    x = np.array([[-1.0, 0.0, 1e-30, 3.0]], "float32")
    np.testing.assert_array_equal(np.asarray(M.quantize_rr(x)), [[0.0, 0.0, 1.0, 1.0]])
