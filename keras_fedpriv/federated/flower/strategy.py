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
import json
import logging
import math
import os
import time
from typing import Any, Iterable, Sequence

import keras
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from keras_fedpriv.federated.flower.common import (
    _arrays,
    _first_line,
    _wait_for_nodes,
    message_nbytes,
)
from keras_fedpriv.federated.horizontal_parties import HorizontalServer
from keras_fedpriv.federated.laplace_eval import MAX_REPORT_ROWS
from keras_fedpriv.federated.malformed import MalformedMessage
from keras_fedpriv.federated.uploads import MalformedUpload, as_upload
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
            ``eps_rr`` must match the clients' ``magrr_eps``.
        laplace_eval: a `keras_fedpriv.callbacks.LaplaceEvaluation` with
            ``eval_data=None``, or None. Each client is asked for at most its
            ``max_report_rows`` rows and a larger report is refused before it
            is parsed; its ``max_scored_rows`` bounds each round's scoring.
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
        self.ledger = ReleaseLedger()
        self.history: dict[str, list[float]] = {}
        self.rejected: list[tuple[int, int, str]] = []
        self.node_of: dict[int, int] | None = None  # client id -> node id
        self._round: dict[str, Any] = {}
        event = getattr(self.upload, "dp_event", lambda: None)() or non_private_event()
        self._upload_kind = ReleaseKind(
            f"{type(self.upload).__name__} upload (received by the server)", "client data",
            CLIENT, event, "counted for every client asked to train, when asked")
        self._clear_kind = ReleaseKind(
            "BatchNormalization statistics and data size (received)", "client data", CLIENT,
            non_private_event(), "batch_norm='average': sent in the clear")
        self._unexpected_kind = ReleaseKind(
            "unexpected reply content (received)", "client data", CLIENT, non_private_event(),
            "a reply carrying more than the protocol releases")
        self._magrr_kind = None if magrr is None else ReleaseKind(
            "MagRR report (received)", "client data", CLIENT, magrr.dp_event(1),
            "one randomized-response bit per round a client takes part in")

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

    def summary(self) -> None:
        """Log the strategy's settings."""
        logger.info("HorizontalStrategy: upload %s, %d clients per round (at least %d "
                    "replies), %d local epochs, batch_norm=%r, MagRR %s, Laplace evaluation %s",
                    type(self.upload).__name__, self.clients_per_round, self.min_replies,
                    self.local_epochs, self.batch_norm, "on" if self.magrr else "off",
                    "on" if self.laplace else "off")

    def _connect(self, grid: Grid) -> None:
        """Wait for the clients and ask each node its client id (the ledger's unit)."""
        nodes = _wait_for_nodes(grid, max(self.num_clients, self.clients_per_round),
                                self.connect_timeout)
        replies = grid.send_and_receive(
            [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n,
                     message_type="query") for n in nodes], timeout=self.connect_timeout)
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
        started = time.perf_counter()
        if self.node_of is None:
            self._connect(grid)
        self._set_weights(arrays)
        epochs = validate_positive_int(int(config.get("local-epochs", self.local_epochs)),
                                       "local-epochs")
        # sample among the clients still connected (a crashed node drops out)
        connected = set(grid.get_node_ids())
        available = [c for c, n in self.node_of.items() if n in connected]
        if len(available) < self.min_replies:
            # asking would spend the clients' privacy on a round that cannot count
            raise RuntimeError(f"round {rnd}: {len(available)} clients are connected, fewer "
                               f"than min_replies={self.min_replies}.")
        chosen = self.server.sample(available, min(self.clients_per_round, len(available)))
        # a client that is asked releases when it answers, whether or not its reply
        # arrives in time or parses: count it now
        self.ledger.record(self._upload_kind, chosen)
        if self._magrr_kind is not None:
            self.ledger.record(self._magrr_kind, chosen)
        if self.server.bn_variables and self.batch_norm == "average":
            self.ledger.record(self._clear_kind, chosen)
        settings: dict[str, Any] = {k: v for k, v in config.items()
                                    if k not in ("round", "local-epochs", "magrr-cut")}
        settings.update({"round": rnd, "local-epochs": epochs})
        cut = self.server.magrr_cut()
        if cut is not None:
            settings["magrr-cut"] = float(cut)
        content = RecordDict({"weights": ArrayRecord(numpy_ndarrays=self.server.global_weights()),
                              "config": ConfigRecord(settings)})
        bn = self.server.global_batch_norm()
        if bn:
            content["batch-norm"] = ArrayRecord(numpy_ndarrays=bn)
        messages = [Message(content, dst_node_id=self.node_of[c], message_type="train")
                    for c in chosen]
        self._round = {"round": rnd, "chosen": chosen, "started": started, "with_bn": bool(bn),
                       "down": sum(message_nbytes(m) for m in messages)}
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check every reply, aggregate the good ones (at least ``min_replies``) and score."""
        state = self._round
        if state.get("round") != server_round - 1:
            raise ValueError(f"aggregate_train for round {server_round} without its "
                             "configure_train.")
        rnd, chosen = state["round"], state["chosen"]
        replies = list(replies)
        client_of = {self.node_of[c]: c for c in chosen}
        with_magrr = self._magrr_kind is not None
        good: dict[int, dict[str, Any]] = {}
        up = 0
        for reply in replies:
            node = reply.metadata.src_node_id
            cid = client_of.get(node)
            if reply.has_error():
                reason = f"error reply: {_first_line(reply.error.reason)}"
            else:
                up += message_nbytes(reply)
                reason = None
                if cid is None:
                    reason = "a reply from a node that was not asked"
                elif cid in good:
                    reason = "a second reply from the same client"
                else:
                    try:
                        good[cid] = _parse_reply(reply, self.server, with_magrr,
                                                 self.batch_norm)
                    except MalformedMessage as err:
                        reason = f"malformed upload: {err}"
                    except Exception as err:  # noqa: BLE001 - no reply may stop the server
                        reason = f"malformed upload: could not be read ({type(err).__name__})"
                    if reason is not None and _extra_content(reply, with_magrr, self.batch_norm,
                                                             self.server):
                        # it sent more than the protocol releases: count that too
                        self.ledger.record(self._unexpected_kind, [cid])
            if reason is not None:
                who = cid if cid is not None else node
                logger.warning("round %d: dropped the reply of client %s: %s", rnd, who, reason)
                self.rejected.append((rnd, who, reason))
        logs: dict[str, float] = {
            "replies": float(len(good)),
            "dropped": float(len(replies) - len(good) + len(chosen) - len(replies)),
            "wire_bytes_down": float(state["down"]), "wire_bytes_up": float(up)}
        updated = len(good) >= self.min_replies
        if updated:
            parsed = [good[c] for c in sorted(good)]
            logs.update(self.server.step(
                [p["upload"] for p in parsed],
                magrr_reports=[p["magrr"] for p in parsed] if self.magrr is not None else None,
                num_examples=[p["num_examples"] for p in parsed],
                batch_norm=[p["batch_norm"] for p in parsed] if state["with_bn"] else None))
            logs["payload_bytes_up"] = float(sum(p["upload"].nbytes for p in parsed))
        else:
            logger.warning("round %d: %d good replies, fewer than min_replies=%d; the global "
                           "model is unchanged", rnd, len(good), self.min_replies)
        if self.validation_data is not None:
            vx, vy = self.validation_data
            scores = self.server.model.evaluate(vx, vy, batch_size=1024, verbose=0,
                                                return_dict=True)
            logs.update({f"val_{k}": float(v) for k, v in scores.items()})
        logs["round_time_s"] = time.perf_counter() - state["started"]
        if self.magrr is not None:
            logs.update(self.magrr.log_values())
        self._log(rnd, logs)
        metrics = MetricRecord({k: float(v) for k, v in logs.items()})
        return (self.initial_arrays() if updated else None), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """With a due `LaplaceEvaluation`: ask the round's clients for noisy outputs."""
        rnd = validate_positive_int(server_round, "server_round") - 1
        if self.laplace is None or not self.laplace._due(rnd) or \
                self._round.get("round") != rnd:
            return []
        # what is asked: at most max_report_rows rows per client (a larger report is refused)
        content = RecordDict({"weights": ArrayRecord(numpy_ndarrays=self.server.global_weights()),
                              "config": ConfigRecord({"max-rows": self.laplace.max_report_rows})})
        bn = self.server.global_batch_norm()
        if bn:
            content["batch-norm"] = ArrayRecord(numpy_ndarrays=bn)
        chosen = self._round["chosen"]
        model = self.server.model
        width = int(model.compute_output_shape((1,) + tuple(model.inputs[0].shape[1:]))[-1]) \
            if getattr(model, "inputs", None) else None
        if self.laplace.num_classes is None:
            self.laplace.num_classes = width  # K, for the release's event
        self.ledger.record(self.laplace._release_kind(), list(chosen))  # asked: counted
        self._round.update(evaluate_started=time.perf_counter(), width=width)
        return [Message(content, dst_node_id=self.node_of[c], message_type="evaluate")
                for c in chosen]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """The Laplace evaluation's clustering scores from the good reports (None if none due)."""
        state = self._round
        rnd = server_round - 1
        if "evaluate_started" not in state or state.get("round") != rnd:
            return None
        client_of = {self.node_of[c]: c for c in state["chosen"]}
        reports: dict[int, np.ndarray] = {}
        for reply in replies:
            cid = client_of.get(reply.metadata.src_node_id)
            reason = None
            if cid is None:
                reason = "a reply from a node that was not asked"
            elif reply.has_error():
                reason = "error reply to 'evaluate'"
            elif cid in reports:
                reason = "a second report from the same client"
            else:
                try:
                    width = state["width"] or self.laplace.num_classes
                    bound = self.laplace.report_bound(width) if width else math.inf
                    reports[cid] = _parse_report(reply, width, self.laplace.max_report_rows,
                                                 bound)
                except MalformedMessage as err:
                    reason = f"malformed report: {err}"
                except Exception as err:  # noqa: BLE001 - no reply may stop the server
                    reason = f"malformed report: could not be read ({type(err).__name__})"
            if reason is not None:
                who = cid if cid is not None else reply.metadata.src_node_id
                logger.warning("round %d: dropped the evaluation of client %s: %s", rnd, who,
                               reason)
                self.rejected.append((rnd, who, reason))
        started = state.pop("evaluate_started")
        if reports:
            logs = self.laplace.receive_reports([(c, reports[c], None) for c in sorted(reports)],
                                                started)
        else:
            logs = dict.fromkeys(self.laplace.log_keys(), float("nan"))
        self._log(rnd, logs)
        return MetricRecord({k: float(v) for k, v in logs.items()})

    def _log(self, rnd: int, logs: dict[str, float]) -> None:
        for k, v in logs.items():
            self.history.setdefault(k, []).append(float(v))
        logger.info("round %d: %s", rnd, {k: round(v, 4) for k, v in logs.items()})

