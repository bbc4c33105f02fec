"""Empirical privacy auditing: a high-confidence lower bound on a mechanism's eps.

If a mechanism ``M`` is (eps, delta)-DP, then for any two neighbouring inputs
``a``, ``b`` and every event ``E`` of its output,

    P[M(a) in E] <= e^eps P[M(b) in E] + delta,

so ``eps >= log((P[M(a) in E] - delta) / P[M(b) in E])``. `audit` runs the
mechanism many times on ``a`` and on ``b``, estimates the two probabilities of
one well-chosen event, and turns one-sided Clopper-Pearson bounds on them into
a lower bound on eps that holds with probability at least ``confidence``
whatever the mechanism is. A lower bound above the eps a mechanism claims
proves the claim false (up to the ``1 - confidence`` chance of a fluke); a
lower bound close to the claim shows that the analysis is tight and that the
implementation is not weaker than its analysis says on that pair of inputs.
It can never prove that a mechanism *is* private.

**How the event is chosen.** Each input gets ``num_trials`` runs, split in
two independent halves. On the *selection* half every candidate event
``{score >= t}`` and ``{score <= t}`` (``t``: every distinct observed score
when there are at most `MAX_THRESHOLDS` of them, else that many quantiles of
the pooled scores), in both orientations (``a`` over ``b`` and ``b`` over
``a``; DP is symmetric), is scored by the lower bound it would give. Only the
best one is then counted on the *evaluation* half, and only those counts
enter the bound. Because the event is chosen on data independent of the
counts, the Clopper-Pearson bounds are valid (choosing the best of thousands
of events on the same counts would not be).

**The bound.** With ``alpha = 1 - confidence``, the lower Clopper-Pearson
bound ``p_a_low`` on the numerator probability and the upper bound
``p_b_up`` on the denominator probability are each taken at level
``1 - alpha / 2`` (Bonferroni), so both hold together with probability at
least ``confidence``, and then ``eps_lower_bound = max(0, log((p_a_low -
delta) / p_b_up))``. The point estimate is the same formula on the raw
frequencies (also clamped at 0; infinite when the event never happened
under the denominator input). The orientation is chosen on the selection
half, not as a maximum over both orientations on the evaluation half, which
would need alpha split four ways.

A statistic that is a monotone function of the privacy loss (the likelihood
ratio of the two output distributions) makes the best threshold event the
Neyman-Pearson optimal one; that is why several auditors below default to a
``"loss"`` statistic rather than the more obvious raw output. For pure
eps-DP mechanisms whose worst case lives in an event of small probability
(Laplace tails, exponential mechanisms with many outputs), the bound is
limited by how many hits that event gets in ``num_trials`` runs.

Ready-made auditors, one per mechanism of the package (each says which eps
its audited output claims): `audit_binary_rr`, `audit_kary_rr`,
`audit_label_dp_layer`, `audit_quantize_rr`, `audit_embedding_dp_layer`,
`audit_laplace`, `audit_magrr`, `audit_signds`.

Needs scipy (``scipy.stats.beta``), which scikit-learn, a dependency of this
package, already requires.

Example:
    >>> result = audit_binary_rr(eps=1.0, num_trials=10**6, seed=0)
    >>> result.eps_lower_bound          # ~0.99, and never above 1 (w.p. 0.95)
    >>> print(result)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from keras_fedpriv.mechanisms.random import secret_generator
from keras_fedpriv.mechanisms.validation import (
    validate_eps,
    validate_positive_int,
    validate_real,
    validate_seed,
)

__all__ = [
    "AuditResult",
    "audit",
    "audit_binary_rr",
    "audit_embedding_dp_layer",
    "audit_kary_rr",
    "audit_label_dp_layer",
    "audit_laplace",
    "audit_magrr",
    "audit_quantize_rr",
    "audit_signds",
    "clopper_pearson",
    "eps_lower_bound",
]

#: Above this many distinct scores, candidate thresholds are quantiles.
MAX_THRESHOLDS = 2048
#: The smallest accepted ``num_trials``.
MIN_TRIALS = 100
#: Default number of runs per input of the ready-made auditors.
DEFAULT_TRIALS = 200_000


# ----------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------


def _validate_trials(num_trials):
    return validate_positive_int(num_trials, "num_trials", minimum=MIN_TRIALS)


def _validate_confidence(confidence):
    return validate_real(confidence, "confidence", low=0, high=1, low_open=True, high_open=True)


def _validate_delta(delta):
    return validate_real(delta, "delta", low=0, high=1, high_open=True)


def _validate_choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}; got {value!r}.")
    return value


def _validate_count(hits, trials, hits_name="hits", trials_name="trials"):
    trials = validate_positive_int(trials, trials_name)
    hits = validate_positive_int(hits, hits_name, minimum=0)
    if hits > trials:
        raise ValueError(f"`{hits_name}` ({hits}) exceeds `{trials_name}` ({trials}).")
    return hits, trials


# ----------------------------------------------------------------------------
# Clopper-Pearson and the bound
# ----------------------------------------------------------------------------


def _cp_lower(hits, trials, alpha):
    """One-sided lower Clopper-Pearson bound at level 1 - alpha (vectorized)."""
    from scipy.stats import beta

    hits = np.asarray(hits, dtype=np.float64)
    trials = np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = beta.ppf(alpha, hits, trials - hits + 1.0)
    return np.where(hits <= 0, 0.0, out)


def _cp_upper(hits, trials, alpha):
    """One-sided upper Clopper-Pearson bound at level 1 - alpha (vectorized)."""
    from scipy.stats import beta

    hits = np.asarray(hits, dtype=np.float64)
    trials = np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = beta.ppf(1.0 - alpha, hits + 1.0, trials - hits)
    return np.where(hits >= trials, 1.0, out)


def clopper_pearson(hits: int, trials: int, confidence: float = 0.95,
                    side: str = "two-sided") -> float | tuple[float, float]:
    """Clopper-Pearson (exact binomial) confidence bounds on a probability.

    Args:
        hits: number of successes (integer in [0, trials]).
        trials: number of independent trials (integer >= 1).
        confidence: level in (0, 1).
        side: ``"two-sided"`` (returns ``(lower, upper)``, each one-sided at
            ``(1 + confidence) / 2``), ``"lower"`` or ``"upper"`` (one bound,
            one-sided at ``confidence``).

    Returns:
        ``(lower, upper)`` floats, or one float for a one-sided bound.
    """
    hits, trials = _validate_count(hits, trials)
    confidence = _validate_confidence(confidence)
    side = _validate_choice(side, "side", ("two-sided", "lower", "upper"))
    alpha = 1.0 - confidence
    if side == "lower":
        return float(_cp_lower(hits, trials, alpha))
    if side == "upper":
        return float(_cp_upper(hits, trials, alpha))
    return float(_cp_lower(hits, trials, alpha / 2)), float(_cp_upper(hits, trials, alpha / 2))


def _bound(num_hits, num_trials, den_hits, den_trials, alpha, delta):
    """Vectorized ``log((p_num_low - delta) / p_den_up)`` (-inf where not positive inside)."""
    low = _cp_lower(num_hits, num_trials, alpha / 2) - delta
    up = _cp_upper(den_hits, den_trials, alpha / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(low > 0, np.log(np.maximum(low, 1e-300) / up), -np.inf)


def _point(num_hits, num_trials, den_hits, den_trials, delta):
    p_num = num_hits / num_trials - delta
    p_den = den_hits / den_trials
    if p_num <= 0:
        return 0.0
    if p_den == 0:
        return math.inf
    return max(0.0, math.log(p_num / p_den))


def eps_lower_bound(a_hits: int, a_trials: int, b_hits: int, b_trials: int,
                    confidence: float = 0.95, delta: float = 0.0) -> float:
    """The eps lower bound from counts of ONE event fixed before the counts were taken.

    ``max(0, log((p_a_low - delta) / p_b_up))`` with one-sided
    Clopper-Pearson bounds, each at level ``1 - (1 - confidence) / 2``. Holds
    with probability at least ``confidence`` for any (eps, delta)-DP
    mechanism, provided the event was not chosen by looking at these counts.

    Args:
        a_hits, a_trials: the event's count in runs on input ``a``.
        b_hits, b_trials: the same on input ``b``.
        confidence: in (0, 1).
        delta: in [0, 1).

    Returns:
        float >= 0.
    """
    a_hits, a_trials = _validate_count(a_hits, a_trials, "a_hits", "a_trials")
    b_hits, b_trials = _validate_count(b_hits, b_trials, "b_hits", "b_trials")
    alpha = 1.0 - _validate_confidence(confidence)
    delta = _validate_delta(delta)
    return max(0.0, float(_bound(a_hits, a_trials, b_hits, b_trials, alpha, delta)))


# ----------------------------------------------------------------------------
# The audit
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """What `audit` found.

    Attributes:
        eps_lower_bound: eps lower bound holding with probability >=
            ``confidence`` (0 when the evidence gives none).
        eps_point_estimate: ``log((p_a - delta) / p_b)`` of the chosen event
            on the evaluation half's frequencies (clamped at 0; ``inf`` when
            the denominator event never occurred). Not a bound.
        event: description of the chosen event and orientation, e.g.
            ``"score >= 1 (P[E | a] / P[E | b])"``.
        counts: the evaluation half's counts, ``{"a_hits", "a_trials",
            "b_hits", "b_trials"}`` (``a``, ``b`` as passed to `audit`, not
            swapped by the orientation).
        confidence: the confidence level.
        num_trials: runs per input (both halves).
        delta: the delta used.
        claimed_eps: the eps the mechanism claims for this output (set by
            the ready-made auditors; None from a bare `audit`).
        name: what was audited (ready-made auditors).
    """

    eps_lower_bound: float
    eps_point_estimate: float
    event: str
    counts: dict
    confidence: float
    num_trials: int
    delta: float = 0.0
    claimed_eps: float | None = None
    name: str = ""

    @property
    def ratio(self) -> float | None:
        """``eps_lower_bound / claimed_eps`` (None without a positive claim)."""
        if not self.claimed_eps:
            return None
        return self.eps_lower_bound / self.claimed_eps

    @property
    def violates_claim(self) -> bool:
        """True when the lower bound exceeds the claimed eps (the claim is refuted)."""
        return self.claimed_eps is not None and self.eps_lower_bound > self.claimed_eps

    def __str__(self):
        c = self.counts
        head = f"{self.name}: " if self.name else ""
        claim = "" if self.claimed_eps is None else f", claimed {self.claimed_eps:.4g}"
        if self.violates_claim:
            claim += " (CLAIM REFUTED)"
        delta = f", delta={self.delta:g}" if self.delta else ""
        level = f"{100 * self.confidence:.6g}%"
        return (f"{head}eps >= {self.eps_lower_bound:.4f} at {level} confidence "
                f"(point estimate {self.eps_point_estimate:.4f}{claim}{delta}); "
                f"event {self.event}; "
                f"hits a {c['a_hits']}/{c['a_trials']}, b {c['b_hits']}/{c['b_trials']}; "
                f"{self.num_trials} runs per input")


def _default_statistic(outputs):
    out = np.asarray(outputs)
    if out.ndim == 0:
        raise ValueError("the mechanism returned a scalar; it must return one output per run "
                         "(first axis n).")
    if out.ndim > 1 and int(np.prod(out.shape[1:])) != 1:
        raise ValueError(f"the mechanism's outputs have shape {out.shape}, more than one value "
                         f"per run: pass a `statistic` mapping them to one score per run.")
    return out.reshape(-1)


def _run(mechanism, statistic, value, n, rng, batch_size):
    scores = []
    done = 0
    while done < n:
        m = n - done if batch_size is None else min(batch_size, n - done)
        s = np.asarray(statistic(mechanism(value, m, rng)))
        if s.dtype == bool:
            s = s.astype(np.float64)
        if s.dtype.kind not in "fiu":
            raise TypeError(f"`statistic` must return real scores; got dtype {s.dtype}.")
        s = s.astype(np.float64)
        if s.size == m:
            s = s.reshape(-1)
        if s.shape != (m,):
            raise ValueError(f"`statistic` must return one score per run: expected shape ({m},), "
                             f"got {s.shape}. (`mechanism(input, n, rng)` must return n outputs.)")
        if np.isnan(s).any():
            raise ValueError("`statistic` returned NaN scores.")
        scores.append(s)
        done += m
    return np.concatenate(scores)


def _thresholds(pooled):
    values = np.unique(pooled)
    if len(values) <= MAX_THRESHOLDS:
        return values
    return np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, MAX_THRESHOLDS),
                                 method="inverted_cdf"))


def _event_counts(sorted_scores, thresholds):
    """Counts of {score >= t} and {score <= t} for each t."""
    n = len(sorted_scores)
    ge = n - np.searchsorted(sorted_scores, thresholds, side="left")
    le = np.searchsorted(sorted_scores, thresholds, side="right")
    return ge, le


def _select_event(sel_a, sel_b, alpha, delta):
    """The (threshold, direction, orientation) with the best bound on the selection half."""
    thresholds = _thresholds(np.concatenate([sel_a, sel_b]))
    sa, sb = np.sort(sel_a), np.sort(sel_b)
    ge_a, le_a = _event_counts(sa, thresholds)
    ge_b, le_b = _event_counts(sb, thresholds)
    na, nb = len(sa), len(sb)
    candidates = []  # (bound array, fallback array, direction, a_over_b)
    for direction, ca, cb in ((">=", ge_a, ge_b), ("<=", le_a, le_b)):
        for a_over_b in (True, False):
            if a_over_b:
                bound = _bound(ca, na, cb, nb, alpha, delta)
                gap = ca / na - cb / nb
            else:
                bound = _bound(cb, nb, ca, na, alpha, delta)
                gap = cb / nb - ca / na
            candidates.append((bound, gap, direction, a_over_b))
    best = max(candidates, key=lambda c: (np.max(c[0]), np.max(c[1])))
    bound, gap, direction, a_over_b = best
    i = int(np.argmax(bound)) if np.isfinite(np.max(bound)) else int(np.argmax(gap))
    return float(thresholds[i]), direction, a_over_b


def audit(mechanism: Callable[..., Any], input_a: Any, input_b: Any, num_trials: int,
          statistic: Callable[..., Any] | None = None, confidence: float = 0.95,
          delta: float = 0.0, seed: int | None = None,
          batch_size: int | None = None) -> AuditResult:
    """Lower-bound a mechanism's eps on one pair of neighbouring inputs.

    Args:
        mechanism: ``mechanism(input, n, rng)`` returns the outputs of ``n``
            independent runs on ``input`` (a numpy array or tensor with
            first axis ``n``, or anything ``statistic`` maps to ``n``
            scores); ``rng`` is a `numpy.random.Generator` that it should
            draw all its randomness (or its seeds) from.
        input_a, input_b: the two neighbouring inputs (passed through as is).
        num_trials: runs per input, an integer >= 100; half select the
            event, half evaluate it.
        statistic: ``statistic(outputs)`` returns one real score per run (a
            1-D array of length ``n``). None: the outputs themselves, which
            must be one scalar per run.
        confidence: probability in (0, 1) with which the returned lower
            bound holds (two one-sided Clopper-Pearson bounds at
            ``1 - (1 - confidence) / 2`` each).
        delta: the delta of the (eps, delta)-DP claim being tested, in
            [0, 1).
        seed: None (fresh OS entropy) or a non-negative integer for a
            reproducible audit; seeds the ``rng`` passed to ``mechanism``.
        batch_size: None (one call per half and input) or an integer >= 1:
            call ``mechanism`` with at most this many runs at a time (to
            bound memory).

    Returns:
        `AuditResult`.

    Raises:
        TypeError / ValueError: bad arguments (named in the message), or a
            mechanism / statistic that does not return one score per run.

    Example:
        >>> def rr(bit, n, rng):
        ...     flip = rng.random(n) < 1 / (1 + np.e)
        ...     return np.where(flip, 1 - bit, bit)
        >>> audit(rr, 1, 0, num_trials=10**6, seed=0).eps_lower_bound   # ~0.99
    """
    if not callable(mechanism):
        raise TypeError(f"`mechanism` must be callable as mechanism(input, n, rng); got "
                        f"{type(mechanism).__name__}.")
    if statistic is not None and not callable(statistic):
        raise TypeError(f"`statistic` must be None or callable as statistic(outputs); got "
                        f"{type(statistic).__name__}.")
    num_trials = _validate_trials(num_trials)
    confidence = _validate_confidence(confidence)
    delta = _validate_delta(delta)
    seed = validate_seed(seed)
    batch_size = validate_positive_int(batch_size, "batch_size", allow_none=True)
    statistic = _default_statistic if statistic is None else statistic
    alpha = 1.0 - confidence
    rng = secret_generator(seed)

    n_sel = num_trials // 2
    n_eval = num_trials - n_sel
    sel_a = _run(mechanism, statistic, input_a, n_sel, rng, batch_size)
    sel_b = _run(mechanism, statistic, input_b, n_sel, rng, batch_size)
    threshold, direction, a_over_b = _select_event(sel_a, sel_b, alpha, delta)

    eval_a = _run(mechanism, statistic, input_a, n_eval, rng, batch_size)
    eval_b = _run(mechanism, statistic, input_b, n_eval, rng, batch_size)
    if direction == ">=":
        hits_a, hits_b = int(np.sum(eval_a >= threshold)), int(np.sum(eval_b >= threshold))
    else:
        hits_a, hits_b = int(np.sum(eval_a <= threshold)), int(np.sum(eval_b <= threshold))
    num, den = (hits_a, hits_b) if a_over_b else (hits_b, hits_a)
    bound = max(0.0, float(_bound(num, n_eval, den, n_eval, alpha, delta)))
    point = _point(num, n_eval, den, n_eval, delta)
    ratio = "P[E | a] / P[E | b]" if a_over_b else "P[E | b] / P[E | a]"
    return AuditResult(
        eps_lower_bound=bound,
        eps_point_estimate=point,
        event=f"E = {{score {direction} {threshold:.6g}}}, ratio {ratio}",
        counts={"a_hits": hits_a, "a_trials": n_eval, "b_hits": hits_b, "b_trials": n_eval},
        confidence=confidence,
        num_trials=num_trials,
        delta=delta,
    )


def _with_claim(result, claimed_eps, name):
    return dataclasses.replace(result, claimed_eps=float(claimed_eps), name=name)


def _tf_seed(rng):
    """A 63-bit seed for a TensorFlow mechanism, drawn from the audit's rng."""
    return int(rng.integers(0, 2**63))


