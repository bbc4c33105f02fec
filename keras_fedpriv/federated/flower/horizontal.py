"""Horizontal FL as Flower apps: a `ClientApp` per client, a `ServerApp` that drives rounds.

The apps are thin: the client half (`HorizontalClient`) and the server half
(`HorizontalServer`) are the objects `HorizontalFL` drives in one process, so
given the same seeds and data both runtimes compute the same global model.

What crosses the wire each round (the record names, config keys, encoders and
parsers are in `keras_fedpriv.federated.horizontal.wire`): the server
sends the global weights (and BatchNormalization statistics, MagRR's
announcement); a client answers with exactly the upload scheme's `to_wire`
arrays (for SignDS a sign and h indices, nothing else) and, only where the
protocol needs them, its BatchNormalization statistics with its data size
(``batch_norm="average"``, in the clear) and MagRR's randomized bit. The
client's loss, data size (SignDS, Gaussian) and SignDS magnitude stay on the
client.

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

import json
from typing import Any, Callable, Sequence

import keras
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from keras_fedpriv.federated.horizontal import wire
from keras_fedpriv.federated.flower.common import (  # noqa: F401 - message_nbytes is public here
    party_budget,
    check_renamed,
    call_with_context,
    logger,
    message_nbytes,
)
from keras_fedpriv.federated.flower.strategy import (  # noqa: F401 - FlowerRunResult is public here
    FlowerRunResult,
    HorizontalStrategy,
    write_result,
)
from keras_fedpriv.federated.flower.central_dp import refuse_dp_mods
from keras_fedpriv.federated.flower.party_store import durable_state_mod
from keras_fedpriv.federated.flower.recent_runs import RecentRuns
from keras_fedpriv.federated.horizontal.parties import (
    ClientDataError,
    HorizontalClient,
    LocalTrainer,
    check_client_data,
)
from keras_fedpriv.federated.uploads import as_upload
from keras_fedpriv.mechanisms.ledger import CLIENT, ReleaseKind, ReleaseLedger, non_private_event
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed
from keras_fedpriv.privacy.budget import BudgetExhausted, PrivacyBudget
from keras_fedpriv.privacy.report import privacy_ledger

__all__ = ["FlowerRunResult", "horizontal_client_app", "horizontal_server_app", "message_nbytes"]

# One model and one compiled training function per (run, model builder) in a process: the
# Simulation Engine runs many virtual clients in one worker process, and tracing per client
# would cost what Flower's own Keras quickstart pays.
_TRAINERS: dict[Any, tuple[keras.Model, LocalTrainer]] = {}
# Each client's half (its upload scheme's state, MagRR copy, own BN statistics), per run.
_CLIENTS: dict[Any, HorizontalClient] = {}
# What a train reply carries in the clear with batch_norm="average" (the client's budget
# counts it as the server's ledger does: a release without DP).
_CLEAR_KIND = ReleaseKind("BatchNormalization statistics and data size (sent)", "client data",
                          CLIENT, non_private_event(), "batch_norm='average': sent in the clear")


# A long-lived process (a party worker) serves run after run: keep a few recent runs only.
_RUNS = RecentRuns(_TRAINERS, _CLIENTS)


def _caches(run_id: int | None = None) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """This process's caches. Reached through a module-level function: Ray pickles the apps'
    closures by value, and a module dict they named directly would arrive as a fresh copy
    with every message (rebuilding the model each time). With ``run_id``, that run becomes
    the most recent and the entries of runs beyond `RecentRuns.keep` are dropped (a run
    that comes back rebuilds its client from ``context.state``)."""
    if run_id is not None:
        _RUNS.use(run_id)
    return _TRAINERS, _CLIENTS


def _default_client_id(context: Context) -> int:
    config = context.node_config
    for key in ("client-id", "partition-id"):
        if key in config:
            return int(config[key])
    raise ValueError("The SuperNode's node config must set 'client-id' or 'partition-id' "
                     "(flower-supernode --node-config \"partition-id=0\"), or pass client_id_fn "
                     f"to horizontal_client_app; got keys {sorted(config)}.")


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
    laplace = client.laplace
    context.state["keras-fedpriv"] = ConfigRecord(
        {"upload": json.dumps(states), "magrr": json.dumps(magrr),
         "laplace": json.dumps(None if laplace is None else laplace.state_dict())})
    own = client.own_batch_norm
    if own is not None:
        context.state["keras-fedpriv-bn"] = ArrayRecord(numpy_ndarrays=own)


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
        if client.laplace is not None and laplace is not None:
            client.laplace.load_state_dict(laplace)
    if "keras-fedpriv-bn" in context.state:
        client.own_batch_norm = context.state["keras-fedpriv-bn"].to_numpy_ndarrays()


def _who(context: Context) -> str:
    """``client 2 (node 8812...)``: the node config's client id or partition id, and the node."""
    config = context.node_config
    name = next((f"client {config[k]}" for k in ("client-id", "partition-id") if k in config),
                "this client")
    return f"{name} (node {context.node_id})"


