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
import secrets
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
    party_budget,
)
from keras_fedpriv.federated.flower.party_store import durable_state_mod  # noqa: E402
from keras_fedpriv.federated.flower.recent_runs import RecentRuns  # noqa: E402
from keras_fedpriv.federated.flower.vertical_roster import TOKEN_BYTES  # noqa: E402
from keras_fedpriv.federated.flower.vertical_strategy import (  # noqa: E402
    VerticalStrategy,
    positive_seconds,
    write_result,
)
from keras_fedpriv.federated.records import arrays_record  # noqa: E402
from keras_fedpriv.federated.vertical import wire  # noqa: E402
from keras_fedpriv.federated.vertical.follower import VerticalFollower  # noqa: E402
from keras_fedpriv.federated.vertical.leader import VerticalLeader  # noqa: E402
from keras_fedpriv.federated.vertical.loop import (  # noqa: E402
    MAX_BATCHES_PER_MESSAGE,
    FeatureTable,
    FollowerRequest,
    VerticalRunResult,
    failure_reason,
    serve_request,
    validate_batches_per_message,
)
from keras_fedpriv.federated.vertical.party import validate_party_name  # noqa: E402
from keras_fedpriv.layers.local_state import local_state  # noqa: E402
from keras_fedpriv.mechanisms.validation import (  # noqa: E402
    validate_positive_int,
    validate_seed,
)
from keras_fedpriv.privacy.budget import BudgetExhausted, PrivacyBudget  # noqa: E402
from keras_fedpriv.privacy.report import privacy_ledger  # noqa: E402

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
    service = _FollowerService(follower_fn, data_fn, parties=parties, party_fn=party_fn,
                              on_finish=on_finish, max_epsilon=max_epsilon,
                              budget_delta=budget_delta, budget_path=budget_path,
                              max_batches_per_message=max_batches_per_message)
    app = ClientApp(mods=[service.audit, durable_state_mod(state_dir, party=service.party_name)])
    app.query()(service.hello)
    app.train()(service.train)
    app.evaluate()(service.evaluate)
    app.query("finish")(service.finish)
    return app


