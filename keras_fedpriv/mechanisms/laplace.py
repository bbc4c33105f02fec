"""The Laplace mechanism on vectors (e.g. a client's softmax outputs), safe under floating point.

``laplace(values, eps, sensitivity)`` adds noise of scale ``b = sensitivity / eps``
to every entry; each row (last axis) is one release whose L1 sensitivity is
``sensitivity`` (2 for probability vectors: two of them differ by at most 2 in
L1; MindSpore Federated's design and code use 1, which understates eps by a factor 2).

Why not ``x + numpy.random.laplace(b)``: floating-point noise leaks the input
through the low-order bits of the output (Mironov, "On significance of the
least significant bits for differential privacy", CCS 2012). The set of
floats that ``x + noise`` can produce depends on ``x``; an attacker who sees
an output impossible under one input knows the input was the other, whatever
eps says. ``tests/test_laplace.py`` shows this on the reference's own sampler.

The default sampler (``sampler="discrete"``) avoids it by working on a grid:

1. a grid step ``gamma``, a power of two about 2^-10 times the smaller of the
   noise scale and ``sensitivity / k`` (multiples of gamma are exact floats);
2. each value is rounded to the nearest grid point, ``m = round(x / gamma)``
   (an integer); rounding moves each of the k entries of a row by at most
   gamma/2, so two rows within L1 distance ``sensitivity`` give integer rows
   within L1 distance ``C = ceil(sensitivity / gamma) + k``;
3. integer discrete-Laplace noise ``Z`` with ``P(Z = z) ∝ exp(-a |z|)``,
   ``a = eps / C``, is added: integers plus integers, no rounding anywhere, so
   the row is exactly eps-DP (Ghosh, Roughgarden, Sundararajan 2009; the
   ratio of the probabilities of any output under neighbouring rows is at most
   ``exp(a C) = exp(eps)``);
4. the output is ``(m + Z) * gamma``: every output lies on the same grid for
   every input, so its bits say nothing beyond the DP release.

``Z`` is the difference of two geometric variables, each drawn by inversion
from a uniform with an unbounded exponent (``U = V * 2^-E``, ``E`` geometric),
so the tails are not truncated at 2^-53 the way a plain float uniform would
truncate them. The noise scale is ``gamma / sinh(a) ≈ (sensitivity + k
gamma) / eps``: ``sensitivity / eps`` times ``1 + k gamma / sensitivity``, at
most 1 + 1/1024.

``sampler="continuous"`` is the textbook float sampler, kept only to compare.
"""

from __future__ import annotations

import math
from fractions import Fraction

import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.random import secret_generator
from keras_fedpriv.mechanisms.validation import (
    validate_eps,
    validate_positive_int,
    validate_real,
)

__all__ = ["MIN_NOISE_PARAMETER", "SAMPLERS", "discrete_laplace_integers", "laplace",
           "laplace_dp_event", "laplace_grid",
           "laplace_scale"]

SAMPLERS = ("discrete", "continuous")
GRID_BITS = 10  # grid step: 2^-GRID_BITS times min(noise scale, sensitivity/k), a power of 2
# Each geometric G = floor(-ln U / a) is computed in float64 and must stay below 2**52, where
# float64 still resolves every integer; otherwise its low bits would be a lattice that the
# rounded input shows through (and beyond 2**63 the int64 cast wraps, so the two geometrics
# cancel and the input goes out merely rounded). -ln U > 128 ln 2 has probability 2**-128, so
# the smallest accepted parameter is a = 128 ln 2 / 2**52.
_MAX_GEOMETRIC = 2**52
MIN_NOISE_PARAMETER = 128 * math.log(2.0) / _MAX_GEOMETRIC


def laplace_scale(eps: float, sensitivity: float = 2.0) -> float:
    """The Laplace scale ``b = sensitivity / eps`` (validated)."""
    eps = validate_eps(eps, "eps", lower_open=True)
    sensitivity = validate_eps(sensitivity, "sensitivity", lower_open=True)
    return sensitivity / eps


def _grid_exponent(b, sensitivity, k):
    """``e`` with ``gamma = 2**e``: 2**-GRID_BITS times min(b, sensitivity / k), rounded down."""
    return math.floor(math.log2(min(b, sensitivity / k))) - GRID_BITS


