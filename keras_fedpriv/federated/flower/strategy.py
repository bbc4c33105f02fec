"""Horizontal FL's server half as a Flower `Strategy`: `HorizontalStrategy`.

`horizontal_server_app` runs this strategy; a user's own `ServerApp` can run
it too (``strategy.start(grid, strategy.initial_arrays(), num_rounds=...)``)
or call its four steps from a loop of its own, inside ``with
strategy.own_loop():`` (a step called while neither its own ``start`` nor
``own_loop()`` runs is refused: that is how Flower's DP wrappers, which
cannot read its replies, drive a strategy). The strategy drives the same
`HorizontalServer` that `HorizontalFL` drives in one process.

Round numbers: every log line, ``rejected`` and the history count rounds from 1,
as Flower does; keras-fedpriv's protocol (client shuffling, MagRR, the Laplace
evaluation's schedule) counts from 0 inside the messages, so Flower's round
``r`` is the protocol's round ``r - 1``, the same round as in-process.

Parties that come and go: the strategy reads the connected nodes every round
and asks every node it has not heard from which client it is (a SuperNode
restarted mid-run gets a new node id and is asked again in the same run). A
client id claimed by more than one connected node takes no part while it is
so claimed: a killed SuperNode stays listed for up to two heartbeats, so a
restarted client takes part again once its predecessor is no longer listed.
Replies are matched to what was sent by the message they answer, never by
sender id (Flower's "Node Unavailable" reply in a lost node's place has
sender id 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

import keras
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from keras_fedpriv.federated.flower.central_dp import CentralDP, refuse_flower_dp
from keras_fedpriv.federated.horizontal import wire
from keras_fedpriv.federated.flower.common import (
    first_line,
    wait_for_nodes,
    message_nbytes,
)
from keras_fedpriv.federated.horizontal.loop import EvaluateReport, HorizontalLoop, TrainReply
from keras_fedpriv.federated.horizontal.parties import HorizontalServer
from keras_fedpriv.federated.malformed import MalformedMessage
from keras_fedpriv.federated.uploads import as_upload
from keras_fedpriv.mechanisms.ledger import (
    CLIENT,
    ReleaseKind,
    ReleaseLedger,
    non_private_event,
)
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed

__all__ = ["FlowerRunResult", "HorizontalStrategy"]

logger = logging.getLogger("keras_fedpriv.flower")


@dataclasses.dataclass
class FlowerRunResult:
    """What a `horizontal_server_app` run leaves to its ``on_finish``.

    Attributes:
        model: the global Keras model after the last round.
        history: per-round logs (``val_*`` metrics, ``global_lr``, the
            number of good and dropped replies, ``below_min_replies``,
            bytes on the wire).
        ledger: the server's release ledger: a release per client asked to
            train, per client id (`keras_fedpriv.privacy.privacy_report` accepts it).
        rejected: ``(round, client id or node id, reason)`` of every dropped
            reply (rounds from 1).
        failed_rounds: the rounds (from 1) with fewer than ``min_replies``
            good replies (the global model was left unchanged).
        asked: per round, ``[client id, node id]`` of each client asked to
            train (each is counted in ``ledger`` when asked).
        replied: per round, ``[client id, node id]`` of each good reply
            (a client that rejoined under a new node id shows the new one).
    """

    model: keras.Model
    history: dict[str, list[float]]
    ledger: ReleaseLedger
    rejected: list[tuple[int, int, str]]
    failed_rounds: list[int] = dataclasses.field(default_factory=list)
    asked: list[list[list[int]]] = dataclasses.field(default_factory=list)
    replied: list[list[list[int]]] = dataclasses.field(default_factory=list)

    def privacy_ledger(self) -> ReleaseLedger:
        """The server's release ledger (so a result is a protection to `privacy_report`)."""
        return self.ledger