class _FollowerService:
    """One follower's answers to the vertical messages: what `vertical_client_app` registers.

    The settings are this object's; the follower itself lives in the
    process's cache (`_followers`, one per run and node) and in the node's
    ``context.state``, whichever is newer (`load`). The arguments are those
    of `vertical_client_app` (already checked there).
    """

    def __init__(self, follower_fn: Callable[..., VerticalFollower], data_fn: Callable[..., Any],
                 *, parties: Sequence[str] | None = None,
                 party_fn: Callable[[Context], str] | None = None,
                 on_finish: Callable[..., None] | None = None,
                 max_epsilon: float | None = None, budget_delta: float = 1e-5,
                 budget_path: str | Callable[[Context], str] | None = None,
                 max_batches_per_message: int = MAX_BATCHES_PER_MESSAGE) -> None:
        self.follower_fn = follower_fn
        self.data_fn = data_fn
        self.parties = parties
        self.party_fn = party_fn
        self.on_finish = on_finish
        self.max_epsilon = max_epsilon
        self.budget_delta = budget_delta
        self.budget_path = budget_path
        self.max_batches_per_message = max_batches_per_message

    # -- settings of the node ---------------------------------------------------------------
    def party_name(self, context: Context) -> str:
        """The node's party: ``party_fn(context)``, else the node config's."""
        if self.party_fn is not None:
            return self.party_fn(context)
        return _party_of(context, self.parties)

    def max_batches(self, context: Context) -> int:
        """The most batches one message may ask for: the code's and the node config's smaller."""
        node = context.node_config.get("max-batches-per-message")
        if node is None:
            return self.max_batches_per_message
        return min(self.max_batches_per_message,
                   validate_batches_per_message(int(node), "max-batches-per-message"))

    # -- the follower and its node state ----------------------------------------------------
    def build(self, context: Context) -> _Cached:
        """A new follower and its feature table, from the user's functions."""
        party = self.party_name(context)
        follower = call_with_context(self.follower_fn, party, context=context)
        if not isinstance(follower, VerticalFollower) or follower.name != party:
            raise TypeError(f"follower_fn({party!r}) must return the VerticalFollower named "
                            f"{party!r}; got {type(follower).__name__}.")
        data = call_with_context(self.data_fn, party, context=context)
        table = (data if isinstance(data, FeatureTable) else
                 FeatureTable(data[1], data[0]) if isinstance(data, tuple) else
                 FeatureTable(data))
        return _Cached(follower, table, 0)

    def load(self, context: Context) -> _Cached:
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
            cached = cache[key] = self.build(context)
        if cached.version > version:
            logger.warning("follower %r (node %s): the node state (version %d) is behind this "
                           "process's follower (version %d); the follower's is kept and written "
                           "back", cached.follower.name, context.node_id, version,
                           cached.version)
            self.write(context, cached)
        elif cached.version < version:
            if _STATE in context.state:
                cached.follower.load_state_dict(_arrays(context.state[_STATE]))
            cached.version = version
            token = meta.get("token", b"")
            cached.token = token if isinstance(token, bytes) else b""
        return cached

    @staticmethod
    def write(context: Context, cached: _Cached) -> None:
        """Put the follower's state and version into the node state."""
        context.state[_STATE] = arrays_record(cached.follower.state_dict())
        context.state[_META] = ConfigRecord({"version": cached.version, "token": cached.token})

    def save(self, context: Context, cached: _Cached) -> None:
        """A new version of the follower's state, in the node state."""
        cached.version += 1
        self.write(context, cached)

    # -- the messages -----------------------------------------------------------------------
    def audit(self, msg: Message, context: Context, call_next: Any) -> Message:
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

    def hello(self, msg: Message, context: Context) -> Message:
        """The ``"query"``: the follower's party, spec and rejoin token."""
        cached = self.load(context)
        if not cached.token:  # drawn once per run, kept in the node state (never logged)
            cached.token = secrets.token_bytes(TOKEN_BYTES)
            self.save(context, cached)
        follower = cached.follower
        return Message(RecordDict({wire.CONFIG: ConfigRecord(
            {"party": follower.name, "spec": json.dumps(follower.spec.to_config()),
             "rejoin-token": cached.token})}), reply_to=msg)

    def train(self, msg: Message, context: Context) -> Message:
        """A ``"train"`` message: gradients to apply, training batches to embed."""
        return self.serve(msg, context, True)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """An ``"evaluate"`` message: inference batches to embed."""
        return self.serve(msg, context, False)

    def finish(self, msg: Message, context: Context) -> Message:
        """The ``"query.finish"``: the run is over (``on_finish`` runs)."""
        cached = self.load(context)
        if self.on_finish is not None:
            call_with_context(self.on_finish, cached.follower, context=context)
        return Message(RecordDict({wire.CONFIG: ConfigRecord({"party": cached.follower.name})}),
                       reply_to=msg)

    def serve(self, msg: Message, context: Context, training: bool) -> Message:
        """Serve one request; the reply is the embeddings, or an error with its reason only."""
        cached = self.load(context)
        counter = random_counter(cached.follower)
        batches = 0
        try:
            limit = self.max_batches(context)
            request = _read_request(msg.content, training, limit)
            cap = party_budget(context, self.max_epsilon, self.budget_delta, self.budget_path,
                               per_record=True)
            before = None if cap is None else privacy_ledger(cached.follower)
            reply = RecordDict({wire.EMBEDDING: arrays_record(
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
            return Message(RecordDict({wire.ERROR: ConfigRecord(
                {"reason": "BudgetExhausted: the follower's privacy budget is spent"})}),
                reply_to=msg)
        except Exception as error:
            # Answered, not raised: the node state then keeps what did happen (a gradient
            # applied, a release made), as in one process; the leader gets the reason only.
            reason = failure_reason(error)
            logger.warning("follower %r (node %s) failed to serve a request: %s",
                           cached.follower.name, context.node_id, reason)
            logger.debug("follower %r: the error", cached.follower.name, exc_info=True)
            reply = RecordDict({wire.ERROR: ConfigRecord({"reason": reason})})
        self.save(context, cached)
        cached.sent = (cached.follower.last_message, counter, random_counter(cached.follower),
                       batches if wire.EMBEDDING in reply else -1)
        return Message(reply, reply_to=msg)


def _read_request(content: RecordDict, training: bool, max_batches: int) -> FollowerRequest:
    """The `FollowerRequest` of a received message's records (checked by `FollowerRequest`)."""
    config = content[wire.CONFIG] if wire.CONFIG in content else {}
    return FollowerRequest.from_arrays(
        _arrays(content[wire.IDS]) if wire.IDS in content else None,
        _arrays(content[wire.GRADIENT]) if wire.GRADIENT in content else None,
        training=training, max_batches=max_batches, **wire.read_request_numbers(config))


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
    settings = dict(epochs=epochs, batch_size=batch_size,
                    batches_per_message=batches_per_message, seed=seed, shuffle=shuffle,
                    validation_batch_size=validation_batch_size, round_timeout=round_timeout,
                    connect_timeout=connect_timeout, party_nodes=party_nodes,
                    on_epoch_end=on_epoch_end, follower_deadline=follower_deadline,
                    poll_interval=poll_interval)
    _check_settings(**settings)
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = VerticalStrategy(call_with_context(leader_fn, context=context), **settings)
        data = call_with_context(data_fn, context=context)
        validation = (None if validation_fn is None
                      else call_with_context(validation_fn, context=context))
        result = strategy.start(grid, data, validation_data=validation,
                                run_config=context.run_config)
        if context.run_config.get("result-path"):
            write_result(str(context.run_config["result-path"]), result)
        if on_finish is not None:
            on_finish(result)

    return app


def _check_settings(**settings: Any) -> None:
    """Refuse a `vertical_server_app` setting now, when the app is built, not at the run."""
    validate_positive_int(settings["epochs"], "epochs")
    validate_positive_int(settings["batch_size"], "batch_size")
    validate_batches_per_message(settings["batches_per_message"])
    validate_positive_int(settings["validation_batch_size"], "validation_batch_size")
    validate_seed(settings["seed"])
    if not isinstance(settings["shuffle"], bool):
        raise TypeError(f"`shuffle` must be a bool; got {settings['shuffle']!r}.")
    positive_seconds(settings["follower_deadline"], "follower_deadline")
    positive_seconds(settings["poll_interval"], "poll_interval")
