"""Vertical FL as Flower apps: the leader is the `ServerApp`, each follower a `ClientApp`.

The leader drives (Flower's vertical pattern): each message to a follower
carries the example ids of K batches (the run config's
``batches-per-message``; 1 by default) and the cut gradients of the
follower's previous K batches; the follower applies the gradients, answers
with its protected embeddings of the new batches; the leader checks the
answers, steps once per batch, and keeps the new cut gradients for the next
message. With K > 1 a follower's embeddings are up to K - 1 steps stale
(docs/vertical.md). The apps are thin: the loop is
`keras_fedpriv.federated.vertical.loop.run_leader` and the
follower's side `serve_request`, exactly what `VerticalDriver` runs in one
process, so given the same seeds, data and K both runtimes compute the same
model.

What crosses the wire (Flower ``Message`` contents):

* leader -> follower (``"train"``: training batches; ``"evaluate"``:
  inference batches for validation): ``"ids"`` (``{"<i>/ids": int64
  (rows_i,)}`` for batches ``i = 0 .. K - 1``), ``"gradient"``
  (``{"<i>/gradient": float (rows_i, ...)}``, the cut gradients of the
  follower's training batches awaiting them, oldest first) when there are
  some, and ``"config"`` (epoch, step; ``message``: the leader's number
  of the message, from 1; ``answers``: the number of the message whose
  batches the gradients are for, see `FollowerRequest`);
* follower -> leader: ``"embedding"``: exactly the follower's wire arrays
  of each batch asked for (`encode_embedding`: ``{"<i>/bits": uint8 (rows_i,
  ceil(d / 8))}`` with an `EmbeddingDPLayer`, else ``{"<i>/embedding":
  float}``), nothing else; or, when it could not serve the request,
  ``"error"`` (`failure_reason`: what was malformed, or only the error's
  type). A follower refuses a message of more batches than its operator
  allows (``max_batches_per_message``, node config
  ``max-batches-per-message``);
* before training, and when a follower is missing (``"query"``): the
  follower's party name, `EmbeddingSpec` (which must match the leader's) and
  rejoin token (32 random bytes it drew for the run; a restarted follower is
  taken back only with it: `keras_fedpriv.federated.flower.vertical_roster`);
  two nodes claiming one follower stop the run; a follower pinned to a node
  id is only that node (see `vertical_server_app`); at the end
  (``"query.finish"``): nothing (the follower's ``on_finish`` runs).

The leader matches each reply to the message it answers and checks it
(`decode_embedding`: keys, dtype, shape, padding bits, finite floats); an
error reply, a missing or malformed one is logged with its reason (never its
data) and the message's batches are skipped, so nothing malformed is ever
used. A follower whose reply is missing, or a Flower error, is waited for
before the next message (up to the run config's ``follower-deadline``);
once it is back, the skipped batches are asked once more as a new message. A
follower checks the gradients it receives the same way (`decode_gradient`)
and answers a malformed one with an error.

A follower's state lives in its node's ``context.state`` between messages
(Flower's Deployment Engine starts a process per message; the Simulation
Engine may route a node's messages to different worker processes): its
weights, optimizer, the local state of its layers (random counters, release
counts and, for unseeded layers, its secret key: it stays on the party's own
SuperNode) and the batches awaiting their gradients (with the weights they
were embedded with, once those have changed), the numbers of the last
messages it served, and its rejoin token. A process keeps the built follower
and reloads the state only when another process has moved on; when the node
state is behind the process's follower (its last state never reached the
SuperNode), the process's follower is kept and written back. With a
``state-dir`` the whole node state is also kept in a private file on the
party's disk, written before each reply leaves
(`keras_fedpriv.federated.flower.party_store`), so a restarted follower
rejoins its run where it was.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import secrets
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
    call_with_context,
    first_line,
    message_nbytes,
    party_budget,
    wait_for_nodes,
)
from keras_fedpriv.federated.flower.party_store import durable_state_mod  # noqa: E402
from keras_fedpriv.federated.records import arrays_record, checked_arrays  # noqa: E402
from keras_fedpriv.federated.flower.recent_runs import RecentRuns  # noqa: E402
from keras_fedpriv.federated.flower.vertical_roster import (  # noqa: E402
    PIN_KEY,
    TOKEN_BYTES,
    FollowerGone,
    FollowerRoster,
)
from keras_fedpriv.privacy.budget import BudgetExhausted, PrivacyBudget  # noqa: E402
from keras_fedpriv.privacy.report import privacy_ledger  # noqa: E402
from keras_fedpriv.federated.vertical.loop import (  # noqa: E402
    MAX_BATCHES_PER_MESSAGE,
    FeatureTable,
    FollowerRequest,
    UntrainedEpoch,
    VerticalRunResult,
    failure_reason,
    run_leader,
    serve_request,
    validate_batches_per_message,
)
from keras_fedpriv.federated.vertical.parties import (  # noqa: E402
    MalformedMessage,
    VerticalFollower,
    VerticalLeader,
)
from keras_fedpriv.federated.vertical.party import validate_party_name  # noqa: E402
from keras_fedpriv.layers.local_state import local_state  # noqa: E402
from keras_fedpriv.mechanisms.validation import (  # noqa: E402
    validate_positive_int,
    validate_seed,
)

__all__ = ["vertical_client_app", "vertical_server_app"]

logger = logging.getLogger("keras_fedpriv.flower")

_STATE = "keras-fedpriv-vertical-state"
_META = "keras-fedpriv-vertical-meta"


@dataclasses.dataclass
class _Cached:
    follower: VerticalFollower
    table: FeatureTable
    version: int  # the node-state version this object holds
    token: bytes = b""  # the follower's rejoin token for the run (b"": not drawn yet)
    # (message, random counter before, after, batches embedded; -1: refused) of the last
    # message served
    sent: tuple[int, int, int, int] | None = None


def random_counter(follower: VerticalFollower) -> int:
    """The sum of the follower's random counters (Philox positions): only ever goes up."""
    return int(sum(int(np.asarray(v).reshape(-1)[0]) for k, v in
                   local_state(follower.layers).items() if k.endswith("/rng_counter")))


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
                        max_batches_per_message: int = MAX_BATCHES_PER_MESSAGE,
                        state_dir: str | Callable[[Context], str] | None = None
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
        state_dir: None, the absolute path of a folder of the party's user
            with mode 700 on the follower's machine, or ``state_dir(context)``
            returning one (node config key ``state-dir`` takes precedence):
            the follower's whole node state (bottom model, optimizer, random
            counters and keys, release counts, batches awaiting gradients,
            rejoin token) is kept there in a file of mode 600 per run,
            written before each reply leaves
            (`keras_fedpriv.federated.flower.party_store`), so a restarted
            SuperNode's follower rejoins the run where it was, never
            rewinding a counter. Without it a restarted follower cannot
            rejoin its run.

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

    def audit(msg: Message, context: Context, call_next: Any) -> Message:
        """Log what a served message used of the follower's randomness, once its state is
        written (the durable state's mod runs inside this one): a restarted follower's lines
        show its random counters going on, never back."""
        reply = call_next(msg, context)
        cached = _followers().get((context.run_id, context.node_id))
        if cached is not None and cached.sent is not None:
            message, before, after, batches = cached.sent
            cached.sent = None
            logger.info("follower %r (node %s) %s message %d (%d batches embedded): random "
                        "counter %d -> %d", cached.follower.name, context.node_id,
                        "refused" if batches < 0 else "answered", message, max(batches, 0),
                        before, after)
        return reply

    def party_name(context: Context) -> str:
        return party_fn(context) if party_fn is not None else _party_of(context, parties)

    app = ClientApp(mods=[audit, durable_state_mod(state_dir, party=party_name)])

    def max_batches(context: Context) -> int:
        node = context.node_config.get("max-batches-per-message")
        if node is None:
            return max_batches_per_message
        return min(max_batches_per_message,
                   validate_batches_per_message(int(node), "max-batches-per-message"))

    def build(context: Context) -> _Cached:
        party = party_name(context)
        follower = call_with_context(follower_fn, party, context=context)
        if not isinstance(follower, VerticalFollower) or follower.name != party:
            raise TypeError(f"follower_fn({party!r}) must return the VerticalFollower named "
                            f"{party!r}; got {type(follower).__name__}.")
        data = call_with_context(data_fn, party, context=context)
        table = (data if isinstance(data, FeatureTable) else
                 FeatureTable(data[1], data[0]) if isinstance(data, tuple) else
                 FeatureTable(data))
        return _Cached(follower, table, 0)

    def load(context: Context) -> _Cached:
        """This process's follower for the node, made the newest of itself and the node state.

        The node state wins when it is newer (another process moved on); the
        process's follower wins when it is newer (its last reply's node state
        never reached the SuperNode: a relay that timed out or was killed
        after the worker answered) and is written back into the node state.
        Nothing is replayed either way: a release either copy made stays
        counted, and no random counter goes back.
        """
        key = (context.run_id, context.node_id)
        meta = context.state[_META] if _META in context.state else ConfigRecord({})
        version = int(meta.get("version", 0))
        cache = _followers(context.run_id)
        cached = cache.get(key)
        if cached is None:
            cached = cache[key] = build(context)
        if cached.version > version:
            logger.warning("follower %r (node %s): the node state (version %d) is behind this "
                           "process's follower (version %d); the follower's is kept and written "
                           "back", cached.follower.name, context.node_id, version,
                           cached.version)
            write(context, cached)
        elif cached.version < version:
            if _STATE in context.state:
                cached.follower.load_state_dict(_arrays(context.state[_STATE]))
            cached.version = version
            token = meta.get("token", b"")
            cached.token = token if isinstance(token, bytes) else b""
        return cached

    def write(context: Context, cached: _Cached) -> None:
        context.state[_STATE] = arrays_record(cached.follower.state_dict())
        context.state[_META] = ConfigRecord({"version": cached.version, "token": cached.token})

    def save(context: Context, cached: _Cached) -> None:
        cached.version += 1
        write(context, cached)

    def serve(msg: Message, context: Context, training: bool) -> Message:
        cached = load(context)
        content = msg.content
        config = content["config"] if "config" in content else {}
        counter = random_counter(cached.follower)
        batches = 0
        try:
            limit = max_batches(context)
            request = FollowerRequest.from_arrays(
                _arrays(content["ids"]) if "ids" in content else None,
                _arrays(content["gradient"]) if "gradient" in content else None,
                training=training, max_batches=limit, epoch=int(config.get("epoch", 0)),
                step=int(config.get("step", 0)), message=int(config.get("message", 0)),
                answers=int(config.get("answers", 0)))
            cap = party_budget(context, max_epsilon, budget_delta, budget_path, per_record=True)
            before = None if cap is None else privacy_ledger(cached.follower)
            reply = RecordDict({"embedding": arrays_record(
                serve_request(cached.follower, request, cached.table, limit))})
            batches = len(request.example_ids or [])
            if cap is not None:
                # checked and recorded in one step under the budget file's lock, as a new
                # entry: a follower restarted within the run still counts what it sent
                cap.reserve(privacy_ledger(cached.follower), run_id=context.run_id,
                            before=before)
        except BudgetExhausted:
            # not sent: the follower goes back to the state before this request (the node
            # state still holds it), so the refused release is neither counted nor replayed
            logger.warning("follower %r (node %s) refused a request: its privacy budget is "
                           "spent", cached.follower.name, context.node_id)
            _followers().pop((context.run_id, context.node_id), None)
            return Message(RecordDict({"error": ConfigRecord(
                {"reason": "BudgetExhausted: the follower's privacy budget is spent"})}),
                reply_to=msg)
        except Exception as error:
            # Answered, not raised: the node state then keeps what did happen (a gradient
            # applied, a release made), as in one process; the leader gets the reason only.
            reason = failure_reason(error)
            logger.warning("follower %r (node %s) failed to serve a request: %s",
                           cached.follower.name, context.node_id, reason)
            logger.debug("follower %r: the error", cached.follower.name, exc_info=True)
            reply = RecordDict({"error": ConfigRecord({"reason": reason})})
        save(context, cached)
        cached.sent = (cached.follower.last_message, counter, random_counter(cached.follower),
                       batches if "embedding" in reply else -1)
        return Message(reply, reply_to=msg)

    @app.query()
    def hello(msg: Message, context: Context) -> Message:
        cached = load(context)
        if not cached.token:  # drawn once per run, kept in the node state (never logged)
            cached.token = secrets.token_bytes(TOKEN_BYTES)
            save(context, cached)
        follower = cached.follower
        return Message(RecordDict({"config": ConfigRecord(
            {"party": follower.name, "spec": json.dumps(follower.spec.to_config()),
             "rejoin-token": cached.token})}), reply_to=msg)

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