def _numpy(x):
    from keras import ops

    return np.asarray(ops.convert_to_numpy(x))


# ----------------------------------------------------------------------------
# Ready-made auditors
# ----------------------------------------------------------------------------


def audit_binary_rr(eps: float, num_trials: int = DEFAULT_TRIALS, seed: int | None = None,
                    confidence: float = 0.95) -> AuditResult:
    """Audit `binary_randomized_response`: bit 1 vs bit 0, statistic = the output bit.

    Claimed: ``eps`` (exactly: ``P[1 | 1] / P[1 | 0] = e^eps``).
    Each call flips a vector of ``n`` copies of the bit in one TensorFlow op.
    """
    from keras_fedpriv.mechanisms.randomized_response import binary_randomized_response

    eps = validate_eps(eps)

    def mechanism(bit, n, rng):
        bits = np.full(n, bit, np.int32)
        return _numpy(binary_randomized_response(bits, eps, seed=_tf_seed(rng)))

    result = audit(mechanism, 1, 0, num_trials, confidence=confidence, seed=seed)
    return _with_claim(result, eps, f"binary RR (eps={eps:g})")


def audit_kary_rr(eps: float, num_classes: int = 10, num_trials: int = DEFAULT_TRIALS,
                  seed: int | None = None, confidence: float = 0.95) -> AuditResult:
    """Audit `kary_randomized_response` over K classes: class 0 vs class 1.

    Statistic: the indicator ``output == 0``. Claimed: ``eps`` (exactly:
    ``P[0 | 0] / P[0 | 1] = e^eps``).
    """
    from keras_fedpriv.mechanisms.randomized_response import kary_randomized_response

    eps = validate_eps(eps)
    k = validate_positive_int(num_classes, "num_classes", minimum=2)

    def mechanism(cls, n, rng):
        out = kary_randomized_response(np.full(n, cls, np.int32), k, eps, seed=_tf_seed(rng))
        return _numpy(out) == 0

    result = audit(mechanism, 0, 1, num_trials, confidence=confidence, seed=seed)
    return _with_claim(result, eps, f"{k}-ary RR (eps={eps:g})")


