"""SignDS (ALGORITHMS.md section 4): the exponential mechanism, the encoder and the server side.

The reference values are computed here independently of the module: exact
integers (`math.comb`, enumeration of subsets with itertools) and Fractions.
"""

import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from keras import ops
from scipy import stats as scipy_stats

from keras_fedpriv import mechanisms as M
from keras_fedpriv.mechanisms.events import pure_dp_event, pure_epsilon
from keras_fedpriv.mechanisms import signds as S
from keras_fedpriv.optimizers import (
    SignDSEncoder,
    SignDSMessage,
    aggregate,
    decode,
    flatten_update,
    unflatten_update,
)
from stats import assert_rate, assert_uniform

pytestmark = [pytest.mark.jax]

# ----------------------------------------------------------------------------
# Exact reference (no module code)
# ----------------------------------------------------------------------------


def exact_omega(d, k, h):
    return [math.comb(k, t) * math.comb(d - k, h - t) for t in range(h + 1)]


def exact_expected(omega, eps):
    """[E(thr) for thr = 1..h] as Fractions, from integer counts omega_t."""
    c = Fraction(math.exp(eps))  # the exact value of the float e^eps
    h = len(omega) - 1
    out = []
    for thr in range(1, h + 1):
        w = [x * (c if t >= thr else 1) for t, x in enumerate(omega)]
        out.append(sum(t * x for t, x in enumerate(w)) / sum(w))
    return out


def exact_threshold(omega, eps):
    expected = exact_expected(omega, eps)
    thr = 1
    while thr < len(expected) and expected[thr] > expected[thr - 1]:
        thr += 1
    return thr, expected[thr - 1]


def exact_pt(omega, eps, thr):
    c = Fraction(math.exp(eps))
    w = [x * (c if t >= thr else 1) for t, x in enumerate(omega)]
    z = sum(w)
    return [x / z for x in w]


def exact_output_dim(omega_of_h, d, eps, ratio, max_dim=None):
    bound = d if max_dim is None else min(d, max_dim)
    best = 1
    for h in range(1, bound + 1):
        _, e = exact_threshold(omega_of_h(h), eps)
        if e / h >= Fraction(ratio):
            best = h
        else:
            break
    return best


def merge_bins(expected):
    """Groups of adjacent bins, each expecting >= 5 counts (the last absorbs a remainder)."""
    groups, current, acc = [], [], 0.0
    for i, e in enumerate(expected):
        current.append(i)
        acc += e
        if acc >= 5:
            groups.append(current)
            current, acc = [], 0.0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


def merged_chisquare(observed, expected, groups=None):
    """Chi-square p-value of counts against expected counts, on merged bins.

    ``groups`` defaults to `merge_bins(expected)`; pass the bins of the
    true distribution to test the same counts against a wrong one.
    """
    groups = merge_bins(expected) if groups is None else groups
    obs = np.array([sum(observed[i] for i in g) for g in groups], float)
    exp = np.array([sum(expected[i] for i in g) for g in groups], float)
    if len(obs) < 2:
        return 1.0
    exp *= obs.sum() / exp.sum()
    return scipy_stats.chisquare(obs, exp).pvalue