def vertical_server_app(leader_fn: Callable[..., VerticalLeader], data_fn: Callable[..., Any],
                        *, epochs: int = 1, batch_size: int = 32, batches_per_message: int = 1,
                        seed: int | None = None,
                        shuffle: bool = True, validation_fn: Callable[..., Any] | None = None,
                        validation_batch_size: int = 256, round_timeout: float = 600.0,
                        connect_timeout: float = 300.0,
                        on_finish: Callable[[VerticalRunResult], None] | None = None,
                        party_nodes: Mapping[str, int] | None = None,
                        on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
                        follower_deadline: float = 600.0,
                        poll_interval: float = 3.0) -> ServerApp:
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
    a single node claiming its name becomes it. A follower that goes missing
    mid-run (its SuperNode restarted: a new node id without node
    authentication) is taken back only by a node that presents its rejoin
    token (and, when pinned, has its pinned node id).

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
        follower_deadline: seconds a follower may stay missing (no reply, or
            its node gone) while the leader waits for it to rejoin; past it
            the run stops with `FollowerGone` naming the follower and its
            node id (run config ``follower-deadline``).
        poll_interval: seconds between two looks for a missing follower
            (each look lists the connected nodes and asks the follower's own
            node and the nodes not refused before to introduce themselves).

    A run that cannot train stops with an error (the ServerApp raises, and
    Flower marks the run ``finished:failed``): an epoch in which every batch
    was skipped (`UntrainedEpoch`), or a follower missing for longer than
    ``follower_deadline`` (`FollowerGone`). Before each message round the
    leader waits for a missing follower to come back
    (`keras_fedpriv.federated.flower.vertical_roster`): a restarted follower
    is taken back only with its rejoin token, and the numbered messages drop
    the batches it embedded that the leader skipped. Once the followers are
    back, the batches of the message whose replies were missing are asked
    again, once, as a new message (fresh noise, each embedding counted by its
    follower): an epoch sent as one message still trains after a lost reply.

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
    follower_deadline = _positive_seconds(follower_deadline, "follower_deadline")
    poll_interval = _positive_seconds(poll_interval, "poll_interval")
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
        gone = _positive_seconds(run.get("follower-deadline", follower_deadline),
                                 "follower-deadline")
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
        roster = FollowerRoster(grid, leader.follower_specs, pins, wait, gone, poll_interval)
        roster.introduce(nodes)
        traffic = {"up": 0, "down": 0}

        def exchange(requests):
            roster.recover()  # a missing follower first comes back (or the run stops)
            messages = {p: _request_message(request, roster.node_of[p])
                        for p, request in requests.items()}
            traffic["down"] += sum(message_nbytes(m) for m in messages.values())
            replies = roster.send(messages)
            out: dict[str, Any] = {}
            for p, request in requests.items():
                reply = replies.get(p)
                if reply is None:
                    out[p] = f"no reply within {wait:g} s"
                    continue
                if reply.has_error():
                    out[p] = f"error reply: {first_line(reply.error.reason)}"
                    continue
                traffic["up"] += message_nbytes(reply)
                out[p] = _embedding_reply(reply, request, leader.follower_specs[p])
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

        try:
            result = run_leader(leader, exchange, ids, y, x, epochs=n_epochs, batch_size=size,
                                batches_per_message=k, seed=seed, shuffle=shuffle,
                                validation_data=validation,
                                validation_batch_size=validation_batch_size,
                                on_epoch_end=clock, stop_when_untrained=True,
                                describe=roster.name, retry=roster.recover)
        except (UntrainedEpoch, FollowerGone) as error:
            logger.error("the run stops: %s", error)
            raise
        result.history.update(extra)
        replies = roster.send({p: Message(RecordDict({"config": ConfigRecord({})}),
                                          dst_node_id=n, message_type="query.finish")
                               for p, n in roster.node_of.items()})
        for p in sorted(roster.node_of):
            if p not in replies or replies[p].has_error():
                logger.warning("%s failed to finish: %s", roster.name(p),
                               "no reply" if p not in replies
                               else first_line(replies[p].error.reason))
        if run.get("result-path"):
            _write_result(str(run["result-path"]), result)
        if on_finish is not None:
            on_finish(result)

    return app


