"""Input checks of the protection layers that never put user data in an error.

Pieces shared by `LabelDPLayer` and `EmbeddingDPLayer`:

* `private_errors`: a decorator for ``call``. Keras appends every call
  argument to an exception raised inside a layer ("Arguments received by
  ..."), which would copy a whole label array or raw embedding into the error
  text and the logs. Errors leaving a decorated ``call`` are marked so that
  Keras leaves their message as it is (our messages name only the argument,
  the first offending position and at most that one value).
* `check_example_ids`: one id per label, unique within the call, integer
  dtype; eagerly a ValueError, in a TensorFlow graph a `tf.debugging.Assert`,
  and in every traced call a boolean that the layer uses to make the output
  safe where no assert runs (XLA, and every traced JAX function).
* `example_ids_assert_message`: the short text of a failed graph check of
  the ids (the rule and the first repeated position); `traced_check_message`
  also knows the finiteness check of an embedding (`NOT_FINITE`).
  `VerticalModel` and the horizontal client's `LocalTrainer` re-raise them as
  a ValueError instead of TensorFlow's graph error.
* `InputErrorFlagMixin`: a small local (never-trained, never a Keras weight)
  counter variable per layer. Under XLA (``jit_compile=True``) `tf.debugging`
  asserts are removed, and traced JAX code cannot raise at all, so a layer that
  receives invalid inputs there outputs a value that does not depend on them
  and counts the event in this variable;
  `check_input_errors()` (run by `VerticalModel` after every step, and to be
  called by the user after a jit-compiled step of a plain model) raises a
  ValueError on the host and resets the counter.
"""

from __future__ import annotations

import functools
import re

import keras
import numpy as np
from keras import ops

from keras_fedpriv import backend
from keras_fedpriv.backend.private import keep_call_arguments_out

_COUNT_RULE = "`example_ids` must hold exactly one id per label"
_UNIQUE_RULE = "`example_ids` must be unique within a call (one id per example)"
# What a failed graph assert of `check_example_ids` says inside tf.errors.InvalidArgumentError.
_ID_ASSERT = re.compile(r"assertion failed: \[(\w+): (" + re.escape(_COUNT_RULE) + "|"
                        + re.escape(_UNIQUE_RULE) + r"); [\w ,]+:\] \[(\d+)\](?: \[(\d+)\])?")
#: What a protection layer's graph check of finiteness says (after the layer's name).
NOT_FINITE = "the embedding has NaN or inf values"
_FINITE_ASSERT = re.compile(r"(\w+): " + re.escape(NOT_FINITE))


def private_errors(call):
    """Decorate a layer's ``call`` so Keras does not append its arguments to errors.

    Args:
        call: the layer's ``call`` method.

    Returns:
        The wrapped method; exceptions pass through unchanged but carry the
        attribute Keras checks before injecting the call arguments.
    """

    @functools.wraps(call)
    def wrapped(self, *args, **kwargs):
        try:
            return call(self, *args, **kwargs)
        except Exception as error:
            keep_call_arguments_out(error)
            raise

    return wrapped


def find_repeat(values: np.ndarray) -> tuple[int, int] | None:
    """The first position whose id appeared before, and that earlier position.

    Args:
        values: a 1-D array of ids.

    Returns:
        ``(position, earlier)``, or None when every id is unique.
    """
    values = np.asarray(values).reshape(-1)
    _, first = np.unique(values, return_index=True)
    if first.size == values.size:
        return None
    repeated = np.ones(values.size, bool)
    repeated[first] = False
    position = int(np.flatnonzero(repeated)[0])
    return position, int(np.flatnonzero(values[:position] == values[position])[0])