def audit_label_dp_layer(eps: float, mode: str = "binary", num_classes: int = 10,
                         per_batch: bool = False, num_trials: int = DEFAULT_TRIALS,
                         seed: int | None = None, confidence: float = 0.95) -> AuditResult:
    """Audit `LabelDPLayer` itself: a batch of ``n`` identical labels, class 0 vs class 1.

    The layer is called with ``training=True``. With ``per_batch=False`` (the
    layer's default) each call passes fresh example ids (a running counter,
    never reused), so every row gets its own independent noise, as ``n``
    distinct examples would; with ``per_batch=True`` the layer draws fresh
    noise per call and row. Statistic: the indicator that the noisy label is
    class 0.

    Args:
        eps: the layer's eps.
        mode: ``"binary"`` (float 0/1 labels), ``"sparse"`` (integer ids with
            ``num_classes``) or ``"onehot"`` (rows of ``num_classes``).
        num_classes: K for ``"sparse"`` and ``"onehot"`` (ignored for binary).
        per_batch: construct the layer with ``per_batch=True``.

    Claimed: ``eps`` per label release (exact on this event).
    """
    from keras_fedpriv.layers.label_dp import LabelDPLayer

    eps = validate_eps(eps)
    mode = _validate_choice(mode, "mode", ("binary", "sparse", "onehot"))
    k = 2 if mode == "binary" else validate_positive_int(num_classes, "num_classes", minimum=2)
    if not isinstance(per_batch, bool):
        raise TypeError(f"`per_batch` must be a bool; got {per_batch!r}.")
    seed = validate_seed(seed)
    layer_seed = int(secret_generator(seed).integers(0, 2**63))
    layer = LabelDPLayer(eps, mode=mode, num_classes=None if mode == "binary" else k,
                         seed=layer_seed, per_batch=per_batch)
    next_id = [0]

    def labels_of(cls, n):
        if mode == "binary":
            return np.full(n, cls, np.float32)
        if mode == "sparse":
            return np.full(n, cls, np.int32)
        rows = np.zeros((n, k), np.float32)
        rows[:, cls] = 1.0
        return rows

    def mechanism(cls, n, rng):
        labels = labels_of(cls, n)
        if per_batch:
            out = layer(labels, training=True)
        else:
            ids = np.arange(next_id[0], next_id[0] + n, dtype=np.int64)
            next_id[0] += n
            out = layer(labels, example_ids=ids, training=True)
        out = _numpy(out)
        return out[:, 0] == 1 if mode == "onehot" else out.reshape(-1) == 0

    result = audit(mechanism, 0, 1, num_trials, confidence=confidence, seed=seed)
    extra = ", per_batch" if per_batch else ""
    return _with_claim(result, eps, f"LabelDPLayer {mode} K={k} (eps={eps:g}{extra})")


