"""Leader-driven vertical FL over the party halves, whatever carries the messages.

The leader drives: for every batch it sends each follower one request (the
cut gradient of the follower's previous batch, if any, and the example ids of
the next batch); each follower applies the gradient, embeds the batch and
answers with its protected embedding; the leader checks every answer, steps
and keeps the new cut gradients for the next request. After the last batch
one more request carries the last gradients.

* `serve_request` is a follower's side of one request (used by every
  runtime);
* `run_leader` is the leader's loop, given an ``exchange`` function that
  carries one round of requests to the followers and brings their answers
  back (`VerticalDriver` calls the followers in this process; the Flower
  ServerApp of `keras_fedpriv.federated.flower_vertical` sends Flower
  messages);
* `VerticalDriver` runs the halves in one process.

A reply that is not what the follower's `EmbeddingSpec` promises (other
arrays, dtype or shape, nonzero padding bits, non-finite floats), an error
reply or a missing one is never used: the leader logs the reason (never the
data), records it in the result's ``rejected`` and skips the batch (no party
updates; the followers drop the batch, whose release stays recorded).

Given the same seeds and data the loop is the same computation in every
runtime: the batches of epoch ``e`` are keyed by ``(seed, e)``
(`epoch_order`), and every party's randomness is its own (seeded layers).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Mapping

import numpy as np
from keras import tree

from keras_fedpriv.federated.vertical_parties import (
    MalformedMessage,
    VerticalFollower,
    VerticalLeader,
    VerticalParties,
    encode_gradient,
)
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed

__all__ = ["FeatureTable", "FollowerRequest", "VerticalDriver", "VerticalRunResult",
           "epoch_order", "failure_reason", "run_leader", "serve_request"]

logger = logging.getLogger("keras_fedpriv.vertical")

#: ``exchange(requests) -> replies``: one request per follower; a reply is the follower's
#: wire arrays (an empty dict when nothing was asked) or a string saying why there is none.
Exchange = Callable[[Mapping[str, "FollowerRequest"]], Mapping[str, Any]]


@dataclasses.dataclass
class FollowerRequest:
    """What the leader asks one follower in one message.

    Attributes:
        gradient: the cut gradient of the follower's last training batch, as
            wire arrays (`encode_gradient`), or None.
        example_ids: int64 ids of the next batch to embed, or None.
        training: whether that batch is a training batch (a gradient will
            follow) or an inference one (validation).
        epoch: the epoch (for logs).
        step: the step within the epoch (for logs).
    """

    gradient: dict[str, np.ndarray] | None = None
    example_ids: np.ndarray | None = None
    training: bool = True
    epoch: int = 0
    step: int = 0


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
                  features: FeatureTable) -> dict[str, np.ndarray]:
    """A follower's side of one request: apply the gradient, then embed the next batch.

    A request without a gradient while a batch awaits one drops that batch
    (the leader skipped it).

    Args:
        follower: the `VerticalFollower`.
        request: the leader's `FollowerRequest`.
        features: the follower's `FeatureTable`.

    Returns:
        The wire arrays of the embedding (`VerticalFollower.embed`), or ``{}``
        when no batch was asked for.

    Raises:
        MalformedMessage: a malformed gradient or ids (nothing is applied).
    """
    if request.gradient is not None:
        follower.apply_gradients(request.gradient)
    elif follower.pending:
        follower.discard()
    if request.example_ids is None:
        return {}
    x = features.rows(request.example_ids)
    return follower.embed(x, np.asarray(request.example_ids, np.int64),
                          training=bool(request.training))


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
            examples), ``steps`` and ``skipped`` batches, ``bytes_up`` /
            ``bytes_down`` (payload bytes of the training messages, all
            followers; ``bytes_up_<party>``, ``bytes_down_<party>`` each) and
            with validation data ``val_loss`` and ``val_<metric>``; runtimes
            may add their own (Flower: ``wire_bytes_up``, ``wire_bytes_down``,
            ``epoch_time_s``).
        rejected: ``(epoch, step, party, reason)`` of every reply not used
            (``step`` -1: a validation request; ``epoch`` equal to the number
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
    return int(sum(np.asarray(a).nbytes for a in arrays.values()))


def _batches(n, batch_size):
    return [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]


def _take(x, index):
    return None if x is None else tree.map_structure(lambda a: np.asarray(a)[index], x)


def run_leader(leader: VerticalLeader, exchange: Exchange, example_ids: Any, y: Any,
               x: Any = None, *, epochs: int = 1, batch_size: int = 32,
               seed: int | None = None, shuffle: bool = True,
               validation_data: tuple[Any, Any, Any] | None = None,
               validation_batch_size: int = 256,
               on_epoch_end: Callable[[int, dict[str, float]], None] | None = None
               ) -> VerticalRunResult:
    """The leader's loop: epochs of batches, each one round trip to every follower.

    Args:
        leader: the `VerticalLeader`.
        exchange: carries one request per follower and returns their replies
            (wire arrays, or a string: why there is no usable reply).
        example_ids: the training examples' ids (integers, one per label).
        y: the training labels.
        x: the leader's own features (rows aligned with ``y``), or None.
        epochs: number of epochs.
        batch_size: examples per step.
        seed: keys the batch order (`epoch_order`); None: fresh entropy.
        shuffle: reshuffle every epoch (else the data's order).
        validation_data: None or ``(example_ids, y, x)`` (``x`` None
            without a leader bottom): scored after every epoch from the
            followers' inference embeddings (each a release, recorded by its
            protection).
        validation_batch_size: examples per validation request.
        on_epoch_end: called with ``(epoch, logs)`` after every epoch.

    Returns:
        A `VerticalRunResult`.
    """
    epochs = validate_positive_int(epochs, "epochs")
    batch_size = validate_positive_int(batch_size, "batch_size")
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
    followers = list(leader.follower_specs)
    history: dict[str, list[float]] = {}
    rejected: list[tuple[int, int, str, str]] = []
    wire: dict[str, dict[str, Any]] = {}
    pending: dict[str, dict[str, np.ndarray]] | None = None

    def ask(requests, epoch, step, rows, training):
        """One round trip; the decoded embeddings, or None (reasons logged)."""
        replies = exchange(requests)
        received, reasons = {}, {}
        for p in followers:
            reply = replies.get(p, "no reply")
            if isinstance(reply, str):
                reasons[p] = reply
                continue
            try:
                received[p] = leader.receive(p, reply, rows)
            except MalformedMessage as error:
                reasons[p] = f"malformed reply: {error}"
                continue
            if training and p not in wire:
                wire[p] = {"keys": sorted(reply), "dtype": str(next(iter(reply.values())).dtype),
                           "bytes_per_example": _nbytes(reply) // max(rows, 1)}
        for p, reason in reasons.items():
            logger.warning("epoch %d step %d: the reply of follower %r was not used: %s",
                           epoch, step, p, reason)
            rejected.append((epoch, step, p, reason))
        return replies, (None if reasons else received)

    for epoch in range(epochs):
        order = epoch_order(seed, epoch, len(y), shuffle)
        totals = {"loss": 0.0, "rows": 0, "steps": 0, "skipped": 0}
        up = {p: 0 for p in followers}
        down = {p: 0 for p in followers}
        for step, (start, stop) in enumerate(_batches(len(y), batch_size)):
            index = order[start:stop]
            batch_ids = ids[index]
            requests = {p: FollowerRequest(gradient=None if pending is None else pending[p],
                                           example_ids=batch_ids, training=True, epoch=epoch,
                                           step=step) for p in followers}
            replies, received = ask(requests, epoch, step, len(index), True)
            for p in followers:
                if isinstance(replies.get(p), Mapping):
                    up[p] += _nbytes(replies[p])
            if received is None:
                pending = None
                totals["skipped"] += 1
                continue
            cut, logs = leader.step(received, y[index], batch_ids, _take(x, index))
            pending = {p: encode_gradient(cut[p], leader.follower_specs[p]) for p in followers}
            for p in followers:  # sent with the next request (or the last one)
                down[p] += _nbytes(pending[p])
            totals["loss"] += logs["loss"] * len(index)
            totals["rows"] += len(index)
            totals["steps"] += 1
        logs = {"loss": totals["loss"] / totals["rows"] if totals["rows"] else float("nan"),
                "steps": float(totals["steps"]), "skipped": float(totals["skipped"]),
                "bytes_up": float(sum(up.values())), "bytes_down": float(sum(down.values()))}
        for p in followers:
            logs[f"bytes_up_{p}"] = float(up[p])
            logs[f"bytes_down_{p}"] = float(down[p])
        if validation_data is not None:
            # the first validation request also carries the epoch's last gradients
            logs.update(_validate(leader, ask, followers, pending, validation_data,
                                  validation_batch_size, epoch))
            pending = None
        for k, v in logs.items():
            history.setdefault(k, []).append(float(v))
        logger.info("epoch %d: %s", epoch, {k: round(v, 4) for k, v in logs.items()})
        if on_epoch_end is not None:
            on_epoch_end(epoch, logs)
    if pending is not None:  # the last gradients: no batch asked, no embedding expected
        replies = exchange({p: FollowerRequest(gradient=pending[p], epoch=epochs, step=0)
                            for p in followers})
        for p in followers:
            reply = replies.get(p, "no reply")
            if isinstance(reply, str) or reply:
                reason = reply if isinstance(reply, str) else "an embedding nobody asked for"
                logger.warning("the last gradients of follower %r: %s", p, reason)
                rejected.append((epochs, 0, p, reason))
    return VerticalRunResult(leader, history, rejected, wire)


def _validate(leader, ask, followers, pending, data, batch_size, epoch):
    ids, y, x = data
    ids = np.asarray(ids, np.int64)
    y = np.asarray(y)
    parts = {p: [] for p in followers}
    for step, (start, stop) in enumerate(_batches(len(ids), batch_size)):
        requests = {p: FollowerRequest(gradient=(pending[p] if pending is not None and step == 0
                                                 else None),
                                       example_ids=ids[start:stop], training=False,
                                       epoch=epoch, step=step) for p in followers}
        _, received = ask(requests, epoch, -1, stop - start, False)
        if received is None:
            return {"val_loss": float("nan")}
        for p in followers:
            parts[p].append(received[p])
    received = {p: np.concatenate(parts[p], axis=0) for p in followers}
    return {f"val_{k}": v for k, v in leader.evaluate(received, y, x).items()}


class VerticalDriver:
    """Runs the halves of vertical FL in one process, leader-driven (`run_leader`).

    Every message goes through the same encoding and checks as across
    processes: followers answer with wire arrays, the leader decodes and
    checks them, cut gradients go back encoded.

    Args:
        parties: a `VerticalParties` (e.g. ``model.split_parties()``).
        follower_data: follower name -> its features: an array (rows are
            example ids ``0 .. n-1``), or ``(example_ids, x)``, or a
            `FeatureTable`. Include the rows of validation examples.

    Example:
        >>> parties = model.split_parties()
        >>> driver = VerticalDriver(parties, {"party_a": (ids, xa)})
        >>> result = driver.fit(y, example_ids=ids, x=xb, epochs=5, batch_size=64, seed=0)
        >>> result.history["loss"]
    """

    def __init__(self, parties: VerticalParties, follower_data: Mapping[str, Any]) -> None:
        if not isinstance(parties, VerticalParties):
            raise TypeError(f"VerticalDriver: `parties` must be a VerticalParties (e.g. "
                            f"model.split_parties()); got {type(parties).__name__}.")
        self.parties = parties
        if not isinstance(follower_data, Mapping):
            raise TypeError("VerticalDriver: `follower_data` must be a dict follower name -> "
                            f"features; got {type(follower_data).__name__}.")
        names = set(parties.followers)
        if set(follower_data) != names:
            raise ValueError(f"VerticalDriver: `follower_data` must have exactly the followers "
                             f"{sorted(names)}; got {sorted(follower_data)}.")
        self.tables = {}
        for p, data in follower_data.items():
            if isinstance(data, FeatureTable):
                self.tables[p] = data
            elif isinstance(data, tuple) and len(data) == 2:
                self.tables[p] = FeatureTable(data[1], data[0])
            else:
                self.tables[p] = FeatureTable(data)

    def exchange(self, requests: Mapping[str, FollowerRequest]) -> dict[str, Any]:
        """Serve every request in this process; a failure becomes a reason (`failure_reason`)."""
        replies = {}
        for p in sorted(requests):
            try:
                replies[p] = serve_request(self.parties.followers[p], requests[p], self.tables[p])
            except Exception as error:  # what a follower process would answer
                logger.debug("follower %r failed to serve a request", p, exc_info=True)
                replies[p] = f"error reply: {failure_reason(error)}"
        return replies

    def fit(self, y: Any, *, example_ids: Any = None, x: Any = None, epochs: int = 1,
            batch_size: int = 32, seed: int | None = None, shuffle: bool = True,
            validation_data: tuple[Any, Any, Any] | None = None,
            validation_batch_size: int = 256) -> VerticalRunResult:
        """Train the halves (see `run_leader` for the arguments).

        Args:
            y: the training labels (held by the leader).
            example_ids: their ids (default ``0 .. len(y) - 1``).
            x: the leader's own features, or None.
            epochs, batch_size, seed, shuffle, validation_data,
                validation_batch_size: as in `run_leader`.

        Returns:
            A `VerticalRunResult` (with ``epoch_time_s`` in the history).
        """
        if example_ids is None:
            example_ids = np.arange(len(np.asarray(y)), dtype=np.int64)
        started = [time.perf_counter()]
        times: list[float] = []

        def clock(epoch, logs):
            now = time.perf_counter()
            times.append(now - started[0])
            started[0] = now

        result = run_leader(self.parties.leader, self.exchange, example_ids, y, x,
                            epochs=epochs, batch_size=batch_size, seed=seed, shuffle=shuffle,
                            validation_data=validation_data,
                            validation_batch_size=validation_batch_size, on_epoch_end=clock)
        result.history["epoch_time_s"] = times
        return result

    def privacy_protections(self) -> list[Any]:
        """Every half (so `privacy_report(driver)` composes what each party recorded)."""
        return self.parties.privacy_protections()
