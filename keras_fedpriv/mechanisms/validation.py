"""Argument validation shared by every mechanism, layer and callback.

There is one epsilon validator (`validate_eps`) and every public entry point
calls it, so that the same rules hold everywhere:
epsilon is a real, finite number ``>= 0``; bools, strings, ``None``, NaN and
infinity are rejected with an error that names the parameter, the value and
the valid range; nothing is ever clamped silently.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

__all__ = ["config_with_seed", "validate_eps", "validate_positive_int", "validate_real",
           "validate_seed"]


def validate_eps(eps: Any, name: str = "eps", *, allow_none: bool = False,
                 lower_open: bool = False, upper: float | None = None) -> float | None:
    """Validate a privacy parameter and return it as a Python float.

    Args:
        eps: the value to check.
        name: the argument name used in error messages.
        allow_none: whether ``None`` is a valid value (returned unchanged).
        lower_open: if True the valid range is ``eps > 0`` instead of
            ``eps >= 0``.
        upper: optional inclusive upper bound.

    Returns:
        ``float(eps)``, or ``None`` when ``eps is None`` and ``allow_none``.

    Raises:
        TypeError: for bools, strings, ``None`` (unless allowed) and other
            non-real values.
        ValueError: for NaN, infinities, negative values and values outside
            ``(lower, upper]``.
    """
    return validate_real(eps, name, low=0, low_open=lower_open, high=upper,
                         allow_none=allow_none)


def validate_real(value: Any, name: str, *, low: float | None = None, high: float | None = None,
                  low_open: bool = False, high_open: bool = False,
                  allow_none: bool = False) -> float | None:
    """Validate a finite real number in a range and return it as a Python float.

    The rules of `validate_eps` (bools, strings, ``None`` unless allowed, NaN
    and infinities rejected; nothing clamped) with a range of the caller's
    choice. The message names the argument, the value and the range.

    Args:
        value: the value to check.
        name: the argument name used in error messages.
        low, high: optional bounds (None: unbounded on that side).
        low_open, high_open: whether each bound is excluded.
        allow_none: whether ``None`` is a valid value (returned unchanged).

    Raises:
        TypeError: for bools, strings, ``None`` (unless allowed) and other
            non-real values.
        ValueError: for NaN, infinities and values outside the range.
    """
    parts = []
    if low is not None:
        parts.append(f"> {low}" if low_open else f">= {low}")
    if high is not None:
        parts.append(f"< {high}" if high_open else f"<= {high}")
    rng = "a finite real number" + (" " + " and ".join(parts) if parts else "")
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"`{name}` must be {rng}; got None.")
    # numpy bools are rejected too: True is not a number here. numpy floats
    # and ints are numbers.Real and pass.
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be {rng}; got {value!r} of type {type(value).__name__}.")
    x = float(value)
    if (math.isnan(x) or math.isinf(x)
            or (low is not None and (x < low or (low_open and x == low)))
            or (high is not None and (x > high or (high_open and x == high)))):
        raise ValueError(f"`{name}` must be {rng}; got {value!r}.")
    return x


def validate_seed(seed: Any, name: str = "seed") -> int | None:
    """Validate an explicit seed: ``None`` or a non-negative Python int < 2**64."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(
            f"`{name}` must be None (a fresh secret from OS entropy) or a non-negative "
            f"integer < 2**64; got {seed!r} of type {type(seed).__name__}."
        )
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"`{name}` must be a non-negative integer < 2**64; got {seed!r}.")
    return seed


def validate_positive_int(value: Any, name: str, *, minimum: int = 1,
                          allow_none: bool = False) -> int | None:
    """Validate an integer argument ``>= minimum`` and return it as int."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer >= {minimum}; got {value!r} "
                        f"of type {type(value).__name__}.")
    if int(value) < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}; got {value!r}.")
    return int(value)


def validate_int_sequence(value, name, *, minimum=1, allow_scalar=True, what="integers"):
    """Validate a sequence of integers ``>= minimum`` (e.g. layer widths); return a tuple.

    Args:
        value: a list/tuple (or other non-string iterable) of integers; with
            ``allow_scalar`` a single integer stands for a one-element sequence.
        name: the argument's name, for error messages.
        minimum: the smallest allowed entry.
        allow_scalar: accept a bare integer.
        what: what the entries are, for error messages.

    Raises:
        TypeError: not a sequence (a string, a bool, a non-iterable), or an
            entry that is not an integer.
        ValueError: an entry below ``minimum``.
    """
    allowed = (f"`{name}` must be a sequence of {what} (integers >= {minimum})"
               + (" or a single integer" if allow_scalar else ""))
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        if not allow_scalar:
            raise TypeError(f"{allowed}; got the integer {value!r}.")
        value = (value,)
    if isinstance(value, (str, bytes, bool, np.bool_)):
        raise TypeError(f"{allowed}; got {value!r} of type {type(value).__name__}.")
    try:
        entries = tuple(value)
    except TypeError:
        raise TypeError(f"{allowed}; got {value!r} of type {type(value).__name__}.") from None
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, (bool, np.bool_)) or not isinstance(entry, numbers.Integral):
            raise TypeError(f"{allowed}; got {value!r} (entry {i}: {entry!r}).")
        if int(entry) < minimum:
            raise ValueError(f"{allowed}; got {value!r} (entry {i}: {entry!r}).")
        out.append(int(entry))
    return tuple(out)


def config_with_seed(config: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """``config`` plus ``"seed"`` when the user passed one explicitly.

    A secret drawn from OS entropy is never written into a config: whoever holds a
    saved config must not be able to replay the noise.
    """
    return config if seed is None else dict(config, seed=seed)
