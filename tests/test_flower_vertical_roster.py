"""Vertical FL on Flower survives its faults (keras_fedpriv/federated/flower/vertical_roster.py,
and the follower's side in keras_fedpriv/federated/flower/vertical.py).

A stand-in Grid (`vertical_grid.FakeGrid`) plays the SuperLink with real followers behind it:
a node that is gone (the SuperLink's "Node Unavailable" reply, sender id 0), a reply lost after
the follower served its message, a follower that restarts as a new node id with its state, and
nodes that claim a follower without its rejoin token. The follower's ClientApp is tested with
stand-in contexts: a node state one version behind the process's follower, and a SuperNode
restarted with its ``state-dir``.
"""

import base64
import logging
import os
import secrets
import stat

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto  # noqa: E402

from keras_fedpriv.federated.flower.vertical import (  # noqa: E402
    _followers,
    vertical_client_app,
    vertical_server_app,
)
from keras_fedpriv.federated.flower.vertical_roster import FollowerGone  # noqa: E402
from keras_fedpriv.federated.malformed import MalformedMessage  # noqa: E402
from keras_fedpriv.federated.vertical.loop import (  # noqa: E402
    FeatureTable,
    FollowerRequest,
    UntrainedEpoch,
    serve_request,
)

from vertical_grid import F1, F2, N, X, Y, FakeGrid, hello, in_a_run, model_fn  # noqa: E402, F401
from vertical_grid import run_leader_on  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.timeout(300)]

BATCHES = N // 8  # batches per epoch (batch size 8)


def _capture(caplog):
    return caplog.at_level(logging.INFO, logger="keras_fedpriv")


def _releases(follower):
    """How many embeddings the follower's protection recorded (one per batch)."""
    return int(follower.protection.release_totals.numpy()[0])


def _fault_at(node, count, what, then=None):
    """A `FakeGrid.fault`: ``what`` for the ``count``-th train message to ``node``."""
    seen = {"n": 0}

    def fault(to, kind, config):
        if to == node and kind == "train":
            seen["n"] += 1
            if seen["n"] == count:
                if then is not None:
                    then()
                return what
        return None

    return fault


# -- the leader ------------------------------------------------------------------------------

def test_a_gone_nodes_reply_from_sender_0_is_matched_to_its_follower_which_rejoins(in_a_run,
                                                                                  caplog):
    """Review: the SuperLink's "Node Unavailable" reply has sender id 0; the leader looked
    followers up by sender id ("a reply from node 0, which was not asked"), and a follower
    restarted as a new node was never asked again. Now the reply is matched by the message it
    answers (its reason is recorded for f1 and node 10), the restarted f1 (node 12, its state
    and token kept) is taken back, is asked the lost message's batch again, trains, and is
    told to finish."""
    grid = FakeGrid()
    f1, f2 = grid.followers[F1], grid.followers[F2]
    grid.fault = _fault_at(F1, 2, "gone", then=lambda: grid.move(F1, 12))
    with _capture(caplog):
        result = run_leader_on(grid, epochs=2)
    assert result.rejected == [(0, 1, "f1", "error reply: Node Unavailable")]
    assert "epoch 1 step 2: the reply of follower 'f1' (node 10) was not used: error reply: " \
        "Node Unavailable" in caplog.text
    assert result.history["steps"] == [BATCHES, BATCHES]  # the batch is asked again
    assert result.history["reasked"] == [1.0, 0.0] and result.history["skipped"] == [0.0, 0.0]
    assert grid.messages_to(12)[0] == "query" and grid.messages_to(12)[-1] == "query.finish"
    # the batch asked again, the rest of both epochs, and the last gradients
    assert grid.messages_to(12).count("train") == 2 * BATCHES
    assert "follower 'f1' is back as node 12 (was node 10)" in caplog.text
    assert "not asked" not in caplog.text and "None" not in caplog.text
    # every batch f1 embedded is counted once, none twice (the last message: gradients only)
    assert len([s for s in grid.served if s[0] in (F1, 12)]) == 2 * BATCHES + 1
    assert _releases(f1) == 2 * BATCHES
    # f2 embedded the batch twice (the leader used the second): both are counted
    assert _releases(f2) == 2 * BATCHES + 1
    assert not f1.pending