# ----------------------------------------------------------------------------
# Statistical test of the encoder
# ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:SignDS. k \\* d")  # k * d = 40: the reference's warning
@pytest.mark.parametrize("eps,dim_out,expected_h", [(1.0, 10, 10), (3.0, 20, 20), (10.0, 0, 13)])
def test_encoder_distribution_matches_exact_formula(eps, dim_out, expected_h):
    d, n = 200, 20_000
    rng = np.random.default_rng(123)
    update = rng.permutation(np.linspace(-1.0, 1.0, d)).astype(np.float32)
    order = np.argsort(update)
    top_plus, top_minus = set(order[-40:].tolist()), set(order[:40].tolist())

    enc = SignDSEncoder(k=0.2, eps=eps, thr_ratio=0.6, dim_out=dim_out, seed=2024)
    k = enc.num_topk(d)
    assert k == 40
    h = enc.output_dim(d)
    assert h == expected_h
    omega = exact_omega(d, k, h)
    thr, _ = exact_threshold(omega, eps)
    assert enc.threshold(d) == thr
    if dim_out == 0:
        assert h == exact_output_dim(lambda hh: exact_omega(d, k, hh), d, eps, 0.6, max_dim=100)

    t_counts = np.zeros(h + 1)
    plus = 0
    sel_plus = np.zeros(d)
    for _ in range(n):
        msg = enc.encode(update)
        idx = msg.indices
        assert len(idx) == h and idx.dtype == np.int32
        top = top_plus if msg.sign == 1 else top_minus
        t_counts[sum(1 for i in idx.tolist() if i in top)] += 1
        if msg.sign == 1:
            plus += 1
            sel_plus[idx] += 1

    # t ~ P(t) of the exact formula.
    expected = [float(p) * n for p in exact_pt(omega, eps, thr)]
    pvalue = merged_chisquare(t_counts, expected)
    assert pvalue > 1e-4, (pvalue, t_counts, expected)
    # The same check rejects the distribution with 2 * eps.
    wrong = [float(p) * n for p in exact_pt(omega, 2 * eps, thr)]
    assert merged_chisquare(t_counts, wrong, merge_bins(expected)) < 1e-8

    # The sign is a fair coin.
    assert_rate(plus, n, 0.5, "sign = +1")
    # Given the sign, indices are uniform within S and within its complement.
    members = sorted(top_plus)
    others = sorted(set(range(d)) - top_plus)
    assert_uniform(sel_plus[members], "selections within S")
    assert_uniform(sel_plus[others], "selections outside S")


def test_sample_t_matches_exact_formula():
    d, k, h, eps = 500, 100, 30, 5.0
    omega = exact_omega(d, k, h)
    thr, _ = exact_threshold(omega, eps)
    assert S.optimal_threshold(d, k, h, eps) == thr
    rng = np.random.default_rng(7)
    n = 20_000
    counts = np.bincount([S.sample_t(d, k, h, eps, thr, rng) for _ in range(n)], minlength=h + 1)
    exact = [float(p) * n for p in exact_pt(omega, eps, thr)]
    assert merged_chisquare(counts, exact) > 1e-4
    wrong = [float(p) * n for p in exact_pt(omega, 2 * eps, thr)]
    assert merged_chisquare(counts, wrong, merge_bins(exact)) < 1e-8


