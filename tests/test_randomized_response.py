"""Randomized response, k-ary RR and RR-with-prior
(keras_fedpriv/mechanisms/randomized_response.py):
output frequencies against the formulas (see stats.py for the tolerance and the power check)."""

import math

import numpy as np
import pytest
from keras import ops

from keras_fedpriv import mechanisms as M
from crosspath import compiled
from stats import EPS_VALUES, N, assert_rate, assert_rejects, assert_uniform, wrong_formula

pytestmark = [pytest.mark.jax]


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_binary_rr_flip_rate(eps):
    bits = np.zeros(N, "int32")
    bits[::2] = 1
    out = np.asarray(M.binary_randomized_response(bits, eps, seed=11))
    flips = int(np.sum(out != bits))
    p = M.flip_probability(eps)
    assert_rate(flips, N, p, f"binary RR eps={eps}")
    if eps < 20:
        assert_rejects(flips, N, wrong_formula(M.flip_probability, eps), f"binary RR eps={eps}")
    # Flips are symmetric: 0 -> 1 and 1 -> 0 at the same rate.
    assert_rate(int(np.sum(out[1::2] == 1)), N // 2, p, "0 -> 1")
    assert_rate(int(np.sum(out[::2] == 0)), N // 2, p, "1 -> 0")


def test_flip_probability_formula():
    for eps in [0.0, 0.3, 1.0, 5.0]:
        assert M.flip_probability(eps) == pytest.approx(1 / (1 + math.exp(eps)), rel=1e-12)
    assert M.flip_probability(0.0) == 0.5
    assert M.flip_probability(1000.0) == pytest.approx(0.0, abs=1e-300)  # no overflow


@pytest.mark.parametrize("eps", EPS_VALUES)
@pytest.mark.parametrize("k", [3, 10])
def test_kary_rr_keep_and_uniform_other(eps, k):
    y = np.arange(N) % k
    out = np.asarray(M.kary_randomized_response(y, k, eps, seed=12))
    keep = int(np.sum(out == y))
    p1 = M.keep_probability(eps, k)
    assert p1 == pytest.approx(math.exp(eps) / (k - 1 + math.exp(eps)) if eps < 700 else 1.0)
    assert_rate(keep, N, p1, f"k-ary RR keep eps={eps} K={k}")
    if eps < 20:
        assert_rejects(keep, N, wrong_formula(lambda e: M.keep_probability(e, k), eps),
                       "k-ary keep")
    # Each particular other class: rate p2 = 1/(K-1+e^eps), and uniform over the K-1.
    p2 = M.other_probability(eps, k)
    assert p1 + (k - 1) * p2 == pytest.approx(1.0)
    moved = out[out != y]
    offset = (moved - y[out != y]) % k  # 1..K-1: which other class
    counts = np.bincount(offset, minlength=k)[1:]
    for c in counts:
        assert_rate(int(c), N, p2, f"k-ary other class eps={eps}")
    if moved.size > 50 * (k - 1):
        assert_uniform(counts, f"k-ary other classes eps={eps} K={k}")


# --- RR-with-prior ------------------------------------------------------------

def _brute_force_k(prior_row, eps):
    top = np.sort(prior_row)[::-1]
    scores = [top[:k].sum() / (1 + (k - 1) * math.exp(-eps)) for k in range(1, len(top) + 1)]
    return int(np.argmax(scores)) + 1


@pytest.mark.parametrize("eps", [0.1, 1.0, 2.0, 8.0])
def test_rr_with_prior_k_star_matches_brute_force(eps):
    rng = np.random.default_rng(3)
    prior = rng.dirichlet(np.full(6, 0.5), size=300).astype("float32")
    got = np.asarray(M.rr_with_prior_k(prior, eps))
    want = [_brute_force_k(row.astype("float64"), eps) for row in prior]
    assert np.mean(got == np.array(want)) > 0.99  # float32 ties may differ on a few rows


@pytest.mark.parametrize("eps,true_class", [(1.0, 0), (1.0, 1), (1.0, 3), (3.0, 0)])
def test_rr_with_prior_output_distribution(eps, true_class):
    prior_row = np.array([0.5, 0.3, 0.15, 0.05], "float32")
    k_star = _brute_force_k(prior_row.astype("float64"), eps)
    prior = np.tile(prior_row, (N, 1))
    out = np.asarray(M.rr_with_prior(np.full(N, true_class), prior, eps, seed=31))
    counts = np.bincount(out, minlength=4)
    top = list(np.argsort(-prior_row)[:k_star])
    for c in range(4):
        if c not in top:
            expected = 0.0
        elif true_class in top:
            expected = (math.exp(eps) if c == true_class else 1.0) / (k_star - 1 + math.exp(eps))
        else:
            expected = 1.0 / k_star
        assert_rate(int(counts[c]), N, expected, f"prior eps={eps} y={true_class} class {c}")


def test_rr_with_prior_is_eps_dp_on_a_fixed_prior():
    """Output probabilities for any two labels differ by at most e^eps."""
    eps = 1.0
    prior = np.tile(np.array([0.4, 0.35, 0.2, 0.05], "float32"), (N, 1))
    dists = []
    for y in range(4):
        out = np.asarray(M.rr_with_prior(np.full(N, y), prior, eps, seed=40 + y))
        dists.append(np.bincount(out, minlength=4) / N)
    dists = np.array(dists)
    support = dists.max(axis=0) > 0
    ratio = dists[:, support].max(axis=0) / dists[:, support].min(axis=0)
    assert np.all(ratio < math.exp(eps) * 1.05), ratio


def test_mechanisms_compiled_match_eager_on_given_words():
    """With ``noise=`` words the mechanisms trace (XLA on TensorFlow, jit on JAX) and draw what
    they draw eagerly: the protection layers call them so inside ``fit``."""
    n = 4000
    words = [ops.convert_to_tensor(w) for w in np.random.default_rng(8).integers(
        0, 2**32, size=(2, n), dtype=np.uint64).astype(np.uint32)]
    y = ops.convert_to_tensor(np.arange(n) % 5, "int32")
    prior = np.random.default_rng(9).dirichlet(np.ones(5), n).astype("float32")
    x = ops.convert_to_tensor(prior - 0.2)
    prior = ops.convert_to_tensor(prior)
    cases = [lambda y, p, a, b: M.binary_randomized_response(y % 2, 1.0, noise=a),
             lambda y, p, a, b: M.kary_randomized_response(y, 5, 1.0, noise=[a, b]),
             lambda y, p, a, b: M.rr_with_prior(y, p, 1.0, noise=[a, b])]
    for fn in cases:
        np.testing.assert_array_equal(np.asarray(fn(y, prior, *words)),
                                      np.asarray(compiled(fn)(y, prior, *words)))
    quantize = lambda x, a: M.quantize_rr(x, 2.0, noise=ops.stack([a] * 5, -1))  # noqa: E731
    np.testing.assert_array_equal(np.asarray(quantize(x, words[0])),
                                  np.asarray(compiled(quantize)(x, words[0])))


def test_threshold_reports_are_binary_rr_of_the_side_of_the_cut():
    """MagRR's report: the bit [value < cut] (float64 on the host) through binary RR."""
    from keras_fedpriv.mechanisms.randomized_response import threshold_reports

    values = np.array([0.0, 1e-5, 2e-5 - 1e-12, 2e-5, 3e-5, 7.0])
    words = np.random.default_rng(0).integers(0, 2**32, size=values.size, dtype=np.uint32)
    bits = np.array([1, 1, 1, 0, 0, 0], np.int32)
    got = ops.convert_to_numpy(threshold_reports(values, 2e-5, 0.7, noise=words))
    want = ops.convert_to_numpy(M.binary_randomized_response(bits, 0.7, noise=words))
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int32 and set(np.unique(got)) <= {0, 1}
