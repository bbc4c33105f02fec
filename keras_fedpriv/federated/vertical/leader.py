"""`VerticalLeader`: the leader's half of vertical FL."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import keras
import numpy as np
from keras import tree

from keras_fedpriv import backend
from keras_fedpriv.backend import private
from keras_fedpriv.federated.messages import EXAMPLE_IDS_KEY
from keras_fedpriv.federated.vertical.party import (
    PartyBottom,
    SentCounter,
    as_example_ids,
    as_numpy_features,
    backend_variables,
    batch_signature,
    label_assert_message,
    leader_loss,
    leader_unprotected_ledger,
    make_optimizer,
    num_rows,
    rows_of,
    validate_class_weight,
    validate_party_name,
)
from keras_fedpriv.federated.vertical.wire import (
    EmbeddingSpec,
    MalformedMessage,
    decode_embedding,
)
from keras_fedpriv.layers import label_formats
from keras_fedpriv.layers.input_checks import InputErrorFlagMixin
from keras_fedpriv.layers.label_dp import LabelDPLayer
from keras_fedpriv.mechanisms.ledger import ReleaseLedger

__all__ = ["VerticalLeader", "validate_label_protection"]


def validate_label_protection(label_dp: Any, labels_privatized: Any, owner: str) -> None:
    """Check how the leader's labels are protected: ``label_dp`` (None or a `LabelDPLayer`) or
    ``labels_privatized`` (a bool: randomized before training), not both.

    Args:
        label_dp: the ``label_dp`` argument.
        labels_privatized: the ``labels_privatized`` argument.
        owner: who checks, for the error text (``"VerticalModel"``, ``"VerticalLeader"``).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: both given.
    """
    if not isinstance(labels_privatized, bool):
        raise TypeError(f"{owner}: `labels_privatized` must be a bool; got "
                        f"{labels_privatized!r}.")
    if labels_privatized and label_dp is not None:
        raise ValueError(f"{owner}: `labels_privatized=True` says the labels given to "
                         "fit were randomized before training; with `label_dp` the model "
                         "randomizes them itself. Pass one or the other.")
    if label_dp is not None and not isinstance(label_dp, LabelDPLayer):
        raise TypeError(f"{owner}: `label_dp` must be None or a "
                        f"keras_fedpriv.LabelDPLayer; got {type(label_dp).__name__}.")


class VerticalLeader:
    """The leader: labels (with label DP), its own bottom if any, the top, the loss.

    ``step`` is one training step of the protocol from the leader's side: it
    randomizes the batch's labels (``label_dp``, once per example id), runs
    the top on the embeddings received (and its own), computes the loss, the
    cut gradient of every follower and the gradients of its own variables,
    and applies the latter with its optimizer.

    Args:
        top: the top Keras model (or layer) over the embeddings; the same input
            rule as `VerticalModel` (a dict keyed by party name if the top has
            several or dict inputs, else the concatenation in sorted party
            order).
        followers: follower name -> its `EmbeddingSpec` (what it sends; a
            follower's ``spec``).
        bottom: the leader's own bottom model, or None.
        name: the leader's party name (required with ``bottom``).
        label_dp: None or a `LabelDPLayer`, applied to the labels of every
            training step (keyed by example id unless ``per_batch``).
        labels_privatized: True if the labels given to ``step`` were already
            randomized; else, without ``label_dp``, every step is recorded as
            a release of the true labels without DP.
        loss: the loss (anything `keras.Model.compile` accepts for one output).
        optimizer: the leader's optimizer (for the top and its own bottom).
        metrics: metrics (`keras.metrics.Metric` objects or their names)
            that `evaluate` reports besides the loss. A name is taken
            literally (``"accuracy"`` is exact-match `keras.metrics.Accuracy`;
            use ``"binary_accuracy"`` for a sigmoid top).
        class_weight: None or a dict class -> weight, applied to the
            randomized labels (see `VerticalModel.fit`).
        label_free_sample_weight: True to allow ``sample_weight`` with
            ``label_dp`` (you confirm the weights do not depend on the labels).

    Example:
        >>> leader = model.split_parties().leader
        >>> received = {"party_a": leader.receive("party_a", message, rows=32)}
        >>> cut, logs = leader.step(received, y[:32], example_ids=ids[:32], x=xb[:32])
    """

    def __init__(self, top: keras.layers.Layer, followers: Mapping[str, EmbeddingSpec], *,
                 bottom: keras.layers.Layer | None = None, name: str | None = None,
                 label_dp: LabelDPLayer | None = None, labels_privatized: bool = False,
                 loss: Any = None, optimizer: Any = "adam", metrics: Sequence[Any] | None = None,
                 class_weight: Mapping[int, float] | None = None,
                 label_free_sample_weight: bool = False,
                 _counter: SentCounter | None = None, _owner: str | None = None,
                 _own_bottom: PartyBottom | None = None, _standalone: bool = True) -> None:
        owner = _owner or "VerticalLeader"
        self._owner = owner
        if not isinstance(top, keras.layers.Layer):
            raise TypeError(f"{owner}: `top` must be a Keras model or layer; got "
                            f"{type(top).__name__}.")
        if not isinstance(followers, Mapping) or not followers:
            raise TypeError(f"{owner}: `followers` must be a non-empty dict follower name -> "
                            f"EmbeddingSpec; got {type(followers).__name__}.")
        for p, spec in followers.items():
            validate_party_name(p, owner, "follower names")
            if not isinstance(spec, EmbeddingSpec):
                raise TypeError(f"{owner}: `followers[{p!r}]` must be an EmbeddingSpec (a "
                                f"follower's `.spec`); got {type(spec).__name__}.")
        validate_label_protection(label_dp, labels_privatized, owner)
        if not isinstance(label_free_sample_weight, bool):
            raise TypeError(f"{owner}: `label_free_sample_weight` must be a bool; got "
                            f"{label_free_sample_weight!r}.")
        self.top = top
        self.label_dp = label_dp
        self.labels_privatized = labels_privatized
        self.label_free_sample_weight = label_free_sample_weight
        self.class_weight = (None if class_weight is None
                             else validate_class_weight(dict(class_weight), owner))
        self.follower_specs = {p: followers[p] for p in sorted(followers)}
        self._counter = _counter if _counter is not None else SentCounter()
        if _own_bottom is not None:
            self.own = _own_bottom
        elif bottom is not None:
            if name is None:
                raise ValueError(f"{owner}: `name` (the leader's party name) is required with "
                                 "`bottom`.")
            self.own = PartyBottom(name, bottom, None, sends=False, owner=owner)
            self.own.build_spec()
        else:
            self.own = None
        self.name = self.own.name if self.own is not None else name
        if self.name is not None:
            validate_party_name(self.name, owner, "the leader's name")
            if self.name in self.follower_specs:
                raise ValueError(f"{owner}: the leader {self.name!r} is also among the "
                                 "followers.")
        self.parties = tuple(sorted(list(self.follower_specs) +
                                    ([self.own.name] if self.own is not None else [])))
        self._resolve_top()
        if self.label_dp is not None:
            self.check_label_classes(self.declared_label_classes(), "label_dp")
        self._standalone = _standalone
        if _standalone:
            self.optimizer = make_optimizer(optimizer, owner)
            if loss is None:
                raise ValueError(f"{owner}: `loss` is required (e.g. 'binary_crossentropy').")
            self._compiled_loss = private.compile_loss(loss)
            self.metrics = []
            for m in metrics or []:
                metric = keras.metrics.get(m) if isinstance(m, str) else m
                if not isinstance(metric, keras.metrics.Metric):
                    raise TypeError(f"{owner}: `metrics` must hold keras.metrics.Metric objects "
                                    f"or their names; got {type(m).__name__}.")
                self.metrics.append(metric)
            variables = self.trainable_variables
            if variables:
                self.optimizer.build(variables)
            self._fns: dict[Any, Any] = {}

    # -- the top's input rule --------------------------------------------------------------
    def embedding_tensors(self) -> dict[str, keras.KerasTensor]:
        """Every party's embedding as a KerasTensor (batch dimension None), by party."""
        out = {p: keras.KerasTensor((None,) + s.shape, dtype=s.dtype)
               for p, s in self.follower_specs.items()}
        if self.own is not None:
            out[self.own.name] = self.own.embedding_tensor
        return {p: out[p] for p in sorted(out)}

    def _resolve_top(self):
        sent = self.embedding_tensors()
        self.top_takes_dict = self._resolve_top_rule(sent)
        try:
            self.top_output_spec = private.compute_output_spec(
                lambda m: self.top(self.combine(m), training=False), sent)
        except Exception as error:
            shapes = {p: tuple(s.shape) for p, s in sent.items()}
            rule = ("a dict keyed by party" if self.top_takes_dict else
                    "the concatenation of the embeddings along the last axis in sorted party "
                    "order")
            raise ValueError(f"{self._owner}: the top model cannot take the embeddings "
                             f"{shapes} as {rule}: {error}") from error

    def _resolve_top_rule(self, sent):
        owner = self._owner
        struct = private.inputs_struct(self.top)
        names = None
        if isinstance(struct, dict):
            names = list(struct)
        elif struct is not None and len(tree.flatten(struct)) > 1:
            names = [t.name for t in tree.flatten(struct)]
        if names is None:  # one input: the concatenation
            if len({s.shape[1:-1] for s in sent.values()}) > 1 or \
                    len({len(s.shape) for s in sent.values()}) > 1:
                raise ValueError(f"{owner}: the top model has one input, so it receives the "
                                 "concatenation of the embeddings along the last axis, but their "
                                 "shapes differ elsewhere: "
                                 f"{ {p: tuple(s.shape) for p, s in sent.items()} }.")
            if len({keras.backend.standardize_dtype(s.dtype) for s in sent.values()}) > 1:
                raise ValueError(f"{owner}: the embeddings have different dtypes "
                                 f"{ {p: s.dtype for p, s in sent.items()} }; the top's single "
                                 "input needs one dtype.")
            expected = getattr(self.top, "inputs", None) if self.top.built else None
            if expected:
                want = expected[0].shape[-1]
                got = sum(int(s.shape[-1]) for s in sent.values())
                if want is not None and want != got:
                    raise ValueError(
                        f"{owner}: the top model's input has last dimension {want}, but the "
                        f"concatenated embeddings (sorted party order "
                        f"{ {p: int(s.shape[-1]) for p, s in sent.items()} }) have {got}.")
            return False
        if sorted(names) != sorted(self.parties):
            raise ValueError(f"{owner}: the top model has inputs named {names}; a top with "
                             "several (or dict) inputs must name them exactly after the parties "
                             f"{list(self.parties)} (it then receives a dict party -> "
                             "embedding). A top with one input receives the concatenation.")
        return True

    def combine(self, sent: Mapping[str, Any]) -> Any:
        """What the top takes: a dict by party, or the concatenation in sorted party order."""
        if self.top_takes_dict:
            return {p: sent[p] for p in self.parties}
        parts = [sent[p] for p in self.parties]
        return parts[0] if len(parts) == 1 else keras.ops.concatenate(parts, axis=-1)

    # -- labels ----------------------------------------------------------------------------
    def declared_label_classes(self) -> int | None:
        """The number of classes ``label_dp``'s settings fix before any label is seen, or None."""
        layer = self.label_dp
        if layer.mode == "binary":
            return 2
        return layer.num_classes  # sparse / onehot / auto: None until the labels are seen

    def top_output_size(self) -> int | None:
        """The last dimension of the top's (single) output, or None when not known."""
        spec = self.top_output_spec
        if not isinstance(spec, keras.KerasTensor) or len(spec.shape) < 2:
            return None
        return spec.shape[-1]

    def check_label_classes(self, num_classes: int | None, source: str) -> None:
        """Raise if ``label_dp``'s ``num_classes`` cannot match the top model's output size.

        Randomized labels take any of the ``num_classes`` values, so a top
        with fewer outputs fails deep inside the loss on a label the user
        never wrote. Two classes fit a top with 1 output (sigmoid) or 2
        (softmax); K > 2 classes need exactly K outputs.

        Args:
            num_classes: the number of classes of the labels, or None (skip).
            source: where ``num_classes`` comes from, for the message.
        """
        outputs = self.top_output_size()
        if num_classes is None or outputs is None:
            return
        allowed = (1, 2) if num_classes == 2 else (num_classes,)
        if outputs not in allowed:
            if num_classes == 2:
                fix = ("2 classes need a top with 1 output (sigmoid) or 2 (softmax); for "
                       f"{outputs} classes use LabelDPLayer(mode='sparse', "
                       f"num_classes={outputs}) (or mode='onehot' for one-hot labels)")
            else:
                fix = (f"the randomized labels take every class id in [0, {num_classes}), so "
                       f"the top needs {num_classes} outputs: set `num_classes` to the number "
                       "of classes the top predicts (or change the top)")
            raise ValueError(f"{self._owner}: {source} has {num_classes} classes but the top "
                             f"model has {outputs} output(s); {fix}.")

    def validate_labels(self, y: Any) -> None:
        """Check array labels against ``label_dp`` eagerly, before anything is traced.

        The same row-by-row rule as `LabelDPLayer` on eager labels, plus the
        number of classes against the top's output size. Labels that are
        neither numpy arrays nor eager tensors are checked inside the step.
        """
        if self.label_dp is None:
            return
        if keras.ops.is_tensor(y) and (hasattr(y, "numpy") or not backend.is_tensorflow()):
            y = keras.ops.convert_to_numpy(y)  # eager (a TensorFlow graph tensor has no numpy)
        if not isinstance(y, np.ndarray) or y.ndim == 0:
            return
        layer = self.label_dp
        mode, k = label_formats.resolve_mode(layer.mode, y.shape, layer.num_classes)
        label_formats.validate_eager(y, mode, k)
        self.check_label_classes(k, f"LabelDPLayer(mode={mode!r}) on these labels")

    def privatize_labels(self, y: Any, example_ids: Any) -> Any:
        """The labels the leader trains on: ``label_dp`` applied (a release), or ``y``.

        Without ``label_dp`` and ``labels_privatized``, the step is counted as
        a release of the true labels without DP.
        """
        if y is None:
            return y
        if self.label_dp is None:
            if not self.labels_privatized:
                self._counter.count(rows_of(tree.flatten(y)[0]))
            return y
        if example_ids is None and not self.label_dp.per_batch:
            raise ValueError(
                f"{self._owner}(label_dp=LabelDPLayer(...)) randomizes each training label once, "
                f"so it needs example ids: add an int64 {EXAMPLE_IDS_KEY!r} entry (shape "
                "(batch,), unique per example) to the input dict, e.g. with "
                "keras_fedpriv.federated.with_example_ids(x) (before shuffling). Alternatively "
                "privatize the labels once before training with keras_fedpriv.privatize_labels "
                "and pass label_dp=None, or use LabelDPLayer(per_batch=True) (fresh noise every "
                "epoch: E epochs cost E * eps).")
        return self.label_dp(y, example_ids=example_ids, training=True)

    def label_sample_weight(self, y_train: Any, sample_weight: Any,
                            class_weight: Mapping[int, float] | None,
                            label_free_sample_weight: bool, refusal: str) -> Any:
        """With ``label_dp``: refuse label-derived sample weights; class weights from ``y_train``.

        Args:
            y_train: the randomized labels.
            sample_weight: the batch's sample weights, or None.
            class_weight: None or a validated dict class -> weight.
            label_free_sample_weight: whether sample weights are allowed.
            refusal: the message of the ValueError for refused sample weights.
        """
        if self.label_dp is None:
            return sample_weight
        if sample_weight is not None and not label_free_sample_weight:
            raise ValueError(refusal)
        if class_weight is None or y_train is None:
            return sample_weight
        mode, k = self.label_dp._resolved
        keys = sorted(class_weight)
        if keys[-1] >= k:
            raise ValueError(f"{self._owner}: `class_weight` has the class {keys[-1]} but the "
                             f"labels have {k} classes; allowed keys: 0..{k - 1}.")
        table = np.ones(k, np.float32)
        for c, w in class_weight.items():
            table[c] = w
        ops = keras.ops
        if mode == "onehot":
            classes = ops.argmax(y_train, axis=-1)
        else:
            classes = ops.cast(ops.round(ops.cast(ops.reshape(y_train, [-1]), "float32")),
                               "int32")
        weights = ops.take(ops.convert_to_tensor(table), classes)
        if sample_weight is None:
            return weights
        sample_weight = ops.convert_to_tensor(sample_weight)
        return sample_weight * ops.reshape(ops.cast(weights, sample_weight.dtype),
                                           ops.shape(sample_weight))

    # -- the top's backward pass -------------------------------------------------------------
    def top_backward(self, received: Mapping[str, Any], y_train: Any, sample_weight: Any,
                     loss_fn: Callable[[Any, Any, Any], Any], scale: Callable[[Any], Any]
                     ) -> tuple[Any, Any, dict[str, Any], list[tuple[Any, Any]]]:
        """Top forward, loss, and ``d loss / d embedding`` of every party (graph piece).

        Args:
            received: every party's embedding (followers' as received, the
                leader's own), without autograd history.
            y_train: the labels trained on.
            sample_weight: the batch's weights, or None.
            loss_fn: ``loss_fn(y, y_pred, sample_weight)`` -> the scalar loss.
            scale: the optimizer's loss scaling.

        Returns:
            ``(loss, y_pred, cut, top_grads)``: ``cut`` maps every party to
            the gradient of its embedding (zeros where the loss does not
            depend on it), ``top_grads`` is a list of (gradient, variable).
        """
        top_vars = list(self.top.trainable_variables)

        def forward(arrived):
            y_pred = self.top(self.combine(arrived), training=True)
            loss = loss_fn(y_train, y_pred, sample_weight)
            return [scale(loss)], (loss, y_pred)

        _, (loss, y_pred), pullback = backend.impl().vjp(forward, top_vars, dict(received))
        top_grads, grads = pullback([None])
        cut = {p: (grads[p] if grads[p] is not None else keras.ops.zeros_like(received[p]))
               for p in self.parties}
        return loss, y_pred, cut, list(zip(top_grads, top_vars))

    # -- standalone ------------------------------------------------------------------------
    def _require_standalone(self, what):
        if not self._standalone:
            raise RuntimeError(f"{self._owner}.{what}: this leader is the one a VerticalModel "
                               "runs inside its train_step; use model.split_parties() for "
                               "standalone halves.")

    @property
    def trainable_variables(self) -> list[Any]:
        """The leader's trainable variables: the top's, then its own bottom's."""
        own = self.own.trainable_variables if self.own is not None else []
        return list(self.top.trainable_variables) + own

    def loss(self, y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        """The leader's loss: the compiled loss plus the top's own losses."""
        return leader_loss(self._compiled_loss, y, y_pred, sample_weight, list(self.top.losses))

    def receive(self, party: str, arrays: Mapping[str, Any], rows: int) -> np.ndarray:
        """A follower's message, checked and decoded (`decode_embedding`).

        Raises:
            MalformedMessage: an unknown sender, or arrays that are not what the
                follower's `EmbeddingSpec` promises.
        """
        if party not in self.follower_specs:
            raise MalformedMessage(f"a message from {party!r}, who is not a follower.")
        return decode_embedding(arrays, self.follower_specs[party], int(rows))

    def _traced_train(self, received, y, example_ids, x, sample_weight):
        scale = self.optimizer.scale_loss
        sent = {p: received[p] for p in self.follower_specs}
        own_pullback = local = None
        if self.own is not None:
            sent[self.own.name], local, own_pullback = self.own.record_forward(
                x, example_ids, scale)
        arrived = {p: keras.ops.stop_gradient(sent[p]) for p in self.parties}
        y_train = self.privatize_labels(y, example_ids)
        sample_weight = self.label_sample_weight(
            y_train, sample_weight, self.class_weight, self.label_free_sample_weight,
            f"{self._owner}.step: `sample_weight` with label_dp: sample weights derived from the "
            "labels would reveal the true labels through the gradients sent to the followers. "
            "Use class_weight= (applied to the randomized labels), or pass "
            "label_free_sample_weight=True if your weights do not depend on the labels.")
        loss, _, cut, pairs = self.top_backward(arrived, y_train, sample_weight, self.loss, scale)
        if self.own is not None:
            pairs += list(zip(self.own.gradients(own_pullback, cut[self.own.name]),
                              self.own.trainable_variables))
        if pairs:
            self.optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])
        total = loss if local is None else loss + keras.ops.cast(local, loss.dtype)
        return {p: cut[p] for p in self.follower_specs}, loss, total

    def _state_variables(self):
        """Every variable the leader's steps read or update (see ``party_function``)."""
        layers = [self.top] + ([self.label_dp] if self.label_dp is not None else [])
        out = [v for layer in layers for v in layer.variables]
        out += self.own.state_variables if self.own is not None else []
        out += list(self.optimizer.variables) + backend_variables(self._counter.variable)
        return out

    def _inputs(self, received, rows, x, what):
        missing = sorted(set(self.follower_specs) - set(received))
        unknown = sorted(set(received) - set(self.follower_specs))
        if missing or unknown:
            raise ValueError(f"{self._owner}.{what}: `received` must hold every follower's "
                             f"embedding; missing {missing}, unknown {unknown}.")
        out = {}
        for p, spec in self.follower_specs.items():
            a = np.asarray(received[p])
            if a.shape != (rows,) + spec.shape or a.dtype != np.dtype(spec.dtype):
                raise ValueError(f"{self._owner}.{what}: `received[{p!r}]` must be {spec.dtype} "
                                 f"of shape {(rows,) + spec.shape}; got {a.dtype} {a.shape} "
                                 "(decode messages with `receive`).")
            out[p] = a
        if self.own is not None:
            if x is None:
                raise ValueError(f"{self._owner}.{what}: `x` (the leader's own features) is "
                                 "required: the leader has a bottom model.")
            x = as_numpy_features(self.own.input_spec, x, self._owner, self.own.name)
            if num_rows(x) != rows:
                raise ValueError(f"{self._owner}.{what}: `x` must have {rows} rows, one per "
                                 "example of the batch.")
        elif x is not None:
            raise ValueError(f"{self._owner}.{what}: `x` must be None: the leader has no "
                             "bottom model.")
        return out, x

    def step(self, received: Mapping[str, Any], y: Any, example_ids: Any = None, x: Any = None,
             sample_weight: Any = None) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """One training step on the leader's side.

        Args:
            received: follower name -> its decoded embedding of the batch
                (`receive`), rows in batch order.
            y: the batch's labels (true labels; ``label_dp`` randomizes them).
            example_ids: the batch's example ids (needed by ``label_dp``
                unless ``per_batch``).
            x: the leader's own features of the batch (with a bottom).
            sample_weight: None, or per-example weights (see
                ``label_free_sample_weight``).

        Returns:
            ``(cut, logs)``: follower name -> the cut gradient to send it
            (numpy, the embedding's shape and dtype), and ``{"loss": ...,
            "total_loss": ...}`` (the leader's loss, and with its own
            bottom's losses added).
        """
        self._require_standalone("step")
        y = np.asarray(y)
        rows = int(y.shape[0]) if y.ndim else 0
        if rows < 1:
            raise ValueError(f"{self._owner}.step: `y` must hold one label per example of the "
                             "batch.")
        received, x = self._inputs(received, rows, x, "step")
        ids = as_example_ids(example_ids, rows, f"{self._owner}.step")
        self.validate_labels(y)
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight, np.float32)
        try:
            fn = self._function("train", y, ids is not None, sample_weight)
            args = [received, y] + [a for a in (ids, x, sample_weight) if a is not None]
            cut, loss, total = fn(*args)
        except backend.impl().traced_check_errors() as error:
            short = label_assert_message(error)
            if short is None:
                raise
            raise ValueError(f"{self._owner}.step: {short}") from None
        self.check_input_errors()
        return ({p: np.asarray(g) for p, g in cut.items()},
                {"loss": float(loss), "total_loss": float(total)})

    def _function(self, kind, y, has_ids, sample_weight):
        """The traced ``"train"`` step or ``"predict"`` (batch dimension None: one trace)."""
        key = (kind, None if y is None else (y.dtype.str, y.shape[1:]), has_ids,
               None if sample_weight is None else sample_weight.shape[1:])
        if key in self._fns:
            return self._fns[key]
        signature = [{p: keras.KerasTensor((None,) + s.shape, s.dtype)
                      for p, s in self.follower_specs.items()}]
        if kind == "train":
            signature.append(keras.KerasTensor((None,) + y.shape[1:], y.dtype.name))
        if has_ids:
            signature.append(keras.KerasTensor((None,), "int64"))
        if self.own is not None:
            signature.append(batch_signature(self.own.input_spec))
        if sample_weight is not None:
            signature.append(keras.KerasTensor((None,) + sample_weight.shape[1:],
                                               sample_weight.dtype.name))

        def fn(received, *rest):
            rest = list(rest)
            y_ = rest.pop(0) if kind == "train" else None
            ids = rest.pop(0) if has_ids else None
            x = rest.pop(0) if self.own is not None else None
            weights = rest.pop(0) if sample_weight is not None else None
            if kind == "train":
                return self._traced_train(received, y_, ids, x, weights)
            return self._traced_predict(received, x)

        self._fns[key] = backend.impl().party_function(fn, signature, self._state_variables)
        return self._fns[key]

    def _traced_predict(self, received, x):
        sent = dict(received)
        if self.own is not None:
            sent[self.own.name] = self.own.forward(x, None, training=False)[1]
        return self.top(self.combine(sent), training=False)

    def predict(self, received: Mapping[str, Any], x: Any = None) -> np.ndarray:
        """The top's prediction from the followers' inference embeddings (and ``x``)."""
        self._require_standalone("predict")
        rows = int(np.shape(next(iter(received.values())))[0]) if received else 0
        received, x = self._inputs(received, rows, x, "predict")
        fn = self._function("predict", None, False, None)
        return np.asarray(fn(received, x) if x is not None else fn(received))

    def evaluate(self, received: Mapping[str, Any], y: Any, x: Any = None) -> dict[str, float]:
        """``{"loss": ..., <metric>: ...}`` on true labels (no label DP at evaluation)."""
        y_pred = self.predict(received, x)
        y = np.asarray(y)
        logs = {"loss": float(self.loss(y, keras.ops.convert_to_tensor(y_pred)))}
        for metric in self.metrics:
            metric.reset_state()
            metric.update_state(y, y_pred)
            logs[metric.name] = float(metric.result())
        return logs

    # -- checks and privacy ----------------------------------------------------------------
    def check_input_errors(self) -> None:
        """Raise if ``label_dp`` met invalid inputs in a compiled (XLA) step."""
        if isinstance(self.label_dp, InputErrorFlagMixin):
            self.label_dp.check_input_errors()

    def unprotected_count(self) -> int:
        """Training steps whose cut gradients came from the true labels."""
        return self._counter.value()

    def privacy_ledger(self) -> ReleaseLedger:
        """What the leader sent without a DP mechanism (``label_dp`` keeps its own ledger)."""
        return leader_unprotected_ledger(self.unprotected_count())

    def privacy_protections(self) -> list[Any]:
        """The leader's layers (``label_dp``'s ledger is found through them)."""
        out = [self.top] + ([self.label_dp] if self.label_dp is not None else [])
        return out + (self.own.layers if self.own is not None else [])
