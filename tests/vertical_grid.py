"""A stand-in for Flower's Grid in the vertical leader's tests: real followers behind node ids.

`FakeGrid` plays the SuperLink for `vertical_server_app`: it gives every message an id (as
Flower's Grid does when it pushes one), and the followers behind it (`VerticalFollower`
objects, served by `serve_request`) answer with replies that name the message they answer.
Faults are injected per node: a node that is gone (the SuperLink's "Node Unavailable" error
reply, whose sender id is 0, as Flower's), a reply lost after the follower served the message,
a follower that moves to a new node id with its state (a restarted SuperNode), and nodes that
are not followers (``others``).
"""

import json
import secrets
import uuid

import keras
import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

import keras_fedpriv as kf
from keras_fedpriv.federated import VerticalModel
from keras_fedpriv.federated.records import arrays_record
from keras_fedpriv.federated.flower.vertical import vertical_server_app
from keras_fedpriv.federated.vertical.loop import (
    FeatureTable,
    FollowerRequest,
    serve_request,
)

N = 24
RNG = np.random.default_rng(0)
X = {"f1": RNG.normal(size=(N, 3)).astype("float32"),
     "f2": RNG.normal(size=(N, 2)).astype("float32"),
     "lead": RNG.normal(size=(N, 2)).astype("float32")}
Y = (X["f1"][:, 0] + X["lead"][:, 0] > 0).astype("float32")
F1, F2 = 10, 11  # the followers' node ids


@pytest.fixture
def in_a_run(monkeypatch):
    """Flower builds a Message only inside a run: a stand-in run id for these tests."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0)


def model_fn():
    """Leader 'lead' with its own bottom; followers f1 and f2 (EmbeddingDP bits)."""
    seeds = iter(range(100))

    def bottom(k):
        return keras.Sequential([keras.Input((k,)), keras.layers.Dense(
            4, kernel_initializer=keras.initializers.GlorotUniform(seed=next(seeds)))])

    top = keras.Sequential([keras.Input((12,)), keras.layers.Dense(
        1, activation="sigmoid", kernel_initializer=keras.initializers.GlorotUniform(seed=50))])
    model = VerticalModel({"f1": bottom(3), "f2": bottom(2), "lead": bottom(2)}, top,
                          leader="lead", embedding_dp=kf.EmbeddingDPLayer(eps=4.0, seed=3))
    model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy")
    return model


def hello(party, spec, token=None):
    """A follower's introduction (a random rejoin token unless one is given)."""
    return RecordDict({"config": ConfigRecord({
        "party": party, "spec": spec,
        "rejoin-token": secrets.token_bytes(32) if token is None else token})})


class FakeGrid:
    """A SuperLink stand-in: real followers at their nodes, and whatever else is connected.

    Attributes:
        followers, tables, tokens: node id -> the follower there, its features, its token.
        others: node id -> the content it answers the leader's query with (a RecordDict, or a
            string: an error reply); it answers every other message with an error reply.
        gone: node ids no longer connected: a message to one gets the SuperLink's
            "Node Unavailable" error reply, from sender 0.
        silent: node ids connected but never answering (no reply within the wait).
        fault: None, or ``fault(node, kind, config) -> None | "lost" | "gone"``: "lost" serves
            the message and loses the reply; "gone" makes the node gone from then on;
            "error": the node answers with a Flower error reply (its ClientApp raised).
        sent: ``(node, kind)`` of every message the leader sent.
        served: ``(node, message number)`` of every train/evaluate message a follower served.
    """

    def __init__(self, others=None):
        parties = model_fn().split_parties()
        self.followers = {F1: parties.followers["f1"], F2: parties.followers["f2"]}
        self.tables = {F1: FeatureTable(X["f1"]), F2: FeatureTable(X["f2"])}
        self.tokens = {F1: secrets.token_bytes(32), F2: secrets.token_bytes(32)}
        self.others = dict(others or {})
        self.gone: set[int] = set()
        self.silent: set[int] = set()
        self.fault = None
        self.sent = []
        self.served = []

    def spec(self, node=F1):
        """The JSON spec of the follower at ``node``."""
        return json.dumps(self.followers[node].spec.to_config())

    def move(self, old, new):
        """The follower at ``old`` restarts as node ``new``, with its state and token."""
        for table in (self.followers, self.tables, self.tokens):
            table[new] = table.pop(old)
        self.gone.add(old)

    def get_node_ids(self):
        return sorted(set([*self.followers, *self.others, *self.silent]) - self.gone)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            node, kind = m.metadata.dst_node_id, m.metadata.message_type
            self.sent.append((node, kind))
            config = m.content["config"] if "config" in m.content else {}
            fault = self.fault(node, kind, config) if self.fault is not None else None
            if fault == "gone":
                self.gone.add(node)
            if node in self.gone:
                reply = Message(Error(0, "Node Unavailable"), reply_to=m)
                reply.metadata.__dict__["_src_node_id"] = 0  # as the SuperLink's in its place
                replies.append(reply)
                continue
            if node in self.silent:
                continue
            if fault == "error":
                replies.append(Message(Error(0, "ClientApp raised ValueError"), reply_to=m))
                continue
            reply = self._answer(node, kind, m)
            if fault != "lost":
                replies.append(reply)
        return replies

    def _answer(self, node, kind, m):
        if node in self.others:  # a rogue answers the rest with an error reply
            answer = self.others[node] if kind == "query" else "not a follower"
            return (Message(Error(0, answer), reply_to=m) if isinstance(answer, str)
                    else Message(answer, reply_to=m))
        if kind == "query":
            follower = self.followers[node]
            return Message(hello(follower.name, self.spec(node), self.tokens[node]),
                           reply_to=m)
        if kind in ("train", "evaluate"):
            content = m.content
            config = content["config"]
            request = FollowerRequest.from_arrays(
                *[({k: a.numpy() for k, a in content[r].items()} if r in content else None)
                  for r in ("ids", "gradient")], training=kind == "train",
                message=config["message"], answers=config["answers"])
            try:
                arrays = serve_request(self.followers[node], request, self.tables[node])
            except Exception as error:  # answered, as the ClientApp does
                return Message(RecordDict({"error": ConfigRecord(
                    {"reason": f"{type(error).__name__}: {error}"})}), reply_to=m)
            self.served.append((node, request.message))
            return Message(RecordDict({"embedding": arrays_record(arrays)}), reply_to=m)
        return Message(RecordDict({"config": ConfigRecord({})}), reply_to=m)

    def messages_to(self, node):
        """The kinds of the messages sent to ``node``, in order."""
        return [kind for n, kind in self.sent if n == node]


def run_leader_on(grid, run_config=None, epochs=1, **kwargs):
    """Run `vertical_server_app`'s leader on ``grid``; its `VerticalRunResult`."""
    out = {}
    kwargs.setdefault("connect_timeout", 5)
    kwargs.setdefault("poll_interval", 0.01)  # no real wait between two looks for a follower
    app = vertical_server_app(lambda: model_fn().split_parties().leader,
                              lambda: (np.arange(N), X["lead"], Y), epochs=epochs, batch_size=8,
                              seed=0, on_finish=lambda r: out.update(r=r), **kwargs)
    app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config=dict(run_config or {})))
    return out["r"]
