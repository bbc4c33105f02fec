"""dELDP estimate (Theorem 2 of the ESORICS 2024 paper) against hand-computed cases.

The VAEBottom below has ``hidden_units=()`` and hand-set kernels::

    mu(x)     = (x0, 2 * x1)
    logvar(x) = (0.2 * x0 - 1, 0)   so   sigma(x) = (exp(0.1 * x0 - 0.5), 1)
"""

import dataclasses
import math
import tracemalloc

import keras
import numpy as np
import pytest
from scipy.spatial.distance import pdist

from keras_fedpriv.layers.vae_bottom import VAEBottom
from keras_fedpriv.privacy import DELDPReport, deldp, max_pairwise_distance

pytestmark = [pytest.mark.jax]

X = np.array([[0, 0], [3, 0], [0, 2],      # label 0: mu (0,0), (3,0), (0,4)
              [1, 1], [-1, 1],             # label 1: mu (1,2), (-1,2)
              [5, 5]], "float32")          # label 2: a single sample
Y = np.array([0, 0, 0, 1, 1, 2])

# By hand. Label 0: distances 3, 4, 5 -> Delta = 5; ||sigma|| is smallest at x0 = 0:
# sqrt(e^-1 + 1). Label 1: Delta = 2; smallest ||sigma|| at x0 = -1: sqrt(e^-1.2 + 1).
FACTOR_2_32 = math.sqrt(2 * (math.log(1.25) + 32 * math.log(2)))  # sqrt(2 ln(1.25 / 2^-32))
DELTA_L = {0: 5.0, 1: 2.0, 2: 0.0}
SIGMA_L = {0: math.sqrt(math.exp(-1.0) + 1), 1: math.sqrt(math.exp(-1.2) + 1),
           2: math.sqrt(math.exp(0.0) + 1)}
EPS_L = {0: 5.0 / SIGMA_L[0] * FACTOR_2_32, 1: 2.0 / SIGMA_L[1] * FACTOR_2_32, 2: 0.0}


def _bottom(scale=1.0):
    layer = VAEBottom(2, hidden_units=(), beta=1.0)
    layer.build((None, 2))
    layer.z_mean.set_weights([scale * np.array([[1, 0], [0, 2]], "float32"),
                              np.zeros(2, "float32")])
    layer.z_log_var.set_weights([np.array([[0.2, 0], [0, 0]], "float32"),
                                 np.array([-1, 0], "float32")])
    return layer


def _assert_dict_close(got, expected, rtol=1e-6):
    assert set(got) == set(expected)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=rtol, abs=1e-12), key


def test_hand_computed_case():
    report = deldp(_bottom(), X, Y)
    assert isinstance(report, DELDPReport)
    assert FACTOR_2_32 == pytest.approx(6.6938, abs=1e-4)
    _assert_dict_close(report.delta_l, DELTA_L)
    _assert_dict_close(report.sigma_l, SIGMA_L)
    _assert_dict_close(report.per_label_eps, EPS_L)
    assert report.eps == pytest.approx(EPS_L[0], rel=1e-6)
    assert report.eps == pytest.approx(28.6169, abs=1e-3)  # 5 / 1.16957 * 6.69385
    assert report.delta == 2.0**-32 and report.num_samples == 6
    assert report.label_counts == {0: 3, 1: 2, 2: 1}
    assert all(type(k) is int for k in report.per_label_eps)


def test_delta_and_mu_scale_change_the_result_as_the_formula_says():
    base = deldp(_bottom(), X, Y)
    loose = deldp(_bottom(), X, Y, delta=1e-5)
    ratio = math.sqrt(2 * math.log(1.25e5)) / FACTOR_2_32
    assert loose.eps == pytest.approx(base.eps * ratio, rel=1e-9)
    assert loose.eps < base.eps
    assert loose.delta_l == base.delta_l and loose.sigma_l == base.sigma_l
    # Twice the spread of mu: twice Delta_l and eps, same sigma_l.
    wide = deldp(_bottom(scale=2.0), X, Y)
    _assert_dict_close(wide.delta_l, {k: 2 * v for k, v in DELTA_L.items()})
    _assert_dict_close(wide.sigma_l, SIGMA_L)
    assert wide.eps == pytest.approx(2 * base.eps, rel=1e-6)


@pytest.mark.parametrize("labels", [
    Y, Y.reshape(-1, 1), Y.astype("float32"), np.eye(3, dtype="float32")[Y],
    np.eye(3, dtype="int64")[Y], list(Y)])
def test_label_formats(labels):
    report = deldp(_bottom(), X, labels)
    _assert_dict_close(report.per_label_eps, EPS_L)
    _assert_dict_close(report.delta_l, DELTA_L)


def test_binary_labels_and_batching():
    y = np.array([0, 0, 0, 1, 1, 1])  # label 1 now holds (1,1), (-1,1), (5,5)
    report = deldp(_bottom(), X, y.reshape(-1, 1), batch_size=2, block_size=1)
    far = math.hypot(5 - (-1), 10 - 2)  # mu (-1,2) to (5,10): 10
    assert report.delta_l == pytest.approx({0: 5.0, 1: far}, rel=1e-6)
    assert report.sigma_l[1] == pytest.approx(SIGMA_L[1], rel=1e-6)
    assert report.eps == pytest.approx(far / SIGMA_L[1] * FACTOR_2_32, rel=1e-6)


