"""Label formats for LabelDPLayer: detection, row-by-row validation, conversion.

Formats:

* ``binary``: shape (N,) or (N, 1), every value exactly 0 or 1;
* ``onehot``: shape (N, K), K >= 2, every row exactly one 1 and zeros elsewhere;
* ``sparse``: shape (N,) or (N, 1), integer class ids in [0, num_classes).

``auto`` picks ``onehot`` for (N, K) with K >= 2, ``sparse`` for (N,) /
(N, 1) when ``num_classes > 2`` is given, else ``binary``. Every row is
validated (unlike the reference, which only checks the total count of ones).
Eager inputs get a ValueError naming the first bad row; in a traced TensorFlow
graph the same check runs as a `tf.debugging.Assert` (raising
InvalidArgumentError with the same message); under XLA (`jit_compile=True`)
asserts are compiled away, and traced JAX code has none, so `LabelDPLayer`
then outputs pure noise for the batch and counts the event for the host (see
`LabelDPLayer.check_input_errors`).
"""

from __future__ import annotations

import collections.abc

import keras
import numpy as np
from keras import ops

from keras_fedpriv import backend
from keras_fedpriv.layers.input_checks import static_int

MODES = ("auto", "binary", "onehot", "sparse")


def resolve_mode(mode, shape, num_classes):
    """Return (mode, K) for labels of static ``shape``."""
    rank = len(shape)
    if rank not in (1, 2):
        raise ValueError(
            f"LabelDPLayer: labels must have shape (N,), (N, 1) or (N, K); got rank {rank} "
            f"shape {tuple(shape)}.")
    last = shape[-1] if rank == 2 else 1
    column = rank == 1 or last == 1
    if mode == "auto":
        if not column:
            mode = "onehot"
        elif num_classes is not None and num_classes > 2:
            mode = "sparse"
        else:
            mode = "binary"
    if mode == "onehot":
        if rank != 2 or last is None or last < 2:
            raise ValueError(
                f"LabelDPLayer(mode='onehot'): labels must have shape (N, K) with a static K >= 2; "
                f"got shape {tuple(shape)}.")
        if num_classes is not None and num_classes != last:
            raise ValueError(f"LabelDPLayer: num_classes={num_classes} but one-hot labels have "
                             f"{last} columns.")
        return mode, int(last)
    if not column:
        raise ValueError(
            f"LabelDPLayer(mode={mode!r}): labels must have shape (N,) or (N, 1); got shape "
            f"{tuple(shape)}. Use mode='onehot' for (N, K) one-hot rows.")
    if mode == "binary":
        return mode, 2
    if num_classes is None:
        raise ValueError("LabelDPLayer(mode='sparse') needs num_classes (an integer >= 2).")
    return mode, int(num_classes)


def _describe_row(values, row):
    return np.array2string(np.asarray(values)[row], separator=", ", threshold=12)


def validate_eager(labels, mode, num_classes):
    """Raise ValueError naming the first invalid row of eager ``labels``."""
    v = np.asarray(labels)
    if mode == "onehot":
        bad_value = ~((v == 0) | (v == 1))
        ones = np.sum(v == 1, axis=-1)
        bad_rows = np.flatnonzero(bad_value.any(axis=-1) | (ones != 1))
        if bad_rows.size:
            row = int(bad_rows[0])
            if bad_value[row].any():
                what = "values other than 0 and 1"
            elif ones[row] == 0:
                what = "no 1 (a row of zeros)"
            else:
                what = f"{int(ones[row])} ones"
            raise ValueError(
                f"LabelDPLayer(mode='onehot'): every row must hold exactly one 1 and zeros "
                f"elsewhere; row {row} has {what}: {_describe_row(v, row)} "
                f"({bad_rows.size} invalid row(s) in total).")
        return
    flat = v.reshape(-1)
    if mode == "binary":
        bad = np.flatnonzero(~((flat == 0) | (flat == 1)))
        if bad.size:
            raise ValueError(
                f"LabelDPLayer(mode='binary'): labels must be exactly 0 or 1; row {int(bad[0])} "
                f"has value {flat[bad[0]].item()!r} ({bad.size} invalid value(s) in total). For integer "
                f"class ids use mode='sparse' with num_classes.")
        return
    with np.errstate(invalid="ignore"):
        ok = (flat == np.round(flat)) & (flat >= 0) & (flat < num_classes)
    bad = np.flatnonzero(~ok)
    if bad.size:
        raise ValueError(
            f"LabelDPLayer(mode='sparse'): labels must be integer class ids in [0, {num_classes}); "
            f"row {int(bad[0])} has value {flat[bad[0]].item()!r} ({bad.size} invalid value(s) in total).")


def _dtype(x):
    return keras.backend.standardize_dtype(x.dtype)


