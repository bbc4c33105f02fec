"""Vertical FL as Flower apps: the leader is the `ServerApp`, each follower a `ClientApp`.

The leader drives (Flower's vertical pattern): each message to a follower
carries the example ids of K batches (the run config's
``batches-per-message``; 1 by default) and the cut gradients of the
follower's previous K batches; the follower applies the gradients, answers
with its protected embeddings of the new batches; the leader checks the
answers, steps once per batch, and keeps the new cut gradients for the next
message. With K > 1 a follower's embeddings are up to K - 1 steps stale
(docs/vertical.md). The apps are thin: the loop is
`keras_fedpriv.federated.vertical_parties.loop.run_leader` and the
follower's side `serve_request`, exactly what `VerticalDriver` runs in one
process, so given the same seeds, data and K both runtimes compute the same
model.

What crosses the wire (Flower ``Message`` contents):

* leader -> follower (``"train"``: training batches; ``"evaluate"``:
  inference batches for validation): ``"ids"`` (``{"<i>/ids": int64
  (rows_i,)}`` for batches ``i = 0 .. K - 1``), ``"gradient"``
  (``{"<i>/gradient": float (rows_i, ...)}``, the cut gradients of the
  follower's training batches awaiting them, oldest first) when there are
  some, and ``"config"`` (epoch, step);
* follower -> leader: ``"embedding"``: exactly the follower's wire arrays
  of each batch asked for (`encode_embedding`: ``{"<i>/bits": uint8 (rows_i,
  ceil(d / 8))}`` with an `EmbeddingDPLayer`, else ``{"<i>/embedding":
  float}``), nothing else; or, when it could not serve the request,
  ``"error"`` (`failure_reason`: what was malformed, or only the error's
  type). A follower refuses a message of more batches than its operator
  allows (``max_batches_per_message``, node config
  ``max-batches-per-message``);
* once, before training (``"query"``): the follower's party name and
  `EmbeddingSpec`, which must match the leader's (two nodes claiming one
  follower stop the run; a follower pinned to a node id is only that node:
  see `vertical_server_app`); at the end (``"query.finish"``): nothing (the
  follower's ``on_finish`` runs).

The leader checks every reply (`decode_embedding`: keys, dtype, shape,
padding bits, finite floats); an error reply, a missing or malformed one is
logged with its reason (never its data) and the message's batches are
skipped, so nothing malformed is ever used. A follower checks the gradients it receives
the same way (`decode_gradient`) and answers a malformed one with an error.

A follower's state lives in its node's ``context.state`` between messages
(Flower's Deployment Engine starts a process per message; the Simulation
Engine may route a node's messages to different worker processes): its
weights, optimizer, the local state of its layers (random counters, release
counts and, for unseeded layers, its secret key: it stays on the party's own
SuperNode) and the batches awaiting their gradients (with the weights they
were embedded with, once those have changed). A process keeps the built
follower and reloads the state only when another process has moved on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

try:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "keras_fedpriv.federated.flower.vertical needs Flower: pip install -e \".[flower]\" "
        "in the root of your keras-fedpriv clone, or pip install "
        "\"flwr[simulation]>=1.41,<1.42\".") from err

from keras_fedpriv.federated.flower.common import (  # noqa: E402
    arrays_record,
    call_with_context,
    checked_arrays,
    first_line,
    message_nbytes,
    party_budget,
    wait_for_nodes,
)
from keras_fedpriv.federated.flower.recent_runs import RecentRuns  # noqa: E402
from keras_fedpriv.privacy.budget import BudgetExhausted, PrivacyBudget  # noqa: E402
from keras_fedpriv.privacy.report import privacy_ledger  # noqa: E402
from keras_fedpriv.federated.vertical_parties.loop import (  # noqa: E402
    MAX_BATCHES_PER_MESSAGE,
    FeatureTable,
    FollowerRequest,
    VerticalRunResult,
    failure_reason,
    run_leader,
    serve_request,
    validate_batches_per_message,
)
from keras_fedpriv.federated.vertical_parties import (  # noqa: E402
    EmbeddingSpec,
    MalformedMessage,
    VerticalFollower,
    VerticalLeader,
)
from keras_fedpriv.federated.vertical_parties.party import validate_party_name  # noqa: E402
from keras_fedpriv.mechanisms.validation import (  # noqa: E402
    validate_positive_int,
    validate_seed,
)

__all__ = ["vertical_client_app", "vertical_server_app"]

logger = logging.getLogger("keras_fedpriv.flower")

_STATE = "keras-fedpriv-vertical-state"
_META = "keras-fedpriv-vertical-meta"
_PIN = "party-node."  # run config: party-node.<party> = the node id pinned to that follower


@dataclasses.dataclass
class _Cached:
    follower: VerticalFollower
    table: FeatureTable
    version: int  # the node-state version this object holds (-1: reload)


# One built follower per (run, node) in a process. The apps' closures reach it through
# `_followers()`: an engine that pickles the app by value (Ray) would copy a dict they
# referenced directly, and every message would build its follower again.
_FOLLOWERS: dict[tuple[int, int], _Cached] = {}
# A long-lived process (a party worker) serves run after run: keep a few recent runs only.
_RUNS = RecentRuns(_FOLLOWERS)


def _followers(run_id: int | None = None) -> dict[tuple[int, int], _Cached]:
    if run_id is not None:  # that run becomes the most recent; older runs beyond keep go
        _RUNS.use(run_id)
    return _FOLLOWERS


def _party_of(context: Context, parties: Sequence[str] | None) -> str:
    config = context.node_config
    if "party" in config:
        return str(config["party"])
    if parties is not None and "partition-id" in config:
        i = int(config["partition-id"])
        if not 0 <= i < len(parties):
            raise ValueError(f"partition-id {i} has no party: `parties` has {len(parties)}.")
        return parties[i]
    raise ValueError("The SuperNode's node config must set 'party' (flower-supernode "
                     "--node-config \"party='party_a'\"), or 'partition-id' with `parties` given "
                     f"to vertical_client_app; got keys {sorted(config)}.")


def _arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """A record from this party's own node state (trusted: no size bound)."""
    return {k: a.numpy() for k, a in record.items()}