def audit_quantize_rr(eps: float, num_trials: int = DEFAULT_TRIALS, seed: int | None = None,
                      confidence: float = 0.95) -> AuditResult:
    """Audit `quantize_rr` on one coordinate: ``x = +0.5`` (quantizes to 1) vs ``-0.5`` (to 0).

    Statistic: the output bit. Claimed: **eps/2** (each coordinate of
    quantize+RR is (eps/2)-DP; the ``eps`` argument is the layer's parameter,
    whose name follows the original design).
    """
    from keras_fedpriv.mechanisms.quantize import quantize_rr

    eps = validate_eps(eps)

    def mechanism(x, n, rng):
        return _numpy(quantize_rr(np.full(n, x, np.float32), eps, seed=_tf_seed(rng)))

    result = audit(mechanism, 0.5, -0.5, num_trials, confidence=confidence, seed=seed)
    return _with_claim(result, eps / 2.0, f"quantize+RR, 1 coordinate (eps={eps:g}, claim eps/2)")


def audit_embedding_dp_layer(eps: float, num_coordinates: int = 1, num_trials: int = DEFAULT_TRIALS,
                             seed: int | None = None, confidence: float = 0.95) -> AuditResult:
    """Audit `EmbeddingDPLayer` itself on a batch of ``n`` identical embeddings.

    Inputs: every coordinate ``+0.5`` vs every coordinate ``-0.5`` (the two
    embeddings differ in all ``d = num_coordinates`` quantized bits).
    Statistic: the number of ones in the released embedding, a monotone
    function of the privacy loss of d independent RR bits. The layer is
    called with ``training=True`` and draws fresh noise per call and row.

    Claimed: **d * eps / 2** (eps/2 per coordinate, basic composition, which
    is exact for this pair and the event "all ones"). With ``d > 1`` the
    worst-case event has probability ``(1 + e^(eps/2))^-d`` under ``b``, so
    the bound gets loose quickly as d or eps grows.
    """
    from keras_fedpriv.layers.embedding_dp import EmbeddingDPLayer

    eps = validate_eps(eps)
    d = validate_positive_int(num_coordinates, "num_coordinates")
    seed = validate_seed(seed)
    layer_seed = int(secret_generator(seed).integers(0, 2**63))
    layer = EmbeddingDPLayer(eps, seed=layer_seed)

    def mechanism(x, n, rng):
        out = _numpy(layer(np.full((n, d), x, np.float32), training=True))
        return out.sum(axis=1)

    result = audit(mechanism, 0.5, -0.5, num_trials, confidence=confidence, seed=seed)
    return _with_claim(result, d * eps / 2.0,
                       f"EmbeddingDPLayer d={d} (eps={eps:g}, claim d*eps/2)")