def _client_error(msg: Message, what: str, context: Context, error: BaseException | None = None,
                  budget: bool = False) -> Message:
    """An error reply that says nothing of the client's data (the details stay in its log).

    Flower would otherwise send ``str(exception)`` to the server, and a Keras or
    TensorFlow error can quote the client's labels or features. A
    `ClientDataError` (data that cannot train the model) is logged as its one
    line, which names no value; anything else with its traceback.
    """
    who = _who(context)
    if budget:
        logger.warning("%s refused a %r message: its privacy budget is spent", who, what)
        return Message(error=Error(code=2, reason=f"the client's privacy budget is spent; it "
                                                  f"refused the {what!r} message"),
                       reply_to=msg)
    if isinstance(error, ClientDataError):
        logger.error("%s failed to answer a %r message: %s", who, what, error)
    else:
        logger.exception("%s failed to answer a %r message", who, what)
    return Message(error=Error(code=1, reason=f"the client failed to answer a {what!r} message "
                                              "(details in the client's own log)"),
                   reply_to=msg)


def horizontal_client_app(model_fn: Callable[[], keras.Model],
                          data_fn: Callable[[Context], tuple[Any, Any]],
                          upload_fn: Callable[[], Any] = lambda: "fedavg", *,
                          batch_size: int = 32, seed: int | None = None,
                          batch_norm: str = "average",
                          eps_rr: float | Callable[[Context], float | None] | None = None,
                          laplace_eval_fn: Callable[[Context], Any] | None = None,
                          client_id_fn: Callable[[Context], int] = _default_client_id,
                          max_local_epochs: int = 100, max_epsilon: float | None = None,
                          budget_delta: float = 1e-5,
                          budget_path: str | Callable[[Context], str] | None = None,
                          state_dir: str | Callable[[Context], str] | None = None,
                          mods: Sequence[Any] = (), **renamed: Any) -> ClientApp:
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
            ``eps_rr``, its MagRR reports; a seeded upload scheme has its
            own seed. Chosen by the client's code, never by the server.
        batch_norm: ``"average"`` (send BatchNormalization statistics, in
            the clear) or ``"local"`` (FedBN: keep them).
        eps_rr: MagRR's ``eps_rr`` on this client (SignDS only), None if
            the server runs no MagRR, or ``eps_rr(context)`` returning
            either. Must match the server's MagRR. (Formerly ``magrr_eps``:
            that name is refused with a TypeError.)
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
        max_epsilon: None or a cap on the eps (at ``budget_delta``) that this
            client's releases compose to, over this run and, with
            ``budget_path``, past runs (`keras_fedpriv.privacy.PrivacyBudget`):
            a reply that would go over it is not sent (the server gets an
            error reply saying the budget is spent). The node config key
            ``max-epsilon`` sets it too; with both, the smaller counts.
        budget_delta: the delta of that composed eps.
        budget_path: None, or the absolute path of a JSON file on the client's
            machine that keeps every release of every run (releases are only
            ever added, one name per file; each reply is checked
            and recorded under the file's lock before it leaves), or
            ``budget_path(context)`` returning one (one file per client;
            the node config key ``privacy-budget-path`` takes precedence).
            Without it the budget covers this run only, as the node state
            remembers it. A reply carrying anything without DP (FedAvg, or
            BatchNormalization statistics with ``batch_norm="average"``)
            never fits a budget.
        state_dir: None, or the absolute path of a folder on the client's
            machine (its user's, mode 700) where the client keeps its node
            state (`keras_fedpriv.federated.flower.party_store`): its release
            counters, ledgers and FedBN statistics, written before each reply
            leaves. A SuperNode restarted mid-run continues from that file:
            its counters never rewind and no noise is drawn twice. Or
            ``state_dir(context)`` returning one; the node config key
            ``state-dir`` takes precedence. Without either, a restarted
            SuperNode starts the run's counters again (a seeded client would
            repeat its noise): set it wherever a SuperNode may restart.
        mods: Flower mods for the `ClientApp` (e.g. ``message_size_mod``).
            Flower's DP mods (``fixedclipping_mod``, ``adaptiveclipping_mod``,
            ``LocalDpMod``) are refused: they clip or noise the reply's arrays
            as if they were model weights, which rewrites this package's
            uploads (see `keras_fedpriv.federated.flower.central_dp`).
        **renamed: nothing; a former argument name (``magrr_eps``) gets a
            TypeError naming the new one.

    Choose the upload scheme, its eps and MagRR's in client code or from
    ``context.node_config`` (set by the client's operator with
    ``flower-supernode --node-config``), never from ``context.run_config``:
    the run config is set by whoever starts the run, i.e. the server's side,
    which could otherwise switch every client to FedAvg or to a larger eps.

    Returns:
        A `flwr.clientapp.ClientApp` answering ``"query"`` and ``"train"``
        messages of `horizontal_server_app`.
    """
    check_renamed(renamed, "horizontal_client_app")
    mods = refuse_dp_mods(mods)
    batch_size = validate_positive_int(batch_size, "batch_size")
    max_local_epochs = validate_positive_int(max_local_epochs, "max_local_epochs")
    seed = validate_seed(seed)
    if batch_norm not in ("average", "local"):
        raise ValueError(f"`batch_norm` must be 'average' or 'local'; got {batch_norm!r}.")
    if max_epsilon is not None:
        PrivacyBudget(max_epsilon, budget_delta)  # checks the arguments now
    service = _ClientService(model_fn, data_fn, upload_fn, batch_size=batch_size, seed=seed,
                             batch_norm=batch_norm, eps_rr=eps_rr,
                             laplace_eval_fn=laplace_eval_fn, client_id_fn=client_id_fn,
                             max_local_epochs=max_local_epochs, max_epsilon=max_epsilon,
                             budget_delta=budget_delta, budget_path=budget_path)
    app = ClientApp(mods=[durable_state_mod(state_dir), *mods])
    app.query()(service.query)
    app.evaluate()(service.evaluate)
    app.train()(service.train)
    return app


class _ClientService:
    """One horizontal client's answers to the server's messages: what `horizontal_client_app`
    registers. The settings are this object's (the app's arguments, already checked); the
    client lives in this process's caches (`_caches`) and, as its truth, in the node's
    ``context.state`` (`_load_state`, `_save_state`)."""

    def __init__(self, model_fn: Callable[[], keras.Model],
                 data_fn: Callable[[Context], tuple[Any, Any]], upload_fn: Callable[[], Any], *,
                 batch_size: int, seed: int | None, batch_norm: str,
                 eps_rr: float | Callable[[Context], float | None] | None,
                 laplace_eval_fn: Callable[[Context], Any] | None,
                 client_id_fn: Callable[[Context], int], max_local_epochs: int,
                 max_epsilon: float | None, budget_delta: float,
                 budget_path: str | Callable[[Context], str] | None) -> None:
        self.model_fn = model_fn
        self.data_fn = data_fn
        self.upload_fn = upload_fn
        self.batch_size = batch_size
        self.seed = seed
        self.batch_norm = batch_norm
        self.eps_rr = eps_rr
        self.laplace_eval_fn = laplace_eval_fn
        self.client_id_fn = client_id_fn
        self.max_local_epochs = max_local_epochs
        self.max_epsilon = max_epsilon
        self.budget_delta = budget_delta
        self.budget_path = budget_path

    # -- the budget ---------------------------------------------------------------------------
    def spend(self, context: Context, party: HorizontalClient,
              before: ReleaseLedger | None = None, clear: bool = False) -> ReleaseLedger | None:
        """Reserve in the client's budget what its reply carries; return its ledger so far.

        With ``before`` None, a check before any noise is drawn (already over: refuse
        before training); else the releases recorded since ``before`` are checked and
        recorded in one step under the budget file's lock. ``clear``: the reply also
        carries BatchNormalization statistics and the data size without DP (inf).
        """
        cap = party_budget(context, self.max_epsilon, self.budget_delta, self.budget_path)
        if cap is None:
            return None
        now = privacy_ledger(party.privacy_protections())
        ledger = ReleaseLedger.merged([now])
        if clear:
            ledger.record(_CLEAR_KIND, [party.client_id])
        try:
            if before is None:
                cap.check(ledger, run_id=context.run_id, before=now)
            else:
                cap.reserve(ledger, run_id=context.run_id, before=before)
        except BudgetExhausted:
            # the refused message's noise draws and records are dropped with the cached copy:
            # the client's truth stays what context.state holds
            _caches()[1].pop((context.run_id, context.node_id), None)
            raise
        return now

    # -- the client -----------------------------------------------------------------------------
    def client(self, context: Context) -> HorizontalClient:
        """This node's client: the process's copy brought up to the node state, or a new one."""
        clients = _caches(context.run_id)[1]
        key = (context.run_id, context.node_id)
        if key in clients:
            party = clients[key]
            try:
                _load_state(context, party)
                return party
            except ValueError:
                # this process's copy is ahead of the node state (a message that drew noise
                # failed before its state was saved: nothing of it was sent); load_state_dict
                # never rewinds a live object, so the client is rebuilt from the node state
                clients.pop(key, None)
        party = self.build(context)
        _load_state(context, party)
        clients[key] = party
        return party

    def data(self, context: Context) -> tuple[np.ndarray, np.ndarray]:
        """The client's ``(x, y)`` from ``data_fn``, checked for rows, floats as float32."""
        x, y = self.data_fn(context)
        x, y = np.asarray(x), np.asarray(y)
        if len(x) != len(y) or len(x) == 0:
            raise ClientDataError(f"{_who(context)}: x and y must have the same non-zero number "
                                  f"of rows; got {len(x)} and {len(y)}.")
        if x.dtype.kind == "f":
            x = x.astype(np.float32, copy=False)
        if y.dtype.kind == "f":
            y = y.astype(np.float32, copy=False)
        return x, y

    def trainer(self, context: Context, x: np.ndarray, y: np.ndarray) -> LocalTrainer:
        """The process's model and compiled training function for this run (built once)."""
        trainers = _caches()[0]
        # by name: an unpickled copy of model_fn is another object for every message
        tkey = (context.run_id, getattr(self.model_fn, "__module__", ""),
                getattr(self.model_fn, "__qualname__", repr(self.model_fn)))
        if tkey not in trainers:
            model = self.model_fn()
            if not model.built:
                model(x[:1])
            trainers[tkey] = (model, LocalTrainer(model, self.batch_size,
                                                   (x.shape[1:], x.dtype),
                                                   (y.shape[1:], y.dtype)))
        return trainers[tkey][1]

    def build(self, context: Context) -> HorizontalClient:
        """A new client from the user's functions (its state is loaded by `client`)."""
        x, y = self.data(context)
        trainer = self.trainer(context, x, y)
        check_client_data(trainer.model, x, y, _who(context))
        magrr = None
        eps = self.eps_rr(context) if callable(self.eps_rr) else self.eps_rr
        if eps is not None:
            from keras_fedpriv.federated.magrr import MagRR

            magrr = MagRR(eps_rr=eps, seed=self.seed)
        upload = as_upload(call_with_context(self.upload_fn, context=context))
        laplace = None if self.laplace_eval_fn is None else self.laplace_eval_fn(context)
        return HorizontalClient(trainer, (x, y), upload, self.client_id_fn(context),
                                seed=self.seed, batch_norm=self.batch_norm, magrr=magrr,
                                laplace=laplace)

    # -- the messages ---------------------------------------------------------------------------
    def query(self, msg: Message, context: Context) -> Message:
        """The ``"query"``: the client's id."""
        try:
            party = self.client(context)
        except Exception as err:  # noqa: BLE001 - the reason stays on the client
            return _client_error(msg, "query", context, err)
        return Message(wire.query_reply_content(party.client_id), reply_to=msg)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """An ``"evaluate"``: the model's outputs plus Laplace noise, a report of fixed size."""
        try:
            party = self.client(context)
            if party.laplace is None:
                raise ValueError("this client runs no LaplaceEvaluation (laplace_eval_fn).")
            model = party.trainer.model
            order = wire.read_train(msg)
            for v, w in zip(model.trainable_variables, order.weights):
                v.assign(w)
            for v, w in zip(party.trainer.bn_variables, order.batch_norm):
                v.assign(w)
            before = self.spend(context, party)
            # a report of a fixed size: the server's max-rows, or this client's own cap when
            # the server names none (a report's shape must not tell the client's data size)
            rows = order.max_rows if order.max_rows is not None else party.laplace.max_report_rows
            outputs = party.laplace.client_outputs(model, party.x, max_rows=rows)
            noisy, _ = party.laplace.report_outputs(outputs, party.client_id)
            self.spend(context, party, before)
            _save_state(context, party)
        except BudgetExhausted:
            return _client_error(msg, "evaluate", context, budget=True)
        except Exception as err:  # noqa: BLE001 - the reason stays on the client
            return _client_error(msg, "evaluate", context, err)
        return Message(wire.report_content(party.client_id, noisy), reply_to=msg)

    def train(self, msg: Message, context: Context) -> Message:
        """A ``"train"``: local training, then the upload; an error reply names no data."""
        try:
            return self._train(msg, context)
        except BudgetExhausted:
            return _client_error(msg, "train", context, budget=True)
        except Exception as err:  # noqa: BLE001 - the reason stays on the client
            return _client_error(msg, "train", context, err)

    def _train(self, msg: Message, context: Context) -> Message:
        party = self.client(context)
        order = wire.read_train(msg)
        bn = order.batch_norm
        epochs = validate_positive_int(order.local_epochs, "local-epochs")
        if epochs > self.max_local_epochs:
            raise ValueError(f"the server asked for {epochs} local epochs; this client accepts "
                             f"at most max_local_epochs={self.max_local_epochs}.")
        rnd = validate_positive_int(order.round, "round", minimum=0)
        clear = bool(bn) and self.batch_norm == "average"  # the reply carries BN statistics
        before = self.spend(context, party, clear=clear)  # already over: refuse before training
        result = party.fit(order.weights, rnd, epochs, bn, magrr_cut=order.magrr_cut)
        self.spend(context, party, before, clear=clear)
        _save_state(context, party)
        content = wire.train_reply_content(
            party.client_id, party.upload.to_wire(result.upload), result.magrr_report,
            result.batch_norm if clear else None, party.num_examples)
        return Message(content, reply_to=msg)


