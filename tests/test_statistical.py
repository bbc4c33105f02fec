"""Empirical output frequencies of every mechanism against its formula.

>= 100k samples each, tolerance 5 standard deviations, fixed seeds (so the
tests are deterministic), and for each a check that a wrong formula (eps
doubled or halved) would be rejected.
"""

import math

import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv import mechanisms as M
from stats import assert_rate, assert_rejects, assert_uniform

N = 200_000
EPS_VALUES = [0.0, 0.5, 1.0, 2.0, 8.0, 40.0]


def _wrong(p_fn, eps):
    """A formula that differs from the right one (eps doubled, or halved at eps=0)."""
    return p_fn(2 * eps) if eps > 0 else p_fn(1.0)


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_binary_rr_flip_rate(eps):
    bits = np.zeros(N, "int32")
    bits[::2] = 1
    out = M.binary_randomized_response(bits, eps, seed=11).numpy()
    flips = int(np.sum(out != bits))
    p = M.flip_probability(eps)
    assert_rate(flips, N, p, f"binary RR eps={eps}")
    if eps < 20:
        assert_rejects(flips, N, _wrong(M.flip_probability, eps), f"binary RR eps={eps}")
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
    out = M.kary_randomized_response(y, k, eps, seed=12).numpy()
    keep = int(np.sum(out == y))
    p1 = M.keep_probability(eps, k)
    assert p1 == pytest.approx(math.exp(eps) / (k - 1 + math.exp(eps)) if eps < 700 else 1.0)
    assert_rate(keep, N, p1, f"k-ary RR keep eps={eps} K={k}")
    if eps < 20:
        assert_rejects(keep, N, _wrong(lambda e: M.keep_probability(e, k), eps), "k-ary keep")
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


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_quantize_rr_rates(eps):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N // 8, 8)).astype("float32")
    out = M.quantize_rr(x, eps, seed=13).numpy()
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
    np.testing.assert_array_equal(M.quantize_rr(x).numpy(), [[0.0, 0.0, 1.0, 1.0]])


# --- The layers, through their public paths (what users run) -----------------

@pytest.mark.parametrize("eps", [0.0, 1.0, 8.0])
def test_label_layer_binary_rates(eps):
    y = np.zeros((N, 1), "float32")
    y[: N // 2] = 1
    out = kf.privatize_labels(y, eps, seed=21)
    assert out.shape == y.shape and out.dtype == y.dtype
    assert_rate(int(np.sum(out != y)), N, M.flip_probability(eps), f"LabelDP binary eps={eps}")
    if eps > 0:
        assert_rejects(int(np.sum(out != y)), N, M.flip_probability(2 * eps), "LabelDP binary")


@pytest.mark.parametrize("eps", [0.0, 1.0, 4.0])
def test_label_layer_onehot_rates(eps):
    k = 5
    cls = np.arange(N) % k
    y = np.eye(k, dtype="float32")[cls]
    out = kf.privatize_labels(y, eps, seed=22)
    assert out.shape == y.shape and out.dtype == y.dtype
    assert np.all(out.sum(axis=1) == 1)
    got = out.argmax(axis=1)
    assert_rate(int(np.sum(got == cls)), N, M.keep_probability(eps, k), f"one-hot keep eps={eps}")
    counts = np.bincount((got[got != cls] - cls[got != cls]) % k, minlength=k)[1:]
    assert_uniform(counts, f"one-hot other classes eps={eps}")


def test_label_layer_sparse_rates_per_true_class():
    k, eps = 4, 1.5
    cls = np.arange(N, dtype="int64") % k
    out = kf.privatize_labels(cls, eps, mode="sparse", num_classes=k, seed=23)
    assert out.dtype == np.int64
    for c in range(k):
        rows = out[cls == c]
        assert_rate(int(np.sum(rows == c)), rows.size, M.keep_probability(eps, k), f"class {c}")
        assert_uniform(np.bincount(rows[rows != c], minlength=k)[[j for j in range(k) if j != c]],
                       f"sparse other classes of {c}")


@pytest.mark.parametrize("eps", [0.0, 1.0, 6.0])
def test_embedding_layer_rates(eps):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(N // 16, 16)).astype("float32")
    layer = kf.EmbeddingDPLayer(eps=eps, seed=24)
    out = layer(x, training=True).numpy()
    ones = x > 0
    assert_rate(int(out[ones].sum()), int(ones.sum()), M.quantize_keep_probability(eps), "keep 1")
    assert_rate(int(out[~ones].sum()), int((~ones).sum()), M.quantize_turn_on_probability(eps),
                "turn 0 into 1")
    # Per coordinate the turn-on rate is the same (no position bias).
    col_counts = ((out == 1) & ~ones).sum(axis=0)
    col_n = (~ones).sum(axis=0)
    for c, n in zip(col_counts, col_n):
        assert_rate(int(c), int(n), M.quantize_turn_on_probability(eps), "per-coordinate 0 -> 1")


def test_label_layer_ids_and_per_batch_rates():
    """Both noise sources (id-keyed Philox, per-call stateless) have the right rate."""
    eps = 1.0
    y = np.zeros(N, "float32")
    layer = kf.LabelDPLayer(eps, seed=25)
    by_id = layer(y, example_ids=np.arange(N), training=True).numpy()
    assert_rate(int(by_id.sum()), N, M.flip_probability(eps), "id-keyed")
    per_batch = kf.LabelDPLayer(eps, seed=25, per_batch=True)
    a = per_batch(y, training=True).numpy()
    b = per_batch(y, training=True).numpy()
    assert_rate(int(a.sum()), N, M.flip_probability(eps), "per-batch")
    # Consecutive calls are independent: agreement rate p^2 + (1-p)^2.
    p = M.flip_probability(eps)
    assert_rate(int(np.sum(a == b)), N, p * p + (1 - p) ** 2, "per-batch independence")


# --- RR-with-prior ------------------------------------------------------------

def _brute_force_k(prior_row, eps):
    top = np.sort(prior_row)[::-1]
    scores = [top[:k].sum() / (1 + (k - 1) * math.exp(-eps)) for k in range(1, len(top) + 1)]
    return int(np.argmax(scores)) + 1


@pytest.mark.parametrize("eps", [0.1, 1.0, 2.0, 8.0])
def test_rr_with_prior_k_star_matches_brute_force(eps):
    rng = np.random.default_rng(3)
    prior = rng.dirichlet(np.full(6, 0.5), size=300).astype("float32")
    got = M.rr_with_prior_k(prior, eps).numpy()
    want = [_brute_force_k(row.astype("float64"), eps) for row in prior]
    assert np.mean(got == np.array(want)) > 0.99  # float32 ties may differ on a few rows


@pytest.mark.parametrize("eps,true_class", [(1.0, 0), (1.0, 1), (1.0, 3), (3.0, 0)])
def test_rr_with_prior_output_distribution(eps, true_class):
    prior_row = np.array([0.5, 0.3, 0.15, 0.05], "float32")
    k_star = _brute_force_k(prior_row.astype("float64"), eps)
    prior = np.tile(prior_row, (N, 1))
    out = M.rr_with_prior(np.full(N, true_class), prior, eps, seed=31).numpy()
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
        out = M.rr_with_prior(np.full(N, y), prior, eps, seed=40 + y).numpy()
        dists.append(np.bincount(out, minlength=4) / N)
    dists = np.array(dists)
    support = dists.max(axis=0) > 0
    ratio = dists[:, support].max(axis=0) / dists[:, support].min(axis=0)
    assert np.all(ratio < math.exp(eps) * 1.05), ratio
