"""The package's logger, ``logging.getLogger("keras_fedpriv")``, and its verbosity.

Progress and diagnostics go through this logger, never through bare ``print``.
By default it shows warnings and errors on stderr; `set_verbosity` changes the
level (``"debug"``, ``"info"``, ``"warning"``, ``"error"`` or a `logging` level).
A function's ``verbose=`` argument shows that call's progress at ``INFO``
whatever the level.

Example:
    >>> import keras_fedpriv
    >>> keras_fedpriv.set_verbosity("info")
"""

from __future__ import annotations

import contextlib
import logging

__all__ = ["logger", "set_verbosity"]

logger = logging.getLogger("keras_fedpriv")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("keras_fedpriv: %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def set_verbosity(level: int | str) -> int:
    """Set the package logger's level; return the previous one.

    Args:
        level: ``"debug"``, ``"info"``, ``"warning"``, ``"error"`` (any case) or
            an integer `logging` level.
    """
    if isinstance(level, str) and level.lower() in _LEVELS:
        value = _LEVELS[level.lower()]
    elif isinstance(level, int) and not isinstance(level, bool) and level >= 0:
        value = level
    else:
        raise ValueError(f"`level` must be one of {sorted(_LEVELS)} or a logging level (an "
                         f"integer >= 0); got {level!r}.")
    previous = logger.level
    logger.setLevel(value)
    return previous


@contextlib.contextmanager
def verbose_scope(verbose):
    """Show ``INFO`` messages inside the block when ``verbose`` is truthy."""
    if not verbose or logger.isEnabledFor(logging.INFO):
        yield
        return
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(previous)
