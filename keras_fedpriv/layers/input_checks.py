"""Input checks of the protection layers that never put user data in an error.

Pieces shared by `LabelDPLayer` and `EmbeddingDPLayer`:

* `private_errors`: a decorator for ``call``. Keras appends every call
  argument to an exception raised inside a layer ("Arguments received by
  ..."), which would copy a whole label array or raw embedding into the error
  text and the logs. Errors leaving a decorated ``call`` are marked so that
  Keras leaves their message as it is (our messages name only the argument,
  the first offending position and at most that one value).
* `check_example_ids`: one id per label, unique within the call, integer
  dtype; eagerly a ValueError, in a graph a `tf.debugging.Assert`, and in
  both cases a boolean that the layer uses to make the output safe where the
  asserts are compiled away (XLA).
* `example_ids_assert_message`: the short text of a failed graph check of
  the ids (the rule and the first repeated position), which `VerticalModel`
  re-raises as a ValueError instead of TensorFlow's graph error.
* `InputErrorFlagMixin`: a small local (non-Keras, never-trained) counter
  variable per layer. Under XLA (``jit_compile=True``) `tf.debugging`
  asserts are removed, so a layer that receives invalid inputs there outputs
  a value that does not depend on them and counts the event in this variable;
  `check_input_errors()` (run by `VerticalModel` after every step, and to be
  called by the user after a jit-compiled step of a plain model) raises a
  ValueError on the host and resets the counter.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import tensorflow as tf

from keras_fedpriv.layers.secret_rng import _LocalVariable

_COUNT_RULE = "`example_ids` must hold exactly one id per label"
_UNIQUE_RULE = "`example_ids` must be unique within a call (one id per example)"
# What a failed graph assert of `check_example_ids` says inside tf.errors.InvalidArgumentError.
_ID_ASSERT = re.compile(r"assertion failed: \[(\w+): (" + re.escape(_COUNT_RULE) + "|"
                        + re.escape(_UNIQUE_RULE) + r"); [\w ,]+:\] \[(\d+)\](?: \[(\d+)\])?")


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
            # keras/src/utils/traceback_utils.py skips errors that carry this
            # attribute ("only inject info for the innermost failing call").
            error._keras_call_info_injected = True
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


def check_example_ids(example_ids, num_labels, eager, owner="LabelDPLayer"):
    """Validate ``example_ids`` against ``num_labels`` labels.

    Args:
        example_ids: integer ids, any shape; flattened to one id per label.
        num_labels: the number of labels, a scalar int32 tensor.
        eager: True to raise a ValueError now; False to build graph asserts.
        owner: the layer's name for the messages.

    Returns:
        ``(ids, ok, asserts)``: int64 ids of shape (num_labels,) (padded or
        cut when the count is wrong, which ``ok`` then reports), a scalar bool
        tensor (None when eager: invalid ids have raised), and the graph's
        assert ops (empty when eager).

    Raises:
        TypeError: non-integer ids.
        ValueError: (eager, or static shapes) a wrong count, or a repeated id,
            naming the first offending position.
    """
    ids = tf.reshape(tf.convert_to_tensor(example_ids), [-1])
    if not ids.dtype.is_integer:
        raise TypeError(f"{owner}: `example_ids` must be integers; got dtype {ids.dtype.name}.")
    count = ids.shape[0]
    static_n = tf.get_static_value(num_labels)
    if count is not None and static_n is not None and count != int(static_n):
        raise ValueError(f"{owner}: `example_ids` has {count} entries but there are "
                         f"{int(static_n)} labels; give exactly one id per label.")
    if ids.dtype == tf.uint64:
        ids = tf.bitcast(ids, tf.int64)  # a bijection: distinct ids stay distinct
    ids = tf.cast(ids, tf.int64)
    if eager:
        values = ids.numpy()
        if values.size != int(num_labels):
            raise ValueError(f"{owner}: `example_ids` has {values.size} entries but there are "
                             f"{int(num_labels)} labels; give exactly one id per label.")
        repeat = find_repeat(values)
        if repeat is not None:
            raise ValueError(f"{owner}: {_UNIQUE_RULE}; position {repeat[0]} repeats the id at "
                             f"position {repeat[1]}.")
        return ids, None, []
    m = tf.size(ids)
    n = tf.cast(num_labels, tf.int32)
    count_ok = tf.equal(m, n)
    ids = tf.concat([ids, tf.zeros([n], tf.int64)], axis=0)[:n]
    order = tf.argsort(ids, stable=True)
    ordered = tf.gather(ids, order)
    repeats = tf.equal(ordered[1:], ordered[:-1])
    # A later occurrence comes after its first one in a stable sort.
    first_repeat = tf.reduce_min(tf.where(repeats, order[1:], tf.fill(tf.shape(order[1:]), n)))
    unique_ok = tf.logical_not(tf.reduce_any(repeats))
    asserts = [
        tf.debugging.Assert(count_ok, [f"{owner}: {_COUNT_RULE}; ids, labels:", m, n]),
        tf.debugging.Assert(tf.logical_or(unique_ok, tf.logical_not(count_ok)),
                            [f"{owner}: {_UNIQUE_RULE}; first repeated position:", first_repeat]),
    ]
    return ids, tf.logical_and(count_ok, unique_ok), asserts


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


class InputErrorFlagMixin:
    """A host-readable counter of invalid inputs met where asserts do not run (XLA).

    Subclasses set ``_input_error_reasons`` (one text per counter slot) and
    call ``self._init_input_errors()`` in ``__init__``.
    """

    _input_error_reasons = ()

    def _init_input_errors(self):
        self.input_errors = _LocalVariable(np.zeros(len(self._input_error_reasons), np.int64),
                                           trainable=False, name="input_errors")

    def _count_input_errors(self, bad, deps=()):
        """Add the bool flags ``bad`` (one per reason) to the counter (graph path)."""
        with tf.control_dependencies(list(deps)):
            return self.input_errors.assign_add(tf.cast(tf.stack(bad), tf.int64))

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
        counts = self.input_errors.numpy()
        if not counts.any():
            return
        self.input_errors.assign(np.zeros_like(counts))
        what = "; ".join(f"{reason} ({int(c)} call(s))"
                         for reason, c in zip(self._input_error_reasons, counts) if c)
        raise ValueError(f"{type(self).__name__} {self.name!r}: a compiled (XLA) call received "
                         f"invalid inputs: {what}. Those outputs were replaced by values that do "
                         "not depend on the invalid inputs. Run one call eagerly (or without "
                         "jit_compile) on the same data to get the first offending position.")