def _client_ids(replies: Sequence[Message]) -> dict[int, int]:
    """Client id -> node id from the query replies; an id two nodes claim is dropped."""
    claims: dict[int, list[int]] = {}
    for reply in replies:
        node = reply.metadata.src_node_id
        if reply.has_error():
            logger.warning("node %s did not answer the query", node)
            continue
        try:
            cid = reply.content["config"]["client-id"]
        except Exception:  # noqa: BLE001 - a malformed answer is no answer
            cid = None
        if isinstance(cid, bool) or not isinstance(cid, int) or cid < 0:
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


def _extra_content(reply: Message, with_magrr: bool, batch_norm: str,
                   server: HorizontalServer) -> bool:
    """Whether a reply carries content the protocol does not release (counted if so)."""
    try:
        content = reply.content
        meta = content["config"] if "config" in content else {}
        expected_bn = bool(server.bn_variables) and batch_norm == "average"
        return (set(content.keys()) - {"upload", "config"} - ({"batch-norm"} if expected_bn
                                                              else set())) != set() or \
            (set(meta.keys()) - {"client-id"} - ({"magrr-report"} if with_magrr else set())
             - ({"num-examples"} if expected_bn else set())) != set()
    except Exception:  # noqa: BLE001 - unreadable: count it
        return True


