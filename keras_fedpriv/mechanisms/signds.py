"""SignDS's exponential mechanism: the pure math (MindSpore Federated's SignDS design).

A client holds a flat update of length ``d`` and a top-k set ``S`` of ``k``
indices (the k largest values for sign +1, the k smallest for sign -1). It
releases a set ``J`` of ``h`` indices. With ``t = |J ∩ S|`` there are

    omega_t = C(k, t) * C(d - k, h - t)

sets meeting ``S`` in ``t`` places, and the exponential mechanism with the
utility ``1[t >= thr]`` (sensitivity 1) picks ``J`` with probability
proportional to ``e^eps`` if ``t >= thr`` and 1 otherwise. So

    P(t) ∝ omega_t * (e^eps if t >= thr else 1),    E(thr) = sum_t t P(t),

and given ``t``, ``J`` is ``t`` uniform members of ``S`` plus ``h - t``
uniform non-members. Any two updates change ``P(J)`` by a factor of at most
``e^eps``: the index set is eps-LDP (the SignDS design's proof).

The threshold ``thr`` and the output size ``h`` are chosen by the rules of the
reference implementation (`optimal_threshold`, `optimal_output_dim`). All of
it is computed in log space (log-gamma, ratio recurrences, log-sum-exp):
``omega_t`` overflows float64 long before ``d`` reaches real model sizes (the
reference stops at h = 65 for d = 266,084 because a sum becomes inf; the
correct answer is larger). Nothing here overflows for ``d`` in the billions.

Only numpy and the standard library are used (no scipy at runtime).
"""

from __future__ import annotations

import functools
import math
import numbers

import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.events import pure_dp_event
from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int

__all__ = [
    "log_omega",
    "t_distribution",
    "expected_topk",
    "expected_topk_by_threshold",
    "optimal_threshold",
    "optimal_output_dim",
    "sample_t",
    "select_indices",
    "signds_dp_event",
]

_CHUNK = 2.0 ** -10
_LOG_CHUNK = 10.0 * math.log(2.0)


# ----------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------


def _validate_dkh(d, k, h):
    d = validate_positive_int(d, "d")
    k = validate_positive_int(k, "k")
    if k > d:
        raise ValueError(f"`k` must be an integer in [1, d={d}]; got {k!r}.")
    if h is not None:
        h = validate_positive_int(h, "h")
        if h > d:
            raise ValueError(f"`h` must be an integer in [1, d={d}]; got {h!r}.")
    return d, k, h


def validate_thr(thr, h):
    """``thr`` as an int, checked to be an integer in ``[1, h]`` (TypeError / ValueError
    naming ``thr`` otherwise). Example: ``validate_thr(3, h=5)`` returns 3."""
    if isinstance(thr, (bool, np.bool_)) or not isinstance(thr, numbers.Integral):
        raise TypeError(f"`thr` must be an integer in [1, h={h}]; got {thr!r} "
                        f"of type {type(thr).__name__}.")
    if not 1 <= int(thr) <= h:
        raise ValueError(f"`thr` must be an integer in [1, h={h}]; got {thr!r}.")
    return int(thr)


def _validate_ratio(thr_ratio, name="thr_ratio"):
    allowed = f"`{name}` must be a finite real number in (0, 1]"
    if isinstance(thr_ratio, (bool, np.bool_)) or not isinstance(thr_ratio, numbers.Real):
        raise TypeError(f"{allowed}; got {thr_ratio!r} of type {type(thr_ratio).__name__}.")
    value = float(thr_ratio)
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"{allowed}; got {thr_ratio!r}.")
    return value


# ----------------------------------------------------------------------------
# Distribution of t
# ----------------------------------------------------------------------------


def _log_comb(n, r):
    return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)