def laplace_grid(eps: float, sensitivity: float = 2.0,
                 num_values: int = 1) -> tuple[float, int, float]:
    """The grid of the discrete sampler for rows of ``num_values`` entries.

    Returns:
        ``(gamma, C, a)``: the grid step (a power of two), the integer L1
        sensitivity after rounding to the grid (an exact Python int), and the
        discrete-Laplace parameter ``a = eps / C`` (noise pmf ∝ exp(-a |z|)).

    Raises:
        ValueError: where the discrete sampler cannot be exact: a grid step
            below the smallest normal float64 (2**-1022), or ``a`` below
            `MIN_NOISE_PARAMETER` (eps so small that the geometric draws
            would exceed 2**52, where float64 no longer resolves integers);
            the message names eps and the smallest eps accepted for this
            sensitivity and row length.
    """
    b = laplace_scale(eps, sensitivity)
    k = validate_positive_int(num_values, "num_values")
    sensitivity, eps = float(sensitivity), float(eps)
    # fine against both the noise scale and the rounding margin k * gamma / sensitivity
    exponent = _grid_exponent(b, sensitivity, k) if b > 0 else -math.inf
    if exponent < -1022:
        raise ValueError(
            f"`eps`={eps!r} with sensitivity={sensitivity!r} needs a grid step 2**{exponent} "
            f"below the smallest normal float64 (2**-1022): the discrete Laplace sampler "
            f"cannot be exact there. Use a smaller eps or rescale the values.")
    gamma = 2.0**exponent
    # exact integer arithmetic: sensitivity / gamma can overflow a float for huge eps
    c = math.ceil(Fraction(sensitivity) / Fraction(2) ** exponent) + k
    a = float(Fraction(eps) / c)
    if a < MIN_NOISE_PARAMETER:
        # For eps < num_values the grid (hence C) does not depend on eps.
        e0 = _grid_exponent(math.inf, sensitivity, k)
        c0 = math.ceil(Fraction(sensitivity) / Fraction(2) ** e0) + k
        raise ValueError(
            f"`eps` must be >= {MIN_NOISE_PARAMETER * c0:.3g} for the discrete Laplace sampler "
            f"with sensitivity={sensitivity!r} and num_values={k} (rows of {k} values on a "
            f"grid of step 2**{e0}); got {eps!r}. Below it the integer noise would exceed "
            f"2**52, where float64 no longer represents it exactly.")
    return gamma, c, a


def _check_sampler(sampler):
    if sampler not in SAMPLERS:
        raise ValueError(f"`sampler` must be one of {SAMPLERS}; got {sampler!r}.")
    return sampler


def _geometric_failures(a, shape, rng):
    """G >= 0 with P(G >= g) = exp(-a g), by inversion of an untruncated uniform.

    Raises:
        ValueError: ``a`` below `MIN_NOISE_PARAMETER`.
        RuntimeError: a draw at or above 2**52 (probability below 2**-128 per
            draw for an accepted ``a``), which float64 cannot resolve; it
            depends only on the noise, never on the data.
    """
    a = float(a)
    if not a >= MIN_NOISE_PARAMETER:
        raise ValueError(f"`a` must be >= {MIN_NOISE_PARAMETER:.3g} (the draws must stay below "
                         f"2**52 to be exact in float64); got {a!r}.")
    e = rng.geometric(0.5, size=shape) - 1           # U = V * 2^-E, E ~ Geometric(1/2) from 0
    v = 0.5 + 0.5 * rng.random(size=shape)           # V uniform in [1/2, 1)
    neg_log_u = e * math.log(2.0) - np.log(v)        # -ln U >= 0, unbounded
    g = np.floor(neg_log_u / a)
    if np.any(g >= _MAX_GEOMETRIC):
        raise RuntimeError("a geometric draw reached 2**52 (probability < 2**-128): retry.")
    return g.astype(np.int64)


def discrete_laplace_integers(a: float, shape: int | tuple[int, ...],
                              rng: np.random.Generator) -> np.ndarray:
    """Integer noise with ``P(Z = z) ∝ exp(-a |z|)`` (difference of two geometrics)."""
    return _geometric_failures(a, shape, rng) - _geometric_failures(a, shape, rng)


