"""`VerticalFollower`: a follower's half of vertical FL."""

from __future__ import annotations

from typing import Any, Mapping

import keras
import numpy as np
from keras import tree

from keras_fedpriv import backend
from keras_fedpriv.federated.vertical.party import (
    PartyBottom,
    PendingBatch,
    SentCounter,
    as_example_ids,
    as_numpy_features,
    batch_signature,
    follower_unprotected_ledger,
    logger,
    make_optimizer,
    num_rows,
)
from keras_fedpriv.federated.vertical.wire import (
    MalformedMessage,
    decode_gradient,
    encode_embedding,
)
from keras_fedpriv.layers.local_state import (
    load_local_state,
    local_state,
    restore,
    snapshot,
)
from keras_fedpriv.layers.release_counter import refuse_if_behind
from keras_fedpriv.mechanisms.ledger import ReleaseLedger

__all__ = ["VerticalFollower"]


class VerticalFollower(PartyBottom):
    """A follower: its bottom model, its protection and its own optimizer.

    ``embed`` computes and encodes what the follower sends for a batch and
    records the release (in the protection's ledger, or as a release without
    DP); ``apply_gradients`` takes the cut gradient the leader sent back and
    updates the bottom (see the module docstring for how the gradient is
    computed after the round trip).

    Args:
        name: the follower's party name (an identifier).
        bottom: its built Keras model (or layer) over its features.
        protection: its protection layer (`EmbeddingDPLayer`: packed bits on
            the wire; any other Keras layer: floats), or None.
        optimizer: its optimizer (a Keras optimizer or its name).

    Example:
        >>> parties = model.split_parties()          # a compiled VerticalModel
        >>> follower = parties.followers["party_a"]
        >>> message = follower.embed(xa[:32], example_ids=ids[:32])   # {"bits": uint8}
        >>> follower.apply_gradients(gradient_from_leader)
    """

    def __init__(self, name: str, bottom: keras.layers.Layer,
                 protection: keras.layers.Layer | None = None,
                 optimizer: str | keras.optimizers.Optimizer | None = "adam", *,
                 _counter: SentCounter | None = None, _owner: str | None = None) -> None:
        super().__init__(name, bottom, protection, sends=True, counter=_counter,
                         owner=_owner or "VerticalFollower")
        self.build_spec()
        self.optimizer = make_optimizer(optimizer, self._owner)
        if self.trainable_variables:
            self.optimizer.build(self.trainable_variables)
        self._queue: list[PendingBatch] = []  # training batches awaiting their gradients, oldest first
        self._fns: dict[Any, Any] = {}
        #: the number of the newest leader message served (0: none numbered), and of the
        #: message whose batches await their gradients (0: none, or unnumbered); the leader
        #: numbers its messages from 1 (`keras_fedpriv.federated.vertical.loop`)
        self.last_message = 0
        self.pending_message = 0

    # -- traced pieces (one trace each: batch dimension None) --------------------------------
    def _function(self, kind, has_ids):
        """The traced ``"train"`` / ``"infer"`` forward pass or the ``"replay"``."""
        key = (kind, has_ids)
        if key in self._fns:
            return self._fns[key]
        signature = [batch_signature(self.input_spec)]
        if has_ids:
            signature.append(keras.KerasTensor((None,), "int64"))
        if kind == "replay":
            signature.append(keras.KerasTensor((None,) + self.spec.shape, self.spec.dtype))

            def fn(features, *rest):
                ids = rest[0] if has_ids else None
                return self._traced_replay(features, ids, rest[-1])
        else:
            training = kind == "train"

            def fn(features, *rest):
                ids = rest[0] if has_ids else None
                return self.forward(features, ids, training=training)[1]

        self._fns[key] = backend.impl().party_function(fn, signature,
                                                       lambda: self.state_variables)
        return self._fns[key]

    def _traced_replay(self, features, example_ids, cut):
        sent, local, pullback = self.record_forward(features, example_ids,
                                                    self.optimizer.scale_loss, count=False)
        grads = self.gradients(pullback, keras.ops.cast(cut, sent.dtype))
        grads = [keras.ops.zeros_like(v) if g is None else g
                 for g, v in zip(grads, self.trainable_variables)]
        return sent, grads, (keras.ops.zeros((), "float32") if local is None
                             else keras.ops.cast(local, "float32"))

    def _apply(self, grads):
        if "apply" not in self._fns:
            variables = self.trainable_variables

            def apply(gradients):
                self.optimizer.apply(gradients, variables)

            self._fns["apply"] = backend.impl().party_function(
                apply, [[keras.KerasTensor(v.shape, v.dtype) for v in variables]],
                lambda: variables + list(self.optimizer.variables))
        self._fns["apply"](grads)

    # -- the protocol ----------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether a training batch awaits its cut gradient."""
        return bool(self._queue)

    @property
    def pending_batches(self) -> int:
        """How many training batches await their cut gradients (oldest gets the next one)."""
        return len(self._queue)

    @property
    def wire_format(self) -> dict[str, Any]:
        """How this follower's messages are encoded and their size per example."""
        s = self.spec
        return {"up": "1-bit packed" if s.bits else s.dtype,
                "up_bytes_per_example": s.bytes_up_per_example,
                "down": s.dtype, "down_bytes_per_example": s.bytes_down_per_example}

    def embed(self, x: Any, example_ids: Any = None, training: bool = True, *,
              queue: bool = False) -> dict[str, np.ndarray]:
        """What the follower sends for a batch: its protected embedding, encoded.

        The call is a release, recorded by the protection (per example id
        when ``example_ids`` are given). With ``training=True`` the batch is
        kept for `apply_gradients`; batches still waiting are dropped (the
        leader skipped them: their releases stay recorded) unless ``queue``.

        Args:
            x: the follower's features of the batch (rows in the order of
                ``example_ids``).
            example_ids: None or integer ids, one per row.
            training: True for a training step (the leader answers with a
                gradient), False for inference.
            queue: keep the batches already waiting: this one gets its
                gradient after theirs (several batches per message: their
                gradients are applied as delayed gradients, each computed
                with the weights its batch was embedded with).

        Returns:
            The wire arrays (`encode_embedding`): ``{"bits": uint8}`` with an
            `EmbeddingDPLayer`, else ``{"embedding": float}``.
        """
        if not isinstance(training, bool):
            raise TypeError(f"{self._owner}.embed: `training` must be a bool; got {training!r}.")
        if not isinstance(queue, bool):
            raise TypeError(f"{self._owner}.embed: `queue` must be a bool; got {queue!r}.")
        x = as_numpy_features(self.input_spec, x, self._owner, self.name)
        rows = num_rows(x)
        if rows is None:
            raise ValueError(f"{self._owner}.embed: the feature arrays of party {self.name!r} "
                             "have different numbers of rows.")
        ids = as_example_ids(example_ids, rows, f"{self._owner}.embed")
        if self._queue and training and not queue:
            logger.debug("follower %r: %d batch(es) awaiting a gradient were dropped",
                         self.name, len(self._queue))
            self._queue = []
        # what the replay restores: the random counters and keys, never the per-example
        # release counts (the replay counts nothing), so a batch keeps no copy of them
        before = snapshot(self.layers, id_counts=False).values if training else None
        fn = self._function("train" if training else "infer", ids is not None)
        sent = fn(x, ids) if ids is not None else fn(x)
        self.check_input_errors()
        sent = np.asarray(sent)
        message = encode_embedding(sent, self.spec)
        if training:
            self._queue.append(PendingBatch(x, ids, sent, before))
        return message

    def discard(self) -> None:
        """Forget the batches awaiting their gradients (their releases stay recorded)."""
        self._queue = []
        self.pending_message = 0

    def receive_gradient(self, arrays: Mapping[str, Any], position: int = 0) -> np.ndarray:
        """A received gradient message, checked against the batch awaiting it.

        Args:
            arrays: the wire arrays (``{"gradient": ...}``).
            position: which waiting batch it is for (0: the oldest).

        Returns:
            The gradient array.

        Raises:
            MalformedMessage: no such batch awaits a gradient, or the arrays
                are not a finite gradient of the embedding's dtype and shape.
        """
        if not self._queue:
            raise MalformedMessage(f"follower {self.name!r} received a gradient but no batch "
                                   "awaits one.")
        if not 0 <= position < len(self._queue):
            raise MalformedMessage(f"follower {self.name!r} received a gradient for batch "
                                   f"{position} but {len(self._queue)} await one.")
        return decode_gradient(arrays, self.spec, int(self._queue[position].sent.shape[0]))

    def _replay(self, pending, gradient):
        """The sent embedding recomputed under a tape from the batch's saved state, and grads."""
        current = None
        if pending.weights is not None:  # embedded with older weights: a delayed gradient
            current = [np.array(v.numpy()) for v in self.trainable_variables]
            for v, w in zip(self.trainable_variables, pending.weights):
                v.assign(np.reshape(w, v.shape))
        # the replay counts nothing per example: the tables are neither copied nor restored
        after = snapshot(self.layers, id_counts=False)
        restore(self.layers, pending.state_before)
        try:
            fn = self._function("replay", pending.example_ids is not None)
            args = [pending.features] + ([pending.example_ids]
                                         if pending.example_ids is not None else [])
            sent, grads, local = fn(*args, gradient)
        finally:
            restore(self.layers, after)
            if current is not None:
                for v, w in zip(self.trainable_variables, current):
                    v.assign(w)
        return np.asarray(sent), grads, local

    def apply_gradients(self, cut_gradient: Any) -> dict[str, float]:
        """Update the bottom (and protection) from the cut gradient of the oldest waiting batch.

        With several batches waiting (``embed(queue=True)``) each gradient is
        computed with the weights its batch was embedded with and applied to
        the current weights (a delayed gradient).

        Args:
            cut_gradient: ``d loss / d embedding`` for the oldest batch of
                ``embed(training=True)`` still waiting: an array of the
                embedding's shape and dtype (or the wire arrays
                ``{"gradient": ...}``).

        Returns:
            ``{"local_loss": ...}``: the party's own losses (e.g. a VAE
            bottom's KL term) on the batch; they stay with the follower.

        Raises:
            MalformedMessage: no batch awaits a gradient, or the gradient has
                the wrong shape or dtype, or non-finite values.
            RuntimeError: the recomputed message differs from the one sent
                (the bottom or protection draws randomness outside the state
                the follower keeps); nothing is updated.
        """
        if not isinstance(cut_gradient, Mapping):
            cut_gradient = {"gradient": np.asarray(cut_gradient)}
        gradient = self.receive_gradient(cut_gradient)
        pending = self._queue.pop(0)
        sent, grads, local = self._replay(pending, gradient)
        same = (np.array_equal(sent, pending.sent) if self.spec.bits else
                np.allclose(sent, pending.sent, rtol=1e-5, atol=1e-6))
        if not same:
            raise RuntimeError(f"follower {self.name!r}: the embedding recomputed for the gradient "
                               "differs from the one sent; a layer draws randomness outside the "
                               "party's state (use the package's protection layers or Keras "
                               "layers with seed generators). Nothing was updated.")
        if self.trainable_variables:
            waiting = [p for p in self._queue if p.weights is None]
            if waiting:  # they were embedded with the weights about to change: keep those
                weights = [np.array(v.numpy()) for v in self.trainable_variables]
                for p in waiting:
                    p.weights = weights
            self._apply(grads)
        return {"local_loss": float(local)}

    # -- state across processes --------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything the follower needs to go on in another process (its own secrets included).

        The trainable weights, the optimizer's variables, the layers' local
        state (`keras_fedpriv.layers.local_state`: random counters and keys,
        release counts), the batches awaiting their gradients (with the
        weights they were embedded with, where those have changed since) and
        the numbers of the newest leader message served and of the message
        those batches came from.
        Keep it where the party keeps its data (e.g. Flower's node state on
        its SuperNode).
        """
        out = {f"weights/{i}": np.array(v.numpy())
               for i, v in enumerate(self.trainable_variables)}
        out.update({f"optimizer/{i}": np.array(v.numpy())
                    for i, v in enumerate(self.optimizer.variables)})
        out.update({f"local/{k}": v for k, v in local_state(self.layers).items()})
        if self._counter is not None:
            out["unprotected"] = np.array([self._counter.value()], np.int64)
        out["messages"] = np.array([self.last_message, self.pending_message], np.int64)
        weight_sets: list[list[np.ndarray]] = []
        for j, p in enumerate(self._queue):
            head = f"pending/{j}/"
            flat = tree.flatten(p.features)
            out.update({f"{head}x/{i}": np.asarray(a) for i, a in enumerate(flat)})
            out[f"{head}sent"] = np.asarray(p.sent)
            if p.example_ids is not None:
                out[f"{head}ids"] = p.example_ids
            out.update({f"{head}before/{k}": np.asarray(v) for k, v in p.state_before.items()})
            if p.weights is not None:
                if not any(p.weights is w for w in weight_sets):
                    weight_sets.append(p.weights)
                s = next(i for i, w in enumerate(weight_sets) if p.weights is w)
                out[f"{head}weights"] = np.array([s], np.int64)
        for s, weights in enumerate(weight_sets):
            out.update({f"pending_weights/{s}/{i}": w for i, w in enumerate(weights)})
        return out

    def _refuse_if_behind(self, state):
        """Restoring never rewinds: a state behind this follower's releases is refused."""
        live = local_state(self.layers)
        for name, value in live.items():
            saved = state.get(f"local/{name}")
            if saved is None:
                continue
            if name.endswith("/release_totals"):
                refuse_if_behind(value, saved, f"{self._owner}.load_state_dict")
            elif name.endswith("/rng_counter") and np.any(
                    np.reshape(np.asarray(saved, np.int64), value.shape) < value):
                raise ValueError(f"{self._owner}.load_state_dict: the state's random counter is "
                                 "behind this follower's: loading it would replay noise already "
                                 "sent; load a state only into a new copy.")
        if self._counter is not None and "unprotected" in state:
            live_count = int(self._counter.variable.numpy()[self._counter.slot])
            if int(np.asarray(state["unprotected"]).reshape(-1)[0]) < live_count:
                raise ValueError(f"{self._owner}.load_state_dict: the state counts fewer "
                                 "releases without DP than this follower made; loading it would "
                                 "rewind the count.")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` (taken from this follower or a copy built the same way).

        Restoring never rewinds: a state behind what this follower has
        already released (its release counts, random counter or count of
        releases without DP) is refused with a ValueError, and nothing is
        loaded.
        """
        self._refuse_if_behind(state)
        try:
            queue = self._pending_from_state(state)  # read first: a broken queue loads nothing
            for i, v in enumerate(self.trainable_variables):
                v.assign(np.reshape(state[f"weights/{i}"], v.shape))
            for i, v in enumerate(self.optimizer.variables):
                v.assign(np.reshape(state[f"optimizer/{i}"], v.shape))
        except KeyError as error:
            raise ValueError(f"{self._owner}.load_state_dict: the state lacks {error}; it was "
                             "taken from a follower of another structure.") from None
        load_local_state(self.layers, {k[len("local/"):]: v for k, v in state.items()
                                       if k.startswith("local/")})
        if self._counter is not None and "unprotected" in state:
            var = self._counter.variable
            value = var.numpy().copy()
            value[self._counter.slot] = int(np.asarray(state["unprotected"]).reshape(-1)[0])
            var.assign(value)
        self._queue = queue
        messages = np.asarray(state.get("messages", np.zeros(2, np.int64)), np.int64).reshape(-1)
        self.last_message, self.pending_message = int(messages[0]), int(messages[1])

    def _pending_from_state(self, state):
        n = len(tree.flatten(self.input_spec))
        weight_sets: dict[int, list[np.ndarray]] = {}
        queue = []
        for j in range(len(state)):
            head = f"pending/{j}/"
            if f"{head}sent" not in state:
                break
            flat = [np.asarray(state[f"{head}x/{i}"]) for i in range(n)]
            before = {k[len(head) + len("before/"):]: v for k, v in state.items()
                      if k.startswith(f"{head}before/")}
            ids = state.get(f"{head}ids")
            weights = None
            if f"{head}weights" in state:
                s = int(np.asarray(state[f"{head}weights"]).reshape(-1)[0])
                if s not in weight_sets:
                    weight_sets[s] = [np.asarray(state[f"pending_weights/{s}/{i}"])
                                      for i in range(len(self.trainable_variables))]
                weights = weight_sets[s]
            queue.append(PendingBatch(tree.pack_sequence_as(self.input_spec, flat),
                                  None if ids is None else np.asarray(ids, np.int64),
                                  np.asarray(state[f"{head}sent"]), before, weights))
        return queue

    # -- privacy ---------------------------------------------------------------------------
    def privacy_ledger(self) -> ReleaseLedger:
        """What this follower sent without a DP mechanism (its protection keeps the rest)."""
        return follower_unprotected_ledger(self.name, self.protection, self.unprotected_count())

    def privacy_protections(self) -> list[Any]:
        """The follower's layers (its protection's ledger is found through them)."""
        return self.layers