def horizontal_server_app(model_fn: Callable[[], keras.Model],
                          upload_fn: Callable[[], Any] = lambda: "fedavg", *,
                          rounds: int = 3, clients_per_round: int = 2, local_epochs: int = 1,
                          num_clients: int | None = None, min_replies: int = 1,
                          seed: int | None = None, batch_norm: str = "average",
                          magrr: Any = None, laplace_eval: Any = None,
                          validation_data: tuple[Any, Any] | None = None,
                          round_timeout: float = 600.0, connect_timeout: float = 300.0,
                          max_failed_rounds: int | None = None,
                          on_finish: Callable[[FlowerRunResult], None] | None = None
                          ) -> ServerApp:
    """A Flower `ServerApp` that runs horizontal FL rounds with keras-fedpriv's server half.

    Run settings can be overridden per run with Flower's run config
    (``flwr run . --run-config "num-server-rounds=5 clients-per-round=3"``):
    ``num-server-rounds``, ``clients-per-round``, ``local-epochs``,
    ``min-replies``, ``round-timeout``, ``max-failed-rounds``; ``result-path`` (a folder)
    makes the server write ``history.json``, ``ledger.json`` and ``weights.npz`` there at
    the end (also when the run stops for too many failed rounds).

    A round with fewer than ``min_replies`` good replies leaves the global
    model unchanged and is counted (logged, ``below_min_replies`` in the
    history, ``failed_rounds`` in the result); once more rounds than
    ``max_failed_rounds`` fell so, the ServerApp raises a RuntimeError naming
    the rounds and the clients that did not answer: the run's status on the
    SuperLink is ``finished:failed`` (``flwr list``; ``flwr run`` itself exits 0).

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
            run). Its ``eps_rr`` must match the clients' ``eps_rr``.
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
        max_failed_rounds: None or an integer >= 0: how many rounds may fall
            below ``min_replies`` before the run stops (None: half the run's
            rounds, rounded down).
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
        wait = float(run.get("round-timeout", round_timeout))
        if not wait > 0:
            raise ValueError(f"`round-timeout` must be > 0 seconds; got {wait!r}.")
        limit = validate_positive_int(run.get("max-failed-rounds", max_failed_rounds),
                                      "max-failed-rounds", minimum=0, allow_none=True)
        model = model_fn()
        magrr_ = magrr
        if callable(magrr) and not hasattr(magrr, "server_update"):
            magrr_ = magrr(context)
        laplace = laplace_eval
        if callable(laplace) and not hasattr(laplace, "receive_reports"):
            laplace = laplace(context)
        strategy = HorizontalStrategy(
            model, call_with_context(upload_fn, context=context), clients_per_round=per_round,
            local_epochs=epochs, num_clients=num_clients, min_replies=need, seed=seed,
            batch_norm=batch_norm, magrr=magrr_, laplace_eval=laplace,
            validation_data=validation_data, connect_timeout=connect_timeout,
            max_failed_rounds=limit)
        try:
            strategy.start(grid, strategy.initial_arrays(), num_rounds=n_rounds, timeout=wait)
        finally:  # a run stopped for too many failed rounds leaves its record too
            result = strategy.run_result()
            logger.info("%d of %d rounds fell below min_replies=%d%s", len(result.failed_rounds),
                        len(next(iter(result.history.values()), [])), need,
                        f" (rounds {result.failed_rounds})" if result.failed_rounds else "")
            if run.get("result-path"):
                write_result(str(run["result-path"]), result)
        if on_finish is not None:
            on_finish(result)

    return app



