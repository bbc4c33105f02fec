"""dELDP: the distance-based empirical local DP estimate of a VAE bottom.

Theorem 2 of "Exploiting Internal Randomness for Privacy in Vertical Federated
Learning", ESORICS 2024.

For each label l, over the given samples x with that label::

    Delta_l = max_{x, x'} ||mu(x) - mu(x')||_2
    sigma_l = min_x ||sigma(x)||_2            (sigma = exp(0.5 * logvar))
    eps_l   = Delta_l / sigma_l * sqrt(2 ln(1.25 / delta))
    eps     = max_l eps_l

This is an EMPIRICAL estimate over the samples it is given, not a
differential-privacy guarantee: another input (or another sample of the same
population) can have a larger Delta_l or a smaller sigma_l, and the Gaussian
calibration ``sqrt(2 ln(1.25 / delta))`` is the classical one, proved only
for eps <= 1.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.validation import validate_positive_int

__all__ = ["DELDPReport", "deldp", "max_pairwise_distance"]


@dataclasses.dataclass(frozen=True)
class DELDPReport:
    """Result of `deldp`: an empirical dELDP estimate (NOT a DP guarantee).

    Attributes:
        eps: ``max_l eps_l`` (``inf`` if some label has ``sigma_l == 0`` and
            ``Delta_l > 0``).
        per_label_eps: ``{label: eps_l}``.
        delta_l: ``{label: Delta_l}``, the largest L2 distance between the
            means ``mu(x)`` of two samples with that label (0 for a label with
            a single sample).
        sigma_l: ``{label: sigma_l}``, the smallest L2 norm of the standard
            deviation vector ``exp(0.5 * logvar(x))`` over the samples with
            that label.
        delta: the delta the estimate is computed for.
        num_samples: how many samples the estimate is over.
        label_counts: ``{label: number of samples with that label}``.
    """

    eps: float
    per_label_eps: dict
    delta_l: dict
    sigma_l: dict
    delta: float
    num_samples: int
    label_counts: dict = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        """A plain-text table of the estimate, saying what it is and is not."""
        lines = [
            f"dELDP estimate: eps = {self.eps:.6g} at delta = {self.delta:.6g}",
            f"EMPIRICAL estimate over the {self.num_samples} given samples (Theorem 2 of the VAE "
            f"paper), NOT a differential-privacy guarantee: unseen inputs can have a larger "
            f"Delta_l or a smaller sigma_l.",
            "eps_l = Delta_l / sigma_l * sqrt(2 ln(1.25 / delta)), eps = max_l eps_l",
            "",
        ]
        header = ("label", "samples", "Delta_l", "sigma_l", "eps_l")
        rows = [(str(label), str(self.label_counts.get(label, "")),
                 f"{self.delta_l[label]:.6g}", f"{self.sigma_l[label]:.6g}",
                 f"{self.per_label_eps[label]:.6g}") for label in self.per_label_eps]
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        lines.append("  ".join(h.rjust(w) for h, w in zip(header, widths)))
        lines.append("  ".join("-" * w for w in widths))
        lines.extend("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)
        return "\n".join(lines)

    def __str__(self):
        return self.summary()


# --- exact maximum pairwise distance, in blocks ----------------------------------------

def _block_max(a, b, same):
    """Largest distance between a row of ``a`` and a row of ``b`` (float64 rows)."""
    sq = (np.einsum("ij,ij->i", a, a)[:, None] + np.einsum("ij,ij->i", b, b)[None, :]
          - 2.0 * (a @ b.T))
    if same:
        np.fill_diagonal(sq, 0.0)
    i, j = np.unravel_index(int(np.argmax(sq)), sq.shape)
    # Recompute the winning pair directly (the Gram trick loses a few low bits);
    # the Gram value keeps a margin so a near-tie cannot hide a larger pair.
    exact = float(np.linalg.norm(a[i] - b[j]))
    gram = math.sqrt(max(float(sq[i, j]), 0.0))
    return exact, gram


def max_pairwise_distance(points: ArrayLike, block_size: int = 1024) -> float:
    """Exact ``max_{i, j} ||points[i] - points[j]||_2`` without an N x N matrix.

    Rows too close to the centroid to be in a farthest pair are dropped (by
    the triangle inequality), the rest are ordered by their distance to an
    extreme row and cut into blocks of ``block_size``; a pair of blocks is
    only compared if the distance of their centres plus both radii could
    beat the best pair found so far (again an exact bound), and each
    comparison holds at most ``block_size**2`` distances.

    Args:
        points: array ``(N, d)``.
        block_size: rows per block (positive int).

    Returns:
        The largest pairwise L2 distance as a float (0.0 for N <= 1).
    """
    block_size = validate_positive_int(block_size, "block_size")
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"`points` must be a 2-D array (N, d); got shape {p.shape}.")
    n = len(p)
    if n <= 1:
        return 0.0
    # Centre the rows: distances do not change and the Gram trick keeps its precision.
    p = p - p.mean(axis=0)
    # A lower bound from two farthest-point sweeps, and a coherent row order.
    far = p[np.argmax(np.linalg.norm(p - p[0], axis=1))]
    dist_far = np.linalg.norm(p - far, axis=1)
    best = float(dist_far.max())
    # Relative slack for the bounds' own rounding, so pruning never drops the true maximum.
    slack = 1e-9 * (1.0 + float(np.abs(p).max()))
    # A row at distance r from the centre is within r + max(r) of every row:
    # rows with r + max(r) <= best cannot be in a better pair.
    radius = np.linalg.norm(p, axis=1)
    keep = radius + radius.max() + slack >= best
    p, dist_far = p[keep], dist_far[keep]
    p = p[np.argsort(dist_far, kind="stable")]
    blocks = [p[s:s + block_size] for s in range(0, len(p), block_size)]
    centres = np.stack([b.mean(axis=0) for b in blocks])
    radii = np.array([np.linalg.norm(b - c, axis=1).max() for b, c in zip(blocks, centres)])
    pairs = []
    for i in range(len(blocks)):
        for j in range(i, len(blocks)):
            bound = float(np.linalg.norm(centres[i] - centres[j])) + radii[i] + radii[j]
            pairs.append((bound, i, j))
    pairs.sort(reverse=True)
    for bound, i, j in pairs:
        if bound + slack < best:
            break
        exact, gram = _block_max(blocks[i], blocks[j], i == j)
        best = max(best, exact)
        if gram > best + slack:
            # The Gram trick saw a larger pair than the one it returned exactly:
            # settle this block pair by direct differences, row by row.
            for row in blocks[i]:
                best = max(best, float(np.linalg.norm(blocks[j] - row, axis=1).max()))
    return best


# --- inputs ----------------------------------------------------------------------------

def _validate_delta(delta):
    if isinstance(delta, (bool, np.bool_)) or not isinstance(delta, numbers.Real):
        raise TypeError(f"`delta` must be a real number in (0, 1); got {delta!r} of type "
                        f"{type(delta).__name__}.")
    value = float(delta)
    if not (0.0 < value < 1.0):  # also rejects NaN
        raise ValueError(f"`delta` must be a real number in (0, 1); got {delta!r}.")
    return value


def _label_key(value):
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def _normalize_labels(labels, n):
    y = np.asarray(labels)
    if y.ndim == 0:
        raise ValueError(f"`labels` must have shape (N,), (N, 1) or one-hot (N, K); got a "
                         f"scalar {labels!r}.")
    if len(y) != n:
        raise ValueError(f"`x` and `labels` must have the same length; got {n} samples and "
                         f"{len(y)} labels.")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    elif y.ndim == 2:
        if not np.issubdtype(y.dtype, np.number) and y.dtype != bool:
            raise TypeError(f"one-hot `labels` must be numeric; got dtype {y.dtype}.")
        if y.shape[1] == 0:
            raise ValueError(f"`labels` of shape {y.shape} have no classes.")
        y = np.argmax(y, axis=1)
    elif y.ndim != 1:
        raise ValueError(f"`labels` must have shape (N,), (N, 1) or one-hot (N, K); got shape "
                         f"{y.shape}.")
    if np.issubdtype(y.dtype, np.floating):
        if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            bad = y[~(np.isfinite(y) & (y == np.round(y)))][0]
            raise ValueError(f"`labels` must be class ids (integers), binary or one-hot; got "
                             f"the value {bad!r}.")
        y = y.astype(np.int64)
    return y


def _encoder(bottom):
    if hasattr(bottom, "encode") and callable(bottom.encode):
        return bottom.encode
    if callable(bottom):
        return bottom
    raise TypeError(f"`vae_bottom` must be a VAEBottom, an object with an `encode(x)` method "
                    f"or a callable, returning (mu, logvar); got {type(bottom).__name__}.")


def _encode_all(bottom, x, batch_size):
    encode = _encoder(bottom)
    mus, logvars = [], []
    for start in range(0, len(x), batch_size):
        out = encode(x[start:start + batch_size])
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"the encoder of `vae_bottom` must return a pair (mu, logvar); got "
                            f"{type(out).__name__}.")
        mu, logvar = (np.asarray(t, dtype=np.float64) for t in out)
        if mu.shape != logvar.shape or len(mu) != len(x[start:start + batch_size]):
            raise ValueError(f"the encoder returned mu of shape {mu.shape} and logvar of shape "
                             f"{logvar.shape} for a batch of {len(x[start:start + batch_size])} "
                             f"rows; they must have the same shape, one row per sample.")
        mus.append(mu.reshape(len(mu), -1))
        logvars.append(logvar.reshape(len(logvar), -1))
    mu, logvar = np.concatenate(mus), np.concatenate(logvars)
    for name, value in (("mu", mu), ("logvar", logvar)):
        bad = ~np.isfinite(value)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise ValueError(f"the encoder returned non-finite {name} (NaN or inf), first in "
                             f"row {row}.")
    return mu, logvar


# --- the estimate ----------------------------------------------------------------------

def gaussian_factor(delta: float) -> float:
    """``sqrt(2 ln(1.25 / delta))``, the Gaussian mechanism's calibration factor."""
    return math.sqrt(2.0 * math.log(1.25 / _validate_delta(delta)))


