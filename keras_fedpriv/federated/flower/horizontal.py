"""Horizontal FL as Flower apps: a `ClientApp` per client, a `ServerApp` that drives rounds.

The apps are thin: the client half (`HorizontalClient`) and the server half
(`HorizontalServer`) are the objects `HorizontalFL` drives in one process, so
given the same seeds and data both runtimes compute the same global model.

What crosses the wire each round (Flower ``Message`` contents):

* server -> client (message type ``"train"``): ``"weights"`` (the global
  trainable weights), ``"batch-norm"`` (the global BatchNormalization
  statistics, if any) and ``"config"`` (round, local epochs, MagRR's
  announcement ``magrr-cut``);
* client -> server: ``"upload"`` (exactly the upload scheme's `to_wire`
  arrays: for SignDS a sign and h indices, nothing else), and only where the
  protocol needs it ``"batch-norm"`` + ``num-examples`` (``batch_norm=
  "average"``, in the clear) and ``magrr-report`` (MagRR's randomized bit).
  The client's loss, data size (SignDS, Gaussian) and SignDS magnitude stay
  on the client.

The server checks every reply before it is used: a reply with an error, a
malformed upload (`MalformedUpload`: wrong keys, dtype or length, unsorted,
repeated or out-of-range indices, a non-finite value), a bad MagRR bit or bad
BatchNormalization statistics is dropped with a logged reason and never
aggregated; a round with fewer than ``min_replies`` good replies leaves the
global model unchanged. Records are checked before anything in them is
deserialized (record types, keys, array kinds and sizes), and no reply can
stop the server. The server's release ledger counts a release for every
client it asks to train, when it asks (a client that answers has released,
even if its reply is late or dropped), and anything a reply carries beyond
the protocol.

Secrets: what a client relies on for its privacy (its mechanism seeds, its
upload scheme and eps) comes from the client's own code or node config, never
from a message or the run configuration, which the server's side controls.
In a real deployment leave seeds None (fresh OS entropy per release).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import re
import time
from typing import Any, Callable, Sequence

import keras
import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from keras_fedpriv.federated.horizontal_parties import (
    HorizontalClient,
    HorizontalServer,
    LocalTrainer,
)
from keras_fedpriv.federated.uploads import MalformedUpload, as_upload
from keras_fedpriv.mechanisms.ledger import (
    CLIENT,
    ReleaseKind,
    ReleaseLedger,
    non_private_event,
)
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed

__all__ = ["FlowerRunResult", "horizontal_client_app", "horizontal_server_app", "message_nbytes"]

logger = logging.getLogger("keras_fedpriv.flower")

# One model and one traced training function per (run, model builder) in a process: the
# Simulation Engine runs many virtual clients in one worker process, and tracing per client
# would cost what Flower's own Keras quickstart pays.
_TRAINERS: dict[Any, tuple[keras.Model, LocalTrainer]] = {}
# Each client's half (its upload scheme's state, MagRR copy, own BN statistics), per run.
_CLIENTS: dict[Any, HorizontalClient] = {}


def _caches() -> tuple[dict[Any, Any], dict[Any, Any]]:
    """This process's caches. Reached through a module-level function: Ray pickles the apps'
    closures by value, and a module dict they named directly would arrive as a fresh copy
    with every message (rebuilding the model each time)."""
    return _TRAINERS, _CLIENTS


def message_nbytes(message: Message) -> int:
    """The size of a Flower message as Flower serializes it (protobuf bytes).

    What Flower sends for the message, content and metadata, before the
    transport's own framing (HTTP/gRPC headers, TLS).
    """
    from flwr.common.serde import message_to_proto

    return len(message_to_proto(message).SerializeToString())


def _default_client_id(context: Context) -> int:
    config = context.node_config
    for key in ("client-id", "partition-id"):
        if key in config:
            return int(config[key])
    raise ValueError("The SuperNode's node config must set 'client-id' or 'partition-id' "
                     "(flower-supernode --node-config \"partition-id=0\"), or pass client_id_fn "
                     f"to horizontal_client_app; got keys {sorted(config)}.")


def _call(fn: Callable[..., Any], *args: Any, context: Context) -> Any:
    """``fn(*args, context=context)`` if ``fn`` declares ``context``, else ``fn(*args)``."""
    try:
        takes = "context" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        takes = False
    return fn(*args, context=context) if takes else fn(*args)


def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Named numpy arrays as a Flower ArrayRecord."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(reason: Any) -> str:
    """An error reply's own message, one line: a client's traceback is its own business."""
    text = _ANSI.sub("", str(reason))
    # a ClientApp exception, as the engine wraps it
    match = re.search(r"occurred\. Message: *\n?(.+)", text)
    line = match.group(1) if match else (text.strip().splitlines() or [""])[0]
    return line.strip()[:200]


def _stateful(upload: Any) -> list[Any]:
    """The objects whose ``state_dict`` holds the upload scheme's release counters."""
    out = [upload] if hasattr(upload, "state_dict") else []
    protections = getattr(upload, "privacy_protections", None)
    if protections is not None:
        out += [p for p in protections() if hasattr(p, "state_dict")]
    return out