def _log_omega(d, k, h):
    """Unvalidated `log_omega` (d, k, h ints with 1 <= k <= d, 1 <= h <= d)."""
    out = np.full(h + 1, -np.inf)
    t_min = max(0, h - (d - k))
    t_max = min(h, k)
    base = _log_comb(k, t_min) + _log_comb(d - k, h - t_min)
    # omega_{t+1} / omega_t = (k - t) / (t + 1) * (h - t) / (d - k - h + t + 1):
    # a cumulative sum of logs of small exact integers, accurate to ~1e-15
    # relative (differences of lgamma(d) would lose ~8 digits at d = 1e8).
    t = np.arange(t_min, t_max, dtype=np.float64)
    steps = (np.log(k - t) - np.log(t + 1.0) + np.log(h - t) - np.log(d - k - h + t + 1.0))
    out[t_min] = base
    out[t_min + 1:t_max + 1] = base + np.cumsum(steps)
    return out


def log_omega(d: int, k: int, h: int) -> np.ndarray:
    """``log(C(k, t) * C(d - k, h - t))`` for ``t = 0..h``.

    Args:
        d: the update's length (integer >= 1).
        k: the size of the top-k set (integer in [1, d]).
        h: the number of released indices (integer in [1, d]).

    Returns:
        float64 array of length ``h + 1``; ``-inf`` where the count is zero
        (``t > k`` or ``h - t > d - k``).
    """
    d, k, h = _validate_dkh(d, k, h)
    return _log_omega(d, k, h)


def _log_weights(d, k, h, eps, thr):
    logw = _log_omega(d, k, h)
    logw[thr:] += eps
    return logw


def _logsumexp(x):
    m = np.max(x)
    if not np.isfinite(m):
        return m
    return float(m + np.log(np.sum(np.exp(x - m))))


def t_distribution(d: int, k: int, h: int, eps: float, thr: int) -> np.ndarray:
    """``P(t)`` for ``t = 0..h``: ``∝ omega_t * (e^eps if t >= thr else 1)``.

    Args:
        d, k, h: as in `log_omega`.
        eps: privacy parameter (finite, >= 0).
        thr: threshold, an integer in [1, h].

    Returns:
        float64 array of length ``h + 1`` summing to 1 (normalized with
        log-sum-exp, so it never overflows).
    """
    d, k, h = _validate_dkh(d, k, h)
    eps = validate_eps(eps)
    thr = validate_thr(thr, h)
    logw = _log_weights(d, k, h, eps, thr)
    return np.exp(logw - _logsumexp(logw))


def _expected(logw):
    """``sum_t t p_t`` for ``p ∝ exp(logw)``."""
    p = np.exp(logw - _logsumexp(logw))
    return float(np.dot(np.arange(len(logw), dtype=np.float64), p))


def expected_topk(d: int, k: int, h: int, eps: float, thr: int) -> np.ndarray:
    """``E(thr) = sum_t t P(t)``: expected number of released top-k indices."""
    d, k, h = _validate_dkh(d, k, h)
    eps = validate_eps(eps)
    thr = validate_thr(thr, h)
    return _expected(_log_weights(d, k, h, eps, thr))


