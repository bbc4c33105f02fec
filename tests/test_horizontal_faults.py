"""Horizontal FL's faults without processes: replies matched by the message they answer, nodes
that come back under a new node id, runs that stop after too many failed rounds, client data
checked up front with a one-line message, and evaluation reports of a fixed size.

The strategy's tests drive its four steps with a stand-in Grid that gives every message an id
(as Flower's grids do when they push it) and answers as the test says.
"""

import json
import logging
import re
import uuid

import keras
import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    RecordDict,
)

from keras_fedpriv.callbacks import LaplaceEvaluation  # noqa: E402
from keras_fedpriv.federated import HorizontalFL  # noqa: E402
from keras_fedpriv.federated.flower import HorizontalStrategy, horizontal_client_app  # noqa: E402
from keras_fedpriv.federated.horizontal.parties import ClientDataError  # noqa: E402

from flower_stubs import model_fn  # noqa: E402

pytestmark = [pytest.mark.jax, pytest.mark.flower, pytest.mark.timeout(300)]

NODE_UNAVAILABLE = "Node Unavailable: the node did not answer in time"


class _Grid:
    """Connected nodes ``{node id: client id}``; ``lost`` nodes stay listed but do not answer:
    the SuperLink answers for them with an error whose sender id is 0."""

    def __init__(self, clients):
        self.clients = dict(clients)
        self.lost = set()
        self.failing = set()  # nodes whose client answers "train" with an error
        self.sent = []

    def get_node_ids(self):
        return sorted(self.clients)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as Flower's push does
            self.sent.append(m)
            node = m.metadata.dst_node_id
            if node in self.lost:
                reply = Message(Error(code=3, reason=NODE_UNAVAILABLE), reply_to=m)
                reply.metadata.__dict__["_src_node_id"] = 0
            elif m.metadata.message_type == "query":
                reply = Message(RecordDict({"config": ConfigRecord(
                    {"client-id": self.clients[node]})}), reply_to=m)
            elif node in self.failing:
                reply = Message(Error(code=1, reason="the client failed"), reply_to=m)
            else:
                reply = Message(_upload(self.clients[node]), reply_to=m)
            replies.append(reply)
        return replies


def _upload(cid):
    """A well-formed FedAvg reply of a zero update."""
    dim = sum(int(np.prod(w.shape)) for w in model_fn().trainable_weights)
    return RecordDict({"upload": ArrayRecord({"update": Array(np.zeros(dim, np.float32)),
                                              "num_examples": Array(np.array([5], np.int64))}),
                       "config": ConfigRecord({"client-id": cid})})


def _round(strategy, grid, rnd):
    with strategy.own_loop():  # this test's own loop drives the strategy's steps
        messages = list(strategy.configure_train(rnd, strategy.initial_arrays(), ConfigRecord(),
                                                 grid))
    return messages, strategy.aggregate_train(rnd, grid.send_and_receive(messages))


def _asked(messages):
    return sorted(m.metadata.dst_node_id for m in messages)


def test_an_error_reply_with_sender_id_0_is_matched_to_the_client_it_answers(in_a_run, caplog):
    """Flower's "Node Unavailable" reply for a lost node has sender id 0: it was taken for a
    reply from a node that was not asked, and the lost client was named by no id."""
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=3, seed=0,
                                  min_replies=2)
    grid = _Grid({10: 0, 11: 1, 12: 2})
    with strategy.own_loop():
        strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), grid)  # connects
        grid.lost.add(12)
        messages = list(strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(),
                                                 grid))
    with caplog.at_level(logging.WARNING, logger="keras_fedpriv.flower"):
        _, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert strategy.rejected == [(1, 2, f"error reply: {NODE_UNAVAILABLE}")]
    assert metrics["replies"] == 2.0 and metrics["below_min_replies"] == 0.0
    assert "round 1: dropped the reply of client 2 (node 12): error reply" in caplog.text