def test_a_lost_reply_leaves_the_follower_in_step_with_the_leader(in_a_run, caplog):
    """f1 served its 2nd message but the reply was lost: the leader finds f1 on its own node
    again and asks the batch again as a new message (numbered, without gradients), which makes
    f1 drop the batch it embedded and embed it again with fresh noise; both releases are
    counted."""
    grid = FakeGrid()
    f1 = grid.followers[F1]
    grid.fault = _fault_at(F1, 2, "lost")
    with _capture(caplog):
        result = run_leader_on(grid, epochs=1)
    assert [r[:3] for r in result.rejected] == [(0, 1, "f1")]
    assert result.history["steps"] == [BATCHES] and result.history["reasked"] == [1.0]
    assert _releases(f1) == BATCHES + 1  # the lost one included: it was sent
    assert f1.last_message == grid.messages_to(F1).count("train")  # every one numbered
    assert not f1.pending
    assert "follower 'f1' is back as node 10 (was node 10)" in caplog.text


def test_a_restarted_node_whose_worker_is_not_up_yet_is_asked_again(in_a_run, caplog):
    """f1's SuperNode restarts as node 12 before its party worker is up: its first
    introduction is an error reply. It is asked again (not refused for good), and once its
    worker answers it is taken back."""
    grid = FakeGrid()
    count = {"train": 0, "query": 0}

    def fault(to, kind, config):
        if to == F1 and kind == "train":
            count["train"] += 1
            if count["train"] == 2:
                grid.others[12] = "ClientApp raised: the worker is not up"
                return "gone"
        if to == 12 and kind == "query":
            count["query"] += 1
            if count["query"] == 2:  # its worker is up now
                del grid.others[12]
                grid.move(F1, 12)
        return None

    grid.fault = fault
    with _capture(caplog):
        result = run_leader_on(grid)
    assert grid.messages_to(12)[:3] == ["query", "query", "train"]
    assert result.history["steps"] == [BATCHES]
    assert "follower 'f1' is back as node 12 (was node 10)" in caplog.text


def test_a_node_answering_errors_does_not_keep_a_live_follower_out(in_a_run, caplog):
    """Review: f1's reply is lost (its node alive) and node 13 connects and answers every
    query with an error. The leader asked only the nodes it had not asked before while there
    were any, and a node that answered with an error stayed one of them: f1's own node was
    never asked and the run stopped with FollowerGone naming a healthy f1. Now f1's own node
    is asked beside node 13, f1 is taken back at the first look, and node 13 is sent queries
    only."""
    grid = FakeGrid()
    grid.fault = _fault_at(F1, 2, "lost",
                           then=lambda: grid.others.update({13: "ClientApp raised: no worker"}))
    with _capture(caplog):
        result = run_leader_on(grid, run_config={"follower-deadline": 60.0})
    assert "follower 'f1' is back as node 10 (was node 10)" in caplog.text
    assert set(grid.messages_to(13)) == {"query"}
    assert grid.messages_to(F1).count("query") == 2  # its introduction, and one look
    assert result.history["steps"][-1] > 0


def test_a_silent_node_is_not_asked_again_after_two_looks(in_a_run, caplog):
    """A connected node that never answers the query (each look then waits a whole round)
    is asked at two looks, then no more; the follower's own node is asked at every look."""
    grid = FakeGrid()
    count = {"looks": 0}

    def fault(to, kind, config):
        if to == F1 and kind == "train" and not count["looks"]:
            count["looks"] = 1
            grid.silent.add(14)
            return "lost"  # f1's replies are lost for two more looks, then it answers
        if to == F1 and kind == "query" and count["looks"]:
            count["looks"] += 1
            return "lost" if count["looks"] <= 3 else None
        return None

    grid.fault = fault
    with _capture(caplog):
        run_leader_on(grid, run_config={"follower-deadline": 60.0})
    assert grid.messages_to(14) == ["query", "query"]
    assert "node 14 did not answer the query 2 times; it is not asked again" in caplog.text
    assert "follower 'f1' is back as node 10 (was node 10)" in caplog.text