def _expected_by_threshold(d, k, h, eps):
    """``E(thr)`` for every ``thr = 1..h`` in O(h) (index i holds thr = i + 1).

    With ``A(thr) = sum_{t < thr} w_t``, ``B(thr) = sum_{t >= thr} w_t`` and
    ``A'``, ``B'`` the same sums of ``t * w_t``:
    ``E(thr) = (A' + e^eps B') / (A + e^eps B)``; the four sums are cumulative
    log-sum-exps.
    """
    logw = _log_omega(d, k, h)
    t = np.arange(h + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        logtw = np.log(t) + logw  # -inf at t = 0
    # prefix[j] = log sum_{t <= j}; suffix[j] = log sum_{t >= j}.
    pre_w = np.logaddexp.accumulate(logw)
    pre_tw = np.logaddexp.accumulate(logtw)
    suf_w = np.logaddexp.accumulate(logw[::-1])[::-1]
    suf_tw = np.logaddexp.accumulate(logtw[::-1])[::-1]
    thr = np.arange(1, h + 1)
    num = np.logaddexp(pre_tw[thr - 1], eps + suf_tw[thr])
    den = np.logaddexp(pre_w[thr - 1], eps + suf_w[thr])
    return np.exp(num - den)


def expected_topk_by_threshold(d: int, k: int, h: int, eps: float) -> np.ndarray:
    """``E(thr)`` for all thresholds ``thr = 1..h`` at once, in O(h).

    Returns:
        float64 array of length ``h``; entry ``i`` is ``E(thr = i + 1)``.
    """
    d, k, h = _validate_dkh(d, k, h)
    eps = validate_eps(eps)
    return _expected_by_threshold(d, k, h, eps)


def _threshold_from_logw(logw, eps):
    """The optimal threshold from ``logw = log omega_t`` (t = 0..h), in O(h).

    Comparing ``E(thr + 1)`` with ``E(thr)`` in floating point is useless:
    for large eps and h the first values agree to all 16 digits (the mass
    below a small thr is ~1e-15), and rounding decides the scan (d = 266,084,
    k = 53,216, eps = 100 gives thr = 1 at h = 150, and h stops at 149). The
    comparison is done exactly instead. Moving ``w_thr`` across the threshold
    gives

        E(thr + 1) - E(thr) = (e^eps - 1) w_thr (E(thr) - thr) / Z(thr + 1),

    so ``E`` strictly increases iff ``eps > 0``, ``w_thr > 0`` and
    ``E(thr) > thr``, i.e. iff
    ``e^eps sum_{t >= thr} (t - thr) w_t > sum_{t < thr} (thr - t) w_t``.
    Both sides are sums of positive terms: the left is
    ``e^eps sum_{s > thr} B(s)`` with ``B(s) = sum_{t >= s} w_t`` and the
    right ``sum_{s <= thr} A(s)`` with ``A(s) = sum_{t < s} w_t``, so they are
    cumulative log-sum-exps with no cancellation.
    """
    h = len(logw) - 1
    if h == 1 or eps == 0.0:
        return 1  # eps = 0: E(thr) = h k / d for every thr
    pre_w = np.logaddexp.accumulate(logw)               # log sum_{t <= j} w_t
    suf_w = np.logaddexp.accumulate(logw[::-1])[::-1]   # log sum_{t >= j} w_t
    log_a = pre_w[:h]          # log A(s), s = 1..h
    log_b = suf_w[1:]          # log B(s), s = 1..h
    log_l = np.logaddexp.accumulate(log_a)              # log sum_{s <= thr} A(s)
    # log sum_{s > thr} B(s) for thr = 1..h (the last is an empty sum).
    log_u = np.append(np.logaddexp.accumulate(log_b[:0:-1])[::-1], -np.inf)
    thr = np.arange(1, h)
    increases = np.isfinite(logw[thr]) & (eps + log_u[thr - 1] > log_l[thr - 1])
    stops = np.flatnonzero(~increases)
    return int(stops[0]) + 1 if len(stops) else h


def optimal_threshold(d: int, k: int, h: int, eps: float) -> int:
    """The reference's threshold: scan ``thr = 1..h`` while ``E(thr)`` strictly increases.

    Returns the last ``thr`` of the increasing run (1 if ``E(2) <= E(1)``).
    O(h); the increases are decided exactly (see `_threshold_from_logw`),
    not by comparing rounded values of ``E``.
    """
    d, k, h = _validate_dkh(d, k, h)
    eps = validate_eps(eps)
    return _threshold_from_logw(_log_omega(d, k, h), eps)


def optimal_output_dim(d: int, k: int, eps: float, thr_ratio: float,
                       max_dim: int | None = None) -> int:
    """The reference's output size: the largest ``h`` of the run ``E(thr_opt(h)) / h >= thr_ratio``.

    ``h`` increases from 1 while the expected fraction of released indices
    that come from the top-k set, at the optimal threshold for that ``h``, is
    at least ``thr_ratio``; the last ``h`` that satisfied it is returned (at
    least 1, also when ``h = 1`` already fails).

    Computed in log space, so unlike the reference it does not stop early
    because of a float overflow (for d = 266,084, k = 53,216, eps = 100,
    thr_ratio = 0.6 the reference returns 65).

    Args:
        d: update length (integer >= 1).
        k: top-k set size (integer in [1, d]).
        eps: privacy parameter (finite, >= 0).
        thr_ratio: real in (0, 1].
        max_dim: optional cap on ``h`` (integer >= 1); ``h`` never exceeds
            ``d`` either.

    Returns:
        int ``h`` in ``[1, min(d, max_dim)]``.

    Cost: O(h^2) for the returned h (each step is O(h)). Without a cap the
    scan still ends by ``h = d`` (there ``t = k`` for sure and the ratio is
    ``k / d``); when ``k / d >= thr_ratio`` every ``h`` satisfies the rule
    (the tilted distribution dominates the hypergeometric one, whose mean is
    ``h k / d``), and the bound is returned directly.
    """
    d, k, _ = _validate_dkh(d, k, None)
    eps = validate_eps(eps)
    thr_ratio = _validate_ratio(thr_ratio)
    max_dim = validate_positive_int(max_dim, "max_dim", allow_none=True)
    bound = d if max_dim is None else min(d, max_dim)
    if k >= thr_ratio * d:
        return bound
    best = 1
    for h in range(1, bound + 1):
        logw = _log_omega(d, k, h)
        thr = _threshold_from_logw(logw, eps)
        logw[thr:] += eps
        if _expected(logw) / h >= thr_ratio:
            best = h
        else:
            break
    return best


# ----------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------


def _log_uniform(rng):
    """``log U`` for ``U ~ Uniform(0, 1]`` with full relative precision near 0.

    A float64 from ``rng.random()`` cannot be below 2**-53, so an inverse CDF
    fed with it could never draw an outcome whose probability is smaller (and
    with eps = 100 many are ~e^-100). Here ``U`` is drawn as ``2**(-10 n) * u``
    with ``n`` geometric (``P(n >= j) = 2**(-10 j)``) and ``u`` uniform on
    ``(2**-10, 1]`` (a grid of relative spacing <= 2**-43), so ``log U`` has
    no lower limit.
    """
    shift = 0.0
    while True:
        u = 1.0 - rng.random()  # in (0, 1]; P(u <= 2**-10) is exactly 2**-10
        if u > _CHUNK:
            return math.log(u) - shift
        shift += _LOG_CHUNK


@functools.lru_cache(maxsize=64)
def _sampling_table(d, k, h, eps, thr):
    """Cached inverse-CDF tables for `_sample_t` (one per parameter set).

    Returns ``(lo, m, neg_log_sf_upper, log_cdf_lower)``: the smallest
    possible ``t``, the mode's offset ``m`` from it, ``-log P(t >= lo + j)``
    for ``j > m`` (non-decreasing) and ``log P(t <= lo + j | t <= lo + m)``
    for ``j <= m`` (non-decreasing, ending at 0).
    """
    logw = _log_weights(d, k, h, eps, thr)
    valid = np.flatnonzero(np.isfinite(logw))
    lo, hi = int(valid[0]), int(valid[-1])
    w = logw[lo:hi + 1]
    m = int(np.argmax(w))
    log_sf = np.logaddexp.accumulate(w[::-1])[::-1] - _logsumexp(w)  # log P(t >= lo + j)
    log_cdf = np.logaddexp.accumulate(w[:m + 1])
    log_cdf -= log_cdf[-1]
    upper = -log_sf[m + 1:]
    upper.flags.writeable = False
    log_cdf.flags.writeable = False
    return lo, m, upper, log_cdf


def _sample_t(d, k, h, eps, thr, rng):
    """Inverse-CDF sample of ``t`` from `t_distribution`, in log space.

    The support is split at the mode ``m``: the upper side ``t > m`` is
    sampled from the log survival function and the lower side from the log
    CDF, each with a log-uniform of unbounded range (`_log_uniform`), so tiny
    probabilities on either tail keep full relative precision (a plain CDF
    rounds ``1 - CDF`` to 0 on the upper tail, and a float64 uniform cannot
    go below 2**-53 on the lower one).
    """
    lo, m, upper, log_cdf = _sampling_table(d, k, h, eps, thr)
    if len(upper):
        log_u = _log_uniform(rng)
        if -log_u > upper[0]:
            # P(upper side) = P(t >= lo + m + 1). Then the largest j > m with
            # log_u < log_sf[j]: upper[:c] < -log_u for the first c entries.
            c = int(np.searchsorted(upper, -log_u, side="left"))
            return lo + m + max(c, 1)
    # Lower side, a fresh uniform: the smallest j <= m with log_v < log_cdf[j].
    j = int(np.searchsorted(log_cdf, _log_uniform(rng), side="right"))
    return lo + min(j, m)


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"`rng` must be a numpy.random.Generator; got {type(rng).__name__}.")


