"""The messages that cross party boundaries in a `VerticalModel`, and callbacks that observe them.

In vertical (split) learning two kinds of message cross a party boundary at
each training step:

* **up**: each follower sends the leader its (protected) embedding of the
  batch, one row per example;
* **down**: the leader sends each follower the gradient of the loss with
  respect to that embedding (the "cut-layer gradient").

`VerticalModel` hands both to every `MessageCallback` after each training
step, as numpy arrays in a `StepMessages`. Attacks (label inference from
gradients, feature reconstruction from embeddings) and communication
accounting are built on this. The true labels travel in a separate field,
`StepMessages.evaluation`, because no follower ever receives them: they are
there only to *evaluate* attacks.
"""

from __future__ import annotations

import dataclasses
import numbers
import sys
from typing import Any, Sequence

import keras
import numpy as np
from keras import tree

from keras_fedpriv.mechanisms.validation import validate_int_sequence

__all__ = ["EXAMPLE_IDS_KEY", "EvaluationData", "PartyMessages", "StepMessages",
           "MessageCallback", "MessageRecorder", "with_example_ids"]

#: Reserved key of the input dict that carries the example ids (int64, shape (batch,)).
EXAMPLE_IDS_KEY = "example_ids"


@dataclasses.dataclass(frozen=True)
class PartyMessages:
    """What crossed one follower's boundary in one training step.

    Attributes:
        embeddings: what the follower sent up, shape (batch, ...) (after its
            protection: 0/1 values with `EmbeddingDPLayer`).
        gradients: what the leader sent down, ``d loss / d embeddings``, same
            shape (float).
        bytes_up: bytes of ``embeddings`` on the wire (see docs/vertical.md).
        bytes_down: bytes of ``gradients`` on the wire.
    """

    embeddings: np.ndarray
    gradients: np.ndarray
    bytes_up: int
    bytes_down: int


@dataclasses.dataclass(frozen=True)
class EvaluationData:
    """Batch data that does NOT cross any boundary, for evaluating attacks only.

    Attributes:
        labels: the true labels of the batch (held by the leader only).
        noisy_labels: the labels the leader trained on (after its `label_dp`;
            equal to ``labels`` without label DP). Leader-only as well.
        example_ids: the batch's ``"example_ids"`` input, or None.
    """

    labels: np.ndarray
    noisy_labels: np.ndarray
    example_ids: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class StepMessages:
    """All messages of one training step.

    Attributes:
        epoch: 0-based epoch index.
        step: 0-based step (batch) index within the epoch.
        parties: follower name -> `PartyMessages` (the leader's own bottom,
            if any, sends nothing and is not listed).
        evaluation: `EvaluationData` (never sent; for evaluation only).

    ``messages["party_a"]`` is ``messages.parties["party_a"]``.
    """

    epoch: int
    step: int
    parties: dict
    evaluation: EvaluationData

    def __getitem__(self, party):
        try:
            return self.parties[party]
        except KeyError:
            raise KeyError(f"No messages for party {party!r}; the followers are "
                           f"{sorted(self.parties)}.") from None


class MessageCallback(keras.callbacks.Callback):
    """Base class of callbacks that observe the messages of a `VerticalModel`.

    Override `on_messages`. It is called after every training step (in the
    main thread, before ``on_train_batch_end``), with the step's
    `StepMessages`. Only `VerticalModel.fit` produces messages, and only with
    ``steps_per_execution=1`` (it raises otherwise). Messages are captured
    only while a `MessageCallback` is among the ``fit`` callbacks, so
    training without one pays nothing.

    Example:
        >>> class NormPrinter(MessageCallback):
        ...     def on_messages(self, step, messages):
        ...         print(step, np.linalg.norm(messages["party_a"].gradients, axis=1))
    """

    def set_model(self, model: Any) -> None:
        if not getattr(model, "_is_vertical_model", False):
            raise TypeError(f"{type(self).__name__} observes the messages of a "
                            f"keras_fedpriv.federated.VerticalModel; it was given a "
                            f"{type(model).__name__}.")
        super().set_model(model)

    def on_messages(self, step: int, messages: StepMessages) -> None:
        """Called after each training step.

        Args:
            step: the step index within the epoch (``messages.step``).
            messages: a `StepMessages` (numpy arrays).
        """


def _validate_epochs(epochs):
    if epochs is None:
        return None
    return frozenset(validate_int_sequence(epochs, "epochs", minimum=0,
                                           what="epoch indices (None: all epochs)"))