def laplace(values: ArrayLike, eps: float, sensitivity: float = 2.0,
            rng: np.random.Generator | None = None, sampler: str = "discrete") -> np.ndarray:
    """Add Laplace noise of scale ``sensitivity / eps`` to every entry of ``values``.

    Args:
        values: array-like of finite reals; each row (last axis) is one
            release with L1 sensitivity ``sensitivity`` (a 1-D array is one row).
        eps: privacy parameter per row, a finite number > 0.
        sensitivity: L1 sensitivity of a row (2 for probability vectors).
        rng: a `numpy.random.Generator`; None draws a fresh secret from OS
            entropy (`secret_generator`).
        sampler: ``"discrete"`` (default; float-safe, see the module
            docstring) or ``"continuous"`` (textbook float sampler, leaks
            through its low-order bits; for comparison only).

    Returns:
        float64 array of the shape of ``values``.

    Raises:
        TypeError / ValueError: bad eps, sensitivity or sampler, or values
            with NaN or infinity (named in the message); for the discrete
            sampler also an eps too small for it to be exact (see
            `laplace_grid`) or values beyond 2**52 grid steps.

    Example:
        >>> noisy = laplace(probabilities, eps=10.0, sensitivity=2.0)
    """
    sampler = _check_sampler(sampler)
    b = laplace_scale(eps, sensitivity)
    x = np.asarray(values, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("`values` must have at least one axis (a row of values); got a scalar.")
    if not np.all(np.isfinite(x)):
        raise ValueError("`values` must be finite; it contains NaN or infinity.")
    rng = secret_generator() if rng is None else rng
    if sampler == "continuous":
        return x + rng.laplace(0.0, b, size=x.shape)
    gamma, _, a = laplace_grid(eps, sensitivity, x.shape[-1])
    m = np.rint(x / gamma)
    if np.any(np.abs(m) > _MAX_GEOMETRIC):
        raise ValueError(f"`values` must lie within +-2**52 grid steps of 0 for the discrete "
                         f"sampler (|value| <= {_MAX_GEOMETRIC * gamma:.6g} at eps={eps!r}, "
                         f"sensitivity={sensitivity!r}); got a value of magnitude "
                         f"{float(np.max(np.abs(x))):.6g}.")
    m = m.astype(np.int64)
    return (m + discrete_laplace_integers(a, x.shape, rng)).astype(np.float64) * gamma


def laplace_dp_event(eps: float, sensitivity: float = 2.0, num_values: int | None = None,
                     sampler: str = "discrete",
                     distance: float | None = None) -> dp_accounting.DpEvent:
    """The dp_accounting event of one row.

    Args:
        eps, sensitivity: as in `laplace` (the noise is calibrated to them).
        num_values: entries per row (needed for the discrete sampler, whose
            integer sensitivity depends on it).
        sampler: as in `laplace`.
        distance: the L1 distance between neighbouring rows that the event
            must cover, when it differs from ``sensitivity`` (e.g. 2 for
            probability vectors whose noise was calibrated to the original design's
            sensitivity 1). Default: ``sensitivity``.

    Returns:
        ``DiscreteLaplaceDpEvent(a, ceil(distance / gamma) + k)`` for the
        discrete sampler (exactly what it does: eps = a C at ``distance =
        sensitivity``), ``LaplaceDpEvent(sensitivity / (eps distance))`` for
        the continuous one (the idealized real-valued mechanism; its float
        implementation does not achieve it).
    """
    sampler = _check_sampler(sampler)
    laplace_scale(eps, sensitivity)
    distance = float(sensitivity) if distance is None else validate_real(
        distance, "distance", low=0, low_open=True)
    if sampler == "continuous":
        return dp_accounting.LaplaceDpEvent(
            noise_multiplier=float(sensitivity) / (float(eps) * distance))
    if num_values is None:
        raise ValueError("`num_values` (entries per row) is needed for the discrete sampler's "
                         "event: its integer sensitivity is ceil(sensitivity/gamma) + num_values.")
    gamma, _, a = laplace_grid(eps, sensitivity, num_values)
    return dp_accounting.dp_event.DiscreteLaplaceDpEvent(
        noise_parameter=a, sensitivity=math.ceil(distance / gamma) + int(num_values))
