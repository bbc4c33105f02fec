"""Argument validation shared by every mechanism, layer and callback.

There is one epsilon validator (`validate_eps`) and every public entry point
calls it, so that the rules of ALGORITHMS.md section 0 hold everywhere:
epsilon is a real, finite number ``>= 0``; bools, strings, ``None``, NaN and
infinity are rejected with an error that names the parameter, the value and
the valid range; nothing is ever clamped silently.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["config_with_seed", "validate_eps", "validate_seed", "validate_positive_int"]


def validate_eps(eps, name="eps", *, allow_none=False, lower_open=False, upper=None):
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
    low = "> 0" if lower_open else ">= 0"
    rng = f"a finite real number {low}" + (f" and <= {upper}" if upper is not None else "")
    if eps is None:
        if allow_none:
            return None
        raise TypeError(f"`{name}` must be {rng}; got None.")
    # numpy bools are rejected too: True is not a privacy level. numpy floats
    # and ints are numbers.Real and pass.
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"`{name}` must be {rng}; got {eps!r} of type {type(eps).__name__}.")
    value = float(eps)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"`{name}` must be {rng}; got {eps!r}.")
    if value < 0 or (lower_open and value == 0):
        raise ValueError(f"`{name}` must be {rng}; got {eps!r}.")
    if upper is not None and value > upper:
        raise ValueError(f"`{name}` must be {rng}; got {eps!r}.")
    return value


def validate_seed(seed, name="seed"):
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


def validate_positive_int(value, name, *, minimum=1, allow_none=False):
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


def config_with_seed(config, seed):
    """``config`` plus ``"seed"`` when the user passed one explicitly.

    A secret drawn from OS entropy is never written into a config (ALGORITHMS.md
    section 0): whoever holds a saved config must not be able to replay the noise.
    """
    return config if seed is None else dict(config, seed=seed)
