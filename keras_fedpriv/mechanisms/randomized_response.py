"""Randomized response: binary, k-ary, and k-ary with a prior (RR-with-prior).

Pure functions: no Keras state. Each takes the data, ``eps`` and either
``noise`` (uniform uint32 words, from `keras_fedpriv.mechanisms.random`) or a
``seed`` (None: a fresh secret from OS entropy; an int: reproducible). The
formulas:

* binary: flip with ``p = 1 / (1 + e^eps)``;
* k-ary over K classes: keep with ``p1 = e^eps / (K - 1 + e^eps)``, move to
  each other class with ``p2 = 1 / (K - 1 + e^eps)``;
* RR-with-prior (Ghazi et al. 2021): k-ary RR restricted to the k* classes
  with the largest prior, where k* maximizes
  ``sum_{top k} prior / (1 + (k - 1) e^-eps)``; a label outside them goes to
  a uniform class among them. Same eps guarantee, better accuracy.

Probabilities are computed with ``exp(-eps)`` so that large eps never
overflows.

**Realized epsilon.** The mechanisms compare uniform 32-bit words with
integer thresholds, so the probabilities actually used are multiples of
2**-32 (keep) and 2**-64 (each other class), not the real numbers above. The
keep threshold is the largest integer whose exact output distribution is
eps-DP (a keep probability rounds DOWN, a flip or move probability UP), and a
move picks the other class by exact division of a second word into equal
buckets (the few remainder words keep the true class, which the threshold
accounts for), so every other class has exactly the same probability and the
realized mechanism is exactly k-ary randomized response. Its epsilon,
`realized_epsilon`, is at most ``eps`` and is what the DpEvents report.
Two consequences:

* for large eps the realized epsilon saturates: a move probability cannot go
  below 2**-32, so binary RR at any ``eps >= 22.2`` is realized at
  ``log(2**32 - 1) ~= 22.18`` (more private than asked; the DpEvent says
  22.18, and `realized_epsilon` tells the caller). No eps ever yields
  "never move";
* for ``eps`` below about ``K * 2**-32`` with ``K - 1`` not a power of two, no
  multiple of 2**-32 realizes the exact distribution and the realized
  epsilon can exceed ``eps`` by at most about ``K * 2**-32`` (e.g. eps = 0
  over K = 3 classes is realized at ~1e-9); the DpEvent reports that value.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Sequence

import dp_accounting
from typing import Any

import numpy as np
from keras import ops
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.random import uniform_index, uniform_words, words_below
from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int

__all__ = [
    "flip_probability",
    "flip_threshold",
    "keep_probability",
    "other_probability",
    "binary_randomized_response",
    "kary_randomized_response",
    "rr_with_prior",
    "rr_with_prior_k",
    "randomized_response_dp_event",
    "realized_epsilon",
    "rr_with_prior_dp_event",
    "threshold_reports",
]

_WORDS = 2**32  # outcomes of one uniform uint32 word


def flip_probability(eps: float) -> float:
    """Flip probability of binary randomized response, ``1 / (1 + e^eps)``."""
    eps = validate_eps(eps)
    t = math.exp(-eps)
    return t / (1.0 + t)


def keep_probability(eps: float, num_classes: int) -> float:
    """Probability that k-ary RR keeps the true class, ``e^eps / (K - 1 + e^eps)``."""
    eps = validate_eps(eps)
    k = validate_positive_int(num_classes, "num_classes", minimum=2)
    return 1.0 / (1.0 + (k - 1) * math.exp(-eps))


def other_probability(eps: float, num_classes: int) -> float:
    """Probability of each particular other class, ``1 / (K - 1 + e^eps)``."""
    eps = validate_eps(eps)
    k = validate_positive_int(num_classes, "num_classes", minimum=2)
    t = math.exp(-eps)
    return t / (1.0 + (k - 1) * t)


def _move_buckets(num_classes):
    """``(S, R)``: a move word picks other class ``word // S``; the ``R`` words above keep."""
    return divmod(_WORDS, num_classes - 1)


def _kary_weights(keep_threshold, num_classes):
    """Exact probabilities of k-ary RR with this keep threshold, in units of 2**-64.

    Returns ``(keep, other)``: the probability of outputting the true class
    and of each particular other class, times 2**64 (integers).
    """
    s, r = _move_buckets(num_classes)
    moved = _WORDS - keep_threshold
    return keep_threshold * _WORDS + moved * r, moved * s