def rows_ok(labels, mode, num_classes):
    """Traced check of every row: ``(bool (N,) tensor, rule text)``."""
    v = ops.convert_to_tensor(labels)
    if _dtype(v) == "bool":
        v = ops.cast(v, "int32")
    if mode == "onehot":
        valid_values = ops.all(ops.logical_or(ops.equal(v, 0), ops.equal(v, 1)), axis=-1)
        one = ops.equal(ops.sum(ops.cast(ops.equal(v, 1), "int32"), axis=-1), 1)
        return (ops.logical_and(valid_values, one),
                "LabelDPLayer(mode='onehot'): every row must hold exactly one 1; first bad row:")
    flat = ops.reshape(v, (-1,))
    if mode == "binary":
        return (ops.logical_or(ops.equal(flat, 0), ops.equal(flat, 1)),
                "LabelDPLayer(mode='binary'): labels must be exactly 0 or 1 (for integer class "
                "ids use mode='sparse' with num_classes); first bad row:")
    # In the labels' own dtype: an integer is whole, a float must be (NaN fails every test).
    whole = ops.equal(flat, ops.round(flat)) if "float" in _dtype(flat) else ops.ones_like(flat, "bool")
    in_range = ops.logical_and(ops.greater_equal(flat, 0), ops.less(flat, num_classes))
    return (ops.logical_and(whole, in_range),
            f"LabelDPLayer(mode='sparse'): labels must be integer class ids in "
            f"[0, {num_classes}); first bad row:")


def first_false(flags):
    """The position of the first False in a bool (N,) tensor (N when all are True, and for
    an empty batch: a replica that got no rows of the last global batch)."""
    return ops.argmin(ops.concatenate([ops.cast(flags, "int32"), ops.zeros((1,), "int32")]))


def graph_assert(labels, mode, num_classes, row_ok=None):
    """The backend's graph assert with the same rule (TensorFlow: a
    `tf.debugging.Assert` op; JAX: None, as traced JAX code cannot assert).

    Under XLA the assert is compiled away; `LabelDPLayer` then also uses
    `rows_ok` to make the output independent of invalid labels.
    """
    checked, rule = rows_ok(labels, mode, num_classes)
    if row_ok is None:
        row_ok = checked
    return backend.impl().graph_assert(ops.all(row_ok), [rule, first_false(row_ok)], summarize=8)


def to_class_ids(labels, mode):
    """int32 class ids of shape (N,)."""
    v = ops.convert_to_tensor(labels)
    if mode == "onehot":
        return ops.cast(ops.argmax(v, axis=-1), "int32")
    return ops.cast(ops.reshape(v, (-1,)), "int32")


def from_class_ids(ids, like, mode, num_classes):
    """Class ids back to the format, shape and dtype of ``like``."""
    like = ops.convert_to_tensor(like)
    if mode == "onehot":
        return ops.one_hot(ids, num_classes, dtype=like.dtype)
    return ops.reshape(ops.cast(ids, like.dtype), (-1,) + tuple(like.shape[1:]))


#: How far a row of ``prior`` may sum from 1 (a float16 / bfloat16 softmax sums within ~0.005).
PRIOR_SUM_TOLERANCE = 0.01

_PRIOR_RULE = (f"class probabilities: finite values in [0, 1], each row summing to 1 (within "
               f"{PRIOR_SUM_TOLERANCE})")


def _not_dense(what):
    return TypeError(f"LabelDPLayer: `prior` must be a dense numeric array (a NumPy array, a "
                     f"tf.Tensor or nested lists of numbers) of {_PRIOR_RULE}; got {what}.")


def refuse_non_dense_prior(prior):
    """Raise TypeError (naming `prior`, never its values) for a prior that is not dense.

    Called before Keras looks at the call's tensors (it would build the layer from a
    ragged prior's shape and blame the labels) and again when the prior is converted.
    """
    kind = backend.impl().non_dense_kind(prior)
    if kind is not None:
        raise _not_dense(kind)
    if isinstance(prior, (collections.abc.Mapping, str, bytes)):
        raise _not_dense(f"a {type(prior).__name__}")


def prior_matrix(prior, mode, num_classes):
    """The prior as float32 (N, K); binary priors may be P(label = 1) of shape (N,) / (N, 1)."""
    refuse_non_dense_prior(prior)
    if not (ops.is_tensor(prior) or isinstance(prior, np.ndarray)):
        try:
            array = np.asarray(prior)
        except (TypeError, ValueError):  # NumPy's message would show the prior's values
            array = None
        if array is None or array.dtype.kind not in "biuf":
            raise _not_dense(f"a {type(prior).__name__} that is not a rectangular array of "
                             f"numbers")
        prior = array
    elif isinstance(prior, np.ndarray) and prior.dtype.kind not in "biuf":
        raise TypeError(f"LabelDPLayer: `prior` must be a numeric array of {_PRIOR_RULE}; got "
                        f"dtype {prior.dtype}.")
    p = ops.convert_to_tensor(prior)
    dtype = _dtype(p)
    if not (dtype == "bool" or dtype.startswith(("float", "bfloat", "int", "uint"))):
        raise TypeError(f"LabelDPLayer: `prior` must be a numeric array of {_PRIOR_RULE}; got "
                        f"dtype {dtype}.")
    p = ops.cast(p, "float32")
    if mode == "binary" and (len(p.shape) == 1 or p.shape[-1] == 1):
        p1 = ops.reshape(p, (-1,))
        p = ops.stack([1.0 - p1, p1], axis=-1)
    if len(p.shape) != 2 or p.shape[-1] != num_classes:
        raise ValueError(
            f"LabelDPLayer: `prior` must have shape (N, {num_classes}) (one probability per "
            f"class{', or (N,) with P(label=1) for binary labels' if mode == 'binary' else ''}); "
            f"got shape {tuple(p.shape)}.")
    return p