def test_a_restarted_node_is_asked_again_in_the_same_run_once_its_predecessor_is_gone(in_a_run,
                                                                                      caplog):
    """A SuperNode restarted mid-run has a new node id: it was never asked again in that run.
    While its dead predecessor is still listed, two nodes claim the client id: neither is
    asked."""
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=3, seed=0,
                                  min_replies=2)
    grid = _Grid({10: 0, 11: 1, 12: 2})
    asked = [_asked(_round(strategy, grid, 1)[0])]
    grid.lost.add(12)
    asked.append(_asked(_round(strategy, grid, 2)[0]))
    grid.clients[13] = 2  # client 2 restarted: a new node, while node 12 is still listed
    with caplog.at_level(logging.WARNING, logger="keras_fedpriv.flower"):
        asked.append(_asked(_round(strategy, grid, 3)[0]))
    assert "2 connected nodes (12, 13) claim client id 2; it takes no part" in caplog.text
    del grid.clients[12]  # the SuperLink no longer lists the killed node
    asked.append(_asked(_round(strategy, grid, 4)[0]))
    asked.append(_asked(_round(strategy, grid, 5)[0]))
    assert asked == [[10, 11, 12], [10, 11, 12], [10, 11], [10, 11, 13], [10, 11, 13]]
    assert strategy.history["replies"] == [3.0, 2.0, 2.0, 3.0, 3.0]
    # node 13 was asked its client id once; the server's ledger counts client 2 as one client
    queries = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "query"]
    assert sorted(queries) == [10, 11, 12, 13]
    units = strategy.ledger.to_dict()["kinds"][0]["units"]
    assert units == {"0": 5, "1": 5, "2": 4}  # asked in rounds 1, 2 (lost), 4 and 5
    assert strategy.run_result().replied[3] == [[0, 10], [1, 11], [2, 13]]


def test_too_many_failed_rounds_stop_the_run_naming_the_clients_that_did_not_answer(in_a_run):
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=3, seed=0,
                                  min_replies=2, max_failed_rounds=1)
    grid = _Grid({10: 0, 11: 1, 12: 2})
    grid.failing.update({11, 12})
    arrays, metrics = _round(strategy, grid, 1)[1]  # one failed round: allowed
    assert arrays is None and metrics["below_min_replies"] == 1.0
    with pytest.raises(RuntimeError) as error:
        _round(strategy, grid, 2)
    assert str(error.value) == (
        "2 rounds fell below min_replies=2 (rounds [1, 2]), more than max-failed-rounds=1: the "
        "run stops. Round 2 asked clients [0, 1, 2]; no good reply from client 1 (node 11), "
        "client 2 (node 12); connected clients: client 0 (node 10), client 1 (node 11), "
        "client 2 (node 12).")
    assert strategy.failed_rounds == [1, 2] and strategy.history["below_min_replies"] == [1.0,
                                                                                          1.0]
    assert strategy.run_result().failed_rounds == [1, 2]


def test_the_default_limit_is_half_the_rounds_that_start_runs(in_a_run):
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=3, seed=0)
    assert strategy.failure_limit() is None  # the four steps alone: no limit
    strategy._num_rounds = 7  # what start() records
    assert strategy.failure_limit() == 3
    assert HorizontalStrategy(model_fn(), "fedavg", max_failed_rounds=0).failure_limit() == 0
    with pytest.raises(ValueError, match="`max_failed_rounds` must be an integer >= 0"):
        HorizontalStrategy(model_fn(), "fedavg", max_failed_rounds=-1)


def test_a_round_with_too_few_connected_clients_asks_no_one_and_counts_as_failed(in_a_run):
    """It raised a RuntimeError that ended the run at once."""
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=3, seed=0,
                                  min_replies=2)
    grid = _Grid({10: 0, 11: 1, 12: 2})
    _round(strategy, grid, 1)
    del grid.clients[11], grid.clients[12]
    messages, (arrays, metrics) = _round(strategy, grid, 2)
    assert messages == [] and arrays is None and metrics["replies"] == 0.0
    assert strategy.failed_rounds == [2]
    assert strategy.ledger.to_dict()["kinds"][0]["units"] == {"0": 1, "1": 1, "2": 1}


# ------------------------------------------------------------ client data, checked up front

def _digits_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _client(rows, width=8, labels=None):
    x = np.full((rows, width), 7.3125, np.float32)  # a value that must never be printed
    y = np.arange(rows) % 4 if labels is None else labels
    return x, y


WIDE = "client 1: features must have shape (batch, 8) (the model's input); got (batch, 9)."
LABEL = ("client 1: labels must be integer class ids in [0, 4) (the model has 4 outputs, loss "
         "sparse_categorical_crossentropy); 1 of 23 labels are not (the first is row 22).")