class MessageRecorder(MessageCallback):
    """Record the messages of chosen epochs into numpy arrays.

    The recorder is cleared at the start of every ``fit``: it holds the
    messages of its latest ``fit``.

    Args:
        epochs: epoch indices to record (an int or a collection of ints), or
            None for every epoch. Default ``(0,)``: the first epoch.
        max_steps: record at most this many steps per epoch (None: all).
        parties: follower names to record (None: all followers).

    Example:
        >>> recorder = MessageRecorder(epochs=(0,))
        >>> model.fit(x, y, epochs=3, callbacks=[recorder])
        >>> g = recorder.cut_gradients("party_a")   # (num_examples_seen, d)
        >>> y_true = recorder.labels()              # aligned rows, for evaluation
    """

    def __init__(self, epochs: Sequence[int] | str | None = (0,), max_steps: int | None = None,
                 parties: Sequence[str] | None = None) -> None:
        super().__init__()
        self.epochs = _validate_epochs(epochs)
        if max_steps is not None and (isinstance(max_steps, (bool, np.bool_)) or
                                      not isinstance(max_steps, numbers.Integral) or
                                      max_steps < 1):
            raise ValueError(f"`max_steps` must be None or an integer >= 1; got {max_steps!r}.")
        self.max_steps = None if max_steps is None else int(max_steps)
        if parties is not None:
            if isinstance(parties, str):
                parties = (parties,)
            parties = tuple(parties)
            if not all(isinstance(p, str) for p in parties):
                raise TypeError(f"`parties` must be None or party names (str); got {parties!r}.")
        self.parties = parties
        self._steps = []

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._steps = []
        if self.parties is not None:
            unknown = sorted(set(self.parties) - set(self.model.followers))
            if unknown:
                raise ValueError(f"MessageRecorder(parties=...): {unknown} are not followers of "
                                 f"the model; its followers are {list(self.model.followers)}.")

    def on_messages(self, step: int, messages: StepMessages) -> None:
        if self.epochs is not None and messages.epoch not in self.epochs:
            return
        if self.max_steps is not None and \
                sum(1 for s in self._steps if s.epoch == messages.epoch) >= self.max_steps:
            return
        if self.parties is not None:
            messages = dataclasses.replace(
                messages, parties={p: messages.parties[p] for p in self.parties})
        self._steps.append(messages)

    # --- accessors ---------------------------------------------------------------

    @property
    def recorded_epochs(self) -> list[int]:
        """Sorted epoch indices with at least one recorded step."""
        return sorted({s.epoch for s in self._steps})

    def steps(self, epoch: int | None = None) -> list[StepMessages]:
        """The recorded `StepMessages` (of ``epoch``, or all), in order."""
        if not self._steps:
            raise ValueError("MessageRecorder: nothing recorded yet (pass the recorder to "
                             f"VerticalModel.fit(callbacks=[...]); recording epochs "
                             f"{'all' if self.epochs is None else sorted(self.epochs)}).")
        if epoch is None:
            return list(self._steps)
        chosen = [s for s in self._steps if s.epoch == epoch]
        if not chosen:
            raise ValueError(f"MessageRecorder: epoch {epoch!r} was not recorded; recorded "
                             f"epochs: {self.recorded_epochs}.")
        return chosen

    def _party(self, party, epoch):
        steps = self.steps(epoch)
        if party not in steps[0].parties:
            raise ValueError(f"MessageRecorder: no messages of party {party!r}; recorded "
                             f"parties: {sorted(steps[0].parties)} (the leader's own bottom "
                             "sends nothing).")
        return [s.parties[party] for s in steps]

    def embeddings(self, party: str, epoch: int | None = None) -> np.ndarray:
        """What ``party`` sent up, rows of all recorded steps concatenated."""
        return np.concatenate([m.embeddings for m in self._party(party, epoch)], axis=0)

    def cut_gradients(self, party: str, epoch: int | None = None) -> np.ndarray:
        """What the leader sent ``party`` (d loss / d embedding), rows concatenated."""
        return np.concatenate([m.gradients for m in self._party(party, epoch)], axis=0)

    def labels(self, epoch: int | None = None) -> np.ndarray:
        """True labels of the recorded rows (for evaluating attacks; never sent)."""
        return np.concatenate([s.evaluation.labels for s in self.steps(epoch)], axis=0)

    def noisy_labels(self, epoch: int | None = None) -> np.ndarray:
        """The labels the leader trained on (after label DP), rows concatenated."""
        return np.concatenate([s.evaluation.noisy_labels for s in self.steps(epoch)], axis=0)

    def example_ids(self, epoch: int | None = None) -> np.ndarray:
        """The ``"example_ids"`` of the recorded rows (error if the inputs had none)."""
        steps = self.steps(epoch)
        if any(s.evaluation.example_ids is None for s in steps):
            raise ValueError("MessageRecorder: the inputs had no 'example_ids' (see "
                             "keras_fedpriv.federated.with_example_ids).")
        return np.concatenate([s.evaluation.example_ids for s in steps], axis=0)

    def bytes_up(self, party: str | None = None, epoch: int | None = None) -> int:
        """Bytes sent up in the recorded steps (by ``party``, or all followers)."""
        steps = self.steps(epoch)
        return int(sum(m.bytes_up for s in steps for p, m in s.parties.items()
                       if party is None or p == party))

    def bytes_down(self, party: str | None = None, epoch: int | None = None) -> int:
        """Bytes sent down in the recorded steps (to ``party``, or all followers)."""
        steps = self.steps(epoch)
        return int(sum(m.bytes_down for s in steps for p, m in s.parties.items()
                       if party is None or p == party))


