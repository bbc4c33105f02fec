"""VerticalStep: the protocol's training and evaluation steps of a `VerticalModel`, in one graph.

A `VerticalModel`'s ``train_step`` and ``test_step`` run through the backend
(`vertical_train_step`, `vertical_test_step` of `keras_fedpriv.backend`),
which calls `VerticalStep.train` and `VerticalStep.test` (the model's
``protocol_step``): on TensorFlow as they are, on JAX stateless over the state
Keras' functional trainer passes.

One training step, over the party halves (`PartyBottom` per party, the
`VerticalLeader`) that share the model's layers:

1. each party runs its bottom (and protection), recorded for its own
   gradients; followers send the protected embedding up;
2. the leader randomizes the labels (``label_dp``), runs the top on what
   arrived (no autograd history crosses the wire), computes the loss and the
   cut gradients ``d loss / d embedding``;
3. each party computes its gradients from its cut gradient alone (plus its
   own losses);
4. one optimizer step on all variables (per-party optimizers in deployment;
   the same math for per-variable optimizers).

The step also updates the model's loss tracker, its traffic metrics (the
bytes each follower's messages take on the wire) and its compiled metrics,
and, when message callbacks watch, returns the step's messages in the logs
under `MESSAGES_KEY`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import keras
import numpy as np
from keras import tree

from keras_fedpriv import backend
from keras_fedpriv.backend import private
from keras_fedpriv.federated.vertical.leader import VerticalLeader
from keras_fedpriv.federated.vertical.party import PartyBottom, add_all, rows_of, sum_losses
from keras_fedpriv.federated.vertical.wire import up_bytes

__all__ = ["MESSAGES_KEY", "SAMPLE_WEIGHT_REFUSAL", "VerticalStep"]

#: The key of a training step's logs that holds its messages (when message callbacks watch);
#: the model removes it before the logs reach the callbacks.
MESSAGES_KEY = "__keras_fedpriv_messages__"

#: Why a `VerticalModel` with ``label_dp`` refuses sample weights (in ``fit`` and in the step).
SAMPLE_WEIGHT_REFUSAL = (
    "VerticalModel.fit: `sample_weight` (or a third element of the data) with label_dp: sample "
    "weights derived from the labels would reveal the true labels through the gradients sent "
    "to the followers. Use class_weight= (applied to the randomized labels), or pass "
    "label_free_sample_weight=True to fit if your weights do not depend on the labels.")


class VerticalStep:
    """The training and evaluation steps of one `VerticalModel` (see the module docstring).

    Built by the model; the backend runs `train` and `test` as Keras'
    ``train_step`` and ``test_step``.

    Args:
        model: the `VerticalModel` (its optimizer, loss tracker, compiled
            loss and metrics, and ``traffic`` metrics).
        halves: party name -> its `PartyBottom`, sharing the model's layers.
        leader: the `VerticalLeader` sharing the model's top and ``label_dp``.
        split_inputs: ``split_inputs(x) -> (features by party, example ids or
            None)``, checking the input dict.

    Attributes:
        class_weight: None or the validated ``fit(class_weight=...)`` that,
            with ``label_dp``, weights each example by its randomized label.
        label_free_sample_weight: whether ``fit`` was told that the sample
            weights do not depend on the labels.
        capture_messages: whether a training step returns its messages
            (under `MESSAGES_KEY`).
    """

    def __init__(self, model: keras.Model, halves: Mapping[str, PartyBottom],
                 leader: VerticalLeader,
                 split_inputs: Callable[[Any], tuple[dict[str, Any], Any]]) -> None:
        self.model = model
        self.halves = dict(halves)
        self.leader = leader
        self.parties = tuple(self.halves)
        self.followers = tuple(p for p in self.parties if self.halves[p].sends)
        self._split_inputs = split_inputs
        self.class_weight = None
        self.label_free_sample_weight = False
        self.capture_messages = False

    # -- training ----------------------------------------------------------------------------

    def train(self, data: Any) -> dict[str, Any]:
        """One training step of the protocol; Keras' logs."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        features, ids = self._split_inputs(x)
        scale = self._scale()

        # 1. Each party: bottom (+ protection), recorded for its own gradients.
        sent, local, pullbacks = {}, {}, {}
        for p in self.parties:
            sent[p], local[p], pullbacks[p] = self.halves[p].record_forward(
                features[p], ids, scale)

        # 2. The leader: labels (label DP), top on what arrived (no autograd history
        #    crosses the wire), loss, cut gradients.
        received = {p: keras.ops.stop_gradient(sent[p]) for p in self.parties}
        y_train, sample_weight = self._labels(y, ids, sample_weight)
        loss, y_pred, cut, top_pairs = self.leader.top_backward(
            received, y_train, sample_weight, self._loss_fn(x), scale)
        by_var = {id(v): g for g, v in top_pairs}

        # 3. Each party: its gradients from g_p alone (+ its own losses).
        for p in self.parties:
            half = self.halves[p]
            by_var.update(zip(map(id, half.trainable_variables),
                              half.gradients(pullbacks[p], cut[p])))

        # 4. One optimizer step (per-party optimizers in deployment; same math).
        trainable = model.trainable_variables
        if trainable:
            model.optimizer.apply_gradients(zip([by_var.get(id(v)) for v in trainable],
                                                trainable))
        return self._train_logs(dict(x=x, y=y, y_train=y_train, y_pred=y_pred,
                                     sample_weight=sample_weight, loss=loss, local=local,
                                     features=features, sent=sent, cut=cut, ids=ids))

    def _scale(self):
        """The optimizer's loss scaling (the identity without an optimizer)."""
        optimizer = self.model.optimizer
        return optimizer.scale_loss if optimizer is not None else (lambda v: v)

    def _labels(self, y, ids, sample_weight):
        """The leader's labels trained on (label DP) and the weights they get."""
        y_train = self.leader.privatize_labels(y, ids)
        sample_weight = self.leader.label_sample_weight(
            y_train, sample_weight, self.class_weight, self.label_free_sample_weight,
            SAMPLE_WEIGHT_REFUSAL)
        return y_train, sample_weight

    def _loss_fn(self, x):
        """``loss_fn(y, y_pred, sample_weight)``: the compiled loss of a training step."""
        def loss_fn(y_true, y_pred, weights):
            return private.model_compute_loss(self.model, x=x, y=y_true, y_pred=y_pred,
                                              sample_weight=weights, training=True)
        return loss_fn

    def _train_logs(self, step):
        """The loss tracker, traffic and metrics of a training step; its logs.

        Args:
            step: a dict with ``x, y, y_train, y_pred, sample_weight, loss``
                (the leader's), ``local`` (party -> its own loss or None),
                ``features, sent, cut, ids``.
        """
        total = step["loss"]
        for value in step["local"].values():
            if value is not None:
                total = total + keras.ops.cast(value, total.dtype)
        self._track_loss(total, step["features"])
        self._count_traffic(step["sent"], gradients_sent=True)
        logs = self.model.compute_metrics(step["x"], step["y_train"], step["y_pred"],
                                          sample_weight=step["sample_weight"])
        if self.capture_messages:
            logs = dict(logs)
            logs[MESSAGES_KEY] = self._gather_messages(step)
        return logs

    def _gather_messages(self, step):
        captured = {"up": {p: step["sent"][p] for p in self.followers},
                    "down": {p: step["cut"][p] for p in self.followers},
                    "labels": step["y"],
                    "noisy_labels": step["y_train"]}
        if step["ids"] is not None:
            captured["example_ids"] = step["ids"]
        # Every replica returns the whole global batch (replica order = batch order), so
        # Keras' cross-replica reduction leaves it unchanged.
        return backend.impl().gather_replicas(captured)

    # -- evaluation --------------------------------------------------------------------------

    def test(self, data: Any) -> dict[str, Any]:
        """One evaluation step (stateful: on JAX it runs in a `keras.StatelessScope`); Keras'
        logs. Inference messages go up too, and are counted in the traffic metrics."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        features, ids = self._split_inputs(x)
        sent, total_local = {}, []
        for p in self.parties:
            _, sent[p], losses = self.halves[p].forward(features[p], ids, training=False)
            if losses:
                total_local.append(sum_losses(losses))
        y_pred = self.leader.top(self.leader.combine(sent), training=False)
        loss = private.model_compute_loss(self.model, x=x, y=y, y_pred=y_pred,
                                          sample_weight=sample_weight, training=False)
        for extra in total_local:
            loss = loss + keras.ops.cast(extra, loss.dtype)
        self._track_loss(loss, features)
        self._count_traffic(sent, gradients_sent=False)
        return self.model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    # -- what both steps update --------------------------------------------------------------

    def _track_loss(self, loss, features):
        """The model's loss tracker, weighted by the batch's rows."""
        private.loss_tracker(self.model).update_state(
            private.unscale_loss_for_distribution(loss),
            sample_weight=rows_of(tree.flatten(features)[0]))

    def wire_bytes(self, party: str, sent: Any) -> tuple[Any, Any]:
        """(bytes up, bytes down) of one message of follower ``party`` whose embedding is
        ``sent`` (float64 scalars; float32 on JAX without x64)."""
        rows = rows_of(sent)  # an int where static (always on JAX), else a tensor
        rows = float(rows) if isinstance(rows, int) else keras.ops.cast(rows, "float64")
        coords = int(np.prod(sent.shape[1:]))  # static: checked when the model was built
        size = np.dtype(keras.backend.standardize_dtype(sent.dtype)).itemsize
        up = up_bytes(rows, coords, size, self.halves[party].spec.bits)
        return up, rows * float(coords * size)

    def _count_traffic(self, sent, gradients_sent):
        traffic = self.model.traffic
        total_up, total_down = [], []
        for p in self.followers:
            up, down = self.wire_bytes(p, sent[p])
            traffic[f"bytes_up_{p}"].update_state(up)
            total_up.append(up)
            if gradients_sent:
                traffic[f"bytes_down_{p}"].update_state(down)
                total_down.append(down)
        traffic["bytes_up"].update_state(add_all(total_up))
        if total_down:
            traffic["bytes_down"].update_state(add_all(total_down))