def test_any_encoder_and_degenerate_labels():
    mu = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [4.0, 0.0]])
    logvar = np.array([[-3000.0, -3000.0]] * 2 + [[0.0, 0.0], [-3000.0, -3000.0]])

    def encode(x):
        rows = np.asarray(x, dtype=int)[:, 0]
        return mu[rows], logvar[rows]

    class Encoder:
        def encode(self, x):
            return encode(x)

    x = np.arange(4).reshape(-1, 1)
    y = [0, 0, 1, 1]
    for bottom in (encode, Encoder()):
        report = deldp(bottom, x, y, delta=0.01)
        # Label 0: identical mu and sigma underflowing to 0 -> Delta 0, eps 0 (not NaN).
        assert report.delta_l[0] == 0.0 and report.sigma_l[0] == 0.0
        assert report.per_label_eps[0] == 0.0
        # Label 1: Delta 3, the smallest sigma is 0 -> eps inf.
        assert report.delta_l[1] == 3.0 and report.sigma_l[1] == 0.0
        assert report.per_label_eps[1] == math.inf and report.eps == math.inf
    with pytest.raises(TypeError, match="pair"):
        deldp(lambda x: np.zeros((len(x), 2)), x, y)
    with pytest.raises(TypeError, match="vae_bottom"):
        deldp(42, x, y)


def test_report_says_it_is_empirical_and_is_frozen():
    report = deldp(_bottom(), X, Y)
    text = str(report)
    assert text == report.summary()
    assert "EMPIRICAL" in text and "NOT a differential-privacy guarantee" in text
    lines = text.splitlines()
    row0 = next(line for line in lines if line.split()[:1] == ["0"])
    assert row0.split() == ["0", "3", "5", f"{SIGMA_L[0]:.6g}", f"{EPS_L[0]:.6g}"]
    assert f"{report.eps:.6g}" in lines[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.eps = 0.0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"delta": 0.0}, ValueError, "`delta`"),
    ({"delta": 1.0}, ValueError, "`delta`"),
    ({"delta": -1e-5}, ValueError, "`delta`"),
    ({"delta": float("nan")}, ValueError, "`delta`"),
    ({"delta": True}, TypeError, "`delta`"),
    ({"delta": "1e-5"}, TypeError, "`delta`"),
    ({"batch_size": 0}, ValueError, "`batch_size`"),
    ({"block_size": 1.5}, TypeError, "`block_size`"),
    ({"labels": Y[:5]}, ValueError, "same length"),
    ({"labels": Y.reshape(6, 1, 1)}, ValueError, "shape"),
    ({"labels": Y + 0.5}, ValueError, "class ids"),
    ({"x": X[:0], "labels": Y[:0]}, ValueError, "at least one"),
])
def test_bad_inputs(kwargs, error, match):
    args = {"x": X, "labels": Y, **kwargs}
    with pytest.raises(error, match=match):
        deldp(_bottom(), **args)


def test_non_finite_encoder_output_is_rejected():
    def encode(x):
        out = np.zeros((len(x), 2))
        out[1, 0] = np.nan
        return out, np.zeros((len(x), 2))

    with pytest.raises(ValueError, match="non-finite mu.*row 1"):
        deldp(encode, np.zeros((3, 1)), [0, 0, 1])


# --- the exact, blocked maximum pairwise distance ----------------------------------------

@pytest.mark.parametrize("n, d, block_size, offset", [
    (1, 3, 4, 0.0), (2, 3, 1, 0.0), (50, 2, 1, 0.0), (257, 5, 16, 0.0), (300, 3, 1024, 0.0),
    (400, 4, 7, 1e4), (600, 8, 64, 0.0)])
def test_max_pairwise_distance_matches_brute_force(n, d, block_size, offset):
    rng = np.random.default_rng(n + d)
    points = rng.normal(size=(n, d)) * rng.uniform(0.01, 3, size=d) + offset
    expected = pdist(points).max() if n > 1 else 0.0
    assert max_pairwise_distance(points, block_size=block_size) == pytest.approx(
        expected, rel=1e-9, abs=1e-12)


def test_max_pairwise_distance_with_duplicates_and_ties():
    square = np.array([[0, 0], [1, 0], [0, 1], [1, 1]] * 5, dtype=float)
    assert max_pairwise_distance(square, block_size=3) == pytest.approx(math.sqrt(2))
    assert max_pairwise_distance(np.ones((10, 3)), block_size=4) == 0.0


def test_large_label_group_is_exact_and_memory_safe():
    rng = np.random.default_rng(11)
    n = 20_000
    points = rng.normal(size=(n, 4))
    points /= np.maximum(np.linalg.norm(points, axis=1, keepdims=True), 1.0)  # in the unit ball
    points[12_345] = [10.0, 0, 0, 0]
    points[777] = [-10.0, 0, 0, 0]
    tracemalloc.start()
    try:
        result = max_pairwise_distance(points, block_size=1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result == pytest.approx(20.0, rel=1e-12)
    assert peak < 100 * 2**20  # an N x N float64 matrix would be 3.2 GB


def test_a_larger_beta_gives_a_smaller_estimate():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(400, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    eps = {}
    for beta in (0.01, 1.0):
        keras.utils.set_random_seed(11)  # seeded weights and noise: the estimates are deterministic
        bottom = VAEBottom(3, hidden_units=(16,), beta=beta, with_decoder=True, seed=12)
        bottom.pretrain(x, epochs=10, batch_size=64, optimizer=keras.optimizers.Adam(0.01),
                        verbose=0)
        report = deldp(bottom, x, y)
        assert 0 < report.eps < math.inf
        eps[beta] = report.eps
    # The KL term pulls the posteriors towards N(0, I): larger sigma, closer means.
    assert eps[1.0] < 0.5 * eps[0.01], eps