def sample_t(d: int, k: int, h: int, eps: float, thr: int, rng: np.random.Generator) -> int:
    """Draw ``t`` (how many released indices come from the top-k set) from ``P(t)``.

    Inverse CDF in log space (see `_sample_t`), exact up to float64 relative
    rounding of the probabilities, including outcomes far below 2**-53.

    Args:
        d, k, h, eps, thr: as in `t_distribution`.
        rng: a ``numpy.random.Generator`` (seed it from a secret).

    Returns:
        int in ``[max(0, h - (d - k)), min(h, k)]``.
    """
    d, k, h = _validate_dkh(d, k, h)
    eps = validate_eps(eps)
    thr = validate_thr(thr, h)
    _check_rng(rng)
    return _sample_t(d, k, h, eps, thr, rng)


def _choose_outside(rng, d, count, member_mask):
    """``count`` distinct uniform indices in [0, d) with ``member_mask`` False.

    Rejection sampling: meant for a mask that is mostly False (the caller
    ensures at least 3/4 of the indices are eligible).

    The set of the first ``count`` distinct accepted values of i.i.d. uniform
    draws is a uniform ``count``-subset of the accepted values.
    """
    if count == 0:
        return np.empty(0, dtype=np.int64)
    chosen = np.empty(0, dtype=np.int64)
    while len(chosen) < count:
        draws = rng.integers(0, d, size=2 * (count - len(chosen)) + 16)
        draws = draws[~member_mask[draws]]
        pool = np.concatenate([chosen, draws])
        _, first = np.unique(pool, return_index=True)
        chosen = pool[np.sort(first)][:count]
    return chosen


