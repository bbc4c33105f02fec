"""Horizontal FL's server half as a Flower `Strategy`: `HorizontalStrategy`.

`horizontal_server_app` runs this strategy; a user's own `ServerApp` can run
it too (``strategy.start(grid, strategy.initial_arrays(), num_rounds=...)``)
or call its four steps from a loop of its own. The strategy drives the same
`HorizontalServer` that `HorizontalFL` drives in one process.

Round numbers: Flower counts rounds from 1; keras-fedpriv's protocol (client
shuffling, MagRR, the Laplace evaluation's schedule) counts from 0, so Flower's
round ``r`` is the protocol's round ``r - 1``, the same round as in-process.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
import os
from typing import Any, Iterable, Sequence

import keras
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.dp_adaptive_clipping import DifferentialPrivacyAdaptiveBase
from flwr.serverapp.strategy.dp_fixed_clipping import DifferentialPrivacyFixedClippingBase
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from keras_fedpriv.federated.flower import horizontal_wire as wire
from keras_fedpriv.federated.flower.common import (
    first_line,
    wait_for_nodes,
    message_nbytes,
)
from keras_fedpriv.federated.horizontal_loop import EvaluateReport, HorizontalLoop, TrainReply
from keras_fedpriv.federated.horizontal_parties import HorizontalServer
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
            number of good and dropped replies, bytes on the wire).
        ledger: the server's release ledger: a release per client asked to
            train, per client id (`keras_fedpriv.privacy.privacy_report` accepts it).
        rejected: ``(round, client id or node id, reason)`` of every dropped
            reply.
    """

    model: keras.Model
    history: dict[str, list[float]]
    ledger: ReleaseLedger
    rejected: list[tuple[int, int, str]]

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

    Central DP: `keras_fedpriv.federated.flower.central_dp` wraps it in
    Flower's server-side fixed clipping (dense uploads only); Flower's own DP
    wrappers around it directly are refused with a ValueError before any
    client is asked (they clip replies as model weights, which these
    replies are not).

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
                 connect_timeout: float = 300.0) -> None:
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
        self.batch_norm = batch_norm
        self.validation_data = validation_data
        self.upload = as_upload(upload)
        self.server = HorizontalServer(model, self.upload, seed=validate_seed(seed),
                                       batch_norm=batch_norm, magrr=magrr)
        self.magrr = magrr
        self.laplace = laplace_eval
        if laplace_eval is not None:
            laplace_eval.set_model(model)
        self.node_of: dict[int, int] | None = None  # client id -> node id
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
        """``(round, client id or node id, reason)`` of every dropped reply."""
        return self.loop.rejected

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
        return FlowerRunResult(self.server.model, self.history, self.ledger, self.rejected)

    def clip_uploads(self, clipping_norm: float, noise_multiplier: float = 0.0) -> Any:
        """Clip and noise the aggregate on the server (central DP; what `central_dp` calls).

        From now on the aggregate is ``sum_i clip(update_i, clipping_norm) /
        clients_per_round`` plus Gaussian noise of std ``noise_multiplier *
        clipping_norm / clients_per_round``
        (`keras_fedpriv.federated.flower.central_dp.ClippedSum`), before the
        global model is set or scored.

        Args:
            clipping_norm: the L2 bound of one client's update.
            noise_multiplier: the central noise multiplier z (0: none).

        Returns:
            The installed `ClippedSum` (it counts the noised aggregates).

        Raises:
            ValueError: the uploads are clipped already.
        """
        from keras_fedpriv.federated.flower.central_dp import ClippedSum

        if isinstance(self.server.upload, ClippedSum):
            raise ValueError("this HorizontalStrategy already clips its uploads (central_dp "
                             "was applied twice).")
        self.server.upload = ClippedSum(self.upload, clipping_norm, self.clients_per_round,
                                        noise_multiplier)
        return self.server.upload

    def _refuse_flower_dp(self, config: ConfigRecord | None = None) -> None:
        """Refuse Flower's DP wrappers around this strategy: they cannot read its replies.

        Flower's server-side wrappers pass this strategy nothing of their own
        (the same arrays, config and grid), so they are found where they call
        it: any Flower DP wrapper among the callers on the stack (however deep,
        e.g. around another wrapper), except `central_dp`'s own. The
        client-side wrappers are also found by the clipping norm they put in
        the train config. Where the interpreter gives no frames
        (``inspect.currentframe()`` is None), only the config check runs, and
        a server-side wrapper breaks the first replies when it clips them as
        model weights (Flower raises, or this strategy drops them as
        malformed): the clients' releases are counted, no update is released.
        """
        wrapper = None
        frame = inspect.currentframe()
        frame = frame.f_back if frame is not None else None
        while frame is not None and wrapper is None:
            caller = frame.f_locals.get("self")
            if (isinstance(caller, (DifferentialPrivacyFixedClippingBase,
                                    DifferentialPrivacyAdaptiveBase))
                    and not callable(getattr(caller, "central_privacy", None))):
                wrapper = type(caller).__name__
            frame = frame.f_back
        del frame  # no reference cycle through the frames
        if wrapper is None and config is not None and KEY_CLIPPING_NORM in config:
            wrapper = f"a client-side clipping wrapper (config key {KEY_CLIPPING_NORM!r})"
        if wrapper is None:
            return
        upload = f"{type(self.upload).__name__}" + (" with MagRR" if self.magrr else "")
        if getattr(self.upload, "name", "") == "signds":
            why = ("clipping or adding Gaussian noise to a SignDS message (h indices and a "
                   "sign) is meaningless: it gives the model no guarantee, and SignDS is "
                   "already eps-LDP per upload (privacy_report counts it)")
        else:
            why = ("Flower clips each reply's arrays as model weights (reply minus the global "
                   "weights), but a HorizontalStrategy reply carries the flat update and its "
                   "data size, and Flower's client-side clipping mods would rewrite it; for "
                   "central DP-FedAvg use keras_fedpriv.federated.flower.central_dp(strategy, "
                   "noise_multiplier=..., clipping_norm=..., accountant=...)")
        raise ValueError(f"Flower's {wrapper} cannot wrap a HorizontalStrategy with upload "
                         f"{upload}: {why}.")

    def summary(self) -> None:
        """Log the strategy's settings."""
        self._refuse_flower_dp()
        logger.info("HorizontalStrategy: upload %s, %d clients per round (at least %d "
                    "replies), %d local epochs, batch_norm=%r, MagRR %s, Laplace evaluation %s",
                    type(self.upload).__name__, self.clients_per_round, self.min_replies,
                    self.local_epochs, self.batch_norm, "on" if self.magrr else "off",
                    "on" if self.laplace else "off")

    def _connect(self, grid: Grid) -> None:
        """Wait for the clients and ask each node its client id (the ledger's unit)."""
        nodes = wait_for_nodes(grid, max(self.num_clients, self.clients_per_round),
                                self.connect_timeout)
        replies = grid.send_and_receive(
            [Message(wire.query_content(), dst_node_id=n, message_type=wire.QUERY)
             for n in nodes], timeout=self.connect_timeout)
        self.node_of = _client_ids(replies)

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
        """Sample the round's clients, count their releases and build their messages."""
        rnd = validate_positive_int(server_round, "server_round") - 1
        self._refuse_flower_dp(config)  # before any client is asked
        if self.node_of is None:
            self._connect(grid)
        self._set_weights(arrays)
        epochs = validate_positive_int(int(config.get(wire.LOCAL_EPOCHS, self.local_epochs)),
                                       "local-epochs")
        # sample among the clients still connected (a crashed node drops out)
        connected = set(grid.get_node_ids())
        available = [c for c, n in self.node_of.items() if n in connected]
        request = self.loop.begin_round(rnd, available, self.clients_per_round, epochs)
        content = wire.train_content(request, dict(config.items()))
        messages = [Message(content, dst_node_id=self.node_of[c], message_type=wire.TRAIN)
                    for c in request.client_ids]
        self._down = sum(message_nbytes(m) for m in messages)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check every reply, aggregate the good ones (at least ``min_replies``) and score."""
        request = self.loop.last_request
        if request is None or request.round != server_round - 1:
            raise ValueError(f"aggregate_train for round {server_round} without its "
                             "configure_train.")
        client_of = {self.node_of[c]: c for c in request.client_ids}
        with_magrr = self.magrr is not None
        parsed = []
        for reply in replies:
            node = reply.metadata.src_node_id
            cid = client_of.get(node)
            answer = TrainReply(node if cid is None else cid, asked=cid is not None)
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
        logs = self.loop.finish_round(parsed)
        wire_logs = {"wire_bytes_down": float(self._down),
                     "wire_bytes_up": float(sum(a.nbytes for a in parsed)),
                     "payload_bytes_up": logs["upload_bytes"]}
        self.loop.log(request.round, wire_logs)
        logs.update(wire_logs)
        updated = not math.isnan(logs["global_lr"])
        metrics = MetricRecord({k: float(v) for k, v in logs.items()})
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
        return [Message(content, dst_node_id=self.node_of[c], message_type=wire.EVALUATE)
                for c in request.client_ids]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """The Laplace evaluation's clustering scores from the good reports (None if none due)."""
        request = self.loop.evaluating
        if request is None or request.round != server_round - 1:
            return None
        client_of = {self.node_of[c]: c for c in request.client_ids}
        width = request.width
        bound = self.laplace.report_bound(width) if width else math.inf
        reports = []
        for reply in replies:
            node = reply.metadata.src_node_id
            cid = client_of.get(node)
            report = EvaluateReport(node if cid is None else cid, asked=cid is not None)
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


def _client_ids(replies: Sequence[Message]) -> dict[int, int]:
    """Client id -> node id from the query replies; an id two nodes claim is dropped."""
    claims: dict[int, list[int]] = {}
    for reply in replies:
        node = reply.metadata.src_node_id
        if reply.has_error():
            logger.warning("node %s did not answer the query", node)
            continue
        cid = wire.parse_client_id(reply)
        if cid is None:
            logger.warning("node %s answered the query without a valid client id", node)
            continue
        claims.setdefault(cid, []).append(node)
    node_of = {}
    for cid, nodes in claims.items():
        if len(nodes) > 1:
            logger.warning("%d nodes claim client id %d; none of them takes part", len(nodes),
                           cid)
            continue
        node_of[cid] = nodes[0]
    return node_of


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
        json.dump({"history": result.history, "rejected": result.rejected}, f)
    with open(os.path.join(folder, "ledger.json"), "w") as f:
        json.dump(result.ledger.to_dict(), f)
    np.savez(os.path.join(folder, "weights.npz"),
             *[np.asarray(w) for w in result.model.get_weights()])