class ScriptedRNG:
    """Stands in for a Generator: ``random()`` returns scripted values."""

    def __init__(self, values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def script_log_uniform(target):
    """``random()`` values that make `_log_uniform` return ``target`` (< 0)."""
    chunk = 10.0 * math.log(2.0)
    n = int(-target // chunk)
    rem = target + n * chunk  # in (-chunk, 0]
    return [1.0 - 2.0 ** -11] * n + [1.0 - math.exp(rem)]


def flog(x):
    return math.log(x.numerator) - math.log(x.denominator)


def test_sample_t_reaches_probabilities_below_float_resolution():
    # Outcomes with probability far below 2**-53 on both tails are drawn when
    # (and only when) the log-uniform falls in their slice of the CDF.
    d, k, h, eps, thr = 200, 40, 30, 50.0, 5
    omega = exact_omega(d, k, h)
    p = exact_pt(omega, eps, thr)
    mode = max(range(h + 1), key=lambda t: p[t])
    assert 0 < mode < h and p[0] < Fraction(2) ** -60 and p[h] < Fraction(2) ** -60
    lower_mass = sum(p[: mode + 1])
    # Lower side (first draw 0.0 -> log U = 0 -> not the upper side).
    for target, want in [(flog(p[0] / lower_mass) - 1.0, 0),
                         (flog((p[0] + p[1] / 2) / lower_mass), 1)]:
        rng = ScriptedRNG([0.0] + script_log_uniform(target))
        assert S._sample_t(d, k, h, eps, thr, rng) == want
    # Upper side: log U below log P(t >= j).
    for target, want in [(flog(p[h]) - 1.0, h), (flog(p[h] + p[h - 1] / 2), h - 1)]:
        rng = ScriptedRNG(script_log_uniform(target))
        assert S._sample_t(d, k, h, eps, thr, rng) == want


def test_log_uniform_tail():
    rng = np.random.default_rng(3)
    logs = np.array([S._log_uniform(rng) for _ in range(40_000)])
    assert np.all(logs <= 0)
    for q in (0.25, 2.0 ** -10, 2.0 ** -12):
        assert_rate(int(np.sum(logs < math.log(q))), len(logs), q, f"U < {q}")
    # Support: lo..hi only.
    d, k, h = 50, 45, 20
    for eps in (0.0, 50.0, 100.0):
        thr = S.optimal_threshold(d, k, h, eps)
        ts = [S.sample_t(d, k, h, eps, thr, rng) for _ in range(300)]
        assert 15 <= min(ts) and max(ts) <= 20


# ----------------------------------------------------------------------------
# Brute force over all subsets
# ----------------------------------------------------------------------------


def enumerate_omega(d, ks):
    """{k: {h: [count of h-subsets meeting range(k) in t places]}} by enumeration."""
    out = {k: {} for k in ks}
    for h in range(1, d + 1):
        counts = {k: [0] * (h + 1) for k in ks}
        for combo in itertools.combinations(range(d), h):
            for k in ks:
                counts[k][sum(1 for j in combo[:k] if j < k)] += 1
        for k in ks:
            out[k][h] = counts[k]
    return out


@pytest.mark.parametrize("d", [8, 12, 16])
def test_brute_force_threshold_and_output_dim(d):
    ks = [1, 2, 3, 4]
    table = enumerate_omega(d, ks)
    for k in ks:
        for h in range(1, d + 1):
            omega = table[k][h]
            assert omega == exact_omega(d, k, h)  # enumeration = the formula
            with np.errstate(divide="ignore"):
                np.testing.assert_allclose(S.log_omega(d, k, h), np.log(np.array(omega, float)),
                                           rtol=1e-12, atol=1e-12)
            for eps in (0.5, 1.0, 3.0, 10.0):
                thr, e_thr = exact_threshold(omega, eps)
                assert S.optimal_threshold(d, k, h, eps) == thr, (d, k, h, eps)
                assert S.expected_topk(d, k, h, eps, thr) == pytest.approx(float(e_thr), rel=1e-12)
                np.testing.assert_allclose(S.t_distribution(d, k, h, eps, thr),
                                           [float(p) for p in exact_pt(omega, eps, thr)],
                                           rtol=1e-12, atol=1e-300)
        for eps in (0.5, 1.0, 3.0, 10.0):
            for ratio in (0.5, 0.6, 0.8):
                want = exact_output_dim(lambda hh: table[k][hh], d, eps, ratio)
                assert S.optimal_output_dim(d, k, eps, ratio) == want, (d, k, eps, ratio)
                capped = exact_output_dim(lambda hh: table[k][hh], d, eps, ratio, max_dim=3)
                assert S.optimal_output_dim(d, k, eps, ratio, max_dim=3) == capped


def test_threshold_is_exact_where_floats_tie():
    # For large eps and h the first E(thr) agree to all 16 digits; comparing
    # floats would stop the scan at thr = 1 (it did for h = 150 here).
    d, k, eps = 266_084, 53_216, 100.0
    for h in (150, 238):
        thr, _ = exact_threshold(exact_omega(d, k, h), eps)
        assert S.optimal_threshold(d, k, h, eps) == thr


# ----------------------------------------------------------------------------
# Large d
# ----------------------------------------------------------------------------


def test_large_d_no_overflow():
    d, k, eps = 266_084, 53_216, 100.0
    h = S.optimal_output_dim(d, k, eps, 0.6)
    assert h > 65  # the reference's float64 overflow result
    # The rule's answer, checked exactly at the boundary.
    assert h == 238
    _, e238 = exact_threshold(exact_omega(d, k, 238), eps)
    _, e239 = exact_threshold(exact_omega(d, k, 239), eps)
    assert e238 / 238 >= Fraction(0.6) > e239 / 239
    for d, k in ((266_084, 53_216), (10_000_000, 100_000), (10_000_000, 2_500_000)):
        for eps in (1.0, 100.0):
            h = S.optimal_output_dim(d, k, eps, 0.6)
            thr = S.optimal_threshold(d, k, h, eps)
            p = S.t_distribution(d, k, h, eps, thr)
            assert np.all(np.isfinite(p)) and p.sum() == pytest.approx(1.0)
            assert math.isfinite(S.expected_topk(d, k, h, eps, thr))
            assert np.all(np.isfinite(S.log_omega(d, k, h)[: min(h, k) + 1]))
    assert S.optimal_output_dim(10_000_000, 100_000, 100.0, 0.6) == 43


def test_encode_ten_million():
    d = 10_000_000
    update = np.random.default_rng(1).standard_normal(d, dtype=np.float32)
    enc = SignDSEncoder(k=0.01, eps=100.0, seed=3)
    msg, magnitude = enc.encode_with_magnitude(update)
    h = enc.output_dim(d)
    assert h >= 1 and len(msg.indices) == h
    assert msg.indices.dtype == np.int32
    assert np.all(np.diff(msg.indices) > 0)
    assert 0 <= msg.indices[0] and msg.indices[-1] < d
    assert msg.dim == d and msg.nbytes == 4 * h + 1
    assert math.isfinite(magnitude) and magnitude > 2.0  # mean of the top 1% of N(0, 1)
    # With eps = 100 almost all indices come from the top 1% in the sign's direction.
    values = update[msg.indices] * msg.sign
    cutoff = np.quantile(update * msg.sign, 0.99)
    assert np.mean(values >= cutoff) >= 0.5


def test_select_indices_top_set_by_signed_value_and_ties():
    rng = np.random.default_rng(0)
    update = np.array([-5.0, 4.0, 0.0, 0.0, 0.0, 3.0, -1.0, 0.0], np.float32)
    # eps huge and h = k = thr: all released indices are from S.
    idx, mean = S.select_indices(update, 2, 2, 100.0, 2, +1, rng)
    assert idx.tolist() == [1, 5] and mean == pytest.approx(3.5)
    idx, mean = S.select_indices(update, 2, 2, 100.0, 2, -1, rng)
    assert idx.tolist() == [0, 6] and mean == pytest.approx(3.0)
    # Ties at the k-th value: S still has exactly k members.
    for _ in range(20):
        idx, mean = S.select_indices(update, 4, 4, 100.0, 4, +1, rng)
        assert {1, 5} <= set(idx.tolist()) and len(idx) == 4
        assert mean == pytest.approx(7.0 / 4)
    # Complement sampling when it is small (k close to d).
    idx, _ = S.select_indices(update, 7, 8, 0.0, 1, +1, rng)
    assert idx.tolist() == list(range(8))


# ----------------------------------------------------------------------------
# Domains
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,match", [
    ({"k": 0}, "`k`"), ({"k": 0.3}, "`k`"), ({"k": True}, "`k`"),
    ({"eps": 0}, "`eps`"), ({"eps": 101}, "`eps`"), ({"eps": float("nan")}, "`eps`"),
    ({"eps": True}, "`eps`"),
    ({"thr_ratio": 0.4}, "`thr_ratio`"), ({"thr_ratio": 1.5}, "`thr_ratio`"),
    ({"dim_out": 51}, "`dim_out`"), ({"dim_out": 2.5}, "`dim_out`"), ({"dim_out": -1}, "`dim_out`"),
    ({"max_dim_out": 0}, "`max_dim_out`"),
    ({"seed": -1}, "`seed`"), ({"seed": 1.5}, "`seed`"),
])
def test_encoder_rejects_bad_parameters(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match) as info:
        SignDSEncoder(**kwargs)
    value = next(iter(kwargs.values()))
    assert repr(value) in str(info.value)  # the message names the value too