def deldp(vae_bottom: Any, x: ArrayLike, labels: ArrayLike, delta: float = 2.0**-32,
          batch_size: int = 1024, block_size: int = 1024) -> DELDPReport:
    """Estimate the dELDP epsilon of a VAE bottom's released sample.

    Theorem 2 of "Exploiting Internal Randomness for Privacy in Vertical Federated
    Learning", ESORICS 2024.

    For each label l, over the rows of ``x`` with that label,
    ``Delta_l = max ||mu(x) - mu(x')||_2`` (exact, computed in blocks, never an
    N x N matrix), ``sigma_l = min ||sigma(x)||_2`` with
    ``sigma = exp(0.5 * logvar)``, and
    ``eps_l = Delta_l / sigma_l * sqrt(2 ln(1.25 / delta))``; ``eps = max_l eps_l``.

    This is an EMPIRICAL estimate over the given samples, not a DP guarantee.
    Conventions: a label with a single sample has ``Delta_l = 0`` (so
    ``eps_l = 0``: it says nothing about that label); ``Delta_l = 0`` gives
    ``eps_l = 0`` even if ``sigma_l = 0``; ``sigma_l = 0`` with
    ``Delta_l > 0`` gives ``eps_l = inf`` (a deterministic release).

    Args:
        vae_bottom: a `VAEBottom`, any object with an ``encode(x)`` method, or
            a callable ``f(x)``, returning ``(mu, logvar)`` (log-variance, not
            the standard deviation) with one row per sample.
        x: the features, an array with N rows.
        labels: N labels: shape ``(N,)`` or ``(N, 1)`` class ids / binary, or
            ``(N, K)`` one-hot (argmax is taken).
        delta: in (0, 1); default ``2**-32`` as in the paper.
        batch_size: rows encoded per call (positive int).
        block_size: rows per block in the pairwise-distance search.

    Returns:
        A frozen `DELDPReport`; ``print(report)`` shows a table.

    Example:
        >>> report = deldp(bottom, x_train, y_train, delta=2**-32)
        >>> report.eps, report.per_label_eps
        >>> print(report)
    """
    delta = _validate_delta(delta)
    batch_size = validate_positive_int(batch_size, "batch_size")
    block_size = validate_positive_int(block_size, "block_size")
    if isinstance(x, (list, tuple)) or not hasattr(x, "__len__"):
        x = np.asarray(x)
    n = len(x)
    if n == 0:
        raise ValueError("`x` must hold at least one sample; got 0.")
    y = _normalize_labels(labels, n)
    mu, logvar = _encode_all(vae_bottom, x, batch_size)
    sigma_norm = np.linalg.norm(np.exp(0.5 * logvar), axis=1)
    factor = gaussian_factor(delta)

    per_label_eps, delta_l, sigma_l, counts = {}, {}, {}, {}
    for value in np.unique(y):
        rows = np.flatnonzero(y == value)
        key = _label_key(value)
        d = max_pairwise_distance(mu[rows], block_size=block_size)
        s = float(sigma_norm[rows].min())
        if d == 0.0:
            e = 0.0
        elif s == 0.0:
            e = math.inf
        else:
            e = d / s * factor
        per_label_eps[key], delta_l[key], sigma_l[key], counts[key] = e, d, s, len(rows)
    return DELDPReport(eps=max(per_label_eps.values()), per_label_eps=per_label_eps,
                       delta_l=delta_l, sigma_l=sigma_l, delta=delta, num_samples=n,
                       label_counts=counts)
