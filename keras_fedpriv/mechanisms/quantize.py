"""One-bit quantization followed by randomized response (EmbeddingDP).

``B = 1 if x > 0 else 0`` elementwise; with ``eps`` given, a 1 stays 1 with
``p = e^(eps/2) / (e^(eps/2) + 1)`` and a 0 becomes 1 with
``q = 1 / (e^(eps/2) + 1)``: symmetric randomized
response with flip probability q, so each coordinate is (eps/2)-DP and a
d-dimensional embedding is (d * eps / 2)-DP by basic composition.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import dp_accounting
from keras import ops
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.events import repeat_event
from keras_fedpriv.mechanisms.random import words_below
from keras_fedpriv.mechanisms.randomized_response import (
    noise_words,
    flip_threshold,
    randomized_response_dp_event,
    realized_epsilon,
)
from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int

__all__ = ["quantize_keep_probability", "quantize_turn_on_probability", "quantize_rr",
           "quantize_rr_dp_event", "quantize_realized_epsilon"]


def quantize_keep_probability(eps: float) -> float:
    """``p = e^(eps/2) / (e^(eps/2) + 1)``: a quantized 1 stays 1."""
    eps = validate_eps(eps)
    return 1.0 / (1.0 + math.exp(-eps / 2.0))


def quantize_turn_on_probability(eps: float) -> float:
    """``q = 1 / (e^(eps/2) + 1)``: a quantized 0 turns into 1."""
    eps = validate_eps(eps)
    t = math.exp(-eps / 2.0)
    return t / (1.0 + t)


def quantize_rr(x: ArrayLike, eps: float | None = None, *, seed: int | None = None,
                noise: ArrayLike | Sequence[ArrayLike] | None = None) -> Any:
    """Quantize to one bit and apply randomized response.

    Args:
        x: float tensor, any shape. Not modified.
        eps: None (quantize only) or a finite privacy parameter >= 0; each
            coordinate's release is (eps/2)-DP.
        seed: None (fresh OS-entropy secret, eager only) or an int.
        noise: optional uint32 words with the shape of ``x``.

    Returns:
        Tensor of the shape and dtype of ``x`` whose values are exactly 0.0 or
        1.0. No gradient flows through it; `EmbeddingDPLayer` adds the
        straight-through gradient.

    Example:
        >>> quantize_rr(np.array([[-0.3, 0.8]], "float32"), eps=2.0, seed=1)
    """
    eps = validate_eps(eps, allow_none=True)
    x = ops.convert_to_tensor(x)
    bits = ops.greater(x, 0)
    if eps is not None:
        (words,) = noise_words(noise, ops.shape(x), seed)
        # Keeping a 1 with p = 1 - q and turning a 0 on with q is a flip with
        # probability q (one draw per coordinate).
        # The flip threshold is binary RR's at eps/2: the probability q rounded up.
        flip = words_below(words, flip_threshold(eps / 2.0))
        bits = ops.logical_xor(bits, flip)
    return ops.cast(bits, x.dtype)


def quantize_rr_dp_event(eps: float | None, num_coordinates: int) -> dp_accounting.DpEvent:
    """DpEvent of `quantize_rr` on a ``num_coordinates``-dimensional vector.

    Each coordinate is binary RR at eps/2; the vector is their composition.
    Each coordinate's event is built from the flip probability actually used
    (``q`` rounded up to a multiple of 2**-32), so its epsilon is
    `quantize_realized_epsilon(eps)`: at most eps/2, and ~22.18 for every
    ``eps >= 44.4``. With ``eps=None`` (quantization only) the release is not
    private.
    """
    eps = validate_eps(eps, allow_none=True)
    d = validate_positive_int(num_coordinates, "num_coordinates")
    if eps is None:
        return dp_accounting.NonPrivateDpEvent()
    return repeat_event(randomized_response_dp_event(eps / 2.0, 2), d)


def quantize_realized_epsilon(eps: float) -> float:
    """The epsilon each coordinate of `quantize_rr` at ``eps`` actually achieves.

    Nominally ``eps / 2``; computed from the integer flip threshold in use,
    it is ``realized_epsilon(eps / 2, 2)``: at most eps/2, and
    ``log(2**32 - 1) ~= 22.18`` for every ``eps >= 44.4`` (a flip probability
    cannot go below 2**-32). A d-dimensional vector is ``d`` times this value
    by basic composition.

    Args:
        eps: the privacy parameter of `quantize_rr`, finite and >= 0.

    Returns:
        The realized per-coordinate epsilon (float).
    """
    return realized_epsilon(validate_eps(eps) / 2.0, 2)