class HorizontalStrategy(Strategy):
    """keras-fedpriv's horizontal-FL server as a Flower `Strategy` (Flower's Message API).

    Each round it samples clients, counts their releases in its ledger when it
    asks them, sends the global weights (and MagRR's announcement), checks
    every reply before using it (a malformed upload, an error reply or a reply
    from a node it did not ask is dropped with a logged reason, never
    aggregated) and updates the global model only when at least
    ``min_replies`` good replies arrived. With a `LaplaceEvaluation`, every
    ``every_n_epochs``-th round's clients answer an ``"evaluate"`` message with
    their outputs plus Laplace noise and the strategy logs the clustering
    scores. The clients run `horizontal_client_app` (or a ClientApp that
    answers the same messages).

    Central DP: given a `keras_fedpriv.federated.flower.central_dp.CentralDP`
    (``central_dp=``, or `central_dp` on a built strategy; dense uploads
    only), it clips each update and noises each aggregate before the global
    model is set, scored or returned, and counts each noised aggregate in
    Flower's accountant. Flower's own DP wrappers around it are refused with
    a ValueError before any client is asked (they clip replies as model
    weights, which these replies are not): they call its steps from their
    own ``start``, and `configure_train` (and `summary`) refuse to run
    unless the strategy's own `start`, or an `own_loop` of the user's, is
    running.

    Args:
        model: the compiled global Keras model (its weights are the global
            model; its metrics score ``validation_data``).
        upload: the server's copy of the upload scheme: ``"fedavg"``,
            ``"signds"``, a `SignDSEncoder` or an upload object, with the same
            kind and settings as the clients'.
        clients_per_round: clients sampled each round (uniformly, without
            replacement, among the connected clients' ids).
        local_epochs: epochs of local training per client and round (a
            ``"local-epochs"`` key in Flower's ``train_config`` overrides it).
        num_clients: clients to wait for before the first round (default:
            ``clients_per_round``).
        min_replies: the fewest good replies that make a round; with fewer
            the global model is left unchanged.
        seed: None or an int: the client sampling.
        batch_norm: ``"average"`` or ``"local"`` (FedBN); must match the
            clients'.
        magrr: a `keras_fedpriv.callbacks.MagRR` (SignDS only) or None; its
            ``eps_rr`` must match the clients' ``eps_rr``.
        laplace_eval: a `keras_fedpriv.callbacks.LaplaceEvaluation` with
            ``eval_data=None``, or None. Each client is asked for at most its
            ``max_report_rows`` rows and a larger report is refused before it
            is parsed; its ``max_scored_rows`` bounds each round's scoring.
            The ledger counts ``max_report_rows`` releases about each client
            asked (one per row it may send: the client's own ledger counts
            the rows it sent, at most that).
        validation_data: ``(x, y)`` the strategy scores the global model on
            after every round (``val_*`` metrics), or None.
        connect_timeout: seconds to wait for ``num_clients`` clients and their
            answers to the first ``"query"`` (which tells each node's client id).
        max_failed_rounds: None or an integer >= 0: the run stops with a
            RuntimeError once more rounds than this fell below
            ``min_replies`` (a round with fewer connected clients than
            ``min_replies`` asks no one and counts as fallen). None: half
            the rounds `start` runs (rounded down); without `start`, no limit.
        central_dp: None or a `CentralDP` (central DP-FedAvg: server-side
            clipping and Gaussian noise on each aggregate, counted in its
            Flower accountant); see `use_central_dp`.

    Example:

    ```python
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid, context):
        strategy = HorizontalStrategy(build_model(), "signds", clients_per_round=3)
        strategy.start(grid, strategy.initial_arrays(), num_rounds=5, timeout=600)
        print(privacy_report(strategy))   # the clients' composed releases
    ```
    """

    def __init__(self, model: keras.Model, upload: Any = "fedavg", *,
                 clients_per_round: int = 2, local_epochs: int = 1,
                 num_clients: int | None = None, min_replies: int = 1,
                 seed: int | None = None, batch_norm: str = "average", magrr: Any = None,
                 laplace_eval: Any = None, validation_data: tuple[Any, Any] | None = None,
                 connect_timeout: float = 300.0, max_failed_rounds: int | None = None,
                 central_dp: CentralDP | None = None) -> None:
        self.clients_per_round = validate_positive_int(clients_per_round, "clients_per_round")
        self.local_epochs = validate_positive_int(local_epochs, "local_epochs")
        self.min_replies = validate_positive_int(min_replies, "min_replies")
        self.num_clients = validate_positive_int(num_clients or clients_per_round,
                                                 "num_clients")
        if self.min_replies > self.clients_per_round:
            raise ValueError(f"`min_replies`={self.min_replies} is more than "
                             f"`clients_per_round`={self.clients_per_round}: no round could "
                             "count.")
        if batch_norm not in ("average", "local"):
            raise ValueError(f"`batch_norm` must be 'average' or 'local'; got {batch_norm!r}.")
        if not float(connect_timeout) > 0:
            raise ValueError(f"`connect_timeout` must be > 0 seconds; got {connect_timeout!r}.")
        if magrr is not None and not hasattr(magrr, "server_update"):
            raise TypeError(f"`magrr` must be a MagRR or None; got {type(magrr).__name__}.")
        if laplace_eval is not None and not hasattr(laplace_eval, "receive_reports"):
            raise TypeError("`laplace_eval` must be a LaplaceEvaluation or None; got "
                            f"{type(laplace_eval).__name__}.")
        self.connect_timeout = float(connect_timeout)
        self.max_failed_rounds = (None if max_failed_rounds is None else validate_positive_int(
            max_failed_rounds, "max_failed_rounds", minimum=0))
        self.batch_norm = batch_norm
        self.validation_data = validation_data
        self.upload = as_upload(upload)
        self.server = HorizontalServer(model, self.upload, seed=validate_seed(seed),
                                       batch_norm=batch_norm, magrr=magrr)
        self.magrr = magrr
        self.laplace = laplace_eval
        if laplace_eval is not None:
            laplace_eval.set_model(model)
        self.node_of: dict[int, int] | None = None  # client id -> node id, this round
        self.claims: dict[int, int | None] = {}  # node id -> the client id it answered
        self._last_node: dict[int, int] = {}  # client id -> the node it last took part from
        self._sent: list[Message] = []  # the messages of the step in progress
        self._timeout = self.connect_timeout  # how long a query waits (start: the round's)
        self._num_rounds: int | None = None
        self.asked: list[list[list[int]]] = []  # per round: [client id, node id] asked
        self.replied: list[list[list[int]]] = []  # per round: [client id, node id] of good replies
        event = getattr(self.upload, "dp_event", lambda: None)() or non_private_event()
        asked = [ReleaseKind(
            f"{type(self.upload).__name__} upload (received by the server)", "client data",
            CLIENT, event, "counted for every client asked to train, when asked")]
        if magrr is not None:
            asked.append(ReleaseKind(
                "MagRR report (received)", "client data", CLIENT, magrr.dp_event(1),
                "one randomized-response bit per round a client takes part in"))
        if self.server.bn_variables and batch_norm == "average":
            asked.append(ReleaseKind(
                "BatchNormalization statistics and data size (received)", "client data", CLIENT,
                non_private_event(), "batch_norm='average': sent in the clear"))
        unexpected = ReleaseKind(
            "unexpected reply content (received)", "client data", CLIENT, non_private_event(),
            "a reply carrying more than the protocol releases")
        # the round loop HorizontalFL.fit runs too; this class only carries its messages
        self.loop = HorizontalLoop(self.server, min_replies=self.min_replies,
                                   asked_kinds=asked, extra_kind=unexpected,
                                   laplace=laplace_eval, count_evaluations=True,
                                   validation_data=validation_data, log_magrr=True,
                                   log=logger)
        self._down = 0
        self._driving = 0  # how many of its own drivers (start, own_loop) are running now
        self.central: CentralDP | None = None
        if central_dp is not None:
            self.use_central_dp(central_dp)

    @property
    def ledger(self) -> ReleaseLedger:
        """The release ledger: a release per client asked."""
        return self.loop.ledger

    @property
    def history(self) -> dict[str, list[float]]:
        """Per-round logs: every key has one entry per round (NaN where it did not apply)."""
        return self.loop.history

    @property
    def rejected(self) -> list[tuple[int, int, str]]:
        """``(round, client id or node id, reason)`` of every dropped reply (rounds from 1)."""
        return self.loop.rejected

    @property
    def failed_rounds(self) -> list[int]:
        """The rounds (from 1) with fewer than ``min_replies`` good replies."""
        return [r + 1 for r in self.loop.failed_rounds]

    def failure_limit(self) -> int | None:
        """How many rounds may fall below ``min_replies`` before the run stops (None: any)."""
        if self.max_failed_rounds is not None:
            return self.max_failed_rounds
        return None if self._num_rounds is None else self._num_rounds // 2

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, **kwargs: Any) -> Any:
        """Flower's `Strategy.start`, remembering ``num_rounds`` (for the default
        ``max_failed_rounds``) and ``timeout`` (how long a late node's query waits)."""
        self._num_rounds = validate_positive_int(num_rounds, "num_rounds")
        self._timeout = min(float(timeout), self.connect_timeout)
        with self.own_loop():  # its steps may run: nothing else drives them
            return super().start(grid, initial_arrays, num_rounds=num_rounds, timeout=timeout,
                                 **kwargs)

    @contextlib.contextmanager
    def own_loop(self) -> Iterator["HorizontalStrategy"]:
        """Call the strategy's steps from a loop of your own: ``with strategy.own_loop():``.

        `configure_train` and `summary` run only while the strategy's own
        `start` or an ``own_loop()`` is running (`start` opens one): Flower's
        DP wrappers drive a strategy they wrap through its steps from their
        own ``start`` and hand it nothing else to tell them apart by, so a
        step called from anywhere else is refused before any client is asked
        (`keras_fedpriv.federated.flower.central_dp.refuse_flower_dp`).
        Opening it says that you, not a wrapper, call the steps inside it: a
        Flower client-side wrapper is still refused there (by the clipping
        norm it puts in the train config), a server-side one is not found
        before its first round (it then breaks that round's replies: the
        asked clients are counted, no update is released). It is closed on
        leaving the block, also by an exception.

        Yields:
            The strategy.

        Example:

        ```python
        with strategy.own_loop():
            for rnd in range(1, 4):
                messages = strategy.configure_train(rnd, strategy.initial_arrays(),
                                                    ConfigRecord(), grid)
                strategy.aggregate_train(rnd, grid.send_and_receive(messages))
        ```
        """
        self._driving += 1
        try:
            yield self
        finally:
            self._driving -= 1

    @property
    def model(self) -> keras.Model:
        """The global model."""
        return self.server.model

    def privacy_ledger(self) -> ReleaseLedger:
        """The release ledger: a release per client asked (`privacy_report` accepts it)."""
        return self.ledger

    def initial_arrays(self) -> ArrayRecord:
        """The global model's trainable weights, as ``Strategy.start`` wants them."""
        return ArrayRecord(numpy_ndarrays=self.server.global_weights())

    def run_result(self) -> FlowerRunResult:
        """The model, per-round history, ledger and dropped replies so far."""
        return FlowerRunResult(self.server.model, self.history, self.ledger, self.rejected,
                               self.failed_rounds, [list(r) for r in self.asked],
                               [list(r) for r in self.replied])

    def use_central_dp(self, central: CentralDP) -> None:
        """Clip and noise every aggregate from now on (central DP-FedAvg; what `central_dp` calls).

        The upload is decorated with ``central.decorate(...)`` (a `ClippedSum`):
        the aggregate is ``sum_i clip(update_i, clipping_norm) /
        clients_per_round`` plus Gaussian noise of std ``noise_multiplier *
        clipping_norm / clients_per_round``, before the global model is set or
        scored; each round first asks ``central.check_budget()`` (before any
        client is asked) and each aggregation ends with ``central.count()``.

        Args:
            central: a `CentralDP`.

        Raises:
            TypeError: ``central`` is not a `CentralDP`.
            ValueError: central DP is given already, or after this strategy has
                asked clients (rounds it aggregated in the clear would be outside the
                central figure), or refused for this strategy's upload, MagRR or
                BatchNormalization statistics.
        """
        if not isinstance(central, CentralDP):
            raise TypeError(f"`central_dp` must be a CentralDP or None; got "
                            f"{type(central).__name__}.")
        if self.central is not None:
            raise ValueError("this HorizontalStrategy already clips its uploads (central DP "
                             "was given twice).")
        if self.asked:
            raise ValueError(f"central DP must be given before the strategy's first round: "
                             f"this HorizontalStrategy has already asked clients in "
                             f"{len(self.asked)} round(s), whose aggregates were released "
                             f"without its noise.")
        self.server.upload = central.decorate(
            self.upload, self.clients_per_round, magrr=self.magrr,
            clear_batch_norm=self.batch_norm == "average" and bool(self.server.bn_variables))
        self.central = central

    @property
    def accountant(self) -> Any:
        """The central DP's Flower accountant (None: no central DP, or none given)."""
        return None if self.central is None else self.central.accountant

    def central_privacy(self) -> list[Any]:
        """The central releases (noised aggregates), as `privacy_report` shows them."""
        if self.central is None:
            return []
        return self.central.central_privacy(f"HorizontalStrategy with {self.central!r}")

    def summary(self) -> None:
        """Log the strategy's settings (what Flower's ``Strategy.start`` calls first).

        Raises:
            ValueError: called while neither the strategy's own `start` nor an
                `own_loop` is running (e.g. by a Flower DP wrapper's ``start``).
        """
        refuse_flower_dp(self.upload, self.magrr, driven=self._driving > 0, step="summary")
        logger.info("HorizontalStrategy: upload %s, %d clients per round (at least %d "
                    "replies), %d local epochs, batch_norm=%r, MagRR %s, Laplace evaluation "
                    "%s, central DP %s", type(self.upload).__name__, self.clients_per_round,
                    self.min_replies, self.local_epochs, self.batch_norm,
                    "on" if self.magrr else "off", "on" if self.laplace else "off",
                    self.central if self.central is not None else "off")

    def _connect(self, grid: Grid) -> None:
        """Learn which client each connected node is; the first time, wait for the clients.

        Every node not yet heard from (new, or whose last query failed) is asked
        its client id; a client id claimed by more than one connected node takes
        no part while it is so claimed (see the module's docstring).
        """
        if self.node_of is None:
            nodes = wait_for_nodes(grid, max(self.num_clients, self.clients_per_round),
                                   self.connect_timeout)
            timeout = self.connect_timeout
        else:
            nodes = sorted(grid.get_node_ids())
            timeout = self._timeout
        unknown = [n for n in nodes if self.claims.get(n) is None]
        if unknown:
            sent = [Message(wire.query_content(), dst_node_id=n, message_type=wire.QUERY)
                    for n in unknown]
            self.claims.update(_client_ids(sent, grid.send_and_receive(sent, timeout=timeout)))
        self.node_of = self._claimed(nodes)

    def _claimed(self, nodes: Sequence[int]) -> dict[int, int]:
        """Client id -> node id among ``nodes``, for the ids exactly one of them claims."""
        claims: dict[int, list[int]] = {}
        for node in nodes:
            cid = self.claims.get(node)
            if cid is not None:
                claims.setdefault(cid, []).append(node)
        node_of = {}
        for cid, owners in sorted(claims.items()):
            if len(owners) > 1:
                logger.warning("%d connected nodes (%s) claim client id %d; it takes no part "
                               "while they do", len(owners), ", ".join(map(str, owners)), cid)
                continue
            old = self._last_node.get(cid)
            if old is not None and old != owners[0]:
                logger.info("client %d is node %d now (was node %d): it takes part again",
                            cid, owners[0], old)
            node_of[cid] = self._last_node[cid] = owners[0]
        return node_of

    def _answers(self, replies: Iterable[Message]) -> list[tuple[Message, int | None, int]]:
        """``(reply, client id or None, node id)`` per reply, matched to the message it answers.

        A reply is matched by ``metadata.reply_to_message_id`` (Flower's error
        reply for a lost node carries sender id 0, not the node's); one that
        answers no message sent in this step has no client id and is named by its
        sender id. Only a grid that gave the sent messages no ids (a stand-in in
        tests) is matched by sender id.
        """
        answers = _reply_matcher(self._sent)
        client_of = {n: c for c, n in (self.node_of or {}).items()}
        out = []
        for reply in replies:
            sent = answers(reply)
            if sent is None:
                out.append((reply, None, reply.metadata.src_node_id))
                continue
            node = sent.metadata.dst_node_id
            out.append((reply, client_of.get(node), node))
        return out

    def _too_many_failed(self, request: Any) -> None:
        """Raise once more rounds fell below ``min_replies`` than the limit allows."""
        limit = self.failure_limit()
        failed = self.failed_rounds
        if limit is None or len(failed) <= limit:
            return
        missing = [c for c in request.client_ids if c not in self.loop.accepted]
        raise RuntimeError(
            f"{len(failed)} rounds fell below min_replies={self.min_replies} (rounds "
            f"{failed}), more than max-failed-rounds={limit}: the run stops. Round "
            f"{request.round + 1} asked clients {list(request.client_ids)}; no good reply "
            f"from {_named(missing, self.node_of)}; connected clients: "
            f"{_named(sorted(self.node_of or {}), self.node_of)}.")

    def _set_weights(self, arrays: ArrayRecord) -> None:
        weights = arrays.to_numpy_ndarrays()
        ours = self.server.trainable
        if len(weights) != len(ours) or any(tuple(w.shape) != tuple(v.shape)
                                            for w, v in zip(weights, ours)):
            raise ValueError(f"`arrays` must hold the model's {len(ours)} trainable weights "
                             f"(shapes {[tuple(v.shape) for v in ours]}); got shapes "
                             f"{[tuple(w.shape) for w in weights]}.")
        for v, w in zip(ours, weights):
            v.assign(w)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Sample the round's clients, count their releases and build their messages.

        Raises:
            ValueError: called while neither the strategy's own `start` nor an
                `own_loop` is running (e.g. by a Flower DP wrapper), or a train
                config from Flower's client-side DP wrappers; both before any
                client is asked.
        """
        rnd = validate_positive_int(server_round, "server_round") - 1
        # before any client is asked: a Flower DP wrapper, or any other outside driver
        refuse_flower_dp(self.upload, self.magrr, config, driven=self._driving > 0)
        if self.central is not None:
            self.central.check_budget()
        self._set_weights(arrays)
        epochs = validate_positive_int(int(config.get(wire.LOCAL_EPOCHS, self.local_epochs)),
                                       "local-epochs")
        # the clients connected now: a crashed node drops out, a restarted one comes back
        self._connect(grid)
        request = self.loop.begin_round(rnd, sorted(self.node_of), self.clients_per_round,
                                        epochs, ask_none_if_short=True)
        self.asked.append([[c, self.node_of[c]] for c in request.client_ids])
        content = wire.train_content(request, dict(config.items()))
        self._sent = [Message(content, dst_node_id=self.node_of[c], message_type=wire.TRAIN)
                      for c in request.client_ids]
        self._down = sum(message_nbytes(m) for m in self._sent)
        return list(self._sent)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check every reply, aggregate the good ones (at least ``min_replies``) and score."""
        request = self.loop.last_request
        if request is None or request.round != server_round - 1:
            raise ValueError(f"aggregate_train for round {server_round} without its "
                             "configure_train.")
        with_magrr = self.magrr is not None
        parsed = []
        for reply, cid, node in self._answers(replies):
            answer = TrainReply(node if cid is None else cid, asked=cid is not None, node=node)
            if reply.has_error():
                answer.reason = f"error reply: {first_line(reply.error.reason)}"
            else:
                answer.nbytes = message_nbytes(reply)
                if cid is not None:
                    answer.result, answer.reason = _read(
                        wire.parse_train_reply, reply, self.server, with_magrr,
                        self.batch_norm, what="upload")
                    answer.extra = answer.reason is not None and wire.extra_content(
                        reply, self.server, with_magrr, self.batch_norm)
            parsed.append(answer)
        try:
            logs = self.loop.finish_round(parsed)
        finally:  # a noised aggregate counts even if something after it failed
            if self.central is not None:
                self.central.count()
        node_of_answer = {a.sender: a.node for a in parsed if a.asked}
        self.replied.append([[c, node_of_answer[c]] for c in self.loop.accepted])
        wire_logs = {"wire_bytes_down": float(self._down),
                     "wire_bytes_up": float(sum(a.nbytes for a in parsed)),
                     "payload_bytes_up": logs["upload_bytes"]}
        wire_logs["below_min_replies"] = float(logs["replies"] < self.min_replies)
        self.loop.log(request.round, wire_logs)
        logs.update(wire_logs)
        self._too_many_failed(request)
        updated = not math.isnan(logs["global_lr"])
        metrics = MetricRecord({k: float(v) for k, v in logs.items()})
        if updated and self.central is not None:
            metrics["central_noise_std"] = float(self.central.noise_std)
        return (self.initial_arrays() if updated else None), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """With a due `LaplaceEvaluation`: ask the round's clients for noisy outputs."""
        rnd = validate_positive_int(server_round, "server_round") - 1
        if not self.loop.evaluation_due(rnd):
            return []
        model = self.server.model
        width = int(model.compute_output_shape((1,) + tuple(model.inputs[0].shape[1:]))[-1]) \
            if getattr(model, "inputs", None) else None
        request = self.loop.begin_evaluate(rnd, width)  # asked: counted
        content = wire.evaluate_content(request)
        self._sent = [Message(content, dst_node_id=self.node_of[c], message_type=wire.EVALUATE)
                      for c in request.client_ids]
        return list(self._sent)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """The Laplace evaluation's clustering scores from the good reports (None if none due)."""
        request = self.loop.evaluating
        if request is None or request.round != server_round - 1:
            return None
        width = request.width
        bound = self.laplace.report_bound(width) if width else math.inf
        reports = []
        for reply, cid, node in self._answers(replies):
            report = EvaluateReport(node if cid is None else cid, asked=cid is not None,
                                    node=node)
            if cid is not None and reply.has_error():
                report.reason = "error reply to 'evaluate'"
            elif cid is not None:
                report.rows, report.reason = _read(wire.parse_report, reply, width,
                                                   request.max_rows, bound, what="report")
            reports.append(report)
        logs = self.loop.finish_evaluate(request.round, reports)
        return MetricRecord({k: float(v) for k, v in logs.items()})


