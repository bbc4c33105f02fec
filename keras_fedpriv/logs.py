"""The package's logger, ``logging.getLogger("keras_fedpriv")``, and its verbosity.

Progress and diagnostics go through this logger, never through bare ``print``.
By default it shows warnings and errors on stderr; `set_verbosity` changes the
level (``"debug"``, ``"info"``, ``"warning"``, ``"error"`` or a `logging` level).
A function's ``verbose=`` argument shows that call's progress at ``INFO``
whatever the level.

Example:
    >>> import keras_fedpriv
    >>> keras_fedpriv.set_verbosity("info")

`quiet_tensorflow` is for programs (the command line, the demos, the
examples' scripts and Flower apps), never called on import: it hides
TensorFlow's start-up log lines unless ``KERAS_FEDPRIV_TF_LOGS=1`` is set.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import tempfile

__all__ = ["TF_LOGS_VARIABLE", "logger", "quiet_tensorflow", "set_verbosity"]

#: Set this environment variable to 1 to see TensorFlow's start-up logs again.
TF_LOGS_VARIABLE = "KERAS_FEDPRIV_TF_LOGS"

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


# An absl log line: severity letter (I, W, E, F), date, time, thread id, file:line]
_ABSL_LINE = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] ")
_PRE_INIT = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_CPU_GUARD_TAIL = b"To enable the following instructions: "


def _hidden(line: bytes, level: int) -> bool:
    """Whether TF_CPP_MIN_LOG_LEVEL ``level`` hides this start-up line of TensorFlow."""
    if level < 1:
        return False
    if line.startswith(_PRE_INIT) or line.startswith(_CPU_GUARD_TAIL):
        return True
    match = _ABSL_LINE.match(line)
    return match is not None and b"IWEF".index(match.group(1)) < level  # FATAL: always shown


class _QuietLoader(importlib.abc.Loader):
    """Runs TensorFlow's own loader with file descriptor 2 captured; replays what is kept.

    A crash inside the import (a FATAL log line aborts the process) would lose
    the captured text: meanwhile `faulthandler` writes to the real stderr, so
    the process at least says that it died in ``import tensorflow``.
    """

    def __init__(self, loader, level):
        self.loader, self.level = loader, level

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self.loader  # as after a plain import
        _flush_stderr()
        try:
            saved = os.dup(2)
        except OSError:  # no stderr to capture (closed): nothing to hide
            self.loader.exec_module(module)
            return
        handler_was_on = faulthandler.is_enabled()
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            faulthandler.enable(saved)
            try:
                self.loader.exec_module(module)
            finally:
                _flush_stderr()
                os.dup2(saved, 2)
                faulthandler.disable()
                if handler_was_on:  # back where -X faulthandler writes, where it can
                    with contextlib.suppress(AttributeError, OSError, ValueError, RuntimeError):
                        faulthandler.enable()
                os.close(saved)
                captured.seek(0)
                kept = [line for line in captured.read().splitlines(keepends=True)
                        if not _hidden(line, self.level)]
                if kept:
                    with os.fdopen(os.dup(2), "wb") as stderr:
                        stderr.write(b"".join(kept))


def _flush_stderr():
    if sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` as the other finders do and gives it `_QuietLoader` (once)."""

    def __init__(self, level):
        self.level = level

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tensorflow":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _QuietLoader(spec.loader, self.level)
        return spec


def quiet_tensorflow(environ: dict | None = None) -> bool:
    """Hide TensorFlow's start-up logs in this process.

    Call it first thing in a program, before anything imports TensorFlow; it
    imports no TensorFlow itself. TensorFlow 2.21 prints lines such as "All
    log messages before absl::InitializeLog()", "oneDNN custom operations are
    on", "Could not find cuda drivers" and "failed call to cuInit" that are
    not errors of the program. This sets ``TF_CPP_MIN_LOG_LEVEL=3`` unless the
    user set it (their value wins), and, as TensorFlow's libraries print some
    lines while they load whatever that variable says, drops the lines of
    ``import tensorflow`` that the level hides (INFO at level 1, also WARNING
    at 2, also ERROR at 3); other output of the import is passed through
    once the import is done (a crash during the import loses them; `faulthandler`
    then says where the process died). Processes started later inherit the
    variable but not that filter: a program they run calls this itself.
    With ``KERAS_FEDPRIV_TF_LOGS=1`` in the environment it changes nothing.

    Args:
        environ: the environment to read and change (default ``os.environ``).

    Returns:
        False if ``KERAS_FEDPRIV_TF_LOGS=1`` asked for the logs, else True
        (also when TensorFlow was imported already and has printed them).
    """
    environ = os.environ if environ is None else environ
    if environ.get(TF_LOGS_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        level = int(environ["TF_CPP_MIN_LOG_LEVEL"])
    except ValueError:
        level = 0
    if level >= 1 and "tensorflow" not in sys.modules and not any(
            isinstance(finder, _QuietFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietFinder(level))
    return True