def _top_set(update, k, sign):
    """Indices of the k largest (sign +1) or k smallest (sign -1) values, in O(d).

    ``np.partition`` finds the k-th value ``v`` (introselect, no full sort; on
    float32 it is faster than ``np.argpartition``, which also moves int64
    indices), then one comparison pass collects the members. Ties at ``v``
    are broken by position (the first ones), so the set has exactly k
    members.
    """
    d = update.shape[0]
    if sign > 0:
        v = np.partition(update, d - k)[d - k]
        top = np.flatnonzero(update >= v)
        if len(top) > k:
            strict = np.flatnonzero(update > v)
            top = np.concatenate([strict, np.flatnonzero(update == v)[:k - len(strict)]])
    else:
        v = np.partition(update, k - 1)[k - 1]
        top = np.flatnonzero(update <= v)
        if len(top) > k:
            strict = np.flatnonzero(update < v)
            top = np.concatenate([strict, np.flatnonzero(update == v)[:k - len(strict)]])
    return top


def select_indices_unvalidated(update, k, h, eps, thr, sign, rng):
    """Unvalidated `select_indices` (update a finite 1-D float array)."""
    d = update.shape[0]
    top = _top_set(update, k, sign)
    topk_mean = abs(float(np.mean(update[top], dtype=np.float64)))
    t = _sample_t(d, k, h, eps, thr, rng)
    from_top = top[rng.choice(k, size=t, replace=False)] if t else np.empty(0, np.int64)
    rest = h - t
    if rest:
        if k <= d // 4 and rest <= (d - k) // 4:
            # Rejection against a membership mask: acceptance >= 3/4.
            mask = np.zeros(d, dtype=bool)
            mask[top] = True
            from_rest = _choose_outside(rng, d, rest, mask)
        else:
            mask = np.ones(d, dtype=bool)
            mask[top] = False
            from_rest = rng.choice(np.flatnonzero(mask), size=rest, replace=False)
    else:
        from_rest = np.empty(0, np.int64)
    indices = np.sort(np.concatenate([from_top, from_rest])).astype(np.int32)
    return indices, topk_mean


