"""Empirical auditing (keras_fedpriv.privacy.audit): validity, tightness, broken mechanisms, errors.

Every audit here is seeded, so each assertion is deterministic. The lower
bound must NEVER exceed the claimed eps of a correct mechanism (the
inequality is not loosened); the broken mechanisms must be caught.
"""

import math

import numpy as np
import pytest
from scipy import stats

from keras_fedpriv.mechanisms.laplace import laplace_scale
from keras_fedpriv.mechanisms.randomized_response import binary_randomized_response
from keras_fedpriv.privacy.audit import (
    AuditResult,
    audit,
    audit_binary_rr,
    audit_embedding_dp_layer,
    audit_kary_rr,
    audit_label_dp_layer,
    audit_laplace,
    audit_magrr,
    audit_quantize_rr,
    audit_signds,
    clopper_pearson,
    eps_lower_bound,
)

pytestmark = [pytest.mark.jax]

N = 200_000


def _check_valid(result, tight=0.8):
    """Bound <= claim (always), and not vacuous: >= tight * claim."""
    assert isinstance(result, AuditResult)
    assert result.eps_lower_bound <= result.claimed_eps, str(result)
    assert not result.violates_claim
    assert result.eps_lower_bound >= tight * result.claimed_eps, str(result)
    assert result.eps_lower_bound <= result.eps_point_estimate
    c = result.counts
    assert c["a_trials"] == c["b_trials"] == result.num_trials - result.num_trials // 2


# ----------------------------------------------------------------------------
# Every auditor: bound <= claimed eps, and close to it
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0])
def test_binary_and_kary_rr(eps):
    _check_valid(audit_binary_rr(eps, num_trials=N, seed=1))
    _check_valid(audit_kary_rr(eps, num_classes=10, num_trials=N, seed=2))


@pytest.mark.parametrize("mode,per_batch", [("binary", False), ("sparse", False),
                                            ("onehot", False), ("binary", True)])
def test_label_dp_layer(mode, per_batch):
    result = audit_label_dp_layer(2.0, mode=mode, num_classes=5, per_batch=per_batch,
                                  num_trials=N, seed=3)
    _check_valid(result)
    assert "LabelDPLayer" in result.name


def test_quantize_rr_claims_half_eps():
    result = audit_quantize_rr(2.0, num_trials=N, seed=4)
    assert result.claimed_eps == 1.0
    _check_valid(result)
    # the release is really eps/2: a claim of the full eps per coordinate is far from tight
    assert result.eps_lower_bound < 1.1


@pytest.mark.parametrize("d", [1, 3])
def test_embedding_dp_layer(d):
    result = audit_embedding_dp_layer(2.0, num_coordinates=d, num_trials=N, seed=5)
    assert result.claimed_eps == d * 1.0
    _check_valid(result)


@pytest.mark.parametrize("sampler", ["discrete", "continuous"])
def test_laplace(sampler):
    _check_valid(audit_laplace(1.0, sampler=sampler, num_trials=N, seed=6))


def test_laplace_difference_statistic_is_valid_but_looser():
    loss = audit_laplace(1.0, num_trials=N, seed=7)
    diff = audit_laplace(1.0, statistic="difference", num_trials=N, seed=7)
    _check_valid(diff, tight=0.5)
    assert diff.eps_lower_bound < loss.eps_lower_bound


def test_magrr():
    _check_valid(audit_magrr(1.0, num_trials=N, seed=8))


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_signds_through_select_indices(eps):
    # one Python call per run (~0.1-0.3 ms): few trials, so a looser tightness check
    _check_valid(audit_signds(eps, num_trials=4000, seed=9), tight=0.6)


@pytest.mark.parametrize("statistic", ["loss", "count"])
def test_signds_distribution(statistic):
    # h=4, thr=3 > h/2: the count statistic is exact too
    _check_valid(audit_signds(4.0, statistic=statistic, sampler="distribution",
                              num_trials=N, seed=10))


def test_signds_count_statistic_is_looser_when_thr_at_most_half_h():
    loss = audit_signds(2.0, h=10, sampler="distribution", num_trials=N, seed=11)
    count = audit_signds(2.0, h=10, statistic="count", sampler="distribution",
                         num_trials=N, seed=11)
    assert "thr=4" in loss.name
    _check_valid(loss, tight=0.9)
    _check_valid(count, tight=0.5)
    assert count.eps_lower_bound < loss.eps_lower_bound


# ----------------------------------------------------------------------------
# Tightness (the requirement) and eps = 0
# ----------------------------------------------------------------------------


def test_rr_tightness_at_a_million_trials():
    result = audit_binary_rr(1.0, num_trials=10**6, seed=12)
    assert 0.5 * 1.0 <= result.eps_lower_bound <= 1.0   # the requirement
    assert result.eps_lower_bound >= 0.98                 # what it actually gives
    assert abs(result.eps_point_estimate - 1.0) < 0.02