def _log_ratio(num, den):
    """``log(num / den)`` for positive integers, accurate also when the ratio is ~1."""
    if den == 0:
        return math.inf
    return math.log1p(float(Fraction(num - den, den)))


@functools.lru_cache(maxsize=4096)
def _keep_threshold(eps, num_classes):
    """The keep threshold of k-ary RR: the largest T whose exact distribution is eps-DP.

    T is the largest integer in [0, 2**32) with ``log(keep / other) <= eps``
    for the exact weights of `_kary_weights` (T = 2**32, "never move", has
    ``other = 0`` and is never chosen). Starts from the float solution of
    ``keep / other = e^eps`` and corrects it by exact integer comparisons.
    """
    k = num_classes
    if k == 1:
        return _WORDS  # one candidate: the output is that candidate, whatever the label
    t = math.exp(-eps)
    s, r = _move_buckets(k)
    # keep / other = e^eps  <=>  T = 2**32 (S - R t) / ((2**32 - R) t + S)
    estimate = _WORDS * (s - r * t) / ((_WORDS - r) * t + s)
    threshold = min(max(int(estimate), 0), _WORDS - 1)  # a start for the search below

    def log_ratio(th):
        return _log_ratio(*_kary_weights(th, k))

    while threshold < _WORDS - 1 and log_ratio(threshold + 1) <= eps:
        threshold += 1
    while threshold > 0 and log_ratio(threshold) > eps:
        threshold -= 1
    return threshold


def _kary_realized(eps, num_classes):
    """``(realized eps, keep, other)`` of k-ary RR at ``eps`` (weights in units of 2**-64)."""
    keep, other = _kary_weights(_keep_threshold(eps, num_classes), num_classes)
    return abs(_log_ratio(keep, other)), keep, other


