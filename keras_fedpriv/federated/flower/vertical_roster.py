"""Which Flower node is which vertical follower, over a whole run: introductions and rejoins.

The vertical leader (`keras_fedpriv.federated.flower.vertical`) sends a
follower its example ids and cut gradients: it must know which node is that
follower when the run starts, and again when the follower's SuperNode
restarts mid-run (Flower then gives it a new node id, unless the SuperLink
authenticates SuperNodes by key).

* At its first introduction (a ``"query"`` message) a follower names its
  party and `EmbeddingSpec`, and sends its **rejoin token**: 32 random bytes
  it drew once for the run and keeps in its node state (with a ``state-dir``,
  in its private state file), never logged. The leader keeps each follower's
  token.
* A follower whose reply is missing, or a Flower error (its node gone: the
  SuperLink's "Node Unavailable" reply, whose sender id is 0), is *missing*.
  Before the next message the leader waits for it: it lists the connected
  nodes, asks the missing follower's own node and pinned node, and each
  other node not refused before (a node silent at two looks is refused), to
  introduce itself, all at once, and takes a node as
  the follower only if it presents the follower's token (and, when pinned,
  has the pinned node id). A node without the token is refused and logged,
  and never sent ids or gradients: a node that is not the follower, or the
  follower restarted without its state file (its counters would start
  again).
* A follower missing for longer than the run's deadline stops the run
  (`FollowerGone`, naming the follower and its node id).

Replies are matched to the messages they answer (``reply_to_message_id``),
never by sender id.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Any, Hashable, Mapping, TypeVar

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from keras_fedpriv.federated.flower.common import first_line
from keras_fedpriv.federated.vertical.wire import EmbeddingSpec, MalformedMessage

__all__ = ["TOKEN_BYTES", "FollowerGone", "FollowerRoster", "introduction", "matched_replies"]

logger = logging.getLogger("keras_fedpriv.flower")

#: bytes of a follower's rejoin token
TOKEN_BYTES = 32
#: a node that is not a follower's is no longer asked after this many queries it did not
#: answer at all: each one makes a look for a missing follower wait a whole round
RETIRE_AFTER = 2
PIN_KEY = "party-node."  # run config: party-node.<party> = the node id pinned to that follower

K = TypeVar("K", bound=Hashable)


class FollowerGone(RuntimeError):
    """A follower missing for longer than the run's follower deadline: the run stops."""


def matched_replies(grid: Grid, messages: Mapping[K, Message], timeout: float
                    ) -> dict[K, Message]:
    """Send ``messages`` and return each one's reply, matched by the message it answers.

    Flower sets each message's id when it pushes it; a reply names the id it
    answers (``reply_to_message_id``). Its sender id is not used: when the
    SuperLink gives up on a node it delivers an error reply whose sender is
    0. A reply that answers no message of this round, or a second reply to
    one, is logged and ignored.

    Args:
        grid: the ServerApp's Grid.
        messages: key (a party, a node id) -> the message to send.
        timeout: seconds to wait for the replies.

    Returns:
        key -> its reply, for the messages answered within ``timeout``.
    """
    keys = list(messages)
    sent = [messages[k] for k in keys]
    replies = list(grid.send_and_receive(sent, timeout=timeout))
    key_of = {m.metadata.message_id: k for k, m in zip(keys, sent) if m.metadata.message_id}
    out: dict[K, Message] = {}
    for reply in replies:
        key = key_of.get(reply.metadata.reply_to_message_id)
        if key is None or key in out:
            logger.warning("a reply from node %s %s; ignored", reply.metadata.src_node_id,
                           "answers a message already answered" if key is not None else
                           "answers no message of this round")
            continue
        out[key] = reply
    return out