def audit_laplace(eps: float, sampler: str = "discrete", statistic: str = "loss",
                  sensitivity: float = 2.0, num_trials: int = DEFAULT_TRIALS, seed: int | None = None,
                  confidence: float = 0.95) -> AuditResult:
    """Audit `laplace` on the rows ``[1, 0]`` vs ``[0, 1]`` (L1 distance 2 = ``sensitivity``).

    Args:
        eps: the eps passed to `laplace`.
        sampler: ``"discrete"`` (default, float-safe) or ``"continuous"``.
        statistic: ``"loss"`` (default): ``clip(y0, 0, 1) - clip(y1, 0, 1)``,
            a monotone function of the privacy loss, whose top event
            ``{y0 >= 1, y1 <= 0}`` has ratio exactly ``e^eps`` and
            probability 1/4 under ``a``, so the bound is nearly tight.
            ``"difference"``: ``y0 - y1``, the obvious statistic; its tail
            ratio only tends to ``e^eps`` (``e^eps (t + c - 1) / (t + c + 1)``
            at threshold t), so it gives a looser bound.
        sensitivity: the sensitivity passed to `laplace` (see "Claimed").

    Claimed: ``eps``, the eps `laplace` promises for probability vectors
    (any two differ by at most 2 in L1). That holds with the default
    ``sensitivity=2``; the discrete sampler's exact eps on this pair is then
    ``eps * N / (N + 2)`` with ``N = 2 / gamma`` grid steps, a hair below.
    With ``sensitivity=1`` (the original design's and the reference's value) the claim
    is false: the true eps of this pair is ``2 * eps``, and the audit shows
    it (`AuditResult.violates_claim`).
    The audit looks at the values only: it does not test the low-order-bit
    leak of the continuous sampler (``tests/test_laplace.py`` does).
    """
    from keras_fedpriv.mechanisms.laplace import laplace

    eps = validate_eps(eps, "eps", lower_open=True)
    sampler = _validate_choice(sampler, "sampler", ("discrete", "continuous"))
    statistic = _validate_choice(statistic, "statistic", ("loss", "difference"))
    sensitivity = validate_eps(sensitivity, "sensitivity", lower_open=True)

    def mechanism(row, n, rng):
        return laplace(np.tile(np.asarray(row, np.float64), (n, 1)), eps, sensitivity, rng, sampler)

    if statistic == "loss":
        def stat(y):
            return np.clip(y[:, 0], 0.0, 1.0) - np.clip(y[:, 1], 0.0, 1.0)
    else:
        def stat(y):
            return y[:, 0] - y[:, 1]

    result = audit(mechanism, [1.0, 0.0], [0.0, 1.0], num_trials, statistic=stat,
                   confidence=confidence, seed=seed)
    note = "" if sensitivity == 2.0 else f", sensitivity={sensitivity:g}"
    return _with_claim(result, eps,
                       f"Laplace {sampler}, {statistic} (eps={eps:g}{note})")


