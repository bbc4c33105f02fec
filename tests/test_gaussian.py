"""Clip + Gaussian noise (the horizontal-FL baseline): scale, shape, clipping, accounting."""

import numpy as np
import pytest
from scipy import stats

from keras_fedpriv.mechanisms.gaussian import (
    clip_by_l2_norm,
    gaussian_dp_event,
    gaussian_epsilon,
    gaussian_mechanism,
)
from keras_fedpriv.mechanisms.random import secret_generator

pytestmark = [pytest.mark.jax]

N = 200_000


def _noise(clip, z, seed=0):
    # a zero update: what comes back is the noise alone
    return gaussian_mechanism(np.zeros(N, np.float32), clip, z, secret_generator(seed)).astype(
        np.float64)


@pytest.mark.parametrize("clip, z", [(1.0, 1.0), (0.5, 3.0), (2.0, 0.1)])
def test_noise_std_matches_z_times_clip(clip, z):
    noise = _noise(clip, z)
    sigma = z * clip
    # the sample variance has std sigma^2 * sqrt(2 / N)
    assert abs(noise.var() - sigma**2) < 5 * sigma**2 * np.sqrt(2 / N)
    assert abs(noise.mean()) < 5 * sigma / np.sqrt(N)
    # the same test rejects a mechanism that used 2 * z
    assert abs(noise.var() - (2 * sigma) ** 2) > 5 * (2 * sigma) ** 2 * np.sqrt(2 / N)


def test_noise_is_gaussian():
    noise = _noise(1.0, 2.0)
    assert stats.kstest(noise / 2.0, "norm").pvalue > 1e-4
    assert stats.kstest(noise / 2.0, "laplace").pvalue < 1e-10


def test_clipping_bounds_the_norm_and_keeps_small_updates():
    big = np.full(100, 3.0, np.float32)
    clipped, norm = clip_by_l2_norm(big, 1.5)
    assert norm == pytest.approx(30.0)
    assert np.linalg.norm(clipped) == pytest.approx(1.5, rel=1e-6)
    np.testing.assert_allclose(clipped / clipped[0], 1.0)  # direction kept
    small = np.full(4, 0.1, np.float32)
    np.testing.assert_array_equal(clip_by_l2_norm(small, 1.0)[0], small)


def test_seeds_reproduce_and_secrets_do_not():
    a = gaussian_mechanism(np.zeros(8), 1.0, 1.0, secret_generator(5))
    b = gaussian_mechanism(np.zeros(8), 1.0, 1.0, secret_generator(5))
    c = gaussian_mechanism(np.zeros(8), 1.0, 1.0)
    d = gaussian_mechanism(np.zeros(8), 1.0, 1.0)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(c, d)


def test_accounting_local_relation_halves_the_multiplier():
    assert gaussian_dp_event(2.0).noise_multiplier == 1.0
    assert gaussian_dp_event(2.0, local=False).noise_multiplier == 2.0
    one = gaussian_epsilon(2.0, 1e-5)
    ten = gaussian_epsilon(2.0, 1e-5, count=10)
    assert one < ten < 10 * one
    assert gaussian_epsilon(2.0, 1e-5, local=False) < one


@pytest.mark.parametrize("kwargs, match", [
    (dict(clip_norm=0.0, noise_multiplier=1.0), "clip_norm"),
    (dict(clip_norm=float("inf"), noise_multiplier=1.0), "clip_norm"),
    (dict(clip_norm=1.0, noise_multiplier=-1.0), "noise_multiplier"),
    (dict(clip_norm=1.0, noise_multiplier=True), "noise_multiplier"),
])
def test_bad_parameters_name_the_argument(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        gaussian_mechanism(np.zeros(3), **kwargs)


def test_non_finite_updates_are_rejected():
    with pytest.raises(ValueError, match="update"):
        gaussian_mechanism(np.array([1.0, np.nan]), 1.0, 1.0)
