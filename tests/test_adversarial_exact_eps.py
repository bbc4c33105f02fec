"""Every eps is exact and never replayed (issue 11, cases 6, 7, 8 and 8b).

Each test fails on the code before the fix: rounding of probability
thresholds, the discrete Laplace sampler at tiny eps, seeded host-side
mechanisms replaying their noise after a restore, and the plain update left
in the weights by a partial SignDS round.
"""

import math
import warnings

import dp_accounting
from dp_accounting import pld
import keras
import numpy as np
import pytest

from keras_fedpriv import mechanisms as M
from keras_fedpriv.federated.laplace_eval import LaplaceEvaluation
from keras_fedpriv.federated.magrr import MagRR
from keras_fedpriv.federated.uploads import GaussianUpload
from keras_fedpriv.mechanisms import random as R
from keras_fedpriv.mechanisms.laplace import laplace, laplace_grid
from keras_fedpriv.mechanisms.randomized_response import (_keep_threshold, _keep_thresholds,
                                                          flip_threshold)
from keras_fedpriv.optimizers.signds import SignDSEncoder
from keras_fedpriv.optimizers.signds_optimizer import SignDS, SignDSRounds
from stats import assert_rate

pytestmark = [pytest.mark.jax]

WORDS = 2**32


def _event_epsilon(event):
    """Pure epsilon of a RandomizedResponseDpEvent: log((1 - a + a/k) / (a/k))."""
    a, k = event.noise_parameter, event.num_buckets
    return math.log((1 - a + a / k) / (a / k))


# --- Case 6: probability thresholds -------------------------------------------------------

def test_case6_flip_threshold_rounds_up_and_never_reaches_zero():
    """Case 6: a flip probability rounds up, so eps > 22.2 still flips (threshold >= 1)."""
    assert R.probability_threshold(1e-12) == 1  # was int(p * 2**32) = 0: never flip
    assert R.probability_threshold(0.3) == math.ceil(0.3 * WORDS)
    for eps in (22.5, 30.0, 100.0, 1000.0):
        assert flip_threshold(eps) == 1
    assert flip_threshold(1.0) / WORDS >= M.flip_probability(1.0)


def test_case6_large_eps_flip_frequency_is_positive_and_matches_the_realized_threshold():
    """Case 6: binary RR at eps=30 flips with probability 2**-32, not 0.

    2**32 draws would be needed to see one flip, so the test draws 2**26 words
    uniform on [0, 64), the conditional law of a word given ``word < 64``:
    the mechanism must flip a fraction T / 64 of them (T = 1 here; the old
    threshold 0 never flipped).
    """
    n = 2**26
    words = keras.ops.convert_to_numpy(R.uniform_words([n], seed=1234)) >> np.uint32(26)
    bits = np.zeros([n], "int32")
    out = M.binary_randomized_response(bits, 30.0, noise=words)
    flips = int(np.sum(keras.ops.convert_to_numpy(out), dtype=np.int64))
    assert flips > 0
    assert_rate(flips, n, flip_threshold(30.0) / 64, "binary RR eps=30 given word < 64")
    # quantize_rr (EmbeddingDP) at eps = 60 flips at eps/2 = 30: the same.
    q = M.quantize_rr(-np.ones([n], "float32"), 60.0, noise=words)
    flips = int(np.sum(keras.ops.convert_to_numpy(q), dtype=np.int64))
    assert_rate(flips, n, flip_threshold(30.0) / 64, "quantize_rr eps=60")
    # Word 0 always flips, at any eps.
    zero = np.zeros([8], "uint32")
    flipped = M.binary_randomized_response(np.zeros(8), 1000.0, noise=zero)
    assert np.all(keras.ops.convert_to_numpy(flipped) == 1)