def vertical_client_app(follower_fn: Callable[..., VerticalFollower],
                        data_fn: Callable[..., Any], *,
                        parties: Sequence[str] | None = None,
                        party_fn: Callable[[Context], str] | None = None,
                        on_finish: Callable[..., None] | None = None,
                        max_epsilon: float | None = None, budget_delta: float = 1e-5,
                        budget_path: str | Callable[[Context], str] | None = None,
                        max_batches_per_message: int = MAX_BATCHES_PER_MESSAGE
                        ) -> ClientApp:
    """A Flower `ClientApp`: one follower of vertical FL.

    Args:
        follower_fn: ``follower_fn(party) -> VerticalFollower`` (with
            ``context=`` if it declares that parameter): this party's half,
            e.g. ``model_fn().split_parties().followers[party]``, or a
            `VerticalFollower` built from the party's own bottom. Called once
            per process and run.
        data_fn: ``data_fn(party)`` (with ``context=`` if declared): the
            party's features, an array whose rows are example ids
            ``0 .. n-1``, or ``(example_ids, x)``. Include every example the
            leader may ask for (training and validation).
        parties: party names by ``partition-id`` (when the node config has
            no ``party``).
        party_fn: ``party_fn(context) -> party name``; default: the node
            config's ``party``, else ``parties[partition-id]``.
        on_finish: called as ``on_finish(follower)`` (with ``context=`` if
            declared) in the follower's process when the leader ends the run.
        max_epsilon: None or a cap on the eps (at ``budget_delta``) that the
            follower's releases compose to for its busiest example, over this
            run and, with ``budget_path``, past runs
            (`keras_fedpriv.privacy.PrivacyBudget` with ``per_record=True``:
            example ids must mean the same rows in every run). An embedding
            that would go over it is not sent: the leader gets an error
            reason instead, and the follower's state stays as it was before
            the request. The node config key ``max-epsilon`` sets it too;
            with both, the smaller counts.
        budget_delta: the delta of that composed eps.
        budget_path: None, the absolute path of a JSON file on the follower's
            machine keeping every release of every run (releases are only ever
            added, one name per file, recorded under the
            file's lock before the embedding leaves), or
            ``budget_path(context)`` returning one (node config key
            ``privacy-budget-path`` takes precedence).
        max_batches_per_message: the most batches the follower serves in
            one message (a message asking for more is answered with an
            error): it bounds how stale the follower's embeddings may be
            (K - 1 steps) and how many batches it keeps awaiting gradients.
            The node config key ``max-batches-per-message`` sets it too; with
            both, the smaller counts.

    Returns:
        A `flwr.clientapp.ClientApp` answering the messages of
        `vertical_server_app`.
    """
    if parties is not None:
        parties = [validate_party_name(p, "vertical_client_app", "`parties`") for p in parties]
    if max_epsilon is not None:
        PrivacyBudget(max_epsilon, budget_delta)  # checks the arguments now
    max_batches_per_message = validate_batches_per_message(max_batches_per_message,
                                                           "max_batches_per_message")
    app = ClientApp()

    def max_batches(context: Context) -> int:
        node = context.node_config.get("max-batches-per-message")
        if node is None:
            return max_batches_per_message
        return min(max_batches_per_message,
                   validate_batches_per_message(int(node), "max-batches-per-message"))

    def load(context: Context) -> _Cached:
        key = (context.run_id, context.node_id)
        version = int(context.state[_META]["version"]) if _META in context.state else 0
        cache = _followers(context.run_id)
        cached = cache.get(key)
        if cached is not None and version == 0 and cached.version != 0:
            # A node state that starts afresh, while this process kept a follower under the
            # same (run, node) ids (a worker process reused by the engine for a new run).
            cached = None
        if cached is None:
            party = party_fn(context) if party_fn is not None else _party_of(context, parties)
            follower = call_with_context(follower_fn, party, context=context)
            if not isinstance(follower, VerticalFollower) or follower.name != party:
                raise TypeError(f"follower_fn({party!r}) must return the VerticalFollower named "
                                f"{party!r}; got {type(follower).__name__}.")
            data = call_with_context(data_fn, party, context=context)
            table = (data if isinstance(data, FeatureTable) else
                     FeatureTable(data[1], data[0]) if isinstance(data, tuple) else
                     FeatureTable(data))
            cached = cache[key] = _Cached(follower, table, 0)
        if cached.version != version:
            if _STATE in context.state:
                cached.follower.load_state_dict(_arrays(context.state[_STATE]))
            cached.version = version
        return cached

    def save(context: Context, cached: _Cached) -> None:
        context.state[_STATE] = arrays_record(cached.follower.state_dict())
        cached.version += 1
        context.state[_META] = ConfigRecord({"version": cached.version})

    def serve(msg: Message, context: Context, training: bool) -> Message:
        cached = load(context)
        content = msg.content
        config = content["config"] if "config" in content else {}
        try:
            limit = max_batches(context)
            request = FollowerRequest.from_arrays(
                _arrays(content["ids"]) if "ids" in content else None,
                _arrays(content["gradient"]) if "gradient" in content else None,
                training=training, max_batches=limit, epoch=int(config.get("epoch", 0)),
                step=int(config.get("step", 0)))
            cap = party_budget(context, max_epsilon, budget_delta, budget_path, per_record=True)
            before = None if cap is None else privacy_ledger(cached.follower)
            reply = RecordDict({"embedding": arrays_record(
                serve_request(cached.follower, request, cached.table, limit))})
            if cap is not None:
                # checked and recorded in one step under the budget file's lock, as a new
                # entry: a follower restarted within the run still counts what it sent
                cap.reserve(privacy_ledger(cached.follower), run_id=context.run_id,
                            before=before)
        except BudgetExhausted:
            # not sent: the follower goes back to the state before this request (the node
            # state still holds it), so the refused release is neither counted nor replayed
            logger.warning("follower %r refused a request: its privacy budget is spent",
                           cached.follower.name)
            _followers().pop((context.run_id, context.node_id), None)
            return Message(RecordDict({"error": ConfigRecord(
                {"reason": "BudgetExhausted: the follower's privacy budget is spent"})}),
                reply_to=msg)
        except Exception as error:
            # Answered, not raised: the node state then keeps what did happen (a gradient
            # applied, a release made), as in one process; the leader gets the reason only.
            reason = failure_reason(error)
            logger.warning("follower %r failed to serve a request: %s", cached.follower.name,
                           reason)
            logger.debug("follower %r: the error", cached.follower.name, exc_info=True)
            reply = RecordDict({"error": ConfigRecord({"reason": reason})})
        save(context, cached)
        return Message(reply, reply_to=msg)

    @app.query()
    def hello(msg: Message, context: Context) -> Message:
        follower = load(context).follower
        return Message(RecordDict({"config": ConfigRecord(
            {"party": follower.name, "spec": json.dumps(follower.spec.to_config())})}),
            reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return serve(msg, context, True)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return serve(msg, context, False)

    @app.query("finish")
    def finish(msg: Message, context: Context) -> Message:
        cached = load(context)
        if on_finish is not None:
            call_with_context(on_finish, cached.follower, context=context)
        return Message(RecordDict({"config": ConfigRecord({"party": cached.follower.name})}),
                       reply_to=msg)

    return app


def _introduction(reply: Message) -> tuple[str, EmbeddingSpec]:
    """The party name and spec of one ``"query"`` reply (`MalformedMessage` if it has none)."""
    try:
        content = reply.content
        if "config" not in content:
            raise MalformedMessage("the reply has no 'config' record")
        config = content["config"]
        if not isinstance(config, ConfigRecord):
            raise MalformedMessage(f"'config' is a {type(config).__name__}, not a ConfigRecord")
        party, spec = config.get("party"), config.get("spec")
        if not isinstance(party, str) or not isinstance(spec, str):
            raise MalformedMessage("'config' must hold the strings 'party' and 'spec'")
        try:
            return party, EmbeddingSpec.from_config(json.loads(spec))
        except Exception as error:  # noqa: BLE001 - whatever the text is, it is not a spec
            raise MalformedMessage(f"its embedding spec does not parse "
                                   f"({type(error).__name__})") from None
    except MalformedMessage:
        raise
    except Exception as error:  # noqa: BLE001 - no reply may stop the leader
        raise MalformedMessage(f"the reply cannot be read ({type(error).__name__})") from None


def _pins(party_nodes: Mapping[str, Any] | None, run_config: Mapping[str, Any],
          leader: VerticalLeader) -> dict[str, int]:
    """Party -> node id: ``party_nodes`` and the run config's ``party-node.<party>`` keys.

    An empty string (the placeholder an app's pyproject declares, so that
    ``flwr run --run-config`` may set the key) pins nothing.
    """
    pins: dict[str, int] = {}
    given = [(f"`party_nodes`[{p!r}]", p, n) for p, n in dict(party_nodes or {}).items()]
    given += [(f"run config {k!r}", k[len(_PIN):], v) for k, v in run_config.items()
              if str(k).startswith(_PIN)]
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


def _introduce(grid: Grid, nodes: list[int], leader: VerticalLeader, timeout: float,
               pins: Mapping[str, int] | None = None) -> dict[str, int]:
    """Ask every node its party and spec; party -> node id (specs must match the leader's).

    A reply that is an error, malformed (no ``config`` record, no party or
    spec, a spec that does not parse), from a node that was not asked or a
    second one from the same node is refused with a logged reason. Which node
    is which follower: a follower pinned in ``pins`` is only its pinned node
    (any other node claiming it is ignored, logged); an unpinned follower
    claimed by two or more nodes stops the run (`RuntimeError` naming the
    party and the nodes): the leader never guesses, since the node it takes
    would receive that follower's example ids and cut gradients. When every
    follower is pinned only the pinned nodes are asked; an unpinned follower
    is whichever single node claims it (logged: trusted on first claim).
    """
    pins = dict(pins or {})
    unpinned = sorted(set(leader.follower_specs) - set(pins))
    for party in unpinned:
        logger.warning("follower %r is not pinned to a node id: the node that claims it is "
                       "trusted on first claim (pin it: party_nodes= or the run config key "
                       "'%s%s', with the SuperLink's node authentication on)", party, _PIN, party)
    connected = sorted(nodes)
    asked = set(connected) if unpinned else set(pins.values()) & set(connected)
    replies = grid.send_and_receive(
        [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n, message_type="query")
         for n in sorted(asked)], timeout=timeout)
    told: dict[int, str] = {}  # node -> what its answer was, for the error below
    claims: dict[str, list[tuple[int, EmbeddingSpec]]] = {}
    answered: set[int] = set()
    for reply in replies:
        node = reply.metadata.src_node_id
        if node not in asked or node in answered:
            logger.warning("node %s: an introduction that was not asked for (%s); ignored", node,
                           "a second reply" if node in answered else "not queried")
            continue
        answered.add(node)
        if reply.has_error():
            logger.warning("node %s did not introduce itself: %s", node,
                           first_line(reply.error.reason))
            told[node] = "answered the query with an error"
            continue
        try:
            party, spec = _introduction(reply)
        except MalformedMessage as error:
            logger.warning("node %s: its introduction was refused: %s", node, error)
            told[node] = f"sent a malformed introduction ({error})"
            continue
        if party not in leader.follower_specs:
            logger.warning("node %s is party %r, not a follower of this leader; ignored", node,
                           party[:64])
            told[node] = f"introduced itself as {party[:64]!r}"
            continue
        told[node] = f"introduced itself as {party!r}"
        if party in pins and node != pins[party]:
            logger.warning("node %s claims follower %r, which is pinned to node %s; ignored",
                           node, party, pins[party])
            continue
        claims.setdefault(party, []).append((node, spec))
    doubled = {p: sorted(n for n, _ in c) for p, c in claims.items() if len(c) > 1}
    for party, claimants in sorted(doubled.items()):
        logger.error("nodes %s all claim to be follower %r; the run does not start", claimants,
                     party)
    if doubled:
        party, claimants = sorted(doubled.items())[0]
        more = f" (and {len(doubled) - 1} more followers)" if len(doubled) > 1 else ""
        raise RuntimeError(
            f"nodes {claimants} all claim to be follower {party!r}{more}: the leader does not "
            f"start rather than send {party!r}'s example ids and cut gradients to a node that "
            "may not be it. Stop the extra node, or pin each follower to its node id "
            f"(vertical_server_app(party_nodes=...) or the run config key '{_PIN}{party}') "
            "with the SuperLink's node authentication on.")
    node_of: dict[str, int] = {}
    for party, ((node, spec),) in claims.items():
        if spec != leader.follower_specs[party]:
            raise RuntimeError(f"follower {party!r} sends {spec}, but the leader expects "
                               f"{leader.follower_specs[party]}; both must be built from the "
                               "same model.")
        node_of[party] = node
    missing = sorted(set(leader.follower_specs) - set(node_of))

    def why(party: str) -> str:
        node = pins.get(party)
        if node is None:
            return f"{party!r}: no node claimed it"
        if node not in asked:
            return f"{party!r}: pinned node {node} is not connected (connected: {connected})"
        return f"{party!r}: pinned node {node} " + told.get(
            node, f"did not answer the query within {timeout:g} s")

    if missing:
        raise RuntimeError(f"the followers {missing} did not introduce themselves ("
                           + "; ".join(why(p) for p in missing)
                           + "); refused introductions are logged on the "
                           "'keras_fedpriv.flower' logger.")
    return node_of