def test_no_rejoin_token_reaches_a_log_line_the_history_or_the_result_files(in_a_run, caplog,
                                                                            tmp_path):
    """A follower's rejoin token is what takes it back: it never appears in any log record
    (the package's loggers, at DEBUG), the history, the rejected replies or the leader's
    result files, in any spelling (bytes, hex, base64, repr), through an introduction, a lost reply, a
    restart under a new node id and a rogue presenting a token of its own."""
    grid = FakeGrid()
    rogue = secrets.token_bytes(32)

    def restart():
        grid.move(F1, 12)
        grid.others[13] = hello("f1", grid.spec(12), rogue)

    grid.fault = _fault_at(F1, 2, "gone", then=restart)
    tokens = [*grid.tokens.values(), rogue]
    with caplog.at_level(logging.DEBUG, logger="keras_fedpriv"):  # the package's loggers
        result = run_leader_on(grid, epochs=2, run_config={"result-path": str(tmp_path / "r")})
    assert "follower 'f1' is back as node 12" in caplog.text  # the token was used
    texts = [caplog.text, repr([r.__dict__ for r in caplog.records]), repr(result.history),
             repr(result.rejected)]
    files = [f.read_bytes() for f in (tmp_path / "r").iterdir()]
    assert len(files) == 2  # history.json and leader.npz
    for token in tokens:
        spellings = [token.hex(), repr(token), base64.b64encode(token).decode()]
        for text in texts:
            assert not any(s in text for s in spellings)
        for data in files:
            assert token not in data and not any(s.encode() in data for s in spellings)


def test_a_node_without_the_followers_token_is_refused_and_the_run_stops_naming_it(in_a_run,
                                                                                  caplog):
    """f1's node goes away; node 13 then claims f1 with another token (a rogue, or f1 started
    again without its state file): it is asked once, sent nothing else, and once f1 has been
    missing for longer than the follower deadline the run stops naming f1 and its node id."""
    grid = FakeGrid()
    grid.fault = _fault_at(F1, 2, "gone",
                           then=lambda: grid.others.update({13: hello("f1", grid.spec(F1))}))
    with _capture(caplog), pytest.raises(FollowerGone, match=(
            r"^follower 'f1' \(node 10\) has been missing for \d+ s, longer than the run's "
            r"follower deadline of 1 s \(run config 'follower-deadline'\): the run stops\. "
            r"Restart that follower's SuperNode")):
        run_leader_on(grid, run_config={"follower-deadline": 1.0})
    assert grid.messages_to(13) == ["query"]
    assert "node 13 claims follower 'f1' without that follower's rejoin token" in caplog.text
    assert "query.finish" not in grid.messages_to(F2)


def test_an_epoch_that_trains_nothing_stops_the_run_naming_the_follower(in_a_run):
    """Review: with every reply of a follower refused the run went on (loss nan) and ended
    as completed. Now it stops after the epoch, naming the follower, its node and why."""
    grid = FakeGrid()
    grid.tables[F2] = FeatureTable(X["f2"][:4])  # f2 knows 4 of the 24 examples
    with pytest.raises(UntrainedEpoch, match=(
            r"^epoch 1 trained no step: all 3 batches were skipped.*follower 'f2' \(node 11\): "
            r"error reply: MalformedMessage: .* unknown to this party")):
        run_leader_on(grid, epochs=2)
    assert grid.messages_to(F2).count("train") == BATCHES
    assert "query.finish" not in grid.messages_to(F1)


def test_an_epoch_sent_as_one_message_trains_after_a_lost_reply(in_a_run):
    """Review: with every batch of an epoch in one message (the example's defaults), one lost
    reply skipped the whole epoch and the run stopped with UntrainedEpoch, although f1 was
    back at once. Now the epoch's batches are asked again once f1 is back: every epoch trains,
    and f1 counts each embedding it made (the lost message's included)."""
    grid = FakeGrid()
    f1 = grid.followers[F1]
    grid.fault = _fault_at(F1, 2, "lost")
    result = run_leader_on(grid, epochs=3, batches_per_message=BATCHES)
    assert result.history["steps"] == [BATCHES] * 3
    assert result.history["reasked"] == [0.0, BATCHES, 0.0]
    assert _releases(f1) == 4 * BATCHES
    # 3 epochs, one message again, and the last gradients: every one numbered and served
    assert f1.last_message == grid.messages_to(F1).count("train") == 5