def _rr_with_prior_realized(eps, num_classes):
    """Realized eps of RR-with-prior over ``num_classes``: the worst candidate-set size.

    A candidate set of k* classes runs k*-ary RR; a label outside the set gets
    `uniform_index` over the k* (``floor`` or ``ceil(2**32 / k*)`` words per
    class). Neighbouring labels share the prior, hence k*, so the realized
    eps is the max over k* = 2..K of the largest log-ratio between the
    probabilities of one output under two labels (inside: keep or other;
    outside: the uniform's smallest and largest bucket).
    """
    worst = 0.0
    for k in range(2, num_classes + 1):
        eps_k, keep, other = _kary_realized(eps, k)
        worst = max(worst, eps_k)
        if k < num_classes:  # a label can be outside the set
            low = (_WORDS // k) * _WORDS
            high = -(-_WORDS // k) * _WORDS
            worst = max(worst, _log_ratio(max(keep, high), min(other, low)))
    return worst


def realized_epsilon(eps: float, num_classes: int = 2, *, with_prior: bool = False) -> float:
    """The epsilon that randomized response at ``eps`` actually achieves.

    Computed from the integer thresholds the mechanisms use (the exact output
    distribution), not from the formula. It is at most ``eps`` (up to about
    ``K * 2**-32`` below eps ~ ``K * 2**-32`` when ``K - 1`` is not a power
    of two, see the module docstring) and saturates for large eps: binary RR
    is realized at ``log(2**32 - 1) ~= 22.18`` for every ``eps >= 22.2``.

    Args:
        eps: the nominal privacy parameter, finite and >= 0.
        num_classes: K >= 2; 2 is `binary_randomized_response` (and MagRR's
            reports), K is `kary_randomized_response` over K classes.
        with_prior: the realized eps of `rr_with_prior` over K classes (the
            worst candidate-set size k* = 2..K) instead of K-ary RR.

    Returns:
        The realized epsilon (float).

    Example:
        >>> realized_epsilon(100.0)  # binary RR: a flip probability of 2**-32
        22.18070977...
    """
    eps = validate_eps(eps)
    k = validate_positive_int(num_classes, "num_classes", minimum=2)
    if with_prior:
        return _rr_with_prior_realized(eps, k)
    return _kary_realized(eps, k)[0]


def _rr_event(realized, keep, other, k):
    """RR event of exact weights, or the RR at the same eps when keep < other."""
    if keep >= other:
        # P(other) = a / K exactly: a = K * other / 2**64 (<= 1 since keep >= other).
        a = float(Fraction(k * other, _WORDS * _WORDS))
    else:
        # Keep below other (eps ~ 0 only): not of dp-accounting's form; the K-ary RR
        # with the same probability ratio dominates it (its hockey-stick divergence is
        # (e^eps - e^x) / (K - 1 + e^eps) against (e^eps - e^x) / (1 + (K - 1) e^eps)).
        a = k / (k - 1 + math.exp(realized))
    return dp_accounting.RandomizedResponseDpEvent(noise_parameter=a, num_buckets=k)


def randomized_response_dp_event(eps: float,
                                 num_buckets: int = 2) -> dp_accounting.RandomizedResponseDpEvent:
    """The `dp_accounting` event of eps-randomized response over ``num_buckets``.

    dp_accounting parametrizes RR by the probability ``a`` of answering with a
    uniform bucket: ``P(keep) = 1 - a + a / K``, ``P(each other) = a / K``.
    The event is built from the probabilities the mechanism actually uses
    (integer thresholds, see `realized_epsilon`), so it is exact: its epsilon
    ``log((1 - a + a / K) / (a / K))`` is `realized_epsilon(eps, K)`, at most
    ``eps`` and ~22.18 (binary) for every eps >= 22.2. With the real numbers
    it would be ``a = K / (K - 1 + e^eps)``. Only for eps ~ 0 with ``K - 1``
    not a power of two can the realized keep probability fall a hair below
    the others'; the event is then the K-ary RR with the same ratio, which
    dominates the mechanism.
    Compose it with a PLD accountant whose neighbouring relation is
    ``REPLACE_ONE`` (label DP and local DP replace one value).
    """
    eps = validate_eps(eps)
    k = validate_positive_int(num_buckets, "num_buckets", minimum=2)
    realized, keep, other = _kary_realized(eps, k)
    return _rr_event(realized, keep, other, k)


def rr_with_prior_dp_event(eps: float,
                           num_classes: int) -> dp_accounting.RandomizedResponseDpEvent:
    """A `dp_accounting` event that dominates `rr_with_prior` over ``num_classes``.

    RR-with-prior runs k*-ary RR with a k* that depends on the prior, so no
    single K-ary RR event is exact; binary RR at the realized epsilon
    (`realized_epsilon(eps, K, with_prior=True)`) dominates every mechanism
    with that pure epsilon (Kairouz, Oh, Viswanath 2015).
    """
    eps = validate_eps(eps)
    k = validate_positive_int(num_classes, "num_classes", minimum=2)
    realized = _rr_with_prior_realized(eps, k)
    return dp_accounting.RandomizedResponseDpEvent(
        noise_parameter=2.0 / (1.0 + math.exp(realized)), num_buckets=2)


def flip_threshold(eps: float) -> int:
    """Word threshold of the binary flip (``word < T`` flips): ``2**32 - keep threshold``.

    Binary RR and `quantize_rr` flip with probability ``T / 2**32``: the flip
    probability ``1 / (1 + e^eps)`` rounded up, exactly the K = 2 case of
    k-ary RR. Always >= 1.
    """
    return _WORDS - _keep_threshold(validate_eps(eps), 2)


def noise_words(noise, shape, seed, count=1):
    """Return ``count`` uint32 noise tensors of ``shape``."""
    if noise is not None:
        noise = noise if isinstance(noise, (list, tuple)) else [noise]
        if len(noise) < count:
            raise ValueError(f"`noise` must hold {count} word tensor(s); got {len(noise)}.")
        return [ops.cast(n, "uint32") for n in noise[:count]]
    words = uniform_words([count] + list(shape), seed=seed)
    return [words[i] for i in range(count)]


def binary_randomized_response(bits: ArrayLike, eps: float, *, seed: int | None = None,
                               noise: ArrayLike | Sequence[ArrayLike] | None = None) -> Any:
    """Flip each bit with probability ``1 / (1 + e^eps)``.

    Args:
        bits: tensor of 0/1 values (any numeric dtype, any shape).
        eps: privacy parameter, finite and >= 0 (0 = fair coin).
        seed: None (fresh OS-entropy secret, eager only) or an int.
        noise: optional uint32 words of the shape of ``bits`` (overrides seed).

    Returns:
        Tensor of the shape and dtype of ``bits`` with values in {0, 1}. The
        realized flip probability is ``flip_threshold(eps) / 2**32`` (see
        `realized_epsilon`).

    Example:
        >>> y = binary_randomized_response(np.array([0, 1, 1]), eps=1.0, seed=7)
    """
    eps = validate_eps(eps)
    bits = ops.convert_to_tensor(bits)
    (words,) = noise_words(noise, ops.shape(bits), seed)
    flip = words_below(words, flip_threshold(eps))
    out = ops.logical_xor(ops.greater(bits, 0), flip)
    return ops.cast(out, bits.dtype)


def threshold_reports(values: ArrayLike, cut: float, eps: float, *, seed: int | None = None,
                      noise: ArrayLike | None = None) -> Any:
    """The bit ``[value < cut]`` of each value, through binary randomized response at ``eps``.

    MagRR's client report (from MindSpore Federated's SignDS design): a client
    compares its private step size with the cut the server announces and
    releases one randomized bit. The comparison is made in float64 on the
    host, so the bit does not depend on the Keras backend's float width.

    Args:
        values: the private values, finite reals (any shape).
        cut: the public threshold (a finite real).
        eps: privacy parameter, finite and >= 0.
        seed: None (fresh OS-entropy secret) or an int.
        noise: optional uint32 words of the shape of ``values`` (overrides seed).

    Returns:
        int32 tensor of the shape of ``values`` with values in {0, 1}: each
        report is ``eps``-LDP (`realized_epsilon`), whatever the cut.

    Example:
        >>> threshold_reports(np.array([0.1, 3.0]), cut=1.0, eps=5.0, seed=0)  # mostly [1, 0]
    """
    bits = np.less(np.asarray(values, np.float64), float(cut)).astype(np.int32)
    return binary_randomized_response(bits, eps, seed=seed, noise=noise)


def _keep_thresholds(max_k, eps):
    """uint32 tables for k = 1..max_k candidates: keep thresholds and move bucket sizes.

    Entry k-1 of the first is `_keep_threshold` (rounded down: never "never
    move"; for k = 1, where nothing moves, 2**32 - 1: the output is the one
    candidate either way), of the second ``S = 2**32 // (k - 1)``, the number
    of move words per other class. ``S = 2**32`` (k = 1, 2) does not fit in
    32 bits: those entries are 1 and `_rr_on_ranks` moves to other rank 0.
    """
    keep = [min(_keep_threshold(eps, k), _WORDS - 1) for k in range(1, max_k + 1)]
    sizes = [1, 1] + [_move_buckets(k)[0] for k in range(3, max_k + 1)]
    return (ops.convert_to_tensor(keep, dtype="uint32"),
            ops.convert_to_tensor(sizes[:max_k], dtype="uint32"))


def _rr_on_ranks(rank_y, k, max_k, keep_words, other_words, eps):
    """k-ary RR on ranks 0..k-1, where k may vary per row (k <= max_k).

    ``rank_y`` is the true class's rank within the candidate set, or -1 when
    it is outside the set (then the output is uniform over the set).
    Returns the output rank (int32). Only 32-bit integer ops (JAX has no
    uint64 without x64).
    """
    k = ops.cast(k, "int32")
    rank_y = ops.cast(rank_y, "int32")
    keep_table, size_table = _keep_thresholds(max_k, eps)
    keep = ops.logical_or(words_below(keep_words, ops.take(keep_table, k - 1)), ops.equal(k, 1))
    # A move goes to other rank word // S: every other rank gets exactly S words;
    # the R = 2**32 mod (k - 1) words above (k - 1) * S keep the true rank
    # (accounted for in the keep threshold). With k <= 2, S = 2**32: rank 0.
    other = ops.cast(ops.floor_divide(ops.cast(other_words, "uint32"),
                                      ops.take(size_table, k - 1)), "int32")
    other = ops.where(ops.greater(k, 2), other, 0)
    keep = ops.logical_or(keep, ops.greater_equal(other, k - 1))
    inside = ops.greater_equal(rank_y, 0)
    # Inside and not kept: the k - 1 other ranks. Outside the set: uniform over all k ranks.
    other = other + ops.cast(ops.greater_equal(other, rank_y), "int32")
    uniform_all = uniform_index(other_words, k)
    return ops.where(inside, ops.where(keep, rank_y, other), uniform_all)


def kary_randomized_response(class_ids: ArrayLike, num_classes: int, eps: float, *,
                             seed: int | None = None,
                             noise: ArrayLike | Sequence[ArrayLike] | None = None) -> Any:
    """k-ary randomized response on integer class ids.

    Keeps the class with ``e^eps / (K - 1 + e^eps)`` and moves to each other
    class with ``1 / (K - 1 + e^eps)``, up to the rounding to integer word
    thresholds (see `realized_epsilon`: the realized distribution is exactly
    K-ary RR at ``realized_epsilon(eps, K) <= eps``).

    Args:
        class_ids: integer tensor with values in [0, num_classes).
        num_classes: K >= 2.
        eps: privacy parameter, finite and >= 0 (0 = uniform class).
        seed: None (fresh OS-entropy secret, eager only) or an int.
        noise: optional pair of uint32 word tensors shaped like ``class_ids``.

    Returns:
        int32 tensor of the shape of ``class_ids``.
    """
    eps = validate_eps(eps)
    k = validate_positive_int(num_classes, "num_classes", minimum=2)
    class_ids = ops.cast(ops.convert_to_tensor(class_ids), "int32")
    w_keep, w_other = noise_words(noise, ops.shape(class_ids), seed, count=2)
    return _rr_on_ranks(class_ids, ops.full(ops.shape(class_ids), k, "int32"), k, w_keep, w_other,
                        eps)


def _static_num_classes(prior):
    num_classes = prior.shape[-1]
    if num_classes is None or num_classes < 2:
        raise ValueError(f"`prior` must have a static last dimension K >= 2 (one probability per "
                         f"class); got shape {tuple(prior.shape)}.")
    return int(num_classes)


def rr_with_prior_k(prior: ArrayLike, eps: float) -> Any:
    """The per-example size k* of the RR-with-prior candidate set.

    ``k* = argmax_k sum_{top k} prior / (1 + (k - 1) e^-eps)``, ties to the
    smallest k.

    Args:
        prior: float tensor (N, K), rows of class probabilities.
        eps: privacy parameter.

    Returns:
        int32 tensor (N,) with values in [1, K].
    """
    eps = validate_eps(eps)
    prior = ops.cast(ops.convert_to_tensor(prior), "float32")
    num_classes = _static_num_classes(prior)
    top = ops.flip(ops.sort(prior, axis=-1), axis=-1)  # descending
    mass = ops.cumsum(top, axis=-1)
    t = math.exp(-eps)
    weights = ops.convert_to_tensor([1.0 / (1.0 + (k - 1) * t) for k in range(1, num_classes + 1)],
                                    dtype="float32")
    score = mass * weights
    return ops.cast(ops.argmax(score, axis=-1), "int32") + 1


def rr_with_prior(class_ids: ArrayLike, prior: ArrayLike, eps: float, *, seed: int | None = None,
                  noise: ArrayLike | Sequence[ArrayLike] | None = None) -> Any:
    """Randomized response with a prior (RRWithPrior, Ghazi et al. 2021).

    For each example, take the k* classes with the largest prior (see
    `rr_with_prior_k`) and run k*-ary randomized response within them; a true
    class outside them is replaced by a uniform class among them. For every
    prior the mechanism is eps-label-DP, provided the prior of an example does
    not depend on that example's label (e.g. it comes from a model trained on
    other data).

    Args:
        class_ids: integer tensor (N,) with values in [0, K).
        prior: float tensor (N, K), per-example class probabilities.
        eps: privacy parameter, finite and >= 0.
        seed: None (fresh OS-entropy secret, eager only) or an int.
        noise: optional pair of uint32 word tensors of shape (N,).

    Returns:
        int32 tensor (N,).
    """
    eps = validate_eps(eps)
    class_ids = ops.cast(ops.convert_to_tensor(class_ids), "int32")
    prior = ops.convert_to_tensor(prior)
    k_star = rr_with_prior_k(prior, eps)
    # order[i, r] = class of rank r (descending prior, ties by class index).
    order = ops.cast(ops.argsort(-ops.cast(prior, "float32"), axis=-1), "int32")
    ranks = ops.cast(ops.argsort(order, axis=-1), "int32")
    rank_y = ops.take_along_axis(ranks, ops.expand_dims(class_ids, -1), axis=-1)[..., 0]
    rank_y = ops.where(ops.less(rank_y, k_star), rank_y, -1)
    w_keep, w_other = noise_words(noise, ops.shape(class_ids), seed, count=2)
    out_rank = _rr_on_ranks(rank_y, k_star, _static_num_classes(prior), w_keep, w_other, eps)
    return ops.take_along_axis(order, ops.expand_dims(out_rank, -1), axis=-1)[..., 0]
