"""Statistical checks shared by the mechanism tests.

Every check compares an empirical count with a formula within ``SIGMAS``
standard deviations, and `assert_rejects` proves the same check has the power
to catch a wrong formula (so a test built on it fails if the formula changes).
"""

import math

import numpy as np
from scipy import stats as scipy_stats

SIGMAS = 5.0
# Checks on draws from a fresh OS-entropy key (unseeded layers, a reloaded model's new key) are
# not deterministic: they use UNSEEDED_SIGMAS, whose two-sided normal tail is 8.0e-11 per check
# (5 standard deviations: 5.7e-7), with samples (SIGMAS / UNSEEDED_SIGMAS)**2 = 1.69 times larger
# so the band is no wider than at SIGMAS.
UNSEEDED_SIGMAS = 6.5
# Each mechanism's frequency test: >= 100k samples, SIGMAS standard deviations, fixed seeds (so
# the tests are deterministic), and a check that a wrong formula (eps doubled or halved) would be
# rejected.
N = 200_000
EPS_VALUES = [0.0, 0.5, 1.0, 2.0, 8.0, 40.0]


def wrong_formula(p_fn, eps):
    """A formula that differs from the right one (eps doubled, or halved at eps=0)."""
    return p_fn(2 * eps) if eps > 0 else p_fn(1.0)


def within(count, n, p, sigmas=SIGMAS):
    """True if ``count`` successes out of ``n`` is within ``sigmas`` standard deviations of
    ``n p``."""
    sd = math.sqrt(max(n * p * (1.0 - p), 0.0))
    # A small absolute slack covers p ~ 0 or 1, where sd ~ 0 (the threshold
    # arithmetic is exact to 2**-32 per draw).
    return abs(count - n * p) <= sigmas * sd + 1e-6 * n + 1.0


def assert_rate(count, n, p, what="", sigmas=SIGMAS):
    """``count`` successes out of ``n`` are consistent with probability ``p``."""
    sd = math.sqrt(max(n * p * (1.0 - p), 0.0))
    assert within(count, n, p, sigmas), (
        f"{what}: observed {count}/{n} = {count / n:.6f}, formula p = {p:.6f} "
        f"(expected {n * p:.1f} +- {sigmas} * {sd:.1f})")


def assert_rejects(count, n, wrong_p, what="", sigmas=SIGMAS):
    """The check must reject a wrong formula, or it could not catch a change."""
    assert not within(count, n, wrong_p, sigmas), (
        f"{what}: the check cannot tell the formula from the wrong value {wrong_p:.6f}")


def assert_uniform(counts, what="", min_pvalue=1e-4):
    """Chi-square goodness of fit to the uniform distribution."""
    counts = np.asarray(counts, dtype=float)
    pvalue = scipy_stats.chisquare(counts).pvalue
    assert pvalue > min_pvalue, f"{what}: not uniform (chi-square p = {pvalue:.2e}): {counts}"
    return pvalue