def select_indices(update: ArrayLike, k: int, h: int, eps: float, thr: int, sign: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Release ``h`` indices of ``update`` by SignDS's exponential mechanism.

    The top-k set ``S`` is the ``k`` largest values of ``update`` for
    ``sign = +1`` and the ``k`` smallest for ``sign = -1`` (signed values,
    not magnitudes; ties broken arbitrarily, ``|S| = k`` exactly). ``t`` is
    drawn from `t_distribution`, then ``t`` indices uniformly without
    replacement from ``S`` and ``h - t`` from its complement; the result is
    sorted, which hides which indices came from ``S``.

    O(d) (``np.partition`` and one comparison pass, no full sort) plus O(h)
    sampling.

    Args:
        update: 1-D array of finite floats of length d.
        k: top-k set size (integer in [1, d]).
        h: number of indices to release (integer in [1, d]).
        eps: privacy parameter (finite, >= 0).
        thr: threshold (integer in [1, h]), e.g. `optimal_threshold`.
        sign: +1 or -1, a fair coin drawn independently of the data.
        rng: a ``numpy.random.Generator`` seeded from a secret.

    Returns:
        ``(indices, topk_mean)``: int32 array of ``h`` sorted, unique indices,
        and ``|mean(update[S])|`` (private: for MagRR on the client, never
        uploaded).
    """
    update = np.asarray(update)
    if update.ndim != 1 or update.dtype.kind not in "fiu":
        raise ValueError(f"`update` must be a 1-D real array; got shape {update.shape} "
                         f"and dtype {update.dtype}.")
    d = update.shape[0]
    d, k, h = _validate_dkh(d, k, h)
    eps = validate_eps(eps)
    thr = validate_thr(thr, h)
    if isinstance(sign, (bool, np.bool_)) or sign not in (1, -1):
        raise ValueError(f"`sign` must be +1 or -1; got {sign!r}.")
    _check_rng(rng)
    if update.dtype.kind == "f" and not np.isfinite(update).all():
        raise ValueError("`update` must be finite; it contains NaN or infinity.")
    return select_indices_unvalidated(update, k, h, eps, thr, int(sign), rng)


# ----------------------------------------------------------------------------
# Accounting
# ----------------------------------------------------------------------------


def signds_dp_event(eps: float) -> dp_accounting.DpEvent:
    """A `dp_accounting` event that upper-bounds one SignDS release at ``eps``.

    dp_accounting has no exponential-mechanism event. Every eps-DP mechanism's
    privacy profile (its hockey-stick divergences for all ``delta``) is
    dominated by that of binary eps-randomized response (Kairouz, Oh and
    Viswanath, "The composition theorem for differential privacy", ICML 2015),
    and composing dominating pairs dominates the composition. So the event of
    binary eps-RR is a valid upper
    bound here, and composing it over rounds (e.g. with a PLD accountant and
    ``REPLACE_ONE``) gives a valid, if possibly loose, bound for repeated
    SignDS releases. The sign is a fair coin independent of the data and
    costs nothing.

    The event is binary RR at exactly ``eps`` (`pure_dp_event`), not the
    thresholded randomized response of this package as realized (whose eps
    is capped near 22.18): SignDS samples with floats in log space and is
    ``eps``-DP at the full ``eps``.

    Args:
        eps: the per-release privacy parameter (finite, >= 0).
    """
    return pure_dp_event(validate_eps(eps))