def _save_state(context: Context, client: HorizontalClient) -> None:
    """The client's release counters, ledgers and FedBN statistics into ``context.state``."""
    states = [obj.state_dict() for obj in _stateful(client.upload)]
    magrr = client.magrr.state_dict() if client.magrr is not None else None
    laplace = getattr(client, "laplace", None)
    context.state["keras-fedpriv"] = ConfigRecord(
        {"upload": json.dumps(states), "magrr": json.dumps(magrr),
         "laplace": json.dumps(None if laplace is None else laplace.state_dict())})
    if client._own_bn is not None:
        context.state["keras-fedpriv-bn"] = ArrayRecord(numpy_ndarrays=list(client._own_bn))


def _load_state(context: Context, client: HorizontalClient) -> None:
    """Restore what `_save_state` wrote: ``context.state`` is the client's truth.

    Called on every message: the Simulation Engine hands a node's messages to
    whichever worker process is free, so a process's cached copy of a client
    may be behind (its counters would replay noise already released).
    """
    if "keras-fedpriv" in context.state:
        record = context.state["keras-fedpriv"]
        for obj, state in zip(_stateful(client.upload), json.loads(record["upload"])):
            obj.load_state_dict(state)
        magrr = json.loads(record["magrr"])
        if client.magrr is not None and magrr is not None:
            client.magrr.load_state_dict(magrr)
        laplace = json.loads(record["laplace"]) if "laplace" in record else None
        if getattr(client, "laplace", None) is not None and laplace is not None:
            client.laplace.load_state_dict(laplace)
    if "keras-fedpriv-bn" in context.state:
        client._own_bn = context.state["keras-fedpriv-bn"].to_numpy_ndarrays()


def _client_error(msg: Message, what: str) -> Message:
    """An error reply that says nothing of the client's data (the details stay in its log).

    Flower would otherwise send ``str(exception)`` to the server, and a Keras or
    TensorFlow error can quote the client's labels or features.
    """
    logger.exception("the client failed to answer a %r message", what)
    return Message(error=Error(code=1, reason=f"the client failed to answer a {what!r} message "
                                              "(details in the client's own log)"),
                   reply_to=msg)