def is_tf_dataset(value: Any) -> bool:
    """Whether ``value`` is a `tf.data.Dataset` (never imports TensorFlow: a dataset exists
    only if TensorFlow was imported)."""
    tf = sys.modules.get("tensorflow")
    data = getattr(tf, "data", None)
    return data is not None and isinstance(value, data.Dataset)


def _num_rows(structure):
    sizes = {int(np.shape(a)[0]) for a in tree.flatten(structure)}
    if len(sizes) != 1:
        raise ValueError(f"with_example_ids: the arrays have different numbers of rows: "
                         f"{sorted(sizes)}.")
    return sizes.pop()


def _add_ids(x, ids):
    if not isinstance(x, dict):
        raise TypeError("with_example_ids: the features must be a dict keyed by party name; got "
                        f"{type(x).__name__}.")
    if EXAMPLE_IDS_KEY in x:
        raise ValueError(f"with_example_ids: the features already have an {EXAMPLE_IDS_KEY!r} "
                         "entry.")
    out = dict(x)
    out[EXAMPLE_IDS_KEY] = ids
    return out


def with_example_ids(data: Any, start: int = 0) -> Any:
    """Add unique int64 ``"example_ids"`` to a vertical model's inputs.

    `VerticalModel` with a `LabelDPLayer` randomizes each training label once:
    the noise is a function of (secret key, example id), so every epoch sees
    the same noisy label. The ids must identify examples, not batch
    positions: add them before shuffling.

    Args:
        data: one of
            * a dict of arrays keyed by party name (the features);
            * a tuple ``(features, labels[, sample_weight])`` of arrays;
            * a `tf.data.Dataset` of **unbatched** elements
              ``(features, labels[, ...])`` in a fixed order; apply this
              before ``shuffle``/``batch`` (ids are the element positions).
        start: the first id (ids are ``start, start + 1, ...``).

    Returns:
        The same kind of object with ``features["example_ids"]`` added.

    Example:
        >>> x = with_example_ids({"party_a": xa, "party_b": xb})
        >>> model.fit(x, y, epochs=5)   # Keras shuffles ids with their rows
        >>> ds = with_example_ids(tf.data.Dataset.from_tensor_slices((x, y)))
        >>> model.fit(ds.shuffle(1000).batch(32), epochs=5)
    """
    if isinstance(start, (bool, np.bool_)) or not isinstance(start, numbers.Integral) or start < 0:
        raise ValueError(f"with_example_ids: `start` must be an integer >= 0; got {start!r}.")
    if is_tf_dataset(data):
        import tensorflow as tf

        spec = data.element_spec
        features_spec = spec[0] if isinstance(spec, tuple) else spec
        if not isinstance(features_spec, dict):
            raise TypeError("with_example_ids: dataset elements must be (features, labels, ...) "
                            "with features a dict keyed by party name; got element_spec "
                            f"{spec!r}.")
        if any(s.shape.rank is not None and s.shape.rank >= 1 and s.shape[0] is None
               for s in tf.nest.flatten(features_spec)):
            raise ValueError("with_example_ids: the dataset looks batched (unknown leading "
                             "dimension); apply with_example_ids to unbatched elements, before "
                             ".shuffle() and .batch().")

        def add(position, element):
            ids = tf.cast(position, tf.int64) + start
            if isinstance(element, tuple):
                return (_add_ids(element[0], ids),) + tuple(element[1:])
            return _add_ids(element, ids)

        return data.enumerate().map(add, num_parallel_calls=tf.data.AUTOTUNE,
                                    deterministic=True)
    if isinstance(data, tuple):
        if not data:
            raise ValueError("with_example_ids: empty tuple.")
        n = _num_rows(data[0])
        ids = np.arange(start, start + n, dtype=np.int64)
        return (_add_ids(data[0], ids),) + tuple(data[1:])
    if isinstance(data, dict):
        n = _num_rows(data)
        return _add_ids(data, np.arange(start, start + n, dtype=np.int64))
    raise TypeError("with_example_ids: expected a dict of arrays, a tuple (features, labels, "
                    f"...) or a tf.data.Dataset; got {type(data).__name__}.")