def _positive_seconds(value: Any, name: str) -> float:
    """``value`` as a finite number of seconds > 0 (a ValueError naming ``name`` if not)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not 0 < seconds < float("inf"):
        raise ValueError(f"`{name}` must be a number of seconds > 0; got {value!r}.")
    return seconds


def _request_message(request: FollowerRequest, node: int) -> Message:
    """The Flower message of one `FollowerRequest` to ``node``."""
    content = RecordDict({"config": ConfigRecord({
        "epoch": request.epoch, "step": request.step, "message": request.message,
        "answers": request.answers})})
    ids, gradients = request.to_arrays()
    if ids is not None:
        content["ids"] = arrays_record(ids)
    if gradients is not None:
        content["gradient"] = arrays_record(gradients)
    return Message(content, dst_node_id=node,
                   message_type="train" if request.training else "evaluate")


def _embedding_reply(reply: Message, request: FollowerRequest, spec: Any) -> Any:
    """A follower's reply content: its embedding arrays (checked in size), or why not."""
    if "error" in reply.content:
        return f"error reply: {first_line(reply.content['error'].get('reason', ''))}"
    if "embedding" not in reply.content:
        return "the reply has no 'embedding' record"
    rows = sum(len(i) for i in request.example_ids or [])
    # checked before anything is deserialized: numpy arrays only, and no more bytes than a
    # float64 embedding of the rows asked for
    batches = max(len(request.example_ids or []), 1)
    limit = 8 * max(rows, 1) * spec.coordinates + 4096 * batches
    try:
        return checked_arrays(reply.content["embedding"], "embedding", limit)
    except MalformedMessage as error:
        return f"malformed reply: {error}"
    except Exception as error:  # an Array that does not decode
        return f"the reply's arrays do not decode ({type(error).__name__})"


def _write_result(folder: str, result: VerticalRunResult) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "history.json"), "w") as f:
        json.dump({"history": result.history, "rejected": result.rejected, "wire": result.wire},
                  f)
    np.savez(os.path.join(folder, "leader.npz"),
             *[np.asarray(v.numpy()) for v in result.leader.trainable_variables])
