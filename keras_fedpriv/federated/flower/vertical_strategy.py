"""The vertical leader on Flower as one class, `VerticalStrategy` (the mirror of `HorizontalStrategy`).

The leader drives the run (Flower's vertical pattern): its loop is
`keras_fedpriv.federated.vertical.loop.run_leader`, exactly what
`VerticalDriver` runs in one process. This class only carries the loop's
requests as Flower messages and brings the replies back: it finds the
followers' nodes (`FollowerRoster`), builds each request's message from the
records of `keras_fedpriv.federated.vertical.wire`, reads each reply there
(within its byte limit, before anything is deserialized), counts the bytes on
the wire and ends the run. `vertical_server_app` builds one per run; a user's
own ``ServerApp`` can too::

    strategy = VerticalStrategy(leader, epochs=3, batch_size=64)
    result = strategy.start(grid, (example_ids, x, y), run_config=context.run_config)

State lives in one place: the settings (``self``), the run's settings after
the run config's overrides (`VerticalRunSettings`), and, while a run is in
progress, its roster and traffic counts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from typing import Any, Callable, Mapping

import numpy as np

# (without Flower, the package keras_fedpriv.federated.flower refuses to import first, saying
# how to install it)
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from keras_fedpriv.federated.flower.common import (
    first_line,
    message_nbytes,
    wait_for_nodes,
)
from keras_fedpriv.federated.flower.vertical_roster import (
    PIN_KEY,
    FollowerGone,
    FollowerRoster,
)
from keras_fedpriv.federated.records import arrays_record, checked_arrays
from keras_fedpriv.federated.vertical import wire
from keras_fedpriv.federated.vertical.leader import VerticalLeader
from keras_fedpriv.federated.vertical.loop import (
    FollowerRequest,
    UntrainedEpoch,
    VerticalRunResult,
    run_leader,
    validate_batches_per_message,
)
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed

__all__ = ["VerticalRunSettings", "VerticalStrategy", "positive_seconds", "write_result"]

logger = logging.getLogger("keras_fedpriv.flower")

#: what the history adds to the leader's logs: Flower's message bytes and each epoch's time
WIRE_LOGS = ("wire_bytes_up", "wire_bytes_down", "epoch_time_s")


def positive_seconds(value: Any, name: str) -> float:
    """``value`` as a finite number of seconds > 0 (a ValueError naming ``name`` if not).

    Example:
        >>> positive_seconds("2.5", "poll_interval")
        2.5
    """
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not 0 < seconds < float("inf"):
        raise ValueError(f"`{name}` must be a number of seconds > 0; got {value!r}.")
    return seconds


@dataclasses.dataclass(frozen=True)
class VerticalRunSettings:
    """One run's settings: the strategy's, after the run config's overrides.

    Attributes:
        epochs: ``num-epochs``.
        batch_size: ``batch-size``.
        batches_per_message: ``batches-per-message`` (K).
        round_timeout: ``round-timeout``, seconds.
        follower_deadline: ``follower-deadline``, seconds.
        pins: follower -> the only node id that may be it (``party_nodes`` and
            the ``party-node.<party>`` keys).
    """

    epochs: int
    batch_size: int
    batches_per_message: int
    round_timeout: float
    follower_deadline: float
    pins: dict[str, int]


def _pins(party_nodes: Mapping[str, Any] | None, run_config: Mapping[str, Any],
          leader: VerticalLeader) -> dict[str, int]:
    """Party -> node id: ``party_nodes`` and the run config's ``party-node.<party>`` keys.

    An empty string (the placeholder an app's pyproject declares, so that
    ``flwr run --run-config`` may set the key) pins nothing.
    """
    pins: dict[str, int] = {}
    given = [(f"`party_nodes`[{p!r}]", p, n) for p, n in dict(party_nodes or {}).items()]
    given += [(f"run config {k!r}", k[len(PIN_KEY):], v) for k, v in run_config.items()
              if str(k).startswith(PIN_KEY)]
    for where, party, value in given:
        if isinstance(value, str) and not value.strip():
            continue
        if party not in leader.follower_specs:
            raise ValueError(f"{where} pins {party!r}, which is not a follower of this leader "
                             f"(followers: {sorted(leader.follower_specs)}).")
        node = value
        if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
            node = int(value.strip())
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)) or \
                not 1 <= node < 2**64:
            raise ValueError(f"{where} must be a Flower node id (an integer in [1, 2**64), or "
                             f"its decimal string; \"\" pins nothing); got {value!r}.")
        if pins.get(party, int(node)) != int(node):
            raise ValueError(f"{where} pins {party!r} to node {int(node)}, but it is already "
                             f"pinned to node {pins[party]}.")
        pins[party] = int(node)
    return pins


def request_message(request: FollowerRequest, node: int) -> Message:
    """The Flower message of one `FollowerRequest` to ``node`` (records of the vertical wire)."""
    content = RecordDict({wire.CONFIG: ConfigRecord(wire.request_numbers(request))})
    ids, gradients = request.to_arrays()
    if ids is not None:
        content[wire.IDS] = arrays_record(ids)
    if gradients is not None:
        content[wire.GRADIENT] = arrays_record(gradients)
    return Message(content, dst_node_id=node,
                   message_type="train" if request.training else "evaluate")


def write_result(folder: str, result: VerticalRunResult) -> None:
    """Write a run's ``history.json`` (history, rejected replies, wire bytes) and ``leader.npz``
    (the leader's trainable weights) into ``folder`` (the run config's ``result-path``)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "history.json"), "w") as f:
        json.dump({"history": result.history, "rejected": result.rejected, "wire": result.wire},
                  f)
    np.savez(os.path.join(folder, "leader.npz"),
             *[np.asarray(v.numpy()) for v in result.leader.trainable_variables])