def test_encoder_rejects_bad_updates_and_small_d():
    enc = SignDSEncoder(k=0.01, seed=0)
    with pytest.raises(ValueError, match="`update`.*NaN"):
        enc.encode(np.array([1.0, np.nan] * 200, np.float32))
    with pytest.raises(ValueError, match="`update`"):
        enc.encode([np.ones(500, np.float32), np.array([np.inf], np.float32)])
    with pytest.raises(ValueError, match="k=0.01 and d=50"):
        enc.encode(np.ones(50, np.float32))
    with pytest.raises(ValueError, match="`num_examples`"):
        enc.encode(np.ones(500, np.float32), num_examples=0)
    with pytest.warns(UserWarning, match="k \\* d"):
        enc.encode(np.arange(1000, dtype=np.float32))
    with pytest.raises(ValueError, match="`dim_out`"), pytest.warns(UserWarning):
        SignDSEncoder(k=0.25, dim_out=20).encode(np.ones(10, np.float32))


def test_math_functions_validate():
    with pytest.raises(ValueError, match="`k`"):
        S.log_omega(10, 11, 3)
    with pytest.raises(ValueError, match="`h`"):
        S.t_distribution(10, 2, 11, 1.0, 1)
    with pytest.raises(ValueError, match="`thr`"):
        S.t_distribution(10, 2, 3, 1.0, 4)
    with pytest.raises(TypeError, match="`d`"):
        S.optimal_output_dim(10.0, 2, 1.0, 0.6)
    with pytest.raises(ValueError, match="`eps`"):
        S.optimal_threshold(10, 2, 3, -1.0)
    with pytest.raises(ValueError, match="`thr_ratio`"):
        S.optimal_output_dim(10, 2, 1.0, 0.0)
    with pytest.raises(ValueError, match="`sign`"):
        S.select_indices(np.ones(10), 2, 3, 1.0, 1, 0, np.random.default_rng(0))
    with pytest.raises(TypeError, match="`rng`"):
        S.sample_t(10, 2, 3, 1.0, 1, np.random)