def introduction(reply: Message) -> tuple[str, EmbeddingSpec, bytes]:
    """The party name, spec and rejoin token of one ``"query"`` reply.

    Raises:
        MalformedMessage: the reply has no such introduction.
    """
    try:
        content = reply.content
        if "config" not in content:
            raise MalformedMessage("the reply has no 'config' record")
        config = content["config"]
        if not isinstance(config, ConfigRecord):
            raise MalformedMessage(f"'config' is a {type(config).__name__}, not a ConfigRecord")
        party, spec, token = config.get("party"), config.get("spec"), config.get("rejoin-token")
        if not isinstance(party, str) or not isinstance(spec, str):
            raise MalformedMessage("'config' must hold the strings 'party' and 'spec'")
        if not isinstance(token, bytes) or len(token) != TOKEN_BYTES:
            raise MalformedMessage(f"'config' must hold the follower's 'rejoin-token' "
                                   f"({TOKEN_BYTES} bytes)")
        try:
            return party, EmbeddingSpec.from_config(json.loads(spec)), token
        except Exception as error:  # noqa: BLE001 - whatever the text is, it is not a spec
            raise MalformedMessage(f"its embedding spec does not parse "
                                   f"({type(error).__name__})") from None
    except MalformedMessage:
        raise
    except Exception as error:  # noqa: BLE001 - no reply may stop the leader
        raise MalformedMessage(f"the reply cannot be read ({type(error).__name__})") from None


def _query(node: int) -> Message:
    return Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=node,
                   message_type="query")