def _read(parse: Any, reply: Message, *args: Any, what: str) -> tuple[Any, str | None]:
    """``(parse(reply, *args), None)``, or ``(None, why)``: no reply may stop the server."""
    try:
        return parse(reply, *args), None
    except MalformedMessage as err:
        return None, f"malformed {what}: {err}"
    except Exception as err:  # noqa: BLE001 - no reply may stop the server
        return None, f"malformed {what}: could not be read ({type(err).__name__})"


def _reply_matcher(sent: Sequence[Message]) -> Callable[[Message], Message | None]:
    """``answers(reply)`` -> the message of ``sent`` that ``reply`` answers, or None.

    Matched by ``metadata.reply_to_message_id`` (Flower's error reply for a
    lost node carries sender id 0, not the node's). Only messages without ids
    (a stand-in grid in tests) are matched by the reply's sender id.
    """
    by_id = {m.metadata.message_id: m for m in sent if m.metadata.message_id}
    if not by_id:
        by_node = {m.metadata.dst_node_id: m for m in sent}
        return lambda reply: by_node.get(reply.metadata.src_node_id)
    return lambda reply: by_id.get(getattr(reply.metadata, "reply_to_message_id", "") or "")


def _client_ids(sent: Sequence[Message], replies: Iterable[Message]) -> dict[int, int | None]:
    """Node id -> the client id its ``"query"`` reply claims (None: no valid answer).

    Replies are matched to the queries by the message they answer; a node
    that did not answer (or answered with an error) maps to None and is asked
    again next round.
    """
    answers = _reply_matcher(sent)
    out: dict[int, int | None] = {m.metadata.dst_node_id: None for m in sent}
    for reply in replies:
        query = answers(reply)
        if query is None:
            continue
        node = query.metadata.dst_node_id
        if reply.has_error():
            logger.warning("node %s did not answer the query: %s", node,
                           first_line(reply.error.reason))
            continue
        cid = wire.parse_client_id(reply)
        if cid is None:
            logger.warning("node %s answered the query without a valid client id", node)
            continue
        out[node] = cid
    for node, cid in out.items():
        if cid is not None:
            logger.info("node %s is client %d", node, cid)
    return out


def _named(clients: Sequence[int], node_of: dict[int, int] | None) -> str:
    """``client 2 (node 81..)``, ... for a message; "none" for no client."""
    node_of = node_of or {}
    return ", ".join(f"client {c} (node {node_of.get(c, '?')})" for c in clients) or "none"


def write_result(folder: str, result: FlowerRunResult) -> None:
    """Write ``history.json``, ``ledger.json`` and ``weights.npz`` of a run into ``folder``.

    Args:
        folder: the folder (created if missing).
        result: the run's `FlowerRunResult`.

    Returns:
        None.
    """
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "history.json"), "w") as f:
        json.dump({"history": result.history, "rejected": result.rejected,
                   "failed_rounds": result.failed_rounds, "asked": result.asked,
                   "replied": result.replied}, f)
    with open(os.path.join(folder, "ledger.json"), "w") as f:
        json.dump(result.ledger.to_dict(), f)
    np.savez(os.path.join(folder, "weights.npz"),
             *[np.asarray(w) for w in result.model.get_weights()])