# ----------------------------------------------------------------------------
# Server side
# ----------------------------------------------------------------------------


def seed_table_messages(extra=None):
    extra = extra or {}
    # The original design's example (1-based indices 1,5,8 / 2,3,4 / 3,6,7), d = 8.
    return [SignDSMessage(1, np.array([0, 4, 7]), 8, **extra.get(0, {})),
            SignDSMessage(-1, np.array([1, 2, 3]), 8, **extra.get(1, {})),
            SignDSMessage(1, np.array([2, 5, 6]), 8, **extra.get(2, {}))]


def test_decode_and_aggregate_seed_example():
    msgs = seed_table_messages()
    assert decode(msgs[1]).tolist() == [0, -1, -1, -1, 0, 0, 0, 0]
    assert decode(msgs[1]).dtype == np.float32
    third = np.float32(1 / 3)
    want = np.array([third, -third, 0, -third, third, third, third, third], np.float32)
    np.testing.assert_array_equal(aggregate(msgs), want)
    np.testing.assert_allclose(aggregate(msgs, global_lr=3.0), [1, -1, 0, -1, 1, 1, 1, 1],
                               atol=1e-6)
    # Explicit weights.
    np.testing.assert_allclose(aggregate(msgs, weights=[2, 1, 1]),
                               [0.5, -0.25, 0, -0.25, 0.5, 0.25, 0.25, 0.5], atol=1e-7)
    # num_examples used when every message has one, ignored otherwise.
    weighted = seed_table_messages({0: {"num_examples": 2}, 1: {"num_examples": 1},
                                    2: {"num_examples": 1}})
    np.testing.assert_allclose(aggregate(weighted), aggregate(msgs, weights=[2, 1, 1]))
    partial = seed_table_messages({0: {"num_examples": 5}})
    np.testing.assert_allclose(aggregate(partial), aggregate(msgs))


def test_aggregate_and_message_validation():
    msgs = seed_table_messages()
    with pytest.raises(ValueError, match="same dim"):
        aggregate(msgs + [SignDSMessage(1, np.array([0]), 9)])
    with pytest.raises(ValueError, match="non-empty"):
        aggregate([])
    with pytest.raises(ValueError, match="`global_lr`"):
        aggregate(msgs, global_lr=0)
    with pytest.raises(ValueError, match="`global_lr`"):
        aggregate(msgs, global_lr=float("inf"))
    with pytest.raises(ValueError, match="`weights`"):
        aggregate(msgs, weights=[1, 1])
    with pytest.raises(ValueError, match="`weights`"):
        aggregate(msgs, weights=[1, -1, 1])
    with pytest.raises(ValueError, match="sorted and unique"):
        SignDSMessage(1, np.array([3, 1]), 8)
    with pytest.raises(ValueError, match="sorted and unique"):
        SignDSMessage(1, np.array([1, 1]), 8)
    with pytest.raises(ValueError, match="`indices`"):
        SignDSMessage(1, np.array([0, 8]), 8)
    with pytest.raises(ValueError, match="`sign`"):
        SignDSMessage(0, np.array([0]), 8)
    m = SignDSMessage(-1, [1, 4], 8)
    assert m.indices.dtype == np.int32 and m.nbytes == 9
    assert {f.name for f in __import__("dataclasses").fields(m)} == {
        "sign", "indices", "dim", "num_examples"}
    with pytest.raises(ValueError):
        m.indices[0] = 2  # read-only