def test_a_follower_that_fails_again_is_asked_once_more_then_the_epoch_stops(in_a_run):
    """A follower whose node answers every message with a Flower error reply is waited for,
    taken back when it introduces itself (it answers the query), and asked the batches once
    more; when that fails
    too the batches are skipped, and an epoch of skipped batches still stops the run."""
    grid = FakeGrid()

    grid.fault = lambda to, kind, config: "error" if (to, kind) == (F2, "train") else None
    with pytest.raises(UntrainedEpoch, match=r"^epoch 1 trained no step: all 3 batches"):
        run_leader_on(grid, epochs=2, run_config={"follower-deadline": 60.0})
    assert grid.messages_to(F2).count("train") == 2 * BATCHES  # each batch: once, and again


def test_an_untrained_epoch_spends_no_release_on_validation(in_a_run):
    """Review: an epoch that trained nothing was still scored on the validation data before the
    run stopped, each follower spending a release per validation batch on a model that had
    not changed. Now no validation message is sent for it."""
    grid = FakeGrid()
    grid.tables[F2] = FeatureTable(X["f2"][:4])  # f2 knows 4 of the 24 examples
    with pytest.raises(UntrainedEpoch):
        run_leader_on(grid, epochs=2, validation_fn=lambda: (np.arange(N), X["lead"], Y))
    assert "evaluate" not in grid.messages_to(F1) + grid.messages_to(F2)
    assert _releases(grid.followers[F1]) == BATCHES  # the training batches only


@pytest.mark.parametrize("key, value", [("follower-deadline", 0), ("follower-deadline", "x"),
                                        ("follower-deadline", float("inf"))])
def test_a_bad_follower_deadline_is_refused_by_name(in_a_run, key, value):
    with pytest.raises(ValueError, match=rf"`{key}` must be a number of seconds > 0; got "):
        run_leader_on(FakeGrid(), run_config={key: value})


@pytest.mark.parametrize("value", [0, -1.0, "x", float("nan")])
def test_a_bad_poll_interval_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"`poll_interval` must be a number of seconds > 0; got "):
        vertical_server_app(lambda: None, lambda: None, poll_interval=value)


# -- the follower's side of a resynchronization ----------------------------------------------

def _follower_and_table():
    return model_fn().split_parties().followers["f1"], FeatureTable(X["f1"])


def _grads(n, rows=8):
    return [{"gradient": np.full((rows, 4), 0.1, np.float32)} for _ in range(n)]


def test_an_old_or_repeated_message_is_never_served_again():
    """A message the follower served again (Flower delivering it twice, or late) would embed
    its batches again and apply its gradients to other batches: a numbered message is served
    once, and gradients apply only to the batches of the message they answer."""
    follower, table = _follower_and_table()
    serve_request(follower, FollowerRequest(example_ids=[np.arange(8)], message=1), table)
    second = FollowerRequest(_grads(1), [np.arange(8, 16)], message=2, answers=1)
    serve_request(follower, second, table)
    weights = [v.numpy().copy() for v in follower.trainable_variables]
    with pytest.raises(MalformedMessage, match="message 2 is not newer than message 2"):
        serve_request(follower, second, table)
    with pytest.raises(MalformedMessage, match=r"the gradients answer message 1, but the "
                                               r"batches awaiting gradients came from message 2"):
        serve_request(follower, FollowerRequest(_grads(1), [np.arange(16, 24)], message=3,
                                                answers=1), table)
    assert _releases(follower) == 2  # nothing embedded again
    for a, v in zip(weights, follower.trainable_variables):
        np.testing.assert_array_equal(a, v.numpy())
    assert follower.pending_message == 2 and follower.pending_batches == 1
    # the leader's next message skips batch 2 (no gradients): f1 drops it and goes on
    serve_request(follower, FollowerRequest(example_ids=[np.arange(16, 24)], message=4), table)
    assert follower.pending_message == 4 and follower.pending_batches == 1
    assert (follower.last_message, _releases(follower)) == (4, 3)


def test_the_message_numbers_move_with_the_followers_state():
    follower, table = _follower_and_table()
    serve_request(follower, FollowerRequest(example_ids=[np.arange(8)], message=5), table)
    copy = model_fn().split_parties().followers["f1"]
    copy.load_state_dict(follower.state_dict())
    assert (copy.last_message, copy.pending_message, copy.pending_batches) == (5, 5, 1)
    with pytest.raises(MalformedMessage, match="message 5 is not newer"):
        serve_request(copy, FollowerRequest(example_ids=[np.arange(8)], message=5), table)


# -- the follower's ClientApp ------------------------------------------------------------------

RUN = 7