@pytest.mark.parametrize("eps", [0.5, 1.0, 8.0, 22.0, 30.0, 100.0])
@pytest.mark.parametrize("k", [2, 3, 10])
def test_case6_event_epsilon_is_the_realized_epsilon(eps, k):
    """Case 6: the RR DpEvent's eps equals realized_epsilon and is <= the claimed eps."""
    event = M.randomized_response_dp_event(eps, k)
    realized = M.realized_epsilon(eps, k)
    assert _event_epsilon(event) == pytest.approx(realized, rel=1e-9, abs=1e-9)
    assert realized <= eps
    if eps >= 30:
        # Saturation: the mechanism is much more private than claimed, and the event says so.
        assert realized < 0.85 * eps and event.noise_parameter > 0
    if k == 2 and eps >= 30:
        assert realized == pytest.approx(math.log(WORDS - 1), rel=1e-12)
        accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(event)
        assert accountant.get_epsilon(1e-12) == pytest.approx(realized, rel=0.02)


def test_case6_realized_epsilon_from_the_thresholds_actually_used():
    """Case 6: realized_epsilon is the exact log-ratio of the integer thresholds in use."""
    for eps in (1.0, 8.0, 30.0):
        f = flip_threshold(eps)
        assert M.realized_epsilon(eps, 2) == pytest.approx(math.log((WORDS - f) / f), rel=1e-12)
        assert M.quantize_realized_epsilon(2 * eps) == M.realized_epsilon(eps, 2)
    # eps = 100 binary: about 22.18, not 100.
    assert M.realized_epsilon(100.0) == pytest.approx(22.1807, abs=1e-4)
    # EmbeddingDP flips at eps/2: quantize_rr_dp_event reports the realized eps/2 per coordinate.
    event = M.quantize_rr_dp_event(100.0, 1)
    assert _event_epsilon(event) == pytest.approx(M.quantize_realized_epsilon(100.0), rel=1e-9)
    # MagRR's eps_rr event too.
    assert _event_epsilon(MagRR(eps_rr=40.0).dp_event()) == pytest.approx(math.log(WORDS - 1))


def test_case6_keep_threshold_never_means_never_move():
    """Case 6: k-ary keep thresholds round down and stay below 2**32 even at eps = 1000."""
    for eps in (0.0, 1.0, 30.0, 1000.0):
        keep, _ = _keep_thresholds(10, eps)
        keep = keras.ops.convert_to_numpy(keep).astype(np.int64)
        # k = 1: one candidate, no choice (the table holds 2**32 - 1; the mechanism keeps it).
        assert keep[0] == WORDS - 1
        # k >= 2: the exact rounded-down threshold, below 2**32 (so some word moves).
        assert [int(t) for t in keep[1:]] == [_keep_threshold(eps, k) for k in range(2, 11)]
        assert np.all(keep[1:] < WORDS)
    assert M.realized_epsilon(1000.0, 10) == pytest.approx(M.realized_epsilon(30.0, 10))
    assert M.realized_epsilon(1000.0, 10) < 25


def test_case6_kary_moves_at_large_eps_are_uniform_and_happen():
    """Case 6: k-ary RR at eps=30 still moves; each other class has exactly S words."""
    k = 3
    n = 2**22
    keep_words = np.full([n], WORDS - 1, "uint32")  # always >= T
    other_words = R.uniform_words([n], seed=77)
    out = keras.ops.convert_to_numpy(M.kary_randomized_response(
        np.zeros(n, "int32"), k, 30.0, noise=[keep_words, other_words]))
    counts = np.bincount(out, minlength=k)
    # A word above the keep threshold moves; the move word splits into 2 equal buckets
    # of S = 2**31 words (remainder 0 for k - 1 = 2): about n/2 to each other class.
    assert counts[0] == 0
    assert_rate(int(counts[1]), n, 0.5, "k-ary other class 1")