class VerticalStrategy:
    """keras-fedpriv's vertical-FL leader on Flower: one run of `run_leader` over Flower messages.

    The mirror of `HorizontalStrategy` for vertical FL: the protocol's loop
    and checks are the vertical package's, this class carries the messages.
    Run settings can be overridden per run with Flower's run config
    (``num-epochs``, ``batch-size``, ``batches-per-message``,
    ``round-timeout``, ``follower-deadline``, ``party-node.<party>``); see
    `vertical_server_app` for what each setting means and how followers
    are identified, pinned and taken back.

    Args:
        leader: the `VerticalLeader`.
        epochs: number of epochs.
        batch_size: examples per step.
        batches_per_message: K, the batches each message to a follower asks for.
        seed: keys the batch order; None: fresh entropy.
        shuffle: reshuffle every epoch.
        validation_batch_size: examples per validation message.
        round_timeout: seconds to wait for the replies of one message round.
        connect_timeout: seconds to wait for the followers to connect.
        party_nodes: None, or follower -> the Flower node id that alone may be it.
        on_epoch_end: None, or called with ``(epoch, logs)`` after every epoch
            (the leader's logs with ``wire_bytes_up``, ``wire_bytes_down`` and
            ``epoch_time_s``).
        follower_deadline: seconds a follower may stay missing before the run
            stops with `FollowerGone`.
        poll_interval: seconds between two looks for a missing follower.

    Example:

    ```python
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid, context):
        leader = build_model().split_parties().leader
        strategy = VerticalStrategy(leader, epochs=3, batch_size=64)
        result = strategy.start(grid, (example_ids, None, y), run_config=context.run_config)
        print(privacy_report(result))
    ```
    """

    def __init__(self, leader: VerticalLeader, *, epochs: int = 1, batch_size: int = 32,
                 batches_per_message: int = 1, seed: int | None = None, shuffle: bool = True,
                 validation_batch_size: int = 256, round_timeout: float = 600.0,
                 connect_timeout: float = 300.0, party_nodes: Mapping[str, int] | None = None,
                 on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
                 follower_deadline: float = 600.0, poll_interval: float = 3.0) -> None:
        if not isinstance(leader, VerticalLeader):
            raise TypeError(f"leader_fn must return a VerticalLeader; got "
                            f"{type(leader).__name__}.")
        self.leader = leader
        self.epochs = validate_positive_int(epochs, "epochs")
        self.batch_size = validate_positive_int(batch_size, "batch_size")
        self.batches_per_message = validate_batches_per_message(batches_per_message)
        self.validation_batch_size = validate_positive_int(validation_batch_size,
                                                           "validation_batch_size")
        self.seed = validate_seed(seed)
        if not isinstance(shuffle, bool):
            raise TypeError(f"`shuffle` must be a bool; got {shuffle!r}.")
        self.shuffle = shuffle
        self.round_timeout = round_timeout
        self.connect_timeout = connect_timeout
        self.party_nodes = party_nodes
        self.on_epoch_end = on_epoch_end
        self.follower_deadline = positive_seconds(follower_deadline, "follower_deadline")
        self.poll_interval = positive_seconds(poll_interval, "poll_interval")
        self.roster: FollowerRoster | None = None  # the run in progress's
        self.traffic = {"up": 0, "down": 0}  # Flower's message bytes so far
        self.extra: dict[str, list[float]] = {key: [] for key in WIRE_LOGS}
        self._marks = {"up": 0, "down": 0, "time": time.perf_counter()}

    # -- one run's settings ---------------------------------------------------------------------
    def settings(self, run_config: Mapping[str, Any] | None = None) -> VerticalRunSettings:
        """This strategy's settings after the run config's overrides, each checked by name."""
        run = dict(run_config or {})
        wait = float(run.get("round-timeout", self.round_timeout))
        if not wait > 0:
            raise ValueError(f"`round-timeout` must be > 0 seconds; got {wait!r}.")
        return VerticalRunSettings(
            epochs=validate_positive_int(int(run.get("num-epochs", self.epochs)), "num-epochs"),
            batch_size=validate_positive_int(int(run.get("batch-size", self.batch_size)),
                                             "batch-size"),
            batches_per_message=validate_batches_per_message(
                int(run.get("batches-per-message", self.batches_per_message)),
                "batches-per-message"),
            round_timeout=wait,
            follower_deadline=positive_seconds(
                run.get("follower-deadline", self.follower_deadline), "follower-deadline"),
            pins=_pins(self.party_nodes, run, self.leader))

    # -- the run --------------------------------------------------------------------------------
    def start(self, grid: Grid, data: tuple[Any, Any, Any], *,
              validation_data: tuple[Any, Any, Any] | None = None,
              run_config: Mapping[str, Any] | None = None) -> VerticalRunResult:
        """Run the leader's loop over Flower and end the run at the followers.

        Args:
            grid: the ServerApp's Grid.
            data: ``(example_ids, x, y)``: the training examples' ids, the
                leader's own features (None without a leader bottom) and the
                labels.
            validation_data: None, or ``(example_ids, x, y)`` scored after
                every epoch.
            run_config: Flower's run config (its overrides of the settings).

        Returns:
            The `VerticalRunResult`; its history adds ``wire_bytes_up``,
            ``wire_bytes_down`` and ``epoch_time_s``.

        Raises:
            UntrainedEpoch: an epoch in which every batch was skipped.
            FollowerGone: a follower missing for longer than the deadline.
        """
        run = self.settings(run_config)
        self._connect(grid, run)
        # this run's own lists (a strategy may start again: the history of a run stays its own)
        self.extra = {key: [] for key in WIRE_LOGS}
        ids, x, y = data
        validation = None
        if validation_data is not None:
            v_ids, v_x, v_y = validation_data
            validation = (v_ids, v_y, v_x)
        self._marks.update(up=self.traffic["up"], down=self.traffic["down"],
                           time=time.perf_counter())
        try:
            result = run_leader(self.leader, self.exchange, ids, y, x, epochs=run.epochs,
                                batch_size=run.batch_size,
                                batches_per_message=run.batches_per_message, seed=self.seed,
                                shuffle=self.shuffle, validation_data=validation,
                                validation_batch_size=self.validation_batch_size,
                                on_epoch_end=self._epoch_end, stop_when_untrained=True,
                                describe=self.roster.name, retry=self.roster.recover)
        except (UntrainedEpoch, FollowerGone) as error:
            logger.error("the run stops: %s", error)
            raise
        result.history.update(self.extra)
        self._finish()
        return result

    def _connect(self, grid: Grid, run: VerticalRunSettings) -> None:
        """Wait for the followers (a pinned follower's own node among them) and introduce them."""
        specs = self.leader.follower_specs
        required = {n: "follower " + ", ".join(repr(p) for p, m in sorted(run.pins.items())
                                               if m == n)
                    for n in set(run.pins.values())}
        nodes = wait_for_nodes(grid, len(specs), self.connect_timeout, what="followers",
                               required=required)
        self.roster = FollowerRoster(grid, specs, run.pins, run.round_timeout,
                                     run.follower_deadline, self.poll_interval)
        self.roster.introduce(nodes)

    def exchange(self, requests: Mapping[str, FollowerRequest]) -> dict[str, Any]:
        """Carry one message round: follower -> its reply's embedding arrays, or why not.

        A missing follower first comes back (or the run stops); each reply is
        read by the vertical wire within its byte limit.
        """
        roster = self.roster
        roster.recover()
        messages = {p: request_message(request, roster.node_of[p])
                    for p, request in requests.items()}
        self.traffic["down"] += sum(message_nbytes(m) for m in messages.values())
        replies = roster.send(messages)
        return {p: self._reply(replies.get(p), request, p) for p, request in requests.items()}

    def _reply(self, reply: Message | None, request: FollowerRequest, party: str) -> Any:
        """One follower's answer: its embedding arrays, or the reason it cannot be used."""
        if reply is None:
            return f"no reply within {self.roster.timeout:g} s"
        if reply.has_error():
            return f"error reply: {first_line(reply.error.reason)}"
        self.traffic["up"] += message_nbytes(reply)
        content = reply.content
        if wire.ERROR in content:
            return f"error reply: {first_line(content[wire.ERROR].get('reason', ''))}"
        return wire.read_embedding_reply(content, request.example_ids,
                                         self.leader.follower_specs[party], checked_arrays)

    def _epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        """Add the epoch's wire bytes and time to the history, then call ``on_epoch_end``."""
        now = time.perf_counter()
        marks, traffic = self._marks, self.traffic
        self.extra["wire_bytes_up"].append(float(traffic["up"] - marks["up"]))
        self.extra["wire_bytes_down"].append(float(traffic["down"] - marks["down"]))
        self.extra["epoch_time_s"].append(now - marks["time"])
        marks.update(up=traffic["up"], down=traffic["down"], time=now)
        if self.on_epoch_end is not None:
            self.on_epoch_end(epoch, {**logs, **{key: v[-1] for key, v in self.extra.items()}})

    def _finish(self) -> None:
        """Tell every follower the run is over (``"query.finish"``); log who did not answer."""
        roster = self.roster
        replies = roster.send({p: Message(RecordDict({wire.CONFIG: ConfigRecord({})}),
                                          dst_node_id=n, message_type="query.finish")
                               for p, n in roster.node_of.items()})
        for p in sorted(roster.node_of):
            if p not in replies or replies[p].has_error():
                logger.warning("%s failed to finish: %s", roster.name(p),
                               "no reply" if p not in replies
                               else first_line(replies[p].error.reason))
