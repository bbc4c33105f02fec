"""Gradient inversion (Deep Leakage from Gradients) against a horizontal-FL client's upload.

In horizontal FL the server knows the global weights it sent and receives each
client's update. For one local SGD step on one batch the update is
``-lr_local * grad``, the gradient of the client's loss on its private batch at
the global weights. Deep Leakage from Gradients (DLG, Zhu, Liu and Han,
NeurIPS 2019) recovers the batch: it optimizes *dummy* inputs (and soft dummy
labels) so that the gradient the model has at the dummy batch matches the
received one. For a single example the label itself is given away by the sign
of the output layer's bias gradient (iDLG, Zhao, Mo and Ma, 2020), and
``distance="cosine"`` matches directions only (Geiping et al., NeurIPS 2020,
"Inverting gradients"), which needs no step size and survives clipping.

`gradient_inversion` runs the attack on any Keras classifier with a softmax
cross-entropy loss; the metric is the reconstruction MSE relative to
predicting the mean of the true inputs (`InversionResult.reconstruction_mse`:
1.0 = nothing learned). See ``docs/results/gradient_inversion.md`` for what it
recovers from FedAvg, Gaussian and SignDS uploads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, Sequence

import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.validation import (
    validate_positive_int,
    validate_real,
    validate_seed,
)

__all__ = ["InversionResult", "gradient_inversion", "infer_label_idlg"]

_DISTANCES = ("l2", "cosine")
_LABEL_MODES = ("auto", "idlg", "optimize")
_INITS = ("uniform", "normal", "zeros")


# --------------------------------------------------------------------------- result


def _as_batch(value, name, shape):
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"`{name}` must be a numeric array; could not convert a "
                         f"{type(value).__name__}: {exc}") from None
    if array.shape != tuple(shape):
        if array.size == int(np.prod(shape)) and array.ndim >= 1 and array.shape[0] == shape[0]:
            array = array.reshape(shape)
        else:
            raise ValueError(f"`{name}` must have shape {tuple(shape)} (the reconstructed "
                             f"batch); got {array.shape}.")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` must contain only finite numbers (no NaN or inf).")
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class InversionResult:
    """Outcome of `gradient_inversion`.

    Attributes:
        x_reconstructed: float32 array ``(num_examples,) + x_shape``, the dummy
            inputs at the smallest gradient distance seen (read only). Their
            order is arbitrary: a gradient averaged over a batch does not
            depend on the order of the examples.
        labels_reconstructed: int64 ``(num_examples,)`` array, the labels the
            attack used or recovered (iDLG's inferred label, the argmax of the
            optimized soft labels, or the known labels), in the order of
            ``x_reconstructed``.
        label_probabilities: float32 ``(num_examples, num_classes)``, the soft
            labels (softmax of the optimized label logits; one-hot for iDLG and
            known labels).
        gradient_distance: the distance (``distance``) between the dummy
            batch's update and the target at ``x_reconstructed``: for
            ``"l2"`` ``||u - t||^2 / ||t||^2``, for ``"cosine"`` ``1 - cos``;
            close to 0 means the attack found inputs that explain the update
            (a large value after the run flags a local minimum).
        history: float64 array, the distance every ``history_every`` steps
            (before that step's update) and after the last step, for every
            restart in turn.
        history_steps: int64 array, the step of each entry of ``history``
            (restart ``r`` counts from ``r * (iterations + 1)``).
        label_mode: ``"idlg"``, ``"optimize"`` or ``"known"``.
        distance: ``"l2"`` or ``"cosine"``.
        iterations: the number of optimizer steps per restart.
        restarts: the number of random restarts.
    """

    x_reconstructed: np.ndarray
    labels_reconstructed: np.ndarray
    label_probabilities: np.ndarray
    gradient_distance: float
    history: np.ndarray
    history_steps: np.ndarray
    label_mode: str
    distance: str
    iterations: int
    restarts: int = 1

    @property
    def num_examples(self) -> int:
        return int(self.x_reconstructed.shape[0])

    def assignment(self, x_true: ArrayLike) -> np.ndarray:
        """Index ``j`` of the reconstruction matched to true example ``i``, for every ``i``.

        The batch order is not identifiable from a gradient, so reconstructions
        are matched to the true examples by the assignment that minimizes the
        total squared error (Hungarian algorithm,
        `scipy.optimize.linear_sum_assignment`). For one example this is
        ``[0]``.

        Args:
            x_true: the true batch, shape ``(num_examples,) + x_shape`` (or
                anything with as many entries per row).

        Returns:
            int64 array ``perm`` with ``x_reconstructed[perm[i]]`` matched to
            ``x_true[i]``.
        """
        x_true = _as_batch(x_true, "x_true", self.x_reconstructed.shape)
        n = self.num_examples
        if n == 1:
            return np.zeros(1, np.int64)
        from scipy.optimize import linear_sum_assignment

        t = x_true.reshape(n, -1)
        r = self.x_reconstructed.reshape(n, -1).astype(np.float64)
        cost = ((t[:, None, :] - r[None, :, :]) ** 2).sum(axis=2)
        rows, cols = linear_sum_assignment(cost)
        perm = np.empty(n, np.int64)
        perm[rows] = cols
        return perm

    def reconstruction_mse(self, x_true: ArrayLike, baseline: ArrayLike | None = None) -> float:
        """Relative MSE of the reconstruction: 1.0 = no better than the mean, 0 = exact.

        ``sum((x_rec[perm] - x_true)**2) / sum((baseline - x_true)**2)`` with
        ``perm`` from `assignment` (the best matching of reconstructions to
        true examples).

        Args:
            x_true: the true batch, shape ``(num_examples,) + x_shape``.
            baseline: the trivial guess to compare with; None (default) = the
                mean of all entries of ``x_true`` (one grey level for every
                pixel; it knows the true mean brightness, so it is a slightly
                generous baseline). Any array broadcastable to ``x_true``
                works, e.g. the mean image of a public data set.

        Returns:
            A float; can exceed 1 (a reconstruction worse than the mean, for
            instance random noise).

        Raises:
            ValueError: wrong shape, NaN/inf, or a zero baseline error.
        """
        x_true = _as_batch(x_true, "x_true", self.x_reconstructed.shape)
        perm = self.assignment(x_true)
        rec = self.x_reconstructed[perm].astype(np.float64)
        if baseline is None:
            base = np.full_like(x_true, x_true.mean())
        else:
            try:
                base = np.broadcast_to(np.asarray(baseline, dtype=np.float64), x_true.shape)
            except ValueError:
                raise ValueError(f"`baseline` must broadcast to the shape of `x_true` "
                                 f"{x_true.shape}; got shape {np.shape(baseline)}.") from None
        denom = float(((base - x_true) ** 2).sum())
        if denom == 0:
            raise ValueError("`x_true` equals the baseline everywhere: the relative MSE is "
                             "undefined (the baseline error is 0).")
        return float(((rec - x_true) ** 2).sum() / denom)

    def label_accuracy(self, y_true: ArrayLike, x_true: ArrayLike | None = None) -> float:
        """Fraction of labels recovered.

        With ``x_true`` the reconstructions are matched to the true examples
        by `assignment` and labels are compared pair by pair; without it the
        labels are compared as multisets (the count of labels in common, / n),
        which is all a batch gradient can tell.
        """
        y = np.asarray(y_true)
        if y.ndim == 2 and y.shape[1] > 1:
            y = y.argmax(axis=1)
        y = y.reshape(-1).astype(np.int64)
        if y.shape[0] != self.num_examples:
            raise ValueError(f"`y_true` must hold {self.num_examples} labels; got {y.shape[0]}.")
        if x_true is not None:
            perm = self.assignment(x_true)
            return float(np.mean(self.labels_reconstructed[perm] == y))
        common = 0
        rec = list(self.labels_reconstructed)
        for label in y:
            if label in rec:
                rec.remove(label)
                common += 1
        return common / self.num_examples

    def __float__(self):
        return float(self.gradient_distance)


# --------------------------------------------------------------------------- validation


def _check_model(model):
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a keras.Model; got {type(model).__name__}.")
    if not model.built:
        raise ValueError("`model` must be built (call it once, or give it a keras.Input) so "
                         "that its weights are the global weights the server knows.")
    tv = list(model.trainable_variables)
    if not tv:
        raise ValueError("`model` has no trainable weights: there is no update to invert.")
    return tv


def _model_x_shape(model, x_shape):
    if x_shape is not None:
        shape = tuple(validate_positive_int(s, "x_shape") for s in
                      (x_shape if isinstance(x_shape, (tuple, list)) else (x_shape,)))
        if not shape:
            raise ValueError("`x_shape` must be a non-empty tuple of positive integers.")
        return shape
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs or len(inputs) != 1:
        raise ValueError("`x_shape` is needed: the model has no single symbolic input to read "
                         "the shape of one example from.")
    shape = tuple(inputs[0].shape[1:])
    if not shape or any(s is None for s in shape):
        raise ValueError(f"`x_shape` is needed: the model's input shape {tuple(inputs[0].shape)} "
                         f"is not fully defined.")
    return tuple(int(s) for s in shape)


def _flatten_target(target_update, tv):
    sizes = [int(np.prod(v.shape)) for v in tv]
    total = int(sum(sizes))
    kind = type(target_update).__name__
    if kind == "SignDSMessage":
        raise ValueError("`target_update` is a SignDSMessage: decode it into the dense vector "
                         "the server can form first, `keras_fedpriv.optimizers.decode(message)`.")
    if kind == "ClientUpload":
        raise ValueError("`target_update` is a ClientUpload: pass its `.message` (decoded with "
                         "`keras_fedpriv.optimizers.decode` for SignDS).")
    if isinstance(target_update, (list, tuple)):
        if len(target_update) != len(tv):
            raise ValueError(f"`target_update` is a list of {len(target_update)} arrays but the "
                             f"model has {len(tv)} trainable variables; give one array per "
                             f"variable (in model.trainable_variables order) or one flat vector "
                             f"of length {total}.")
        parts = []
        for i, (a, v) in enumerate(zip(target_update, tv)):
            try:
                a = np.asarray(a.numpy() if hasattr(a, "numpy") else a, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"`target_update[{i}]` must be a numeric array; could not "
                                 f"convert a {type(a).__name__}: {exc}") from None
            if a.size != int(np.prod(v.shape)):
                raise ValueError(f"`target_update[{i}]` has shape {a.shape} but trainable "
                                 f"variable {i} ({v.path if hasattr(v, 'path') else v.name}) has "
                                 f"shape {tuple(v.shape)}.")
            parts.append(a.reshape(-1))
        flat = np.concatenate(parts)
    else:
        value = target_update.numpy() if hasattr(target_update, "numpy") else target_update
        try:
            flat = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"`target_update` must be a flat numeric vector or a list of "
                             f"per-variable arrays; could not convert a "
                             f"{type(target_update).__name__}: {exc}") from None
        if flat.ndim != 1:
            raise ValueError(f"`target_update` must be a flat (1-D) vector of length {total} or "
                             f"a list of per-variable arrays; got shape {flat.shape}.")
        if flat.shape[0] != total:
            raise ValueError(f"`target_update` has {flat.shape[0]} entries but the model has "
                             f"{total} trainable parameters (in {len(tv)} variables); the "
                             f"update must be for this model's trainable weights, flattened in "
                             f"model.trainable_variables order.")
    if not np.all(np.isfinite(flat)):
        raise ValueError("`target_update` must contain only finite numbers (no NaN or inf).")
    return flat, sizes


def _infer_from_logits(model, from_logits):
    if from_logits is not None:
        if not isinstance(from_logits, (bool, np.bool_)):
            raise TypeError(f"`from_logits` must be None, True or False; got {from_logits!r}.")
        return bool(from_logits)
    loss = getattr(model, "loss", None)
    if loss is not None and hasattr(loss, "get_config"):
        cfg = loss.get_config()
        if "from_logits" in cfg:
            return bool(cfg["from_logits"])
    import keras

    last = model.layers[-1] if getattr(model, "layers", None) else None
    if isinstance(last, keras.layers.Softmax):
        return False
    # a Dense(..., activation="softmax") or an Activation("softmax") layer
    return getattr(getattr(last, "activation", None), "__name__", "") != "softmax"


def _last_layer_slices(tv, sizes, num_classes):
    """(kernel slice, bias slice or None) of the output layer in the flat update."""
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    bias = kernel = None
    if tuple(tv[-1].shape) == (num_classes,):
        bias = slice(int(offsets[-2]), int(offsets[-1]))
        if len(tv) >= 2 and len(tv[-2].shape) == 2 and tv[-2].shape[-1] == num_classes:
            kernel = (slice(int(offsets[-3]), int(offsets[-2])), tuple(tv[-2].shape))
    elif len(tv[-1].shape) == 2 and tv[-1].shape[-1] == num_classes:
        kernel = (slice(int(offsets[-2]), int(offsets[-1])), tuple(tv[-1].shape))
    return kernel, bias


def infer_label_idlg(model: Any, target_update: Any, *, lr_local: float | None = None,
                     seed: int | None = 0) -> int:
    """iDLG: the label of a single example from its gradient (Zhao et al., 2020).

    With a softmax cross-entropy loss, the gradient of one example's loss with
    respect to the logits is ``p - onehot(y)``: negative only at the true
    class. It reaches the output layer's bias unchanged, so the true label is
    the argmin of the bias gradient. Without a bias, the kernel's gradient is
    ``a (p - onehot(y))^T`` and, for non-negative activations ``a`` (ReLU,
    sigmoid), its column sums carry the same signs.

    Args:
        model: the built Keras classifier (output ``(batch, num_classes)``,
            its last trainable variables the output layer's kernel and bias).
        target_update: the client's flat update or gradient (or a list of
            per-variable arrays).
        lr_local: None if ``target_update`` is a gradient; a positive number if
            it is an update ``-lr_local * grad`` (only its sign matters here).
        seed: None or a non-negative int; breaks ties at random (an update
            whose output-layer entries are all equal, e.g. all zero in a
            sparse SignDS vector, says nothing about the label: the guess is
            then uniform over the tied classes, not always class 0).

    Returns:
        The inferred label (int).
    """
    tv = _check_model(model)
    flat, sizes = _flatten_target(target_update, tv)
    lr_local = validate_real(lr_local, "lr_local", low=0, low_open=True, allow_none=True)
    try:
        num_classes = int(model.outputs[0].shape[-1])
    except (AttributeError, ValueError, IndexError, TypeError):
        num_classes = int(tv[-1].shape[-1])
    return _idlg(flat, tv, sizes, num_classes, lr_local,
                 np.random.default_rng(validate_seed(seed)))


def _idlg(flat, tv, sizes, num_classes, lr_local, rng):
    grad = -flat if lr_local is not None else flat
    kernel, bias = _last_layer_slices(tv, sizes, num_classes)
    if bias is not None:
        score = grad[bias]
    elif kernel is not None:
        sl, shape = kernel
        score = grad[sl].reshape(shape).sum(axis=0)
    else:
        raise ValueError("iDLG needs the output layer's kernel or bias to be the model's last "
                         f"trainable variable (shape (..., {num_classes}) or ({num_classes},)); "
                         "pass `labels=` or `label_mode='optimize'` instead.")
    tied = np.flatnonzero(score == score.min())
    return int(tied[0] if tied.size == 1 else rng.choice(tied))


# --------------------------------------------------------------------------- attack


@contextlib.contextmanager
def _quiet_retracing():
    """Silence TensorFlow's "triggered tf.function retracing" warning for one attack.

    On TensorFlow every call builds its own small tf.function around the
    caller's model; the warning (after 5 such calls) would be noise. The
    logger's level is restored (on JAX nothing logs there).
    """
    import logging

    logger = logging.getLogger("tensorflow")
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        logger.setLevel(level)


_ADAM = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-8}  # the dummy batch's Adam (DLG's)


def _check_bounds(bounds):
    """``(low, high)`` as floats, or None."""
    if bounds is None:
        return None
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise ValueError(f"`bounds` must be None or a (low, high) pair; got {bounds!r}.")
    low, high = (float(b) for b in bounds)
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise ValueError(f"`bounds` must be finite with low < high; got {bounds!r}.")
    return low, high


def _model_classes(model, shape, num_classes):
    """The width of the classifier's output, checked against ``num_classes`` if given."""
    from keras import ops

    try:
        out_shape = tuple(model.outputs[0].shape)
    except (AttributeError, ValueError, IndexError, TypeError):
        out_shape = tuple(model(ops.zeros((1,) + shape), training=False).shape)
    if len(out_shape) != 2 or out_shape[-1] is None or out_shape[-1] < 2:
        raise ValueError(f"`model` must be a classifier with output (batch, num_classes >= 2); "
                         f"got output shape {out_shape}.")
    model_classes = int(out_shape[-1])
    if num_classes is not None:
        num_classes = validate_positive_int(num_classes, "num_classes", minimum=2)
        if num_classes != model_classes:
            raise ValueError(f"`num_classes`={num_classes} but the model outputs "
                             f"{model_classes} classes.")
    return model_classes


def _known_labels(labels, num_examples, num_classes):
    """The caller's labels as an int64 ``(num_examples,)`` array of class ids."""
    y = np.asarray(labels)
    if y.ndim == 2 and y.shape[1] == num_classes:
        y = y.argmax(axis=1)
    y = y.reshape(-1)
    if y.shape[0] != num_examples:
        raise ValueError(f"`labels` must hold num_examples={num_examples} labels; got "
                         f"{y.shape[0]}.")
    if y.dtype.kind not in "iu" and not np.all(np.mod(y, 1) == 0):
        raise ValueError(f"`labels` must be integer class ids; got {labels!r}.")
    y = y.astype(np.int64)
    if np.any(y < 0) or np.any(y >= num_classes):
        raise ValueError(f"`labels` must lie in [0, {num_classes}); got {y.tolist()}.")
    return y


def _attack_labels(labels, label_mode, num_examples, num_classes, idlg):
    """``(labels or None, mode)``: known labels, iDLG's (``idlg()``), or None to optimize."""
    if labels is not None:
        return _known_labels(labels, num_examples, num_classes), "known"
    if label_mode == "idlg" or (label_mode == "auto" and num_examples == 1):
        if num_examples != 1:
            raise ValueError(f"`label_mode`='idlg' infers the label of a single example; got "
                             f"num_examples={num_examples} (use 'optimize' or known `labels`).")
        return np.array([idlg()], np.int64), "idlg"
    return None, "optimize"


def _dummy_draws(init, full, num_classes, restarts, bounds, rng):
    """``draw() -> (x0, label logits0)``: the float32 starting point of one restart."""
    if isinstance(init, str):
        if init not in _INITS:
            raise ValueError(f"`init` must be one of {_INITS} or an array of shape {full}; "
                             f"got {init!r}.")
        init_array = None
    else:
        init_array = np.asarray(init, dtype=np.float64)
        if init_array.shape != full:
            raise ValueError(f"`init` array must have shape {full}; got {init_array.shape}.")
        if not np.all(np.isfinite(init_array)):
            raise ValueError("`init` must contain only finite numbers.")
        if restarts > 1:
            raise ValueError("`restarts` > 1 needs a random `init` ('uniform' or 'normal'), "
                             "not a fixed array.")

    def draw():
        if init_array is not None:
            x0 = init_array
        elif init == "uniform":
            x0 = rng.uniform(*(bounds or (0.0, 1.0)), size=full)
        elif init == "normal":
            x0 = rng.standard_normal(size=full)
        else:
            x0 = np.zeros(full)
        if bounds is not None:
            x0 = np.clip(x0, *bounds)
        label0 = rng.standard_normal(size=(full[0], num_classes))
        return x0.astype(np.float32), label0.astype(np.float32)

    return draw


def _step_decay(learning_rate, iterations):
    """``learning_rate``, divided by 10 from 50%, 75% and 90% of the iterations on."""
    import keras

    milestones = sorted({int(iterations * f) for f in (0.5, 0.75, 0.9)})
    # the schedule reads the optimizer's step count t before the step: t > m - 1 means t >= m
    return keras.optimizers.schedules.PiecewiseConstantDecay(
        [m - 1 for m in milestones], [learning_rate / 10.0**i for i in range(len(milestones) + 1)])


class _DummyBatchSearch:
    """DLG's search in one place: the dummy batch, Keras' Adam on it, the closest point seen.

    The dummy inputs (and, when optimized, the label logits) are Keras
    variables; one compiled step (`keras_fedpriv.backend` ``optimizer_step``)
    takes the gradient of `distance` with respect to them and applies
    ``keras.optimizers.Adam`` (the box ``bounds`` as the inputs' constraint).
    The dummy gradient is taken at the model's weights with
    ``model.stateless_call`` and differentiated again
    (``value_and_grad``: ``tf.GradientTape`` on TensorFlow,
    ``jax.value_and_grad`` on JAX); the model is never modified. ``best`` is
    ``(distance, x, label logits)`` of the closest state seen so far.
    """

    def __init__(self, model, tv, target, *, from_logits, distance, y_onehot, scale,
                 optimize_labels, bounds, learning_rate, iterations, full, num_classes):
        import keras
        from keras import ops

        from keras_fedpriv import backend

        impl = backend.impl()
        self._model, self._from_logits, self._kind = model, from_logits, distance
        self._y_onehot, self._scale, self._iterations = y_onehot, scale, iterations
        self._weights = [ops.convert_to_tensor(ops.convert_to_numpy(v)) for v in tv]  # global
        self._frozen = [ops.convert_to_tensor(ops.convert_to_numpy(v))
                        for v in model.non_trainable_variables]
        norm = float(np.linalg.norm(target))
        self._target_unit = (target / norm).astype(np.float32)
        self._target_norm = np.float32(norm)
        # what model(x, training=False) passes on: stateless_call hands its arguments to call()
        self._inference = ({"training": False}
                           if "training" in inspect.signature(model.call).parameters else {})
        self.x = keras.Variable(np.zeros(full, np.float32), name="dummy_x")
        if bounds is not None:  # the optimizer clips after every step
            self.x.constraint = lambda v: ops.clip(v, *bounds)
        self.label_logits = keras.Variable(np.zeros((full[0], num_classes), np.float32),
                                           name="dummy_label_logits")
        self._optimized = [self.x, self.label_logits] if optimize_labels else [self.x]
        self.optimizer = keras.optimizers.Adam(_step_decay(learning_rate, iterations), **_ADAM)
        self._step = impl.optimizer_step(self.optimizer, self._optimized, self._grads_and_best)
        self._fresh = [ops.convert_to_numpy(v) for v in self.optimizer.variables]
        self._value_and_grad = impl.value_and_grad
        self._final = impl.compiled(self._final_best)
        self.best = (ops.convert_to_tensor(np.float32(np.inf)), ops.zeros(full),
                     ops.zeros((full[0], num_classes)))

    def distance(self, x, label_logits=None):
        """The distance of the dummy batch's update to the target (``"l2"`` or ``"cosine"``)."""
        from keras import ops

        def loss(*trainable):
            out, _ = self._model.stateless_call(list(trainable), self._frozen, x,
                                                **self._inference)
            out = ops.cast(out, "float32")
            if self._from_logits:
                logp = ops.log_softmax(out, axis=-1)
            else:
                logp = ops.log(ops.clip(out, 1e-7, 1.0))
            soft = (self._y_onehot if self._y_onehot is not None
                    else ops.softmax(label_logits, axis=-1))
            return -ops.mean(ops.sum(soft * logp, axis=-1))

        _, grads = self._value_and_grad(loss)(*self._weights)
        g = self._scale * ops.concatenate([ops.reshape(ops.cast(gr, "float32"), [-1])
                                           for gr in grads], 0)
        if self._kind == "l2":
            return ops.sum(ops.square(g / self._target_norm - self._target_unit))
        return 1.0 - ops.sum(g * self._target_unit) / (ops.norm(g) + 1e-30)

    @staticmethod
    def _keep_if_best(d, x, label_logits, best):
        from keras import ops

        better = ops.less(d, best[0])
        return (ops.where(better, d, best[0]), ops.where(better, x, best[1]),
                ops.where(better, label_logits, best[2]))

    def _grads_and_best(self, values, best):
        """Pure: the gradients at ``values`` (NaN/inf set to 0), and ``(distance, best)``."""
        from keras import ops

        d, grads = self._value_and_grad(self.distance)(*values)
        grads = [ops.where(ops.isfinite(g), g, ops.zeros_like(g)) for g in grads]
        label_logits = values[1] if len(values) > 1 else best[2]
        return grads, (d, self._keep_if_best(d, values[0], label_logits, best))

    def _final_best(self, x, label_logits, best):
        d = self.distance(x, label_logits)
        return d, self._keep_if_best(d, x, label_logits, best)

    def restart(self, x0, label0):
        """Start again from ``(x0, label0)`` with a fresh Adam (its step count back at 0)."""
        self.x.assign(x0)
        self.label_logits.assign(label0)
        for variable, value in zip(self.optimizer.variables, self._fresh):
            variable.assign(value)

    def run(self, x0, label0, restart, history_every, history):
        """One restart's ``iterations`` steps; appends ``(step, distance)`` to ``history``."""
        self.restart(x0, label0)
        offset = restart * (self._iterations + 1)
        for t in range(self._iterations):
            d, self.best = self._step(self.best)
            if t % history_every == 0:
                history.append((offset + t, float(d)))
        d, self.best = self._final(self.x.value, self.label_logits.value, self.best)
        history.append((offset + self._iterations, float(d)))


def _read_only(array):
    array.setflags(write=False)
    return array


def gradient_inversion(model: Any, target_update: Any, num_examples: int = 1, *,
                       labels: ArrayLike | None = None, label_mode: str = "auto",
                       num_classes: int | None = None, from_logits: bool | None = None,
                       lr_local: float | None = None, distance: str = "l2",
                       learning_rate: float = 0.1, iterations: int = 300, init: str = "uniform",
                       x_shape: Sequence[int] | None = None,
                       bounds: tuple[float, float] | None = None, restarts: int = 1,
                       seed: int | None = 0, history_every: int = 10) -> InversionResult:
    """Reconstruct a client's training batch from its update (DLG / iDLG / cosine matching).

    The server knows the model's current weights (the global weights it sent)
    and receives ``target_update``. It creates ``num_examples`` dummy inputs
    (and, unless the labels are known or inferred, soft dummy labels), and
    minimizes with Keras' Adam (`keras.optimizers.Adam`, on the dummy batch
    held in Keras variables), by differentiating through the gradient
    (twice: ``tf.GradientTape`` on TensorFlow, ``jax.value_and_grad`` on
    JAX), the distance between

    * the dummy batch's gradient ``g`` of the mean softmax cross-entropy at
      the model's weights (``lr_local=None``: ``target_update`` is a
      gradient), or its one-step SGD update ``-lr_local * g`` (``target_update``
      is what a client sends after one local SGD step on one batch, the DLG
      setting), and
    * ``target_update``, both flattened in ``model.trainable_variables`` order:
      ``"l2"``, DLG's sum of squared differences divided by the constant
      ``||target_update||^2`` (the same minimizer; the division keeps Adam
      away from its epsilon when updates are tiny, and makes the value
      readable: 0 = exact match, 1 = no closer than a zero update), or
      ``"cosine"``, ``1 - cos`` (Geiping et al. 2020; scale-free: the step
      size, clipping and any positive rescaling do not matter, only the
      direction).

    The learning rate is divided by 10 at 50%, 75% and 90% of the iterations
    (a `keras.optimizers.schedules.PiecewiseConstantDecay`).
    With ``restarts > 1`` the whole optimization is repeated from fresh random
    dummies; the dummy batch with the smallest distance seen over all steps
    and restarts is returned (the attacker can compute the distance, not the
    error, so this is a fair choice).

    Labels: ``labels=`` (known labels) wins; otherwise ``label_mode="auto"``
    uses iDLG (the label is the argmin of the output bias's gradient, see
    `infer_label_idlg`) when ``num_examples == 1``, and optimizes soft labels
    (a softmax over free logits, as in DLG) for larger batches;
    ``"idlg"`` (one example only) and ``"optimize"`` force either.

    Limits: the model is called with ``training=False`` (no dropout noise);
    the loss is softmax cross-entropy (on logits or on softmax outputs, see
    ``from_logits``) averaged over the batch, as Keras'
    ``SparseCategoricalCrossentropy`` does; BatchNormalization statistics
    are not modelled. Several local steps or an adaptive local optimizer make
    the update a different function of the data; the attack then matches it
    only approximately (use ``"cosine"``).

    Args:
        model: a built Keras classifier with output ``(batch, num_classes)``;
            its current weights are the global weights. Not modified.
        target_update: the client's flat update (a numpy vector of length =
            number of trainable parameters, e.g. ``HorizontalFL.train_client``'s
            output, a `FedAvgUpload`/`GaussianUpload` message, or
            ``keras_fedpriv.optimizers.decode(signds_message)``), or a list of
            per-variable arrays.
        num_examples: the batch size B to reconstruct (integer >= 1).
        labels: optional known labels, ``(B,)`` ints in ``[0, num_classes)``.
        label_mode: ``"auto"``, ``"idlg"`` or ``"optimize"`` (ignored when
            ``labels`` is given).
        num_classes: optional; checked against the model's output width.
        from_logits: whether the model outputs logits; None infers it from the
            compiled loss's ``from_logits`` or, if not compiled, from a
            softmax activation on the last layer (softmax = probabilities).
        lr_local: None (the target is a gradient) or the client's local SGD
            learning rate (> 0; the target is ``-lr_local * grad``).
        distance: ``"l2"`` or ``"cosine"``.
        learning_rate: Adam's initial learning rate on the dummy variables.
        iterations: number of Adam steps per restart (integer >= 1).
        init: ``"uniform"`` (in ``bounds``, or [0, 1)), ``"normal"``,
            ``"zeros"``, or an array of shape ``(B,) + x_shape``.
        x_shape: the shape of one input; None reads it from ``model.inputs``.
        bounds: optional ``(low, high)`` box the dummy inputs are clipped to
            after every step (e.g. ``(0, 1)`` for images scaled to [0, 1]).
        restarts: number of random restarts (integer >= 1).
        seed: None or a non-negative int for the dummy initialization and
            iDLG's tie-breaking (reproducible on one machine with one Keras
            backend and build). No global RNG is read or changed.
        history_every: record the distance every this many steps.

    Returns:
        An `InversionResult`; ``result.reconstruction_mse(x_true)`` is the
        metric (1.0 = nothing learned).

    Raises:
        ValueError: a ``target_update`` that does not match the model's
            trainable weights, NaN/inf, ``num_examples < 1``, an unknown
            ``distance``/``label_mode``/``init``, iDLG with more than one
            example, labels out of range, an all-zero target, ...
        TypeError: a non-Keras model, non-integer counts.

    Example:
        >>> delta, _ = fl.train_client(0, [v.numpy() for v in model.trainable_variables])
        >>> res = gradient_inversion(model, delta, lr_local=0.1, bounds=(0, 1))
        >>> res.reconstruction_mse(x_client), res.labels_reconstructed
    """
    from keras import ops

    tv = _check_model(model)
    num_examples = validate_positive_int(num_examples, "num_examples")
    iterations = validate_positive_int(iterations, "iterations")
    history_every = validate_positive_int(history_every, "history_every")
    restarts = validate_positive_int(restarts, "restarts")
    seed = validate_seed(seed)
    if not isinstance(distance, str) or distance not in _DISTANCES:
        raise ValueError(f"`distance` must be one of {_DISTANCES}; got {distance!r}.")
    if not isinstance(label_mode, str) or label_mode not in _LABEL_MODES:
        raise ValueError(f"`label_mode` must be one of {_LABEL_MODES} (or pass known "
                         f"`labels=`); got {label_mode!r}.")
    learning_rate = validate_real(learning_rate, "learning_rate", low=0, low_open=True)
    lr_local = validate_real(lr_local, "lr_local", low=0, low_open=True, allow_none=True)
    flat, sizes = _flatten_target(target_update, tv)
    if not np.any(flat):
        raise ValueError("`target_update` is all zeros: there is nothing to match (the "
                         "cosine distance is undefined and the relative L2 distance divides "
                         "by its norm).")
    shape = _model_x_shape(model, x_shape)
    from_logits = _infer_from_logits(model, from_logits)
    bounds = _check_bounds(bounds)
    num_classes = _model_classes(model, shape, num_classes)

    rng = np.random.default_rng(seed)
    y, mode = _attack_labels(labels, label_mode, num_examples, num_classes,
                             lambda: _idlg(flat, tv, sizes, num_classes, lr_local, rng))
    full = (num_examples,) + shape
    draw = _dummy_draws(init, full, num_classes, restarts, bounds, rng)

    history = []
    with _quiet_retracing():
        search = _DummyBatchSearch(
            model, tv, flat, from_logits=from_logits, distance=distance,
            y_onehot=np.eye(num_classes, dtype=np.float32)[y] if y is not None else None,
            scale=np.float32(-lr_local) if lr_local is not None else np.float32(1.0),
            optimize_labels=mode == "optimize", bounds=bounds, learning_rate=learning_rate,
            iterations=iterations, full=full, num_classes=num_classes)
        for restart in range(restarts):
            search.run(*draw(), restart, history_every, history)

    best_d, best_x, best_l = (ops.convert_to_numpy(b) for b in search.best)
    if mode == "optimize":
        probs = ops.convert_to_numpy(ops.softmax(best_l, axis=-1)).astype(np.float32)
        y = probs.argmax(axis=1)
    else:
        probs = np.eye(num_classes, dtype=np.float32)[y]
    steps, distances = zip(*history)
    return InversionResult(
        x_reconstructed=_read_only(best_x.astype(np.float32)),
        labels_reconstructed=_read_only(y.astype(np.int64)),
        label_probabilities=_read_only(probs), gradient_distance=float(best_d),
        history=_read_only(np.asarray(distances, np.float64)),
        history_steps=_read_only(np.asarray(steps, np.int64)),
        label_mode=mode, distance=distance, iterations=iterations, restarts=restarts)