def test_case6_rr_with_prior_event_dominates_its_realized_epsilon():
    """Case 6: rr_with_prior_dp_event is binary RR at the worst realized eps over k*."""
    eps, k = 2.0, 10
    event = M.rr_with_prior_dp_event(eps, k)
    worst = max(M.realized_epsilon(eps, j) for j in range(2, k + 1))
    assert _event_epsilon(event) >= worst - 1e-9
    assert _event_epsilon(event) == pytest.approx(M.realized_epsilon(eps, k, with_prior=True))
    assert _event_epsilon(event) <= eps


# --- Case 7: discrete Laplace at tiny eps --------------------------------------------------

def test_case7_tiny_eps_is_refused_not_released_rounded():
    """Case 7: eps=1e-16 used to overflow int64 and release the rounded input; now refused."""
    x = np.array([0.25, 0.75], "float64")
    with pytest.raises(ValueError, match=r"`eps` must be >= .*got 1e-16"):
        laplace(x, 1e-16, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="eps"):
        M.laplace_dp_event(1e-16, 2.0, num_values=2)


def test_case7_smallest_accepted_eps_gives_huge_exact_noise():
    """Case 7: just above the smallest accepted eps the noise is huge, never the input."""
    x = np.array([0.25, 0.75], "float64")
    message = None
    try:
        laplace_grid(1e-16, 2.0, 2)
    except ValueError as err:
        message = str(err)
    smallest = float(message.split(">= ")[1].split(" ")[0])
    out = laplace(np.tile(x, (200, 1)), smallest * 1.01, rng=np.random.default_rng(1))
    gamma = laplace_grid(smallest * 1.01, 2.0, 2)[0]
    assert not np.any(out == np.rint(x / gamma) * gamma)
    assert np.median(np.abs(out - x)) > 1e6


def test_case7_grid_at_extreme_eps_does_not_overflow():
    """Case 7: the integer sensitivity C is an exact int; a sub-normal grid is refused."""
    gamma, c, a = laplace_grid(1e300, 2.0, 10)
    assert isinstance(c, int) and c > 0 and a > 0 and gamma > 0
    with pytest.raises(ValueError, match="grid step"):
        laplace_grid(1e308, 2.0, 10)


# --- Case 8: no replay after restore ------------------------------------------------------

def test_case8_magrr_restored_state_gives_new_flips():
    """Case 8: a seeded MagRR restored with its state does not replay its flips."""
    r = np.full(4096, 1.0)  # every b = 0: the reports are the flips
    original = MagRR(eps_rr=0.5, seed=7)
    before = original.client_reports(r)
    restored = MagRR.from_config(original.get_config())
    restored.load_state_dict(original.state_dict())
    after = restored.client_reports(r)
    # XOR of the two would cancel the noise if they were equal.
    assert np.mean(before != after) > 0.3
    # (b) the same seed and calls without restore are reproducible.
    twin = MagRR(eps_rr=0.5, seed=7)
    np.testing.assert_array_equal(twin.client_reports(r), before)
    np.testing.assert_array_equal(twin.client_reports(r), after)


def test_case8_magrr_from_config_alone_refuses_to_report():
    """Case 8: a seeded MagRR rebuilt from its config without state refuses to report."""
    original = MagRR(eps_rr=0.5, seed=7)
    original.client_reports(np.ones(10))
    clone = MagRR.from_config(original.get_config())
    with pytest.raises(RuntimeError, match="load_state_dict"):
        clone.client_reports(np.ones(10))
    with pytest.raises(ValueError, match="num_releases"):
        clone.load_state_dict({"r_est": 1e-5, "phase": "growth", "rounds_in_range": 0})
    unseeded = MagRR.from_config(MagRR(eps_rr=0.5).get_config())
    assert unseeded.client_reports(np.ones(10)).shape == (10,)