@pytest.mark.parametrize("bad, message", [
    (_client(23, width=9), WIDE),
    (_client(23, labels=np.r_[np.arange(22) % 4, 4]), LABEL),
])
def test_hfl_refuses_a_clients_data_up_front_in_one_line_that_names_no_value(bad, message):
    """One column too wide was a 108-line TypeError quoting the client's features; a label one
    past the last class a TensorFlow error quoting the labels."""
    with pytest.raises(ClientDataError) as error:
        HorizontalFL(_digits_model(), [_client(17), bad]).fit(1, 2, verbose=0)
    assert str(error.value) == message
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize("check, message", [
    (lambda x, y: (x.astype(str), y), "features must be numbers (bool, int or float); got dtype"),
    (lambda x, y: (np.where(np.arange(len(x))[:, None] == 3, np.nan, x), y),
     "features must be finite; 1 of 17 rows hold NaN or infinity (the first is row 3)."),
    (lambda x, y: (x, y.astype(np.float32) + 0.5), "labels must be integer class ids in [0, 4)"),
])
def test_hfl_names_a_bad_dtype_non_finite_features_and_fractional_labels(check, message):
    x, y = check(*_client(17))
    with pytest.raises(ClientDataError, match=r"^client 1: " + re.escape(message)):
        HorizontalFL(_digits_model(), [_client(17), (x, y)])


def _context(partition, node=5, run_id=1):
    """A node's Context (the client apps cache a client per run and node: a test that needs
    fresh clients takes a run id of its own)."""
    return Context(run_id=run_id, node_id=node, node_config={"partition-id": partition},
                   state=RecordDict(), run_config={})


def test_the_flower_client_logs_the_one_line_message_and_replies_without_it(in_a_run, caplog):
    data = [_client(17), _client(23, width=9)]
    app = horizontal_client_app(_digits_model, lambda ctx: data[ctx.node_config["partition-id"]])
    query = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=5, message_type="query")
    with caplog.at_level(logging.INFO, logger="keras_fedpriv.flower"):
        reply = app(query, _context(1))
    assert reply.has_error()
    assert "details in the client's own log" in reply.error.reason and "8" not in \
        reply.error.reason
    lines = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in lines] == [
        "client 1 (node 5) failed to answer a 'query' message: "
        + WIDE.replace("client 1:", "client 1 (node 5):")]
    assert lines[0].exc_info is None  # one line: no traceback
    assert not app(query, _context(0)).has_error()


# ------------------------------------------------- evaluation reports of a fixed size

def _laplace(**kw):
    return LaplaceEvaluation(eps=2.0, from_logits=True, seed=0, max_report_rows=32,
                             metrics="calinski_harabasz", **kw)


def test_two_flower_clients_with_17_and_23_rows_send_reports_of_the_same_shape(in_a_run):
    """The report had min(n, max_report_rows) rows: (17, K) and (23, K) told the server n."""
    data = [_client(17), _client(23)]
    app = horizontal_client_app(_digits_model, lambda ctx: data[ctx.node_config["partition-id"]],
                                laplace_eval_fn=lambda ctx: _laplace())
    weights = [np.asarray(w) for w in _digits_model().trainable_weights]
    shapes, counted = [], []
    for partition in (0, 1):
        ask = Message(RecordDict({"weights": ArrayRecord(numpy_ndarrays=weights),
                                  "config": ConfigRecord({"max-rows": 32})}),
                      dst_node_id=5 + partition, message_type="evaluate")
        context = _context(partition, node=5 + partition, run_id=2)
        reply = app(ask, context)
        assert not reply.has_error(), reply.error.reason
        shapes.append(reply.content["report"]["report"].numpy().shape)
        state = json.loads(context.state["keras-fedpriv"]["laplace"])
        counted.append(state)
    assert shapes == [(32, 4), (32, 4)]
    # each client's own ledger counts the 32 rows it sent, padding included
    for partition, state in enumerate(counted):
        units = state["ledger"]["kinds"][0]["units"]
        assert units == {str(partition): 32}


def test_one_hot_labels_of_another_width_are_named_with_a_categorical_loss():
    model = _digits_model()
    model.compile("sgd", keras.losses.CategoricalCrossentropy(from_logits=True))
    x, _ = _client(17)
    with pytest.raises(ClientDataError) as error:
        HorizontalFL(model, [(x, np.eye(4)[np.arange(17) % 4]), (x, np.eye(3)[np.arange(17) % 3])])
    assert str(error.value) == (
        "client 1: labels must have shape (batch, 4) (one column per model output, loss "
        "categorical_crossentropy); got (batch, 3).")
