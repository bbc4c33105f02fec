"""The loop of leader-driven vertical FL over the party halves, whatever carries the messages.

The leader drives. An epoch's batches are known up front (`epoch_order`),
so the leader asks each follower for the embeddings of ``K`` batches in one
message (``batches_per_message``, K = 1: one message per batch, the
synchronous protocol) and sends their ``K`` cut gradients back with the next
message (or the last one). A follower applies the gradients it receives,
oldest first, then embeds the next ``K`` batches, all with the same bottom
weights: with K > 1 its embeddings are up to K - 1 steps stale, and each
gradient is applied as a delayed gradient (computed with the weights its
batch was embedded with, applied to the current ones). The leader's own
bottom and top are never stale. Every embedding is the same release for
any K: the ledgers count the same.

* `FollowerRequest` is one message to a follower (`to_arrays` /
  `from_arrays`: its wire arrays, checked strictly);
* `serve_request` is a follower's side of one request (every runtime);
* `run_leader` is the leader's loop, given an ``exchange`` function that
  carries one round of requests to the followers and brings their answers
  back (`keras_fedpriv.federated.vertical.driver.VerticalDriver` calls the
  followers in one process; `keras_fedpriv.federated.flower.vertical` sends
  Flower messages).

A reply that is not what the follower's `EmbeddingSpec` promises (other
arrays, number of batches, dtype or shape, nonzero padding bits, non-finite
floats), an error reply or a missing one is never used: the leader logs the
reason (never the data), records it in the result's ``rejected`` and skips
the message's batches (no party updates; the followers drop them, their
releases stay recorded).

Given the same seeds, data and K the loop is the same computation in every
runtime: the batches of epoch ``e`` are keyed by ``(seed, e)``, and every
party's randomness is its own (seeded layers).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from keras import tree

from keras_fedpriv.federated.vertical.follower import VerticalFollower
from keras_fedpriv.federated.vertical.leader import VerticalLeader
from keras_fedpriv.federated.vertical.wire import (
    MalformedMessage,
    encode_gradient,
    pack_batches,
    unpack_batches,
)
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed

__all__ = ["MAX_BATCHES_PER_MESSAGE", "Exchange", "FeatureTable", "FollowerRequest",
           "UntrainedEpoch", "VerticalRunResult", "epoch_order", "failure_reason", "run_leader",
           "serve_request", "validate_batches_per_message"]

logger = logging.getLogger("keras_fedpriv.vertical")

#: The most batches a follower serves in one message unless its operator allows more: it
#: bounds the follower's staleness (K - 1 steps) and the batches it keeps awaiting gradients.
MAX_BATCHES_PER_MESSAGE = 64

#: ``exchange(requests) -> replies``: one request per follower; a reply is the follower's
#: wire arrays (`pack_batches` of its embeddings; empty when nothing was asked) or a string
#: saying why there is none.
Exchange = Callable[[Mapping[str, "FollowerRequest"]], Mapping[str, Any]]


def validate_batches_per_message(value: Any, name: str = "batches_per_message",
                                 maximum: int | None = None) -> int:
    """``value`` as the number of batches per message: an int >= 1 (and <= ``maximum``).

    Args:
        value: the setting.
        name: its name, for the error text.
        maximum: None, or the largest allowed.

    Returns:
        The int.
    """
    k = validate_positive_int(value, name)
    if maximum is not None and k > maximum:
        raise ValueError(f"`{name}` must be an integer in [1, {maximum}]; got {value!r}.")
    return k


@dataclasses.dataclass
class FollowerRequest:
    """What the leader asks one follower in one message.

    Attributes:
        gradients: the cut gradients of the follower's training batches
            awaiting them, oldest first, as wire arrays (`encode_gradient`),
            or None (the leader skipped them: the follower drops them).
        example_ids: int64 ids of each batch to embed next (one array per
            batch), or None.
        training: whether those are training batches (gradients will
            follow) or inference ones (validation).
        epoch: the epoch (for logs).
        step: the epoch's step of the first batch (for logs).
        message: the leader's number of this message (from 1, one more per
            message it sends the follower in the run; 0: unnumbered). A
            follower never serves a numbered message that is not newer than
            the newest it served (an old or repeated message).
        answers: the number of the message whose batches ``gradients`` are
            for (0: unnumbered). A follower applies them only to the batches
            it embedded for that message; batches of any other message that
            await gradients are dropped (the leader skipped them).
    """

    gradients: list[dict[str, np.ndarray]] | None = None
    example_ids: list[np.ndarray] | None = None
    training: bool = True
    epoch: int = 0
    step: int = 0
    message: int = 0
    answers: int = 0

    def __post_init__(self) -> None:
        for name in ("gradients", "example_ids"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (list, tuple)):
                raise TypeError(f"FollowerRequest: `{name}` must be None or a list with one "
                                f"entry per batch; got {type(value).__name__}.")

    def to_arrays(self) -> tuple[dict[str, np.ndarray] | None, dict[str, np.ndarray] | None]:
        """The request's wire arrays: ``(ids, gradients)``, each `pack_batches` or None.

        Returns:
            ``ids``: ``{"<i>/ids": int64 (rows_i,)}``; ``gradients``:
            ``{"<i>/gradient": float (rows_i, ...)}``.
        """
        ids = None if self.example_ids is None else pack_batches(
            [{"ids": np.asarray(i, np.int64)} for i in self.example_ids])
        grads = None if self.gradients is None else pack_batches(self.gradients)
        return ids, grads

    @classmethod
    def from_arrays(cls, ids: Mapping[str, Any] | None, gradients: Mapping[str, Any] | None, *,
                    training: bool, max_batches: int = MAX_BATCHES_PER_MESSAGE, epoch: int = 0,
                    step: int = 0, message: int = 0, answers: int = 0) -> FollowerRequest:
        """The request of `to_arrays`' wire arrays, checked (shapes are checked when served).

        Args:
            ids: the ids arrays, or None.
            gradients: the gradient arrays, or None.
            training: training or inference batches.
            max_batches: the most batches either may hold.
            epoch: the epoch (for logs).
            step: the step (for logs).
            message: the message's number (0: unnumbered).
            answers: the number of the message the gradients are for.

        Returns:
            A `FollowerRequest`.

        Raises:
            MalformedMessage: more than ``max_batches`` batches, batches not
                numbered from 0, or a batch of ids that is not exactly
                ``{"ids": 1-D integers}``.
        """
        example_ids = None
        if ids is not None:
            example_ids = []
            for batch in unpack_batches(ids, "the ids message", max_count=max_batches):
                a = batch.get("ids")
                if set(batch) != {"ids"} or a.ndim != 1 or a.dtype.kind not in "iu":
                    raise MalformedMessage("every batch of the ids message must be exactly "
                                           "{'ids': 1-D integers}.")
                example_ids.append(a.astype(np.int64))
        grads = None if gradients is None else unpack_batches(
            gradients, "the gradient message", max_count=max_batches)
        for name, value in (("message", message), ("answers", answers)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                    not 0 <= value < 2**63:
                raise MalformedMessage(f"the request's {name!r} must be an integer in "
                                       "[0, 2**63).")
        return cls(grads, example_ids, bool(training), int(epoch), int(step), int(message),
                   int(answers))


class FeatureTable:
    """A party's features, looked up by example id.

    Args:
        x: the features (an array, or the bottom's input structure of arrays),
            one row per id.
        example_ids: the ids of the rows (unique integers); default
            ``0 .. rows - 1``.
    """

    def __init__(self, x: Any, example_ids: Any = None) -> None:
        flat = [np.asarray(a) for a in tree.flatten(x)]
        rows = {a.shape[0] if a.ndim else -1 for a in flat}
        if len(rows) != 1 or -1 in rows:
            raise ValueError("FeatureTable: `x` must hold arrays with the same number of rows.")
        n = rows.pop()
        self._x = tree.pack_sequence_as(x, flat)
        ids = np.arange(n, dtype=np.int64) if example_ids is None else np.asarray(example_ids)
        if ids.dtype.kind not in "iu" or ids.shape != (n,):
            raise ValueError(f"FeatureTable: `example_ids` must be {n} integers, one per row; got "
                             f"{ids.dtype} {ids.shape}.")
        ids = ids.astype(np.int64)
        order = np.argsort(ids, kind="stable")
        if n and np.any(ids[order][1:] == ids[order][:-1]):
            raise ValueError("FeatureTable: `example_ids` must be unique.")
        self._sorted, self._rows = ids[order], order

    def __len__(self) -> int:
        return int(self._sorted.size)

    def rows(self, example_ids: Any) -> Any:
        """The features of ``example_ids``, in that order.

        Raises:
            MalformedMessage: ids that are not integers, or unknown here.
        """
        ids = np.asarray(example_ids)
        if ids.dtype.kind not in "iu" or ids.ndim != 1:
            raise MalformedMessage("the requested example ids must be a 1-D integer array.")
        n = self._sorted.size
        at = np.minimum(np.searchsorted(self._sorted, ids), max(n - 1, 0))
        unknown = ids.size if n == 0 else int(np.sum(self._sorted[at] != ids))
        if ids.size and unknown:
            raise MalformedMessage(f"{unknown} requested example id(s) are unknown to this "
                                   "party.")
        index = self._rows[at]
        return tree.map_structure(lambda a: a[index], self._x)


def serve_request(follower: VerticalFollower, request: FollowerRequest,
                  features: FeatureTable, max_batches: int = MAX_BATCHES_PER_MESSAGE
                  ) -> dict[str, np.ndarray]:
    """A follower's side of one request: apply the gradients, then embed the next batches.

    Every gradient and every id is checked before anything is applied or
    embedded. A request without gradients while batches await theirs drops
    them (the leader skipped them). The batches are embedded one by one with
    the same weights, each a release recorded by the protection.

    Numbered requests (`run_leader` numbers its messages) resynchronize a
    follower with the leader after a lost message or a restart: a request
    not newer than the newest one served is refused (nothing applied,
    nothing embedded), and gradients that answer another message than the
    one whose batches are waiting are refused; waiting batches that the
    request does not answer are dropped (their releases stay recorded).

    Args:
        follower: the `VerticalFollower`.
        request: the leader's `FollowerRequest`.
        features: the follower's `FeatureTable`.
        max_batches: the most batches this follower serves in one message.

    Returns:
        The wire arrays of the embeddings (`pack_batches` of
        `VerticalFollower.embed`'s messages), ``{}`` when no batch was asked
        for.

    Raises:
        MalformedMessage: more batches than ``max_batches``, gradients that do
            not match the batches awaiting them (number, dtype, shape, finite)
            or unknown ids (nothing is applied, nothing embedded).
    """
    gradients, ids = request.gradients, request.example_ids
    for what, batches in (("gradients", gradients), ("batches of ids", ids)):
        if batches is not None and len(batches) > max_batches:
            raise MalformedMessage(f"the request holds {len(batches)} {what}; this follower "
                                   f"serves at most {max_batches} batches per message.")
    _check_order(follower, request)
    if gradients is not None:
        if len(gradients) != follower.pending_batches:
            raise MalformedMessage(f"the request holds {len(gradients)} gradients for "
                                   f"{follower.pending_batches} batches awaiting them.")
        for j, g in enumerate(gradients):
            follower.receive_gradient(g, j)  # every one checked before any is applied
    xs = [features.rows(i) for i in ids or []]  # every id too
    if request.message:
        follower.last_message = request.message
    if gradients is not None:
        for g in gradients:
            follower.apply_gradients(g)
    elif follower.pending:
        follower.discard()
    follower.pending_message = 0
    if not xs:
        return {}
    out = pack_batches([follower.embed(x, np.asarray(i, np.int64),
                                       training=bool(request.training), queue=True)
                        for x, i in zip(xs, ids)])
    if request.training:
        follower.pending_message = request.message
    return out


def _check_order(follower: VerticalFollower, request: FollowerRequest) -> None:
    """Refuse a numbered request that is old, or whose gradients answer other batches."""
    if request.message and request.message <= follower.last_message:
        raise MalformedMessage(f"message {request.message} is not newer than message "
                               f"{follower.last_message}, already served: an old or repeated "
                               "message is never served again.")
    if request.gradients is not None and request.answers != follower.pending_message and \
            (request.answers or follower.pending_message):
        held = (f"the batches awaiting gradients came from message {follower.pending_message}"
                if follower.pending else "no batch awaits a gradient")
        raise MalformedMessage(f"the gradients answer message {request.answers}, but {held}.")


class UntrainedEpoch(RuntimeError):
    """An epoch of `run_leader` in which every batch was skipped: the run stops."""


def _untrained(epoch: int, num_batches: int, rejected: Sequence[tuple[int, int, str, str]],
               name: Callable[[str], str]) -> str:
    """The text of `UntrainedEpoch`: the epoch (from 1), and each follower's last reason."""
    last: dict[str, str] = {}
    for e, _, party, reason in rejected:
        if e == epoch:
            last[party] = reason
    why = "; ".join(f"{name(p)}: {r}" for p, r in sorted(last.items())) or "no reason"
    return (f"epoch {epoch + 1} trained no step: all {num_batches} batches were skipped, as "
            f"the replies of some followers could not be used ({why}). The run stops rather "
            "than go on training nothing: bring the follower(s) named back, or look in their "
            "own logs for why they failed.")


def failure_reason(error: BaseException) -> str:
    """What a follower tells the leader about a request it failed to serve.

    A `MalformedMessage` says what was wrong with the request (its texts
    never hold values); any other error only its type: its message may
    quote the follower's data, which stays with the follower (log it there).
    """
    if isinstance(error, MalformedMessage):
        return f"MalformedMessage: {error}"
    return f"{type(error).__name__} (details stay with the follower)"


def epoch_order(seed: int | None, epoch: int, num_examples: int, shuffle: bool = True
                ) -> np.ndarray:
    """The order the leader visits its examples in ``epoch``.

    Keyed by ``(seed, epoch)`` (None: fresh OS entropy); ``shuffle=False``
    keeps the data's order.

    Returns:
        int64 positions, a permutation of ``range(num_examples)``.
    """
    if not shuffle:
        return np.arange(num_examples, dtype=np.int64)
    rng = np.random.default_rng(None if seed is None else [int(seed), int(epoch)])
    return rng.permutation(num_examples).astype(np.int64)


@dataclasses.dataclass
class VerticalRunResult:
    """What a leader-driven run leaves.

    Attributes:
        leader: the `VerticalLeader` (its top, and its own bottom, trained).
        history: per-epoch logs: ``loss`` (the leader's, mean over the epoch's
            examples), ``steps`` and ``skipped`` batches, ``reasked`` (batches
            asked again after a message whose replies could not be used: see
            `run_leader`'s ``retry``), ``bytes_up`` /
            ``bytes_down`` (payload bytes of the training messages, all
            followers; ``bytes_up_<party>``, ``bytes_down_<party>`` each) and
            with validation data ``val_loss`` and ``val_<metric>`` (NaN for an
            epoch whose validation replies were refused: one entry per epoch
            for every figure); runtimes
            may add their own (Flower: ``wire_bytes_up``, ``wire_bytes_down``,
            ``epoch_time_s``).
        rejected: ``(epoch, step, party, reason)`` of every reply not used
            (``step``: the first step the message asked for, -1: a validation
            request; ``epoch`` equal to the number
            of epochs: the request carrying the last gradients).
        wire: follower -> what its accepted training replies held: array
            ``keys``, ``dtype`` and ``bytes_per_example`` (the first reply).
    """

    leader: VerticalLeader
    history: dict[str, list[float]]
    rejected: list[tuple[int, int, str, str]]
    wire: dict[str, dict[str, Any]]

    def privacy_ledger(self) -> Any:
        """The leader's record of what it sent without DP (see `VerticalLeader`)."""
        return self.leader.privacy_ledger()

    def privacy_protections(self) -> list[Any]:
        """The leader's layers (``label_dp``'s ledger)."""
        return self.leader.privacy_protections()


def _nbytes(arrays):
    """Payload bytes of a reply's numpy arrays (anything else in it is refused, not counted)."""
    return int(sum(a.nbytes for a in arrays.values() if isinstance(a, np.ndarray)))


def _batches(n, batch_size):
    return [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]


def _take(x, index):
    return None if x is None else tree.map_structure(lambda a: np.asarray(a)[index], x)


def run_leader(leader: VerticalLeader, exchange: Exchange, example_ids: Any, y: Any,
               x: Any = None, *, epochs: int = 1, batch_size: int = 32,
               batches_per_message: int = 1, seed: int | None = None, shuffle: bool = True,
               validation_data: tuple[Any, Any, Any] | None = None,
               validation_batch_size: int = 256,
               on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
               stop_when_untrained: bool = False,
               describe: Callable[[str], str] | None = None,
               retry: Callable[[], bool] | None = None) -> VerticalRunResult:
    """The leader's loop: epochs of batches, ``batches_per_message`` per round trip.

    Args:
        leader: the `VerticalLeader`.
        exchange: carries one request per follower and returns their replies
            (wire arrays, or a string: why there is no usable reply).
        example_ids: the training examples' ids (integers, one per label).
        y: the training labels.
        x: the leader's own features (rows aligned with ``y``), or None.
        epochs: number of epochs.
        batch_size: examples per step.
        batches_per_message: K, the batches each message to a follower asks
            for (and whose gradients the next one carries); 1: synchronous.
            With K > 1 a follower's embeddings are up to K - 1 steps stale.
            A message never spans two epochs; validation requests group K
            batches too.
        seed: keys the batch order (`epoch_order`); None: fresh entropy.
        shuffle: reshuffle every epoch (else the data's order).
        validation_data: None or ``(example_ids, y, x)`` (``x`` None
            without a leader bottom): scored after every epoch from the
            followers' inference embeddings (each a release, recorded by its
            protection).
        validation_batch_size: examples per validation batch.
        on_epoch_end: called with ``(epoch, logs)`` after every epoch
            (``epoch`` from 0, as Keras callbacks; the log lines count epochs
            and steps from 1).
        stop_when_untrained: raise `UntrainedEpoch` after an epoch in which
            every batch was skipped (no training step), instead of going on.
        describe: how log lines and errors name a follower (default
            ``follower 'f1'``; the Flower leader adds the node id).
        retry: None, or called after a training message whose replies could
            not all be used; True (the followers that were missing are back)
            asks that message's batches once more, as a new numbered message
            without gradients: the followers embed them again with fresh
            noise, each embedding a release they count (the first one
            included, if it was made). The Flower leader passes its roster's
            wait for missing followers, so an epoch sent as one message
            still trains when a reply was lost.

    Every message to a follower is numbered (`FollowerRequest.message`, from
    1) and gradients name the message whose batches they are for
    (``answers``), so a follower that lost or repeated a message, or came
    back from a restart, drops what the leader skipped and never applies a
    gradient to another batch than its own.

    Returns:
        A `VerticalRunResult`.

    Raises:
        UntrainedEpoch: with ``stop_when_untrained``, an epoch trained
            nothing; the message names the followers whose replies were not
            used and why.
    """
    epochs = validate_positive_int(epochs, "epochs")
    batch_size = validate_positive_int(batch_size, "batch_size")
    k = validate_batches_per_message(batches_per_message)
    validation_batch_size = validate_positive_int(validation_batch_size,
                                                  "validation_batch_size")
    seed = validate_seed(seed)
    if not isinstance(shuffle, bool):
        raise TypeError(f"`shuffle` must be a bool; got {shuffle!r}.")
    y = np.asarray(y)
    ids = np.asarray(example_ids)
    if ids.dtype.kind not in "iu" or ids.shape != (len(y),):
        raise ValueError(f"run_leader: `example_ids` must be {len(y)} integers, one per label; "
                         f"got {ids.dtype} {ids.shape}.")
    ids = ids.astype(np.int64)
    if x is not None and {np.shape(a)[0] for a in tree.flatten(x)} != {len(y)}:
        raise ValueError("run_leader: `x` must have one row per label.")
    name = describe if describe is not None else (lambda p: f"follower {p!r}")
    run = _LeaderRun(leader, exchange, name=name, retry=retry, batch_size=batch_size,
                     batches_per_message=k, validation_batch_size=validation_batch_size)
    return run.run(ids, y, x, epochs=epochs, seed=seed, shuffle=shuffle,
                   validation_data=validation_data, on_epoch_end=on_epoch_end,
                   stop_when_untrained=stop_when_untrained)


class _LeaderRun:
    """One run of `run_leader`: its state in one place, one method per part of the loop.

    State: the ``history``, ``rejected`` replies and ``wire`` of the result;
    ``pending``, the cut gradients awaiting the next message (follower -> one
    wire message per batch; None: none, the followers drop theirs); ``sent``,
    the number of the last message, and ``pending_number``, that of the
    message whose batches ``pending`` answers.
    """

    def __init__(self, leader: VerticalLeader, exchange: Exchange, *,
                 name: Callable[[str], str], retry: Callable[[], bool] | None,
                 batch_size: int, batches_per_message: int, validation_batch_size: int) -> None:
        self.leader = leader
        self.exchange = exchange
        self.name = name
        self.retry = retry
        self.batch_size = batch_size
        self.k = batches_per_message
        self.validation_batch_size = validation_batch_size
        self.followers = list(leader.follower_specs)
        self.history: dict[str, list[float]] = {}
        self.rejected: list[tuple[int, int, str, str]] = []
        self.wire: dict[str, dict[str, Any]] = {}
        self.pending: dict[str, list[dict[str, np.ndarray]]] | None = None
        self.sent = 0
        self.pending_number = 0

    def run(self, ids: np.ndarray, y: np.ndarray, x: Any, *, epochs: int, seed: int | None,
            shuffle: bool, validation_data: tuple[Any, Any, Any] | None,
            on_epoch_end: Callable[[int, dict[str, float]], None] | None,
            stop_when_untrained: bool) -> VerticalRunResult:
        """Every epoch (trained, then scored), then the last gradients."""
        for epoch in range(epochs):
            order = epoch_order(seed, epoch, len(y), shuffle)
            logs, steps, num_batches = self.train_epoch(epoch, order, ids, y, x)
            if validation_data is not None and not steps:
                # nothing trained: the model is the one last scored; no release is spent on it
                logs.update(_unmeasured(self.leader))
            elif validation_data is not None:
                # the first validation request also carries the epoch's last gradients
                logs.update(self.validate(validation_data, epoch))
                self.pending = None
            for key, v in logs.items():
                self.history.setdefault(key, []).append(float(v))
            logger.info("epoch %d: %s", epoch + 1, {key: round(v, 4) for key, v in logs.items()})
            if on_epoch_end is not None:
                on_epoch_end(epoch, logs)
            if stop_when_untrained and not steps:
                raise UntrainedEpoch(_untrained(epoch, num_batches, self.rejected, self.name))
        self.send_last_gradients(epochs)
        return VerticalRunResult(self.leader, self.history, self.rejected, self.wire)

    # -- messages ---------------------------------------------------------------------------
    def number(self, requests: dict[str, FollowerRequest]) -> dict[str, FollowerRequest]:
        """Number a round of requests (one more than the last), and name what they answer."""
        self.sent += 1
        for request in requests.values():
            request.message = self.sent
            request.answers = self.pending_number if request.gradients is not None else 0
        return requests

    def ask(self, requests: dict[str, FollowerRequest], epoch: int, step: int,
            rows: Sequence[int], training: bool) -> tuple[Mapping[str, Any], Any]:
        """One round trip; the replies, and the decoded embeddings per batch or None (reasons
        logged and kept in ``rejected``)."""
        replies = self.exchange(self.number(requests))
        received, reasons = {}, {}
        for p in self.followers:
            reply = replies.get(p, "no reply")
            if isinstance(reply, str):
                reasons[p] = reply
                continue
            try:
                batches = unpack_batches(reply, "the embedding message", count=len(rows))
                received[p] = [self.leader.receive(p, b, n) for b, n in zip(batches, rows)]
            except MalformedMessage as error:
                reasons[p] = f"malformed reply: {error}"
                continue
            if training and p not in self.wire:
                first = batches[0]
                self.wire[p] = {"keys": sorted(first),
                                "dtype": str(next(iter(first.values())).dtype),
                                "bytes_per_example": _nbytes(first) // max(rows[0], 1)}
        for p, reason in reasons.items():
            logger.warning("epoch %d %s: the reply of %s was not used: %s",
                           epoch + 1, "validation" if step < 0 else f"step {step + 1}",
                           self.name(p), reason)
            self.rejected.append((epoch, step, p, reason))
        return replies, (None if reasons else received)

    def _ask_counted(self, requests: dict[str, FollowerRequest], epoch: int, step: int,
                     rows: Sequence[int], up: dict[str, int]) -> Any:
        """`ask` for training batches, adding the replies' payload bytes to ``up``."""
        replies, received = self.ask(requests, epoch, step, rows, True)
        for p in self.followers:
            if isinstance(replies.get(p), Mapping):
                up[p] += _nbytes(replies[p])
        return received

    # -- training -----------------------------------------------------------------------------
    def train_epoch(self, epoch: int, order: np.ndarray, ids: np.ndarray, y: np.ndarray,
                    x: Any) -> tuple[dict[str, float], int, int]:
        """One epoch's messages; its logs, the steps trained and the number of batches."""
        totals = {"loss": 0.0, "rows": 0, "steps": 0, "skipped": 0, "reasked": 0}
        up = {p: 0 for p in self.followers}
        down = {p: 0 for p in self.followers}
        batches = _batches(len(y), self.batch_size)
        for first in range(0, len(batches), self.k):
            index = [order[a:b] for a, b in batches[first:first + self.k]]
            self.train_message(epoch, first, index, ids, y, x, totals, up, down)
        logs = {"loss": totals["loss"] / totals["rows"] if totals["rows"] else float("nan"),
                "steps": float(totals["steps"]), "skipped": float(totals["skipped"]),
                "reasked": float(totals["reasked"]),
                "bytes_up": float(sum(up.values())), "bytes_down": float(sum(down.values()))}
        for p in self.followers:
            logs[f"bytes_up_{p}"] = float(up[p])
            logs[f"bytes_down_{p}"] = float(down[p])
        return logs, totals["steps"], len(batches)

    def train_message(self, epoch: int, first: int, index: list[np.ndarray], ids: np.ndarray,
                      y: np.ndarray, x: Any, totals: dict[str, Any], up: dict[str, int],
                      down: dict[str, int]) -> None:
        """One message of K batches: ask (once more after a lost reply, if ``retry`` says the
        followers are back), then step once per batch and keep the cut gradients."""
        group_ids = [ids[i] for i in index]
        rows = [len(i) for i in index]
        requests = {p: FollowerRequest(
            gradients=None if self.pending is None else self.pending[p], example_ids=group_ids,
            training=True, epoch=epoch, step=first) for p in self.followers}
        received = self._ask_counted(requests, epoch, first, rows, up)
        if received is None and self.retry is not None and self.retry():
            totals["reasked"] += len(index)
            # no gradients: those of the last message went with the unanswered one
            again = {p: FollowerRequest(example_ids=group_ids, training=True, epoch=epoch,
                                        step=first) for p in self.followers}
            received = self._ask_counted(again, epoch, first, rows, up)
        if received is None:
            self.pending = None
            totals["skipped"] += len(index)
            return
        self.pending = {p: [] for p in self.followers}
        self.pending_number = self.sent
        for j, batch in enumerate(index):
            cut, logs = self.leader.step({p: received[p][j] for p in self.followers}, y[batch],
                                         group_ids[j], _take(x, batch))
            for p in self.followers:  # sent with the next request (or the last one)
                self.pending[p].append(encode_gradient(cut[p], self.leader.follower_specs[p]))
                down[p] += _nbytes(self.pending[p][-1])
            totals["loss"] += logs["loss"] * len(batch)
            totals["rows"] += len(batch)
            totals["steps"] += 1

    def send_last_gradients(self, epochs: int) -> None:
        """The last gradients: no batch asked, no embedding expected."""
        if self.pending is None:
            return
        replies = self.exchange(self.number({p: FollowerRequest(
            gradients=self.pending[p], epoch=epochs, step=0) for p in self.followers}))
        for p in self.followers:
            reply = replies.get(p, "no reply")
            if isinstance(reply, str) or reply:
                reason = reply if isinstance(reply, str) else "an embedding nobody asked for"
                logger.warning("the last gradients of %s: %s", self.name(p), reason)
                self.rejected.append((epochs, 0, p, reason))

    # -- validation ---------------------------------------------------------------------------
    def validate(self, data: tuple[Any, Any, Any], epoch: int) -> dict[str, float]:
        """Score ``data`` from the followers' inference embeddings (NaN if a reply failed)."""
        ids, y, x = data
        ids = np.asarray(ids, np.int64)
        y = np.asarray(y)
        parts: dict[str, list[np.ndarray]] = {p: [] for p in self.followers}
        batches = _batches(len(ids), self.validation_batch_size)
        for first in range(0, len(batches), self.k):
            group = [ids[a:b] for a, b in batches[first:first + self.k]]
            requests = {p: FollowerRequest(
                gradients=self.pending[p] if self.pending is not None and first == 0 else None,
                example_ids=group, training=False, epoch=epoch, step=first)
                for p in self.followers}
            # the gradients ride only on the first request; `ask` numbers them
            _, received = self.ask(requests, epoch, -1, [len(g) for g in group], False)
            if received is None:
                return _unmeasured(self.leader)
            for p in self.followers:
                parts[p].extend(received[p])
        received = {p: np.concatenate(parts[p], axis=0) for p in self.followers}
        return {f"val_{key}": v for key, v in self.leader.evaluate(received, y, x).items()}


def _unmeasured(leader):
    """The validation logs of an epoch not scored: NaN, so every figure has one per epoch."""
    return {f"val_{key}": float("nan") for key in ["loss"] + [m.name for m in leader.metrics]}