def static_int(value):
    """``value`` as a Python int when it is known now (an int, or a concrete tensor), else None."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    if backend.impl().is_traced(value):
        return None
    return int(ops.convert_to_numpy(value))


def host_example_ids(example_ids, owner):
    """Concrete ids as a NumPy array, refused when the backend's id dtype cannot hold them
    (distinct ids must stay distinct), or None for tensors of the backend."""
    if ops.is_tensor(example_ids):
        return None
    values = np.asarray(example_ids)
    if values.dtype.kind not in "iu":
        raise TypeError(f"{owner}: `example_ids` must be integers; got dtype {values.dtype}.")
    limits = np.iinfo(backend.impl().EXAMPLE_ID_DTYPE)
    if values.dtype.itemsize <= limits.dtype.itemsize:
        return values
    outside = np.flatnonzero((values.reshape(-1) < limits.min) | (values.reshape(-1) > limits.max))
    if outside.size:
        raise ValueError(f"{owner}: `example_ids` must fit in {limits.dtype.name} on Keras' "
                         f"{backend.name()} backend (ids are compared as {limits.dtype.name}); "
                         f"position {int(outside[0])} holds an id outside [{limits.min}, "
                         f"{limits.max}]. Number the examples 0, 1, 2, ...")
    return values.astype(limits.dtype)


def check_example_ids(example_ids, num_labels, eager, owner="LabelDPLayer"):
    """Validate ``example_ids`` against ``num_labels`` labels.

    Args:
        example_ids: integer ids, any shape; flattened to one id per label.
        num_labels: the number of labels, an int or a scalar int32 tensor.
        eager: True to raise a ValueError now; False to build graph asserts
            (TensorFlow) and a flag (every backend).
        owner: the layer's name for the messages.

    Returns:
        ``(ids, ok, asserts)``: the ids as the backend's
        ``EXAMPLE_ID_DTYPE`` (int64 on TensorFlow, int32 on JAX) of shape
        (num_labels,) (padded or cut when the count is wrong, which ``ok``
        then reports), a scalar bool tensor (None when eager: invalid ids
        have raised), and the graph's assert ops (empty when eager, and on
        JAX, which has no run-time asserts).

    Raises:
        TypeError: non-integer ids.
        ValueError: (eager, or static shapes) a wrong count, or a repeated id,
            naming the first offending position; (JAX) an id that does not fit
            in 32 bits.
    """
    host = host_example_ids(example_ids, owner)
    ids = ops.reshape(ops.convert_to_tensor(example_ids if host is None else host), (-1,))
    dtype = keras.backend.standardize_dtype(ids.dtype)
    if not dtype.startswith(("int", "uint")):
        raise TypeError(f"{owner}: `example_ids` must be integers; got dtype {dtype}.")
    count = ids.shape[0]
    static_n = static_int(num_labels)
    if count is not None and static_n is not None and count != static_n:
        raise ValueError(f"{owner}: `example_ids` has {count} entries but there are "
                         f"{static_n} labels; give exactly one id per label.")
    ids = backend.impl().signed_example_ids(ids)
    if eager:
        values = ops.convert_to_numpy(ids)
        if values.size != static_n:
            raise ValueError(f"{owner}: `example_ids` has {values.size} entries but there are "
                             f"{static_n} labels; give exactly one id per label.")
        repeat = find_repeat(values)
        if repeat is not None:
            raise ValueError(f"{owner}: {_UNIQUE_RULE}; position {repeat[0]} repeats the id at "
                             f"position {repeat[1]}.")
        return ids, None, []
    m = ops.shape(ids)[0]
    n = num_labels if static_n is None else static_n
    count_ok = ops.equal(m, n)
    ids = ops.concatenate([ids, ops.zeros((n,), ids.dtype)], axis=0)[:n]
    order = ops.cast(ops.argsort(ids), "int32")  # stable on both backends
    ordered = ops.take(ids, order)
    repeats = ops.equal(ordered[1:], ordered[:-1])
    # A later occurrence comes after its first one in a stable sort; the sentinel n
    # keeps the minimum defined for an empty batch.
    later = ops.where(repeats, order[1:], ops.cast(n, "int32"))
    first_repeat = ops.min(ops.concatenate([later, ops.reshape(ops.cast(n, "int32"), (1,))]))
    unique_ok = ops.logical_not(ops.any(repeats))
    asserts = [
        backend.impl().graph_assert(count_ok, [f"{owner}: {_COUNT_RULE}; ids, labels:", m, n]),
        backend.impl().graph_assert(
            ops.logical_or(unique_ok, ops.logical_not(count_ok)),
            [f"{owner}: {_UNIQUE_RULE}; first repeated position:", first_repeat]),
    ]
    return ids, ops.logical_and(count_ok, unique_ok), [a for a in asserts if a is not None]


def example_ids_assert_message(error: BaseException) -> str | None:
    """The short text of a failed graph check of `check_example_ids`, or None.

    In a traced step the check fails as a `tf.errors.InvalidArgumentError`
    carrying TensorFlow's whole stack trace; the rule and the first offending
    position (or the two counts) are all the user needs.

    Args:
        error: the exception raised by the traced step.

    Returns:
        ``"<owner>: <rule>; position P of a batch repeats an earlier id."``
        (or ``"...; a batch has M ids for N labels."``), or None when
        ``error`` is not such a check.
    """
    match = _ID_ASSERT.search(str(getattr(error, "message", error)))
    if match is None:
        return None
    owner, rule, first, second = match.groups()
    if rule == _UNIQUE_RULE:
        return f"{owner}: {rule}; position {first} of a batch repeats an earlier id."
    return f"{owner}: {rule}; a batch has {first} ids for {second} labels."


def traced_check_message(error: BaseException) -> str | None:
    """The short text of any failed graph check of a protection layer's inputs, or None.

    `example_ids_assert_message`, or for the finiteness check of an embedding
    ``"<owner>: the embedding has NaN or inf values."`` (TensorFlow's text of
    that check adds the op's name and a stack trace, never a value).

    Args:
        error: the exception raised by the traced step.

    Returns:
        The short text, or None when ``error`` is no such check.
    """
    short = example_ids_assert_message(error)
    if short is not None:
        return short
    match = _FINITE_ASSERT.search(str(getattr(error, "message", error)))
    return None if match is None else f"{match.group(1)}: {NOT_FINITE}."


class InputErrorFlagMixin:
    """A host-readable counter of invalid inputs met where asserts do not run (XLA).

    Subclasses set ``_input_error_reasons`` (one text per counter slot) and
    call ``self._init_input_errors()`` in ``__init__``.
    """

    _input_error_reasons = ()

    def _init_input_errors(self):
        # int64 where the backend has it (TensorFlow checkpoints keep this dtype and shape).
        self.input_errors = backend.impl().local_variable(
            self, np.zeros(len(self._input_error_reasons), np.int64), "input_errors")

    def _count_input_errors(self, bad, deps=()):
        """Add the bool flags ``bad`` (one per reason) to the counter (traced path),
        after ``deps`` (TensorFlow graph ops, e.g. the asserts: where one fails, the
        call raises and nothing is counted)."""
        with backend.impl().run_after(list(deps)):
            return backend.impl().assign_add(self.input_errors,
                                             ops.cast(ops.stack(bad), "int32"))

    def check_input_errors(self):
        """Raise if a compiled call met invalid inputs since the last check.

        Under XLA (``jit_compile=True``) the layer cannot raise: it replaces
        the affected output by a value that does not depend on the invalid
        inputs and counts the event. `VerticalModel` calls this after every
        step; with a plain Keras model or your own ``tf.function``, call it
        after each compiled step (or at least before using the results).

        Raises:
            ValueError: naming the layer and what was invalid (never the
                data); the counter is reset first.
        """
        counts = backend.impl().to_numpy(self.input_errors)
        if not counts.any():
            return
        backend.impl().assign(self.input_errors, np.zeros_like(counts))
        what = "; ".join(f"{reason} ({int(c)} call(s))"
                         for reason, c in zip(self._input_error_reasons, counts) if c)
        raise ValueError(f"{type(self).__name__} {self.name!r}: a compiled (XLA) call received "
                         f"invalid inputs: {what}. Those outputs were replaced by values that do "
                         "not depend on the invalid inputs. Run one call eagerly (or without "
                         "jit_compile) on the same data to get the first offending position.")