def _wrong_rows(num_classes, rows, num_labels):
    return (f"LabelDPLayer: `prior` must have shape (N, {num_classes}) with one row per label; "
            f"got {rows} rows for {num_labels} labels.")


def prior_rows_ok(p):
    """Graph check of every row of a float32 (N, K) prior: a bool (N,) tensor.

    Values in [0, 1] are finite (NaN and inf fail both comparisons), so no
    separate finiteness test: the short form keeps XLA's fusion of the
    layer's randomized response (an extra ``is_finite``/``where`` pass cost
    ~30% per call at 4096 x 10 under ``jit_compile``).
    """
    in_range = ops.all(ops.logical_and(ops.greater_equal(p, 0.0), ops.less_equal(p, 1.0)), axis=-1)
    return ops.logical_and(in_range,
                           ops.abs(ops.sum(p, axis=-1) - 1.0) <= PRIOR_SUM_TOLERANCE)


def check_prior(prior, mode, num_classes, num_labels, eager):
    """Validate ``prior`` for ``num_labels`` labels of ``mode`` over ``num_classes`` classes.

    The prior is derived from secret data, so no message holds one of its
    values: only the argument, the rule and the first offending row.

    Args:
        prior: the ``prior`` call argument (see `prior_matrix` for shapes).
        mode: the resolved label mode.
        num_classes: K.
        num_labels: the number of labels, an int or a scalar int32 tensor.
        eager: True to raise a ValueError now; False to build graph asserts
            (TensorFlow) and a flag (every backend).

    Returns:
        ``(p, ok, asserts)``: the float32 (num_labels, K) prior (rows padded
        with a uniform prior or cut when the count is wrong, which ``ok`` then
        reports), a scalar bool tensor (None when eager: an invalid prior has
        raised) and the graph's assert ops (empty when eager).

    Raises:
        TypeError: a prior that is not a dense numeric array (sparse, ragged,
            a mapping, mixed types).
        ValueError: a wrong shape or number of rows (eager, or static shapes),
            or (eager) a row that is not a probability vector.
    """
    p = prior_matrix(prior, mode, num_classes)
    rows, static_n = p.shape[0], static_int(num_labels)
    if rows is not None and static_n is not None and rows != int(static_n):
        raise ValueError(_wrong_rows(num_classes, rows, int(static_n)))
    if eager:
        v = ops.convert_to_numpy(p)
        if v.shape[0] != int(static_n):
            raise ValueError(_wrong_rows(num_classes, v.shape[0], int(static_n)))
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(v).all(axis=-1)
            in_range = ((v >= 0) & (v <= 1)).all(axis=-1)
            sums_ok = np.abs(np.where(np.isfinite(v), v, 0).sum(axis=-1) - 1) <= PRIOR_SUM_TOLERANCE
        bad = np.flatnonzero(~(finite & in_range & sums_ok))
        if bad.size:
            row = int(bad[0])
            what = ("a NaN or infinite value" if not finite[row] else
                    "a value outside [0, 1]" if not in_range[row] else "a sum other than 1")
            raise ValueError(f"LabelDPLayer: `prior` must hold {_PRIOR_RULE}; row {row} has "
                             f"{what} ({bad.size} invalid row(s) in total).")
        return p, None, []
    asserts = []
    if rows is not None and static_n is not None:  # the same count (checked above)
        count_ok = ops.convert_to_tensor(True)
    else:  # a count known only when the graph runs: pad or cut to it, and check it
        n = ops.cast(num_labels, "int32")
        rows = ops.shape(p)[0]
        count_ok = ops.equal(rows, n)
        uniform = ops.full((n, num_classes), 1.0 / num_classes, "float32")
        p = ops.concatenate([p, uniform], axis=0)[:n]
        asserts.append(backend.impl().graph_assert(
            count_ok, [f"LabelDPLayer: `prior` must have shape (N, {num_classes}) with one row "
                       "per label; rows, labels:", rows, n]))
    row_ok = prior_rows_ok(p)
    asserts.append(backend.impl().graph_assert(
        ops.logical_or(ops.all(row_ok), ops.logical_not(count_ok)),
        [f"LabelDPLayer: `prior` must hold {_PRIOR_RULE}; first bad row:", first_false(row_ok)]))
    return p, ops.logical_and(count_ok, ops.all(row_ok)), [a for a in asserts if a is not None]