def audit_magrr(eps: float, num_trials: int = DEFAULT_TRIALS, seed: int | None = None,
                confidence: float = 0.95) -> AuditResult:
    """Audit MagRR's client report (`threshold_reports`, what `MagRR.client_reports` sends).

    A step size at half the announced cut (bit 1) vs twice the cut (bit 0);
    ``n`` clients with the same magnitude report in one call, their noise
    words drawn from the audit's generator. The cut is public and the
    report depends only on which side of it the step size lies, so one cut
    (the growth phase's first, ``2 * 1e-5`` with the default constants)
    stands for all. Statistic: the report.

    Claimed: ``eps`` = ``eps_rr`` per client and round.
    """
    from keras_fedpriv.mechanisms.randomized_response import threshold_reports

    eps = validate_eps(eps, "eps", lower_open=True)
    cut = 2.0 * 1e-5

    def mechanism(r, n, rng):
        words = rng.integers(0, 2**32, size=n, dtype=np.uint32)
        return _numpy(threshold_reports(np.full(n, r, np.float64), cut, eps, noise=words))

    result = audit(mechanism, 0.5 * cut, 2.0 * cut, num_trials, confidence=confidence, seed=seed)
    return _with_claim(result, eps, f"MagRR client bit (eps_rr={eps:g})")


