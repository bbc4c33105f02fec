"""The Laplace mechanism: scale, distribution, float safety (Mironov 2012), accounting, errors."""

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from keras_fedpriv.mechanisms.laplace import (
    discrete_laplace_integers,
    laplace,
    laplace_dp_event,
    laplace_grid,
    laplace_scale,
)

pytestmark = [pytest.mark.jax]

N = 200_000


def _noise(eps, sensitivity=2.0, k=10, sampler="discrete", seed=0):
    x = np.zeros((N // k, k))  # on the grid: what comes back is the noise alone
    return (laplace(x, eps, sensitivity, np.random.default_rng(seed), sampler) - x).ravel()


@pytest.mark.parametrize("eps", [0.5, 1.0, 10.0, 230260.0])
def test_mean_absolute_noise_is_sensitivity_over_eps(eps):
    noise = _noise(eps)
    gamma, c, a = laplace_grid(eps, 2.0, 10)
    exact = gamma / math.sinh(a)             # E|Z| gamma for P(z) ∝ exp(-a|z|)
    se = np.abs(noise).std() / math.sqrt(noise.size)
    assert abs(np.abs(noise).mean() - exact) < 5 * se
    # the exact scale is the nominal sensitivity/eps within +1/1024 (the grid rounding margin)
    assert 1.0 - 1e-6 <= exact / laplace_scale(eps, 2.0) < 1.0 + 1 / 1024
    # the test fails for a mechanism whose scale used 2*eps or sensitivity 1
    assert abs(np.abs(noise).mean() - exact / 2) > 5 * se


@pytest.mark.parametrize("sampler", ["discrete", "continuous"])
def test_noise_is_laplace_distributed(sampler):
    b = laplace_scale(4.0, 2.0)
    noise = _noise(4.0, sampler=sampler)
    scale = b if sampler == "continuous" else laplace_grid(4.0, 2.0, 10)[0] / math.sinh(
        laplace_grid(4.0, 2.0, 10)[2])
    # frozen distributions' cdfs, not names with args: SciPy 1.18.1's kstest passes the args
    # of "norm" on to ndtr, which takes none (a TypeError)
    assert stats.kstest(noise, stats.laplace(0.0, scale).cdf).pvalue > 1e-4
    assert stats.kstest(noise, stats.laplace(0.0, 1.2 * scale).cdf).pvalue < 1e-6
    assert stats.kstest(noise, stats.norm(0.0, scale * math.sqrt(2)).cdf).pvalue < 1e-6


def test_discrete_noise_has_the_exact_geometric_ratio():
    """P(Z = z+1) / P(Z = z) = exp(-a): checked on the counts of small |z|."""
    a = 0.7
    z = discrete_laplace_integers(a, 400_000, np.random.default_rng(1))
    values, counts = np.unique(np.abs(z), return_counts=True)
    pmf = {int(v): c / z.size for v, c in zip(values, counts)}
    # P(|Z| = 0) = tanh(a/2); P(|Z| = j) = 2 tanh(a/2) exp(-a j) for j >= 1
    t = math.tanh(a / 2)
    for j in range(0, 6):
        want = t if j == 0 else 2 * t * math.exp(-a * j)
        se = math.sqrt(want * (1 - want) / z.size)
        assert abs(pmf.get(j, 0.0) - want) < 5 * se, j


def test_discrete_tails_are_not_truncated():
    """Values beyond what a 53-bit uniform could give still occur (unbounded exponent)."""
    a = 1.0
    z = discrete_laplace_integers(a, 4_000_000, np.random.default_rng(2))
    # P(|Z| >= 15) = 2 exp(-15) / (1 + exp(-a)) ~ 2.2e-7: about one in 4M; check the max grows
    # past 10 (P ~ 3e-5 per draw) and that no float overflow produced garbage
    assert 10 <= np.abs(z).max() < 60


# --------------------------------------------------------------- float safety
def _naive_float32_noise_values(beta):
    """Every value the reference's Java sampler (two nextFloat()s) can produce."""
    u = (np.arange(1, 2**24, dtype=np.float64) / 2**24).astype(np.float32).astype(np.float64)
    beta = float(np.float32(beta))
    pos = (-beta * np.log(1.0 - u)).astype(np.float32)
    neg = (beta * np.log(u)).astype(np.float32)
    return np.unique(np.concatenate([pos, neg, np.float32([0.0])]))


def _naive_float32(x, beta, rng, n):
    u1 = (rng.integers(0, 2**24, n) / 2**24).astype(np.float32)
    u2 = (rng.integers(1, 2**24, n) / 2**24).astype(np.float32).astype(np.float64)
    beta = float(np.float32(beta))
    noise = np.where(u1 <= 0.5, -beta * np.log(1.0 - u2), beta * np.log(u2)).astype(np.float32)
    return np.float32(x) + noise


@pytest.mark.slow
def test_naive_sampler_reveals_its_input_and_the_grid_sampler_does_not():
    """Mironov (2012) on the original design's sampler: most outputs for input 0.7 cannot occur for 0.3.

    An attacker who enumerates the sampler's possible noise values knows, for
    every such output, that the input was not 0.3: an infinite privacy loss
    however large the noise. The grid sampler's outputs are multiples of one
    grid step for every input, and every multiple has positive probability for
    every input, so no output excludes an input.
    """
    beta = 0.1  # eps = 10 at the original design's sensitivity 1
    x1, x2 = 0.3, 0.7
    possible_under_x1 = np.unique(np.float32(x1) + _naive_float32_noise_values(beta))
    rng = np.random.default_rng(0)
    y1 = _naive_float32(x1, beta, rng, 100_000)
    y2 = _naive_float32(x2, beta, rng, 100_000)
    assert np.all(np.isin(y1, possible_under_x1))            # the enumeration is complete
    assert np.mean(~np.isin(y2, possible_under_x1)) > 0.5      # > half the outputs give x2 away

    gamma = laplace_grid(10.0, 1.0, 1)[0]
    for x in (x1, x2):
        y = laplace(np.full((100_000, 1), x), 10.0, 1.0, np.random.default_rng(1))
        m = y / gamma
        assert np.array_equal(m, np.rint(m))                   # always on the shared grid
    # and the low-order bits of the grid index look the same for both inputs
    lows = [np.rint(laplace(np.full((100_000, 1), x), 10.0, 1.0,
                            np.random.default_rng(3)) / gamma).astype(np.int64).ravel() % 16
            for x in (x1, x2)]
    table = np.array([np.bincount(low, minlength=16) for low in lows])
    assert stats.chi2_contingency(table).pvalue > 1e-4


# ---------------------------------------------------------------- accounting
@pytest.mark.parametrize("eps", [0.5, 1.0, 5.0])
def test_dp_event_composes_to_eps(eps):
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(laplace_dp_event(eps, 2.0, num_values=10))
    assert acc.get_epsilon(1e-9) == pytest.approx(eps, rel=0.01)
    acc.compose(laplace_dp_event(eps, 2.0, num_values=10), 3)
    assert acc.get_epsilon(1e-9) > 2 * eps


def test_continuous_event_is_the_laplace_event():
    event = laplace_dp_event(4.0, 2.0, sampler="continuous")
    assert isinstance(event, dp_accounting.LaplaceDpEvent)
    assert event.noise_multiplier == pytest.approx(0.25)


def test_grid_is_a_power_of_two_and_fine():
    for eps in (0.1, 1.0, 37.0, 230260.0):
        gamma, c, a = laplace_grid(eps, 2.0, 10)
        assert math.log2(gamma) == int(math.log2(gamma))
        assert 1024 <= min(laplace_scale(eps, 2.0), 2.0 / 10) / gamma < 2048
        assert a * c == pytest.approx(eps)


def test_the_original_designs_default_eps_gives_almost_no_noise():
    """The original design's eps = 230260 at its sensitivity 1: noise ~1e-5 with probability 0.9."""
    noise = np.abs(_noise(230260.0, sensitivity=1.0))
    assert np.quantile(noise, 0.9) == pytest.approx(1e-5, rel=0.05)


def test_seeded_noise_reproduces_and_secret_noise_does_not():
    x = np.full((4, 3), 1 / 3)
    a = laplace(x, 1.0, rng=np.random.default_rng(7))
    b = laplace(x, 1.0, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(laplace(x, 1.0), laplace(x, 1.0))


@pytest.mark.parametrize("kwargs, match", [
    (dict(eps=0.0), "eps"), (dict(eps=-1.0), "eps"), (dict(eps=float("nan")), "eps"),
    (dict(eps=True), "eps"), (dict(eps="1"), "eps"),
    (dict(eps=1.0, sensitivity=0.0), "sensitivity"),
    (dict(eps=1.0, sampler="float"), "sampler"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        laplace(np.zeros((2, 3)), **kwargs)


def test_non_finite_values_are_rejected():
    with pytest.raises(ValueError, match="values"):
        laplace(np.array([[0.5, np.nan]]), 1.0)
    with pytest.raises(ValueError, match="num_values"):
        laplace_dp_event(1.0, 2.0)


@pytest.mark.parametrize("sampler", ["discrete", "continuous"])
def test_event_covers_a_distance_larger_than_the_calibrated_sensitivity(sampler):
    """Noise calibrated to the original design's sensitivity 1 on probability vectors (distance 2): 2 eps."""
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(laplace_dp_event(1.5, 1.0, num_values=10, sampler=sampler, distance=2.0))
    assert acc.get_epsilon(1e-9) == pytest.approx(3.0, rel=0.01)
    with pytest.raises(ValueError, match="distance"):
        laplace_dp_event(1.5, 1.0, num_values=10, sampler=sampler, distance=0.0)