def horizontal_client_app(model_fn: Callable[[], keras.Model],
                          data_fn: Callable[[Context], tuple[Any, Any]],
                          upload_fn: Callable[[], Any] = lambda: "fedavg", *,
                          batch_size: int = 32, seed: int | None = None,
                          batch_norm: str = "average", magrr_eps: float | None = None,
                          laplace_eval_fn: Callable[[Context], Any] | None = None,
                          client_id_fn: Callable[[Context], int] = _default_client_id,
                          max_local_epochs: int = 100) -> ClientApp:
    """A Flower `ClientApp` that trains a horizontal-FL client and uploads through a scheme.

    Args:
        model_fn: builds the compiled Keras model (the same architecture as
            the server's; its optimizer trains locally).
        data_fn: ``data_fn(context) -> (x, y)``: this client's data (e.g. a
            partition chosen by ``context.node_config["partition-id"]``).
        upload_fn: builds this client's upload scheme: ``"fedavg"``,
            ``"signds"``, a `SignDSEncoder`, or an upload object. Called
            once per client and run, with ``context=`` (Flower's `Context`:
            its ``run_config`` and ``node_config``) if it declares a
            ``context`` parameter; the scheme's release counters are kept
            in the node's ``context.state`` between rounds.
        batch_size: local mini-batch size.
        seed: None or an int: keys the client's shuffling and, with
            ``magrr_eps``, its MagRR reports; a seeded upload scheme has its
            own seed. Chosen by the client's code, never by the server.
        batch_norm: ``"average"`` (send BatchNormalization statistics, in
            the clear) or ``"local"`` (FedBN: keep them).
        magrr_eps: MagRR's ``eps_rr`` on this client (SignDS only), None if
            the server runs no MagRR, or ``magrr_eps(context)`` returning
            either. Must match the server's.
        client_id_fn: ``client_id_fn(context) -> int``: the client's id (its
            unit in the release ledger); default: the node config's
            ``client-id`` or ``partition-id``.
        laplace_eval_fn: ``laplace_eval_fn(context) -> LaplaceEvaluation``:
            this client's copy of `keras_fedpriv.callbacks.LaplaceEvaluation`
            (its ``eps``, ``sensitivity`` and seed; ``log_clean`` must be
            off), to answer the server's ``"evaluate"`` messages with its
            model outputs plus Laplace noise; None: the client refuses them.
        max_local_epochs: the most local epochs per round this client
            accepts from the server (a bound on the work a server can ask).

    Choose the upload scheme, its eps and MagRR's in client code or from
    ``context.node_config`` (set by the client's operator with
    ``flower-supernode --node-config``), never from ``context.run_config``:
    the run config is set by whoever starts the run, i.e. the server's side,
    which could otherwise switch every client to FedAvg or to a larger eps.

    Returns:
        A `flwr.clientapp.ClientApp` answering ``"query"`` and ``"train"``
        messages of `horizontal_server_app`.
    """
    batch_size = validate_positive_int(batch_size, "batch_size")
    max_local_epochs = validate_positive_int(max_local_epochs, "max_local_epochs")
    seed = validate_seed(seed)
    if batch_norm not in ("average", "local"):
        raise ValueError(f"`batch_norm` must be 'average' or 'local'; got {batch_norm!r}.")
    app = ClientApp()

    def client(context: Context) -> HorizontalClient:
        trainers, clients = _caches()
        key = (context.run_id, context.node_id)
        if key in clients:
            party = clients[key]
            _load_state(context, party)
            return party
        x, y = data_fn(context)
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype.kind == "f":
            x = x.astype(np.float32)
        if y.dtype.kind == "f":
            y = y.astype(np.float32)
        # by name: an unpickled copy of model_fn is another object for every message
        tkey = (context.run_id, getattr(model_fn, "__module__", ""),
                getattr(model_fn, "__qualname__", repr(model_fn)))
        if tkey not in trainers:
            model = model_fn()
            if not model.built:
                model(x[:1])
            trainers[tkey] = (model, LocalTrainer(model, batch_size, (x.shape[1:], x.dtype),
                                                   (y.shape[1:], y.dtype)))
        trainer = trainers[tkey][1]
        magrr = None
        eps_rr = magrr_eps(context) if callable(magrr_eps) else magrr_eps
        if eps_rr is not None:
            from keras_fedpriv.callbacks.magrr import MagRR

            magrr = MagRR(eps_rr=eps_rr, seed=seed)
        party = HorizontalClient(trainer, (x, y), as_upload(_call(upload_fn, context=context)),
                                 client_id_fn(context),
                                 seed=seed, batch_norm=batch_norm, magrr=magrr)
        party.laplace = None
        if laplace_eval_fn is not None:
            party.laplace = laplace_eval_fn(context)
            if getattr(party.laplace, "log_clean", False):
                raise ValueError("a client's LaplaceEvaluation must not log_clean: the clean "
                                 "outputs would have to leave the client.")
        _load_state(context, party)
        clients[key] = party
        return party

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        try:
            party = client(context)
        except Exception:  # noqa: BLE001 - the reason stays on the client
            return _client_error(msg, "query")
        return Message(RecordDict({"config": ConfigRecord({"client-id": party.client_id})}),
                       reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        try:
            party = client(context)
            if party.laplace is None:
                raise ValueError("this client runs no LaplaceEvaluation (laplace_eval_fn).")
            model = party.trainer.model
            for v, w in zip(model.trainable_variables,
                            msg.content["weights"].to_numpy_ndarrays()):
                v.assign(w)
            if "batch-norm" in msg.content:
                for v, w in zip(party.trainer.bn_variables,
                                msg.content["batch-norm"].to_numpy_ndarrays()):
                    v.assign(w)
            outputs = party.laplace.client_outputs(model, party.x)
            noisy, _ = party.laplace.report_outputs(outputs, party.client_id)
            _save_state(context, party)
        except Exception:  # noqa: BLE001 - the reason stays on the client
            return _client_error(msg, "evaluate")
        return Message(RecordDict({"report": _record({"report": noisy}),
                                   "config": ConfigRecord({"client-id": party.client_id})}),
                       reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        try:
            return _train(msg, context)
        except Exception:  # noqa: BLE001 - the reason stays on the client
            return _client_error(msg, "train")

    def _train(msg: Message, context: Context) -> Message:
        party = client(context)
        config = msg.content["config"]
        weights = msg.content["weights"].to_numpy_ndarrays()
        bn = msg.content["batch-norm"].to_numpy_ndarrays() if "batch-norm" in msg.content else []
        cut = config["magrr-cut"] if "magrr-cut" in config else None
        epochs = validate_positive_int(config["local-epochs"], "local-epochs")
        if epochs > max_local_epochs:
            raise ValueError(f"the server asked for {epochs} local epochs; this client accepts "
                             f"at most max_local_epochs={max_local_epochs}.")
        rnd = validate_positive_int(config["round"], "round", minimum=0)
        result = party.fit(weights, rnd, epochs, bn, magrr_cut=cut)
        _save_state(context, party)
        content = RecordDict({"upload": _record(party.upload.to_wire(result.upload))})
        meta: dict[str, Any] = {"client-id": party.client_id}
        if result.magrr_report is not None:
            meta["magrr-report"] = int(result.magrr_report)
        if bn and batch_norm == "average":
            content["batch-norm"] = ArrayRecord(numpy_ndarrays=result.batch_norm)
            meta["num-examples"] = party.num_examples
        content["config"] = ConfigRecord(meta)
        return Message(content, reply_to=msg)

    return app


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


def _wait_for_nodes(grid: Grid, count: int, timeout: float, what: str = "clients") -> list[int]:
    """The connected node ids once ``count`` are connected (`TimeoutError` after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} of the {count} {what} needed connected "
                               f"within {timeout:g} s.")
        time.sleep(0.5)
    return nodes


def horizontal_server_app(model_fn: Callable[[], keras.Model],
                          upload_fn: Callable[[], Any] = lambda: "fedavg", *,
                          rounds: int = 3, clients_per_round: int = 2, local_epochs: int = 1,
                          num_clients: int | None = None, min_replies: int = 1,
                          seed: int | None = None, batch_norm: str = "average",
                          magrr: Any = None, laplace_eval: Any = None,
                          validation_data: tuple[Any, Any] | None = None,
                          round_timeout: float = 600.0, connect_timeout: float = 300.0,
                          on_finish: Callable[[FlowerRunResult], None] | None = None
                          ) -> ServerApp:
    """A Flower `ServerApp` that runs horizontal FL rounds with keras-fedpriv's server half.

    Run settings can be overridden per run with Flower's run config
    (``flwr run . --run-config "num-server-rounds=5 clients-per-round=3"``):
    ``num-server-rounds``, ``clients-per-round``, ``local-epochs``,
    ``min-replies``, ``round-timeout``; ``result-path`` (a folder) makes the server write
    ``history.json``, ``ledger.json`` and ``weights.npz`` there at the end.

    Args:
        model_fn: builds the compiled global Keras model (its initial weights
            are the first global model; its metrics score ``validation_data``).
        upload_fn: builds the server's copy of the upload scheme (the same
            kind and settings as the clients'; the server uses ``aggregate``
            and ``from_wire``); called with ``context=`` if it declares a
            ``context`` parameter.
        rounds: number of rounds.
        clients_per_round: clients sampled each round (uniformly, without
            replacement, from the connected clients' ids).
        local_epochs: epochs of local training per client and round.
        num_clients: clients to wait for before the first round (default:
            ``clients_per_round``).
        min_replies: the fewest good replies that make a round; with fewer
            the global model is left unchanged for that round.
        seed: None or an int: the client sampling.
        batch_norm: ``"average"`` or ``"local"``; must match the clients'.
        magrr: a `keras_fedpriv.callbacks.MagRR` (server side; SignDS only),
            None, or ``magrr(context)`` returning either (a fresh MagRR per
            run). Its ``eps_rr`` must match the clients' ``magrr_eps``.
        laplace_eval: a `keras_fedpriv.callbacks.LaplaceEvaluation`
            (server side, with ``eval_data=None``), None, or
            ``laplace_eval(context)`` returning either: every
            ``every_n_epochs``-th round the round's clients answer an
            ``"evaluate"`` message with their outputs plus Laplace noise
            (their ``laplace_eval_fn`` copy) and the server logs the
            clustering scores (``laplace_*``).
        validation_data: ``(x, y)`` the server scores the global model on
            after every round (``val_*`` in the history).
        round_timeout: seconds to wait for a round's replies; late replies
            are not used.
        connect_timeout: seconds to wait for ``num_clients`` clients.
        on_finish: called with a `FlowerRunResult` at the end (in the
            Simulation Engine this runs in the caller's process).

    Returns:
        A `flwr.serverapp.ServerApp`.
    """
    rounds = validate_positive_int(rounds, "rounds")
    clients_per_round = validate_positive_int(clients_per_round, "clients_per_round")
    local_epochs = validate_positive_int(local_epochs, "local_epochs")
    min_replies = validate_positive_int(min_replies, "min_replies")
    num_clients = validate_positive_int(num_clients or clients_per_round, "num_clients")
    if min_replies > clients_per_round:
        raise ValueError(f"`min_replies`={min_replies} is more than `clients_per_round`="
                         f"{clients_per_round}: no round could count.")
    seed = validate_seed(seed)
    if batch_norm not in ("average", "local"):
        raise ValueError(f"`batch_norm` must be 'average' or 'local'; got {batch_norm!r}.")
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run = context.run_config
        n_rounds = validate_positive_int(int(run.get("num-server-rounds", rounds)),
                                         "num-server-rounds")
        per_round = validate_positive_int(int(run.get("clients-per-round", clients_per_round)),
                                          "clients-per-round")
        epochs = validate_positive_int(int(run.get("local-epochs", local_epochs)), "local-epochs")
        need = validate_positive_int(int(run.get("min-replies", min_replies)), "min-replies")
        if need > per_round:
            raise ValueError(f"run config 'min-replies'={need} is more than "
                             f"'clients-per-round'={per_round}: no round could count.")
        wait = float(run.get("round-timeout", round_timeout))
        if not wait > 0:
            raise ValueError(f"`round-timeout` must be > 0 seconds; got {wait!r}.")
        model = model_fn()
        upload = as_upload(_call(upload_fn, context=context))
        magrr_ = magrr
        if callable(magrr) and not hasattr(magrr, "server_update"):
            magrr_ = magrr(context)
        server = HorizontalServer(model, upload, seed=seed, batch_norm=batch_norm, magrr=magrr_)
        laplace = laplace_eval
        if callable(laplace) and not hasattr(laplace, "receive_reports"):
            laplace = laplace(context)
        if laplace is not None:
            laplace.set_model(model)
        ledger = ReleaseLedger()
        upload_event = getattr(upload, "dp_event", lambda: None)() or non_private_event()
        upload_kind = ReleaseKind(f"{type(upload).__name__} upload (received by the server)",
                                  "client data", CLIENT, upload_event,
                                  "counted for every client asked to train, when asked")
        clear_kind = ReleaseKind("BatchNormalization statistics and data size (received)",
                                 "client data", CLIENT, non_private_event(),
                                 "batch_norm='average': sent in the clear")
        unexpected_kind = ReleaseKind("unexpected reply content (received)", "client data",
                                      CLIENT, non_private_event(),
                                      "a reply carrying more than the protocol releases")
        magrr_kind = None if magrr_ is None else ReleaseKind(
            "MagRR report (received)", "client data", CLIENT, magrr_.dp_event(1),
            "one randomized-response bit per round a client takes part in")

        nodes = _wait_for_nodes(grid, max(num_clients, per_round), connect_timeout)
        replies = grid.send_and_receive(
            [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n,
                     message_type="query") for n in nodes], timeout=wait)
        node_of = _client_ids(replies)

        history: dict[str, list[float]] = {}
        rejected: list[tuple[int, int, str]] = []
        for rnd in range(n_rounds):
            started = time.perf_counter()
            # sample among the clients still connected (a crashed node drops out)
            connected = set(grid.get_node_ids())
            available = [c for c, n in node_of.items() if n in connected]
            if len(available) < need:
                # asking would spend the clients' privacy on a round that cannot count
                raise RuntimeError(f"round {rnd}: {len(available)} clients are connected, fewer "
                                   f"than min_replies={need}.")
            chosen = server.sample(available, min(per_round, len(available)))
            # a client that is asked releases when it answers, whether or not its reply
            # arrives in time or parses: count it now
            ledger.record(upload_kind, chosen)
            if magrr_kind is not None:
                ledger.record(magrr_kind, chosen)
            if server.bn_variables and batch_norm == "average":
                ledger.record(clear_kind, chosen)
            weights = server.global_weights()
            bn = server.global_batch_norm()
            config: dict[str, Any] = {"round": rnd, "local-epochs": epochs}
            cut = server.magrr_cut()
            if cut is not None:
                config["magrr-cut"] = float(cut)
            content = RecordDict({"weights": ArrayRecord(numpy_ndarrays=weights),
                                  "config": ConfigRecord(config)})
            if bn:
                content["batch-norm"] = ArrayRecord(numpy_ndarrays=bn)
            messages = [Message(content, dst_node_id=node_of[c], message_type="train")
                        for c in chosen]
            down = sum(message_nbytes(m) for m in messages)
            replies = list(grid.send_and_receive(messages, timeout=wait))
            client_of = {node_of[c]: c for c in chosen}
            good = {}
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
                    else:
                        try:
                            good[cid] = _parse_reply(reply, server, magrr_kind is not None,
                                                     batch_norm)
                        except MalformedUpload as err:
                            reason = f"malformed upload: {err}"
                        except Exception as err:  # noqa: BLE001 - no reply may stop the server
                            reason = f"malformed upload: could not be read ({type(err).__name__})"
                        if reason is not None and _extra_content(reply, magrr_kind is not None,
                                                                 batch_norm, server):
                            # it sent more than the protocol releases: count that too
                            ledger.record(unexpected_kind, [cid])
                if reason is not None:
                    who = cid if cid is not None else node
                    logger.warning("round %d: dropped the reply of client %s: %s", rnd, who,
                                   reason)
                    rejected.append((rnd, who, reason))
            logs: dict[str, float] = {"replies": float(len(good)),
                                      "dropped": float(len(replies) - len(good)
                                                       + len(chosen) - len(replies)),
                                      "wire_bytes_down": float(down),
                                      "wire_bytes_up": float(up)}
            if len(good) >= need:
                order = sorted(good)
                parsed = [good[c] for c in order]
                logs.update(server.step(
                    [p["upload"] for p in parsed],
                    magrr_reports=[p["magrr"] for p in parsed] if magrr_ is not None else None,
                    num_examples=[p["num_examples"] for p in parsed],
                    batch_norm=[p["batch_norm"] for p in parsed] if bn else None))
                logs["payload_bytes_up"] = float(sum(p["upload"].nbytes for p in parsed))
            else:
                logger.warning("round %d: %d good replies, fewer than min_replies=%d; the global "
                               "model is unchanged", rnd, len(good), need)
            if validation_data is not None:
                vx, vy = validation_data
                scores = model.evaluate(vx, vy, batch_size=1024, verbose=0, return_dict=True)
                logs.update({f"val_{k}": float(v) for k, v in scores.items()})
            logs["round_time_s"] = time.perf_counter() - started
            if laplace is not None and laplace._due(rnd):
                logs.update(_laplace_round(grid, laplace, server, chosen, node_of, rnd, wait,
                                           ledger, rejected))
            if magrr_ is not None:
                logs.update(magrr_.log_values())
            for k, v in logs.items():
                history.setdefault(k, []).append(float(v))
            logger.info("round %d: %s", rnd, {k: round(v, 4) for k, v in logs.items()})
        result = FlowerRunResult(model, history, ledger, rejected)
        if run.get("result-path"):
            _write_result(str(run["result-path"]), result)
        if on_finish is not None:
            on_finish(result)

    return app


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


def _arrays(record: Any, what: str, max_bytes: int) -> dict[str, np.ndarray]:
    """A received ArrayRecord's arrays, checked before anything is deserialized."""
    if not isinstance(record, ArrayRecord):
        raise MalformedUpload(f"{what!r} must be an ArrayRecord; got {type(record).__name__}.")
    total = 0
    for key, array in record.items():
        if getattr(array, "stype", None) != "numpy.ndarray":
            raise MalformedUpload(f"{what!r} array {key!r} is not a numpy array.")
        total += len(array.data)
        if total > max_bytes:
            raise MalformedUpload(f"{what!r} holds more than the {max_bytes} bytes the protocol "
                                  "sends.")
    return {str(k): a.numpy() for k, a in record.items()}


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
    """One reply's upload, MagRR bit and BN statistics, checked (`MalformedUpload` if not)."""
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


def _laplace_round(grid: Grid, laplace: Any, server: HorizontalServer, chosen: Sequence[int],
                   node_of: dict[int, int], rnd: int, wait: float, ledger: ReleaseLedger,
                   rejected: list[tuple[int, int, str]]) -> dict[str, float]:
    """The round's clients evaluate the new global model under Laplace noise; the server scores."""
    started = time.perf_counter()
    content = RecordDict({"weights": ArrayRecord(numpy_ndarrays=server.global_weights())})
    bn = server.global_batch_norm()
    if bn:
        content["batch-norm"] = ArrayRecord(numpy_ndarrays=bn)
    messages = [Message(content, dst_node_id=node_of[c], message_type="evaluate")
                for c in chosen]
    width = int(server.model.compute_output_shape((1,) + tuple(
        server.model.inputs[0].shape[1:]))[-1]) if getattr(server.model, "inputs", None) \
        else None
    if laplace.num_classes is None:
        laplace.num_classes = width  # K, for the release's event (the clients' output length)
    ledger.record(laplace._release_kind(), list(chosen))  # asked: counted
    client_of = {node_of[c]: c for c in chosen}
    reports = {}
    for reply in grid.send_and_receive(messages, timeout=wait):
        cid = client_of.get(reply.metadata.src_node_id)
        reason = None
        if cid is None:
            reason = "a reply from a node that was not asked"
        elif reply.has_error():
            reason = "error reply to 'evaluate'"
        else:
            try:
                reports[cid] = _parse_report(reply, width)
            except MalformedUpload as err:
                reason = f"malformed report: {err}"
            except Exception as err:  # noqa: BLE001 - no reply may stop the server
                reason = f"malformed report: could not be read ({type(err).__name__})"
        if reason is not None:
            who = cid if cid is not None else reply.metadata.src_node_id
            logger.warning("round %d: dropped the evaluation of client %s: %s", rnd, who, reason)
            rejected.append((rnd, who, reason))
    if not reports:
        return dict.fromkeys(laplace.log_keys(), float("nan"))
    return laplace.receive_reports([(c, reports[c], None) for c in sorted(reports)], started)


def _parse_report(reply: Message, width: int | None) -> np.ndarray:
    """A client's LaplaceEvaluation report, checked (`MalformedUpload` if not as promised)."""
    if set(reply.content.keys()) != {"report", "config"}:
        raise MalformedUpload("the reply must hold exactly 'report' and 'config'.")
    rows = _arrays(reply.content["report"], "report", 8 * 10**8)
    if set(rows) != {"report"}:
        raise MalformedUpload("'report' must hold exactly the array 'report'.")
    noisy = rows["report"]
    if noisy.dtype != np.float64 or noisy.ndim != 2 or len(noisy) == 0 or (
            width is not None and noisy.shape[1] != width):
        raise MalformedUpload(f"the report must be a non-empty float64 array of shape "
                              f"(n, {width}); got {noisy.dtype} {noisy.shape}.")
    if not np.isfinite(noisy).all():
        raise MalformedUpload("the report holds NaN or infinity.")
    return noisy


def _write_result(folder: str, result: FlowerRunResult) -> None:
    import os

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "history.json"), "w") as f:
        json.dump({"history": result.history, "rejected": result.rejected}, f)
    with open(os.path.join(folder, "ledger.json"), "w") as f:
        json.dump(result.ledger.to_dict(), f)
    np.savez(os.path.join(folder, "weights.npz"),
             *[np.asarray(w) for w in result.model.get_weights()])