def audit_signds(eps: float, d: int = 100, k: int = 25, h: int | None = None,
                 thr: int | None = None, thr_ratio: float = 0.6, statistic: str = "loss",
                 sampler: str = "select_indices", num_trials: int = DEFAULT_TRIALS,
                 seed: int | None = None, confidence: float = 0.95) -> AuditResult:
    """Audit SignDS's exponential mechanism on two updates with disjoint top-k sets.

    Update ``a`` is 1 on ``S_a = {0..k-1}`` and 0 elsewhere, update ``b`` is 1
    on ``S_b = {k..2k-1}``; both with sign +1 (the sign is a fair coin
    independent of the data, so the audit conditions on it). With
    ``t_a = |J ∩ S_a|``, ``t_b = |J ∩ S_b|`` for the released set J,
    ``P[J | a] / P[J | b] = e^(eps (1[t_a >= thr] - 1[t_b >= thr]))``.

    Args:
        eps: the mechanism's eps.
        d, k: update length and top-k size (``2 k <= d``).
        h: released indices; None: `optimal_output_dim` (``thr_ratio``,
            capped at 100, as `SignDSEncoder`).
        thr: threshold; None: `optimal_threshold`.
        statistic: ``"loss"`` (default): ``1[t_a >= thr] - 1[t_b >= thr]``,
            the privacy loss over eps, whose event ``{= 1}`` has ratio exactly
            ``e^eps``; ``"count"``: ``t_a``, the number of released indices
            in ``S_a`` (exact as well when ``thr > h / 2``, since then
            ``t_a >= thr`` forces ``t_b < thr``; looser otherwise).
        sampler: ``"select_indices"`` (default): the package's
            `select_indices`, one Python call per run (~70 us each);
            ``"distribution"``: vectorized draws from the exact law of
            ``(t_a, t_b)`` (``t`` from `t_distribution`, the other count
            hypergeometric), which audits the formula, not the code.

    Claimed: ``eps`` for the released index set.
    """
    from keras_fedpriv.mechanisms import signds as S

    eps = validate_eps(eps, "eps", lower_open=True)
    d = validate_positive_int(d, "d", minimum=2)
    k = validate_positive_int(k, "k")
    if 2 * k > d:
        raise ValueError(f"`k` must satisfy 2 k <= d (two disjoint top-k sets); got k={k}, d={d}.")
    if h is None:
        h = S.optimal_output_dim(d, k, eps, thr_ratio, max_dim=100)
    h = validate_positive_int(h, "h")
    if h > d:
        raise ValueError(f"`h` must be an integer in [1, d={d}]; got {h!r}.")
    thr = S.optimal_threshold(d, k, h, eps) if thr is None else S.validate_thr(thr, h)
    statistic = _validate_choice(statistic, "statistic", ("loss", "count"))
    sampler = _validate_choice(sampler, "sampler", ("select_indices", "distribution"))

    def update(which):
        u = np.zeros(d, np.float32)
        u[which * k:(which + 1) * k] = 1.0
        return u

    def score(t_a, t_b):
        if statistic == "count":
            return t_a.astype(np.float64)
        return (t_a >= thr).astype(np.float64) - (t_b >= thr).astype(np.float64)

    if sampler == "select_indices":
        def mechanism(which, n, rng):
            u = update(which)
            t_a = np.empty(n, np.int64)
            t_b = np.empty(n, np.int64)
            for i in range(n):
                idx, _ = S.select_indices(u, k, h, eps, thr, 1, rng)
                t_a[i] = np.count_nonzero(idx < k)
                t_b[i] = np.count_nonzero((idx >= k) & (idx < 2 * k))
            return score(t_a, t_b)
    else:
        p = S.t_distribution(d, k, h, eps, thr)

        def mechanism(which, n, rng):
            t_own = rng.choice(h + 1, size=n, p=p)
            # the h - t_own others are uniform outside the own set: d - k
            # indices, k of them in the other set
            t_other = rng.hypergeometric(k, d - 2 * k, h - t_own)
            t_a, t_b = (t_own, t_other) if which == 0 else (t_other, t_own)
            return score(np.asarray(t_a), np.asarray(t_b))

    result = audit(mechanism, 0, 1, num_trials, confidence=confidence, seed=seed)
    return _with_claim(result, eps, f"SignDS d={d} k={k} h={h} thr={thr}, {statistic}, "
                                    f"{sampler} (eps={eps:g})")