def test_eps_zero_gives_zero():
    assert audit_binary_rr(0.0, num_trials=N, seed=13).eps_lower_bound == 0.0
    assert audit_kary_rr(0.0, num_classes=4, num_trials=N, seed=13).eps_lower_bound == 0.0


def test_bound_is_valid_over_many_seeds():
    """An exactly eps-DP mechanism at few trials: the bound stays below eps for every seed."""
    eps = 1.0
    q = 1.0 / (1.0 + math.e)

    def rr(bit, n, rng):
        return np.where(rng.random(n) < q, 1 - bit, bit)

    bounds = [audit(rr, 1, 0, num_trials=1000, seed=s).eps_lower_bound for s in range(20)]
    assert max(bounds) <= eps, bounds
    assert min(bounds) > 0.0, bounds  # and informative even at 1000 trials


# ----------------------------------------------------------------------------
# Broken mechanisms are caught
# ----------------------------------------------------------------------------


def test_catches_rr_whose_flip_probability_uses_2_eps():
    eps = 1.0

    def broken(bit, n, rng):  # flips with 1/(1 + e^(2 eps)): really 2 eps-DP
        seed = int(rng.integers(0, 2**63))
        return np.asarray(binary_randomized_response(np.full(n, bit, np.int32), 2 * eps, seed=seed))

    result = audit(broken, 1, 0, num_trials=N, seed=14)
    assert result.eps_lower_bound > eps, str(result)
    assert result.eps_lower_bound > 1.9


def test_catches_laplace_with_half_the_scale():
    eps = 1.0
    b = laplace_scale(eps, 2.0)

    def broken(row, n, rng):
        return np.asarray(row) + rng.laplace(0.0, b / 2, size=(n, 2))

    def loss(y):
        return np.clip(y[:, 0], 0, 1) - np.clip(y[:, 1], 0, 1)

    result = audit(broken, [1.0, 0.0], [0.0, 1.0], num_trials=N, statistic=loss, seed=15)
    assert result.eps_lower_bound > eps, str(result)
    # the difference statistic catches it too
    diff = audit(broken, [1.0, 0.0], [0.0, 1.0], num_trials=N,
                 statistic=lambda y: y[:, 0] - y[:, 1], seed=15)
    assert diff.eps_lower_bound > eps, str(diff)


def test_catches_the_seeds_laplace_sensitivity_1():
    result = audit_laplace(1.0, sensitivity=1.0, num_trials=N, seed=16)
    assert result.claimed_eps == 1.0
    assert result.violates_claim and result.eps_lower_bound > 1.8, str(result)
    assert "REFUTED" in str(result)


# ----------------------------------------------------------------------------
# The statistics themselves
# ----------------------------------------------------------------------------


def test_clopper_pearson_matches_scipy():
    for k, n in [(0, 10), (3, 10), (10, 10), (4711, 10000)]:
        lo, hi = clopper_pearson(k, n, 0.9)
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
        assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12)
    assert clopper_pearson(0, 10, 0.95, side="upper") == pytest.approx(1 - 0.05 ** 0.1)
    assert clopper_pearson(10, 10, 0.95, side="lower") == pytest.approx(0.05 ** 0.1)


def test_eps_lower_bound_from_counts_and_delta():
    b0 = eps_lower_bound(7300, 10000, 2700, 10000)
    assert 0.9 < b0 < math.log(0.73 / 0.27)
    assert eps_lower_bound(7300, 10000, 2700, 10000, delta=0.1) < b0
    assert eps_lower_bound(7300, 10000, 2700, 10000, confidence=0.5) > b0
    assert eps_lower_bound(5000, 10000, 5000, 10000) == 0.0
    assert eps_lower_bound(0, 10000, 0, 10000) == 0.0


def test_audit_with_delta_is_smaller_and_reports_it():
    q = 1.0 / (1.0 + math.e)

    def rr(bit, n, rng):
        return np.where(rng.random(n) < q, 1 - bit, bit)

    plain = audit(rr, 1, 0, num_trials=20_000, seed=17)
    with_delta = audit(rr, 1, 0, num_trials=20_000, delta=0.2, seed=17)
    assert with_delta.eps_lower_bound < plain.eps_lower_bound
    assert with_delta.delta == 0.2 and "delta=0.2" in str(with_delta)


def test_batch_size_and_reproducibility():
    q = 1.0 / (1.0 + math.e)
    sizes = []

    def rr(bit, n, rng):
        sizes.append(n)
        return np.where(rng.random(n) < q, 1 - bit, bit)

    a = audit(rr, 1, 0, num_trials=1000, seed=18, batch_size=128)
    assert max(sizes) == 128 and sum(sizes) == 2000
    b = audit(rr, 1, 0, num_trials=1000, seed=18, batch_size=128)
    assert a == b