class FollowerRoster:
    """The leader's record of which node is which follower, and of followers gone missing.

    Args:
        grid: the ServerApp's Grid.
        specs: follower -> the `EmbeddingSpec` the leader expects.
        pins: follower -> the only node id that may be it.
        timeout: seconds to wait for the replies of one message round.
        deadline: seconds a follower may stay missing before `FollowerGone`.
        poll_interval: seconds between two looks for a missing follower.
    """

    def __init__(self, grid: Grid, specs: Mapping[str, EmbeddingSpec],
                 pins: Mapping[str, int] | None, timeout: float, deadline: float,
                 poll_interval: float = 3.0) -> None:
        self.grid = grid
        self.specs = dict(specs)
        self.pins = dict(pins or {})
        self.timeout = float(timeout)
        self.deadline = float(deadline)
        self.poll_interval = float(poll_interval)
        self.node_of: dict[str, int] = {}
        self.tokens: dict[str, bytes] = {}
        self.missing: dict[str, float] = {}  # follower -> when it went missing (monotonic)
        # nodes that introduced themselves and were not taken, or did not answer the query
        # RETIRE_AFTER times (never asked again, unless a missing follower's own or pinned node)
        self.asked: set[int] = set()
        self.silent: dict[int, int] = {}  # node -> queries it did not answer within the wait

    # -- names ------------------------------------------------------------------------------
    def name(self, party: str) -> str:
        """``follower 'f1' (node 12)``: how every log line names a follower."""
        node = self.node_of.get(party)
        return f"follower {party!r}" + (f" (node {node})" if node is not None else "")

    # -- the first introduction ---------------------------------------------------------------
    def introduce(self, nodes: list[int]) -> dict[str, int]:
        """Ask the connected ``nodes`` their party, spec and token; follower -> node id.

        A reply that is an error or malformed is refused with a logged
        reason. A follower pinned in ``pins`` is only its pinned node (any
        other node claiming it is ignored, logged); an unpinned follower
        claimed by two or more nodes stops the run (`RuntimeError` naming the
        party and the nodes): the leader never guesses, since the node it
        takes would receive that follower's example ids and cut gradients.
        When every follower is pinned only the pinned nodes are asked; an
        unpinned follower is whichever single node claims it (logged:
        trusted on first claim).
        """
        unpinned = sorted(set(self.specs) - set(self.pins))
        for party in unpinned:
            logger.warning("follower %r is not pinned to a node id: the node that claims it is "
                           "trusted on first claim (pin it: party_nodes= or the run config key "
                           "'%s%s', with the SuperLink's node authentication on)", party,
                           PIN_KEY, party)
        connected = sorted(nodes)
        asked = sorted(set(connected) if unpinned else set(self.pins.values()) & set(connected))
        replies = matched_replies(self.grid, {n: _query(n) for n in asked}, self.timeout)
        told: dict[int, str] = {}  # node -> what its answer was, for the error below
        claims: dict[str, list[tuple[int, EmbeddingSpec, bytes]]] = {}
        for node in asked:
            if node not in replies:
                continue
            reply = replies[node]
            if reply.has_error():
                logger.warning("node %s did not introduce itself: %s", node,
                               first_line(reply.error.reason))
                told[node] = "answered the query with an error"
                continue
            try:
                party, spec, token = introduction(reply)
            except MalformedMessage as error:
                logger.warning("node %s: its introduction was refused: %s", node, error)
                told[node] = f"sent a malformed introduction ({error})"
                continue
            if party not in self.specs:
                logger.warning("node %s is party %r, not a follower of this leader; ignored",
                               node, party[:64])
                told[node] = f"introduced itself as {party[:64]!r}"
                continue
            told[node] = f"introduced itself as {party!r}"
            if party in self.pins and node != self.pins[party]:
                logger.warning("node %s claims follower %r, which is pinned to node %s; ignored",
                               node, party, self.pins[party])
                continue
            claims.setdefault(party, []).append((node, spec, token))
        self._refuse_doubles(claims)
        for party, ((node, spec, token),) in claims.items():
            if spec != self.specs[party]:
                raise RuntimeError(f"follower {party!r} sends {spec}, but the leader expects "
                                   f"{self.specs[party]}; both must be built from the same "
                                   "model.")
            self.node_of[party] = node
            self.tokens[party] = token
        self.asked = set(asked) - set(self.node_of.values())
        missing = sorted(set(self.specs) - set(self.node_of))
        if missing:
            raise RuntimeError(f"the followers {missing} did not introduce themselves ("
                               + "; ".join(self._why(p, asked, connected, told)
                                           for p in missing)
                               + "); refused introductions are logged on the "
                               "'keras_fedpriv.flower' logger.")
        for party, node in sorted(self.node_of.items()):
            logger.info("follower %r is node %s", party, node)
        return dict(self.node_of)

    def _refuse_doubles(self, claims: Mapping[str, list[Any]]) -> None:
        doubled = {p: sorted(c[0] for c in cs) for p, cs in claims.items() if len(cs) > 1}
        for party, claimants in sorted(doubled.items()):
            logger.error("nodes %s all claim to be follower %r; the run does not start",
                         claimants, party)
        if doubled:
            party, claimants = sorted(doubled.items())[0]
            more = f" (and {len(doubled) - 1} more followers)" if len(doubled) > 1 else ""
            raise RuntimeError(
                f"nodes {claimants} all claim to be follower {party!r}{more}: the leader does "
                f"not start rather than send {party!r}'s example ids and cut gradients to a node "
                "that may not be it. Stop the extra node, or pin each follower to its node id "
                f"(vertical_server_app(party_nodes=...) or the run config key "
                f"'{PIN_KEY}{party}') with the SuperLink's node authentication on.")

    def _why(self, party: str, asked: list[int], connected: list[int],
             told: Mapping[int, str]) -> str:
        node = self.pins.get(party)
        if node is None:
            return f"{party!r}: no node claimed it"
        if node not in asked:
            return f"{party!r}: pinned node {node} is not connected (connected: {connected})"
        return f"{party!r}: pinned node {node} " + told.get(
            node, f"did not answer the query within {self.timeout:g} s")

    # -- a run's messages ---------------------------------------------------------------------
    def send(self, messages: Mapping[str, Message], timeout: float | None = None
             ) -> dict[str, Message]:
        """Send follower -> message; follower -> reply. Followers without a reply, or with a
        Flower error reply (their node gone, their ClientApp failed), become missing."""
        replies = matched_replies(self.grid, messages, self.timeout if timeout is None
                                  else timeout)
        now = time.monotonic()
        for party in messages:
            reply = replies.get(party)
            if reply is None or reply.has_error():
                if party not in self.missing:
                    logger.warning("%s is missing: %s", self.name(party),
                                   "no reply" if reply is None else
                                   f"error reply: {first_line(reply.error.reason)}")
                self.missing.setdefault(party, now)
            else:
                self.missing.pop(party, None)
        return replies

    def recover(self) -> bool:
        """Wait until no follower is missing: take back each one that rejoins with its token.

        Returns:
            Whether a follower was missing (and is now back).

        Raises:
            FollowerGone: a follower has been missing for longer than the
                deadline (the message names it, its last node id and what to
                do).
        """
        was_missing = bool(self.missing)
        while self.missing:
            self._check_deadline()
            ask = sorted(self._candidates(set(self.grid.get_node_ids())))
            if ask:
                left = self.deadline - (time.monotonic() - min(self.missing.values()))
                replies = matched_replies(self.grid, {n: _query(n) for n in ask},
                                          max(min(self.timeout, left), 0.1))
                self._take_back(replies, ask)
            if self.missing:
                time.sleep(self.poll_interval)
        return was_missing

    def _candidates(self, nodes: set[int]) -> set[int]:
        """The connected nodes to ask for the missing followers: each missing follower's own
        node and pinned node, and every node not yet retired (`asked`) or known as a
        follower. The own nodes are always asked, beside the new ones: a node that never
        introduces itself properly cannot keep a live follower from being taken back."""
        own = {self.node_of[p] for p in self.missing}
        pinned = {self.pins[p] for p in self.missing if p in self.pins}
        fresh = nodes - self.asked - set(self.node_of.values())
        return fresh | (own | pinned) & nodes

    def _check_deadline(self) -> None:
        now = time.monotonic()
        over = sorted((since, p) for p, since in self.missing.items()
                      if now - since > self.deadline)
        if over:
            since, party = over[0]
            raise FollowerGone(
                f"{self.name(party)} has been missing for {now - since:.0f} s, longer than the "
                f"run's follower deadline of {self.deadline:g} s (run config "
                "'follower-deadline'): the run stops. Restart that follower's SuperNode and "
                "party worker with the same node config and its state-dir (it rejoins with "
                "its state), or raise follower-deadline.")

    def _take_back(self, replies: Mapping[int, Message], asked: list[int]) -> None:
        """Take each missing follower back from the nodes that answered with its token."""
        claims: dict[str, list[int]] = {}
        for node in asked:
            reply = replies.get(node)
            if reply is None or reply.has_error():  # not up yet (e.g. its worker): ask again
                self._failed(node, reply)
                continue
            party = self._rejoin_claim(node, reply)
            if party is None:
                self.asked.add(node)
            else:
                claims.setdefault(party, []).append(node)
        for party, nodes in sorted(claims.items()):
            if len(nodes) > 1:
                logger.error("nodes %s all present the rejoin token of follower %r; none is "
                             "taken", nodes, party)
                self.asked.update(nodes)
                continue
            old, new = self.node_of[party], nodes[0]
            self.node_of[party] = new
            self.missing.pop(party)
            self.asked.discard(new)
            if old != new:
                self.asked.add(old)
            logger.warning("follower %r is back as node %s (was node %s)", party, new, old)

    def _failed(self, node: int, reply: Message | None) -> None:
        """Record that ``node`` did not introduce itself. A node that did not answer at all
        at ``RETIRE_AFTER`` looks is retired (added to `asked`), unless it is a missing
        follower's own or pinned node (always asked). A node that answers with an error is
        asked again: a restarted follower's SuperNode answers so until its party worker is
        up, and an error reply costs no wait."""
        if reply is not None:
            logger.info("node %s did not introduce itself: %s", node,
                        first_line(reply.error.reason))
            return
        self.silent[node] = self.silent.get(node, 0) + 1
        if self.silent[node] >= RETIRE_AFTER and node not in self.node_of.values() and \
                node not in self.pins.values():
            logger.info("node %s did not answer the query %d times; it is not asked again",
                        node, self.silent[node])
            self.asked.add(node)

    def _rejoin_claim(self, node: int, reply: Message) -> str | None:
        """The missing follower ``node`` may be taken back as, or None (refused, logged)."""
        try:
            party, spec, token = introduction(reply)
        except MalformedMessage as error:
            logger.warning("node %s: its introduction was refused: %s", node, error)
            return None
        if party not in self.missing:
            logger.warning("node %s claims follower %r, which is %s; ignored", node, party[:64],
                           f"answering as node {self.node_of[party]}" if party in self.node_of
                           else "not a follower of this leader")
            return None
        if party in self.pins and node != self.pins[party]:
            logger.warning("node %s claims follower %r, which is pinned to node %s; ignored",
                           node, party, self.pins[party])
            return None
        if spec != self.specs[party] or not hmac.compare_digest(token, self.tokens[party]):
            logger.warning("node %s claims follower %r without that follower's rejoin token "
                           "(another node, or the follower restarted without its state "
                           "file); refused: it is sent nothing", node, party)
            return None
        return party