@pytest.fixture
def client(monkeypatch):
    """The follower's ClientApp (f1) inside a stand-in run; its cached followers dropped after."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_run_id", RUN), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)

    def make(**kwargs):
        return vertical_client_app(lambda party: model_fn().split_parties().followers[party],
                                   lambda party: X[party], **kwargs)

    yield make
    for key in [k for k in _followers() if k[0] == RUN]:
        _followers().pop(key, None)


def _context(node, state=None, **config):
    return Context(run_id=RUN, node_id=node, node_config={"party": "f1", **config},
                   state=RecordDict() if state is None else state, run_config={})


def _train(app, context, message, ids=None, answers=0, rows=8):
    content = RecordDict({"config": ConfigRecord({"epoch": 0, "step": 0, "message": message,
                                                  "answers": answers})})
    if ids is not None:
        content["ids"] = ArrayRecord({"0/ids": Array(np.asarray(ids, np.int64))})
    if answers:
        content["gradient"] = ArrayRecord({"0/gradient": Array(
            np.full((rows, 4), 0.1, np.float32))})
    return app(Message(content, dst_node_id=context.node_id, message_type="train"),
               context).content


def _hello(app, context):
    reply = app(Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=context.node_id,
                        message_type="query"), context)
    return reply.content["config"]["rejoin-token"]


def _copy(state):
    return recorddict_from_proto(recorddict_to_proto(state))


def test_a_node_state_one_version_behind_the_process_follower_does_not_wedge_it(client):
    """Review: when the node state is one version behind the follower the process holds (a
    relay that timed out after the worker answered), every later message failed with "random
    counter is behind". Now the process's follower, the newest, serves and is written back;
    nothing is replayed: each release is counted once and the random counter only goes on."""
    app = client()
    context = _context(3)
    assert "embedding" in _train(app, context, 1, ids=np.arange(8))
    behind = _copy(context.state)  # what the SuperNode kept: message 2's state never arrived
    assert "embedding" in _train(app, context, 2, ids=np.arange(8, 16), answers=1)
    follower = _followers()[(RUN, 3)].follower
    counter = follower.protection.rng_counter.numpy().copy()
    stale = _context(3, behind)
    reply = _train(app, stale, 3, ids=np.arange(16, 24), answers=2)
    assert "embedding" in reply, reply
    assert _releases(follower) == 3
    assert follower.last_message == 3 and follower.pending_message == 3
    assert stale.state["keras-fedpriv-vertical-meta"]["version"] == 3
    now = follower.protection.rng_counter.numpy()
    assert np.all(now >= counter) and np.any(now > counter)


def test_a_restarted_follower_comes_back_from_its_state_dir(client, tmp_path):
    """A SuperNode restarted mid-run (a new node id, an empty node state, a new process): with
    its state-dir the follower comes back with its token, its waiting batch and its counters,
    so the leader's gradients for that batch apply, and releases count on from where they
    were. The file holds its secrets: mode 600 in a 700 folder."""
    folder = tmp_path / "f1-state"
    folder.mkdir(mode=0o700)
    app = client(state_dir=str(folder))
    before = _context(3)
    token = _hello(app, before)
    assert isinstance(token, bytes) and len(token) == 32
    assert "embedding" in _train(app, before, 1, ids=np.arange(8))
    sent = _followers()[(RUN, 3)].follower.state_dict()
    files = sorted(folder.iterdir())
    assert [f.name for f in files] == [f"run-{RUN}-f1.lock", f"run-{RUN}-f1.state"]
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files)
    _followers().clear()  # the process is gone too
    after = _context(4)  # a new node id, an empty node state
    assert _hello(app, after) == token
    reply = _train(app, after, 2, ids=np.arange(8, 16), answers=1)
    assert "embedding" in reply, reply
    follower = _followers()[(RUN, 4)].follower
    assert _releases(follower) == 2 and follower.last_message == 2
    now = follower.state_dict()
    counters = [key for key in sent if key.endswith("rng_counter")]
    assert counters
    for key in counters:  # counters went on, never back
        assert np.all(now[key] >= sent[key]) and np.any(now[key] > sent[key])


def test_without_its_state_dir_a_restarted_follower_has_another_token(client):
    """The leader takes a follower back only with its token: one restarted from nothing (its
    counters would start again) presents a new one, and is refused."""
    app = client()
    token = _hello(app, _context(3))
    _followers().clear()
    assert _hello(app, _context(4)) != token