def test_result_fields_and_str():
    r = audit_binary_rr(1.0, num_trials=1000, seed=19)
    assert r.num_trials == 1000 and r.confidence == 0.95 and r.claimed_eps == 1.0
    assert set(r.counts) == {"a_hits", "a_trials", "b_hits", "b_trials"}
    text = str(r)
    assert "binary RR" in text and "95%" in text and "claimed 1" in text and "event" in text
    assert r.ratio == r.eps_lower_bound
    bare = audit(lambda x, n, rng: np.full(n, x), 1, 0, num_trials=100, seed=0)
    assert bare.claimed_eps is None and bare.ratio is None and not bare.violates_claim
    # a deterministic mechanism that reveals its input: infinite point estimate
    # and a bound from 50/50 vs 0/50 hits: log(lower / upper), each CP bound at 97.5%
    c = 0.025 ** (1 / 50)
    assert bare.eps_point_estimate == math.inf
    assert bare.eps_lower_bound == pytest.approx(math.log(c / (1 - c)))


# ----------------------------------------------------------------------------
# Bad arguments
# ----------------------------------------------------------------------------


def _coin(x, n, rng):
    return rng.random(n) < 0.5


@pytest.mark.parametrize("kwargs,error,name", [
    ({"num_trials": 99}, ValueError, "num_trials"),
    ({"num_trials": 1000.0}, TypeError, "num_trials"),
    ({"num_trials": True}, TypeError, "num_trials"),
    ({"num_trials": 1000, "confidence": 0.0}, ValueError, "confidence"),
    ({"num_trials": 1000, "confidence": 1.0}, ValueError, "confidence"),
    ({"num_trials": 1000, "confidence": float("nan")}, ValueError, "confidence"),
    ({"num_trials": 1000, "confidence": "0.95"}, TypeError, "confidence"),
    ({"num_trials": 1000, "delta": 1.0}, ValueError, "delta"),
    ({"num_trials": 1000, "delta": -0.1}, ValueError, "delta"),
    ({"num_trials": 1000, "seed": -1}, ValueError, "seed"),
    ({"num_trials": 1000, "batch_size": 0}, ValueError, "batch_size"),
    ({"num_trials": 1000, "statistic": "loss"}, TypeError, "statistic"),
])
def test_bad_audit_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        audit(_coin, 0, 1, **kwargs)


def test_bad_mechanism_or_statistic_output():
    with pytest.raises(TypeError, match="mechanism"):
        audit("not callable", 0, 1, num_trials=1000)
    with pytest.raises(ValueError, match="one score per run"):
        audit(lambda x, n, rng: np.zeros(n + 1), 0, 1, num_trials=1000)
    with pytest.raises(ValueError, match="statistic"):
        audit(lambda x, n, rng: np.zeros((n, 3)), 0, 1, num_trials=1000)
    with pytest.raises(ValueError, match="NaN"):
        audit(lambda x, n, rng: np.full(n, np.nan), 0, 1, num_trials=1000)


@pytest.mark.parametrize("call,error,name", [
    (lambda: audit_binary_rr(-1.0, num_trials=1000), ValueError, "eps"),
    (lambda: audit_kary_rr(1.0, num_classes=1, num_trials=1000), ValueError, "num_classes"),
    (lambda: audit_label_dp_layer(1.0, mode="multi", num_trials=1000), ValueError, "mode"),
    (lambda: audit_label_dp_layer(1.0, per_batch=1, num_trials=1000), TypeError, "per_batch"),
    (lambda: audit_embedding_dp_layer(1.0, num_coordinates=0, num_trials=1000), ValueError,
     "num_coordinates"),
    (lambda: audit_laplace(0.0, num_trials=1000), ValueError, "eps"),
    (lambda: audit_laplace(1.0, sampler="gauss", num_trials=1000), ValueError, "sampler"),
    (lambda: audit_laplace(1.0, statistic="max", num_trials=1000), ValueError, "statistic"),
    (lambda: audit_magrr(1.0, num_trials=50), ValueError, "num_trials"),
    (lambda: audit_signds(1.0, d=10, k=6, num_trials=1000), ValueError, "k"),
    (lambda: audit_signds(1.0, h=4, thr=5, num_trials=1000), ValueError, "thr"),
    (lambda: audit_signds(1.0, sampler="fast", num_trials=1000), ValueError, "sampler"),
    (lambda: eps_lower_bound(11, 10, 0, 10), ValueError, "a_hits"),
    (lambda: clopper_pearson(1, 10, side="both"), ValueError, "side"),
])
def test_bad_auditor_arguments(call, error, name):
    with pytest.raises(error, match=name):
        call()