def test_case8_signds_encoder_restored_state_gives_new_messages():
    """Case 8: a seeded SignDSEncoder restored with its state encodes with new randomness."""
    update = np.random.default_rng(2).standard_normal(4000).astype(np.float32)
    original = SignDSEncoder(k=0.2, eps=10.0, seed=11)
    before = [original.encode(update) for _ in range(3)]
    restored = SignDSEncoder.from_config(original.get_config())
    with pytest.raises(RuntimeError, match="load_state_dict"):
        restored.encode(update)
    restored.load_state_dict(original.state_dict())
    after = [restored.encode(update) for _ in range(3)]
    assert all(a != b for a in after for b in before)
    twin = SignDSEncoder(k=0.2, eps=10.0, seed=11)
    assert [twin.encode(update) for _ in range(6)] == before + after


def test_case8_gaussian_upload_restored_state_gives_new_noise():
    """Case 8: a seeded GaussianUpload has state; restored, its noise is new (no cancel)."""
    delta = np.zeros(1000, np.float32)
    original = GaussianUpload(1.0, 1.0, seed=3)
    before = original.client_message(delta, 1).message
    restored = GaussianUpload(1.0, 1.0, seed=3)
    restored.load_state_dict(original.state_dict())
    after = restored.client_message(delta, 1).message
    assert np.std(before - after) > 1.0  # independent noise: the difference does not cancel
    twin = GaussianUpload(1.0, 1.0, seed=3)
    np.testing.assert_array_equal(twin.client_message(delta, 1).message, before)
    np.testing.assert_array_equal(twin.client_message(delta, 1).message, after)


def test_case8_laplace_evaluation_restored_state_gives_new_noise():
    """Case 8: a seeded LaplaceEvaluation restored with its state adds new noise."""
    probs = np.full((50, 4), 0.25)
    original = LaplaceEvaluation(probs, eps=1.0, seed=4)
    before = original.client_report(probs)
    restored = LaplaceEvaluation.from_config(original.get_config())
    with pytest.raises(RuntimeError, match="load_state_dict"):
        restored.client_report(probs)
    restored.load_state_dict(original.state_dict())
    after = restored.client_report(probs)
    assert not np.any(before == after)
    twin = LaplaceEvaluation(probs, eps=1.0, seed=4)
    np.testing.assert_array_equal(twin.client_report(probs), before)
    np.testing.assert_array_equal(twin.client_report(probs), after)


def test_case8_secret_generator_streams_are_distinct_and_collision_free():
    """Case 8: secret_generator(seed, stream=n) differs per n and per (seed, n) pair."""
    draws = {(s, n): R.secret_generator(s, stream=n).integers(0, 2**63)
             for s, n in [(1, 0), (1, 1), (2, 0), (1, 2**32), (2**32, 0)]}
    assert len(set(draws.values())) == len(draws)
    assert (R.secret_generator(9, stream=3).integers(0, 2**63)
            == R.secret_generator(9, stream=3).integers(0, 2**63))


# --- Case 8b: a partial SignDS round leaves no plain update --------------------------------

def test_case8b_partial_round_is_discarded_with_a_warning():
    """Case 8b: epochs not a multiple of epochs_per_round: weights go back to the round's start."""
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((64, 5)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1, activation="sigmoid")])
    opt = SignDS(keras.optimizers.SGD(0.5), SignDSEncoder(k=0.25, eps=10.0, dim_out=1, seed=1))
    model.compile(opt, "binary_crossentropy")
    starts = []

    class Snapshot(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:  # the start of the partial round (epochs 3..3 of 2-epoch rounds)
                starts.append([w.numpy().copy() for w in model.trainable_weights])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, epochs=3, batch_size=16, verbose=0,
                  callbacks=[Snapshot(), SignDSRounds(epochs_per_round=2)])
    assert len(opt.messages) == 1 and not opt.in_round
    for w, s in zip(model.trainable_weights, starts[0]):
        np.testing.assert_array_equal(w.numpy(), s)
    assert any("1 epoch(s) into a round of 2" in str(w.message) for w in caught)