def test_flatten_roundtrip_and_list_input():
    parts = [np.arange(6, dtype=np.float32).reshape(2, 3), ops.convert_to_tensor([7.0, 8.0]),
             np.float32(9.0) * np.ones((1, 1, 2), np.float32)]
    flat, shapes = flatten_update(parts)
    assert flat.dtype == np.float32 and flat.tolist() == [0, 1, 2, 3, 4, 5, 7, 8, 9, 9]
    back = unflatten_update(flat, shapes)
    for a, b in zip(back, parts):
        np.testing.assert_array_equal(a, np.asarray(b))
    with pytest.raises(ValueError, match="`flat`"):
        unflatten_update(flat[:-1], shapes)
    # A list of tensors encodes like their concatenation (same seed).
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(600, dtype=np.float32), rng.standard_normal(400, dtype=np.float32)
    m1 = SignDSEncoder(k=0.1, eps=10.0, seed=9).encode([ops.convert_to_tensor(a), b.reshape(20, 20)])
    m2 = SignDSEncoder(k=0.1, eps=10.0, seed=9).encode(np.concatenate([a, b]))
    assert m1 == m2 and m1.dim == 1000


# ----------------------------------------------------------------------------
# Secrets, config, accounting
# ----------------------------------------------------------------------------


def test_seeded_reproducible_and_unseeded_fresh():
    update = np.random.default_rng(2).standard_normal(2000).astype(np.float32)
    a = [SignDSEncoder(k=0.2, eps=10.0, seed=11).encode(update) for _ in range(2)]
    assert a[0] == a[1]
    e1, e2 = SignDSEncoder(k=0.2, eps=10.0, seed=11), SignDSEncoder(k=0.2, eps=10.0, seed=11)
    assert [e1.encode(update) for _ in range(4)] == [e2.encode(update) for _ in range(4)]
    f1, f2 = SignDSEncoder(k=0.2, eps=10.0), SignDSEncoder(k=0.2, eps=10.0)
    assert [f1.encode(update) for _ in range(4)] != [f2.encode(update) for _ in range(4)]
    # numpy's global RNG plays no part.
    np.random.seed(0)
    x = SignDSEncoder(k=0.2, eps=10.0, seed=11).encode(update)
    np.random.seed(1)
    assert SignDSEncoder(k=0.2, eps=10.0, seed=11).encode(update) == x


def test_config_and_privacy():
    enc = SignDSEncoder(k=0.2, eps=5.0, thr_ratio=0.7, dim_out=12)
    config = enc.get_config()
    assert "seed" not in config
    assert config == {"k": 0.2, "eps": 5.0, "thr_ratio": 0.7, "dim_out": 12, "max_dim_out": 100}
    assert SignDSEncoder(seed=4).get_config()["seed"] == 4
    assert SignDSEncoder.from_config(config).get_config() == config
    assert enc.epsilon == 5.0
    event = enc.dp_event()
    # binary RR at exactly eps (not the thresholded RR as realized): SignDS is 5-DP
    assert event == pure_dp_event(5.0) == M.signds_dp_event(5.0)
    assert pure_epsilon(event) == pytest.approx(5.0, rel=1e-12)
    assert M.signds.optimal_output_dim is M.optimal_output_dim


def test_default_cap_and_lifting_it():
    d = 266_084
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SignDSEncoder(k=0.2, eps=100.0).output_dim(d) == 100
        assert SignDSEncoder(k=0.2, eps=100.0, max_dim_out=None).output_dim(d) == 238
        assert SignDSEncoder(k=0.2, eps=100.0, max_dim_out=150).output_dim(d) == 150
        assert SignDSEncoder(k=0.2, eps=10.0).output_dim(d) == 14
        assert SignDSEncoder(k=0.2, eps=10.0, dim_out=30).output_dim(d) == 30