def _parse_reply(reply: Message, server: HorizontalServer, with_magrr: bool,
                 batch_norm: str) -> dict[str, Any]:
    """One reply's upload, MagRR bit and BN statistics, checked (a `MalformedMessage` if not)."""
    content = reply.content
    expected_bn = bool(server.bn_variables) and batch_norm == "average"
    keys = {"upload", "config"} | ({"batch-norm"} if expected_bn else set())
    if set(content.keys()) != keys:
        raise MalformedUpload(f"the reply must hold exactly the records {sorted(keys)}; got "
                              f"{sorted(map(str, content.keys()))}.")
    meta = content["config"]
    if not isinstance(meta, ConfigRecord):
        raise MalformedUpload("'config' must be a ConfigRecord.")
    meta_keys = {"client-id"} | ({"magrr-report"} if with_magrr else set()) | \
        ({"num-examples"} if expected_bn else set())
    if set(meta.keys()) != meta_keys:
        raise MalformedUpload(f"'config' must hold exactly {sorted(meta_keys)}; got "
                              f"{sorted(map(str, meta.keys()))}.")
    # a generous bound: twice a dense float64 update plus headers
    arrays = _arrays(content["upload"], "upload", 16 * server.dim + 4096)
    out: dict[str, Any] = {"upload": server.receive(arrays), "magrr": None, "num_examples": 1,
                           "batch_norm": None}
    if with_magrr:
        bit = meta["magrr-report"]
        if isinstance(bit, bool) or not isinstance(bit, int) or bit not in (0, 1):
            raise MalformedUpload("'magrr-report' must be 0 or 1.")
        out["magrr"] = bit
    if expected_bn:
        bn_size = sum(int(np.prod(v.shape)) for v in server.bn_variables)
        stats = _arrays(content["batch-norm"], "batch-norm", 16 * bn_size + 4096)
        out["batch_norm"] = server.check_batch_norm(list(stats.values()))
        n = meta["num-examples"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise MalformedUpload("'num-examples' must be an integer >= 1.")
        out["num_examples"] = n
    return out


def _parse_report(reply: Message, width: int | None, max_rows: int = MAX_REPORT_ROWS,
                  bound: float = math.inf) -> np.ndarray:
    """A client's LaplaceEvaluation report, checked (`MalformedUpload` if not as promised).

    Its size is checked before anything is deserialized: no more bytes than a
    float64 ``(max_rows, width)`` array (the rows the server asked for). Its
    values must be finite and at most ``bound`` in magnitude
    (`LaplaceEvaluation.report_bound`: an honest report exceeds it with
    probability about ``exp(-700)``), so no report can overflow the scores.
    """
    if set(reply.content.keys()) != {"report", "config"}:
        raise MalformedUpload("the reply must hold exactly 'report' and 'config'.")
    if width is None:  # pragma: no cover - the strategy knows K before it asks
        raise MalformedUpload("the server does not know the model's output width.")
    rows = _arrays(reply.content["report"], "report", 8 * max_rows * width + 4096)
    if set(rows) != {"report"}:
        raise MalformedUpload("'report' must hold exactly the array 'report'.")
    noisy = rows["report"]
    if noisy.dtype != np.float64 or noisy.ndim != 2 or len(noisy) == 0 or (
            width is not None and noisy.shape[1] != width):
        raise MalformedUpload(f"the report must be a non-empty float64 array of shape "
                              f"(n, {width}); got {noisy.dtype} {noisy.shape}.")
    if len(noisy) > max_rows:
        raise MalformedUpload(f"the report holds {len(noisy)} rows, more than the {max_rows} "
                              "asked for.")
    if not np.isfinite(noisy).all():
        raise MalformedUpload("the report holds NaN or infinity.")
    if np.abs(noisy).max() > bound:
        raise MalformedUpload(f"the report holds values beyond +-{bound:.6g}, which the "
                              "mechanism's noise does not reach.")
    return noisy


def _write_result(folder: str, result: FlowerRunResult) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "history.json"), "w") as f:
        json.dump({"history": result.history, "rejected": result.rejected}, f)
    with open(os.path.join(folder, "ledger.json"), "w") as f:
        json.dump(result.ledger.to_dict(), f)
    np.savez(os.path.join(folder, "weights.npz"),
             *[np.asarray(w) for w in result.model.get_weights()])