def vertical_server_app(leader_fn: Callable[..., VerticalLeader], data_fn: Callable[..., Any],
                        *, epochs: int = 1, batch_size: int = 32, batches_per_message: int = 1,
                        seed: int | None = None,
                        shuffle: bool = True, validation_fn: Callable[..., Any] | None = None,
                        validation_batch_size: int = 256, round_timeout: float = 600.0,
                        connect_timeout: float = 300.0,
                        on_finish: Callable[[VerticalRunResult], None] | None = None,
                        party_nodes: Mapping[str, int] | None = None,
                        on_epoch_end: Callable[[int, dict[str, float]], None] | None = None
                        ) -> ServerApp:
    """A Flower `ServerApp`: the leader of vertical FL, which drives the run.

    Run settings can be overridden per run with Flower's run config:
    ``num-epochs``, ``batch-size``, ``batches-per-message``, ``round-timeout``; ``result-path`` (a
    folder) makes the leader write ``history.json`` and ``leader.npz`` (its
    weights) there at the end; ``party-node.<party>`` pins a follower to a
    node id (as ``party_nodes``).

    Which node is which follower: each node names its party when the leader
    asks (its operator's node config). A follower claimed by two nodes stops
    the run before anything is sent (a `RuntimeError` naming the party and
    the node ids), and a malformed introduction is refused with a logged
    reason. A follower pinned to a node id is only that node (the leader
    waits up to ``connect_timeout`` for it to connect); with the SuperLink's
    node authentication on, a node id belongs to one registered key, so no
    other node can take a pinned follower's place. An unpinned follower is
    trusted on first claim (a warning is logged): if its real node is absent,
    a single node claiming its name becomes it.

    Args:
        leader_fn: ``leader_fn()`` (with ``context=`` if declared) -> the
            `VerticalLeader`, e.g. ``model_fn().split_parties(metrics=[...])
            .leader``.
        data_fn: ``data_fn()`` (with ``context=`` if declared) -> ``(example_ids,
            x, y)``: the training examples' ids, the leader's own features
            (None without a leader bottom) and the labels.
        epochs: number of epochs.
        batch_size: examples per step.
        batches_per_message: K, the batches each message to a follower asks
            for (one message round per K steps); with K > 1 a follower's
            embeddings are up to K - 1 steps stale (`run_leader`). Each
            follower must allow K (``max_batches_per_message``).
        seed: keys the batch order; None: fresh entropy.
        shuffle: reshuffle every epoch.
        validation_fn: None, or ``validation_fn()`` -> ``(example_ids, x, y)``
            scored after every epoch (the followers send inference
            embeddings of those ids).
        validation_batch_size: examples per validation message.
        round_timeout: seconds to wait for the replies of one message round.
        connect_timeout: seconds to wait for the followers (every pinned
            node among them) to connect.
        on_finish: called with the `VerticalRunResult` at the end (in the
            Simulation Engine this runs in the caller's process); its
            history adds ``wire_bytes_up`` / ``wire_bytes_down`` (Flower's
            message bytes) and ``epoch_time_s``.
        party_nodes: None, or follower -> the Flower node id that alone may
            be that follower (the id ``flwr supernode register`` printed);
            the run config's ``party-node.<party>`` keys add to it (an int
            or a decimal string in [1, 2**64); ``""`` pins nothing, so an
            app's pyproject can declare the key; a follower pinned twice must
            get the same id).
        on_epoch_end: None, or called with ``(epoch, logs)`` after every
            epoch (the leader's logs, with ``wire_bytes_up``,
            ``wire_bytes_down`` and ``epoch_time_s``): e.g. a progress line.

    Returns:
        A `flwr.serverapp.ServerApp`.
    """
    epochs = validate_positive_int(epochs, "epochs")
    batch_size = validate_positive_int(batch_size, "batch_size")
    batches_per_message = validate_batches_per_message(batches_per_message)
    validation_batch_size = validate_positive_int(validation_batch_size, "validation_batch_size")
    seed = validate_seed(seed)
    if not isinstance(shuffle, bool):
        raise TypeError(f"`shuffle` must be a bool; got {shuffle!r}.")
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run = context.run_config
        n_epochs = validate_positive_int(int(run.get("num-epochs", epochs)), "num-epochs")
        size = validate_positive_int(int(run.get("batch-size", batch_size)), "batch-size")
        k = validate_batches_per_message(int(run.get("batches-per-message",
                                                     batches_per_message)),
                                         "batches-per-message")
        wait = float(run.get("round-timeout", round_timeout))
        if not wait > 0:
            raise ValueError(f"`round-timeout` must be > 0 seconds; got {wait!r}.")
        leader = call_with_context(leader_fn, context=context)
        if not isinstance(leader, VerticalLeader):
            raise TypeError(f"leader_fn must return a VerticalLeader; got "
                            f"{type(leader).__name__}.")
        ids, x, y = call_with_context(data_fn, context=context)
        validation = None
        if validation_fn is not None:
            v_ids, v_x, v_y = call_with_context(validation_fn, context=context)
            validation = (v_ids, v_y, v_x)
        pins = _pins(party_nodes, run, leader)
        # a pinned follower's own node must be there: another node never stands in for it
        nodes = wait_for_nodes(grid, len(leader.follower_specs), connect_timeout,
                               what="followers", required={
                                   n: "follower " + ", ".join(repr(p) for p, m in
                                                             sorted(pins.items()) if m == n)
                                   for n in set(pins.values())})
        node_of = _introduce(grid, nodes, leader, wait, pins)
        party_of = {n: p for p, n in node_of.items()}
        traffic = {"up": 0, "down": 0}

        def exchange(requests):
            messages = []
            for p, request in requests.items():
                content = RecordDict({"config": ConfigRecord({"epoch": request.epoch,
                                                              "step": request.step})})
                ids, gradients = request.to_arrays()
                if ids is not None:
                    content["ids"] = arrays_record(ids)
                if gradients is not None:
                    content["gradient"] = arrays_record(gradients)
                messages.append(Message(content, dst_node_id=node_of[p],
                                        message_type="train" if request.training
                                        else "evaluate"))
            traffic["down"] += sum(message_nbytes(m) for m in messages)
            out: dict[str, Any] = {}
            for reply in grid.send_and_receive(messages, timeout=wait):
                p = party_of.get(reply.metadata.src_node_id)
                if p is None or p not in requests:
                    logger.warning("a reply from node %s, which was not asked; ignored",
                                   reply.metadata.src_node_id)
                    continue
                if reply.has_error():
                    out[p] = f"error reply: {first_line(reply.error.reason)}"
                    continue
                traffic["up"] += message_nbytes(reply)
                if "error" in reply.content:
                    reason = reply.content["error"].get("reason", "")
                    out[p] = f"error reply: {first_line(reason)}"
                elif "embedding" not in reply.content:
                    out[p] = "the reply has no 'embedding' record"
                else:
                    rows = sum(len(i) for i in requests[p].example_ids or [])
                    # checked before anything is deserialized: numpy arrays only, and no more
                    # bytes than a float64 embedding of the rows asked for
                    batches = max(len(requests[p].example_ids or []), 1)
                    limit = 8 * max(rows, 1) * leader.follower_specs[p].coordinates + \
                        4096 * batches
                    try:
                        out[p] = checked_arrays(reply.content["embedding"], "embedding", limit)
                    except MalformedMessage as error:
                        out[p] = f"malformed reply: {error}"
                    except Exception as error:  # an Array that does not decode
                        out[p] = f"the reply's arrays do not decode ({type(error).__name__})"
            return out

        marks = {"up": 0, "down": 0, "time": time.perf_counter()}
        extra: dict[str, list[float]] = {"wire_bytes_up": [], "wire_bytes_down": [],
                                         "epoch_time_s": []}

        def clock(epoch, logs):
            now = time.perf_counter()
            extra["wire_bytes_up"].append(float(traffic["up"] - marks["up"]))
            extra["wire_bytes_down"].append(float(traffic["down"] - marks["down"]))
            extra["epoch_time_s"].append(now - marks["time"])
            marks.update(up=traffic["up"], down=traffic["down"], time=now)
            if on_epoch_end is not None:
                on_epoch_end(epoch, {**logs, **{key: v[-1] for key, v in extra.items()}})

        result = run_leader(leader, exchange, ids, y, x, epochs=n_epochs, batch_size=size,
                            batches_per_message=k, seed=seed, shuffle=shuffle,
                            validation_data=validation,
                            validation_batch_size=validation_batch_size, on_epoch_end=clock)
        result.history.update(extra)
        for reply in grid.send_and_receive(
                [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n,
                         message_type="query.finish") for n in node_of.values()], timeout=wait):
            if reply.has_error():
                logger.warning("follower %r failed to finish: %s",
                               party_of.get(reply.metadata.src_node_id),
                               first_line(reply.error.reason))
        if run.get("result-path"):
            _write_result(str(run["result-path"]), result)
        if on_finish is not None:
            on_finish(result)

    return app


def _write_result(folder: str, result: VerticalRunResult) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "history.json"), "w") as f:
        json.dump({"history": result.history, "rejected": result.rejected, "wire": result.wire},
                  f)
    np.savez(os.path.join(folder, "leader.npz"),
             *[np.asarray(v.numpy()) for v in result.leader.trainable_variables])
