"""`HorizontalStrategy`: keras-fedpriv's server half as a Flower Strategy in a user's own app."""

import logging

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict  # noqa: E402
from flwr.serverapp import ServerApp  # noqa: E402

from keras_fedpriv.callbacks import MagRR  # noqa: E402
from keras_fedpriv.datasets import digits_clients  # noqa: E402
from keras_fedpriv.federated import HorizontalFL  # noqa: E402
from keras_fedpriv.federated.flower import HorizontalStrategy, horizontal_client_app  # noqa: E402
from keras_fedpriv.optimizers import SignDSEncoder  # noqa: E402
from keras_fedpriv.privacy import privacy_report  # noqa: E402

from flower_stubs import AppGrid, Reply, model_fn  # noqa: E402

# Not in the JAX pass (its user's ServerApp runs on TensorFlow); the ClientApp runs on JAX in
# test_horizontal_faults and the party worker in test_flower_worker.
pytestmark = [pytest.mark.flower, pytest.mark.timeout(300)]



def _signds():
    return SignDSEncoder(k=0.2, eps=10.0, seed=5)


def test_a_users_own_server_app_runs_the_strategy_like_the_in_process_run(in_a_run):
    """A user's ``ServerApp`` with the strategy, its messages carried to the real ClientApp by
    the stand-in SuperLink (`flower_stubs.AppGrid`, two stand-in workers, so each client
    reloads its node state). Flower's Simulation Engine runs the same apps in
    test_flower_horizontal (the SignDS + MagRR run) and test_central_dp (the guide's run)."""
    clients, val = digits_clients(3, seed=0)
    out = {}
    app = ServerApp()

    @app.main()
    def main(grid, context):
        strategy = HorizontalStrategy(model_fn(), _signds(), clients_per_round=2, num_clients=3,
                                      seed=1, magrr=MagRR(eps_rr=3.0, seed=1),
                                      validation_data=val)
        result = strategy.start(grid, strategy.initial_arrays(), num_rounds=3, timeout=120,
                                train_config=ConfigRecord({"local-epochs": 2}))
        out.update(strategy=strategy, result=result)

    client = horizontal_client_app(model_fn, lambda ctx: clients[ctx.node_config["partition-id"]],
                                   _signds, seed=1, eps_rr=3.0)
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    with AppGrid(client, nodes, workers=2) as grid:
        app(grid, grid.context())
    strategy, result = out["strategy"], out["result"]

    model = model_fn()
    fl = HorizontalFL(model, clients, upload=_signds(), seed=1)
    hist = fl.fit(rounds=3, clients_per_round=2, local_epochs=2, validation_data=val, verbose=0,
                  callbacks=[MagRR(eps_rr=3.0, seed=1)])
    for a, b in zip(model.get_weights(), strategy.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # Flower's own Result holds the final global weights and the per-round metrics
    for a, b in zip(model.trainable_weights, result.arrays.to_numpy_ndarrays()):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-6)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    np.testing.assert_allclose([result.train_metrics_clientapp[r]["global_lr"] for r in (1, 2, 3)],
                               hist.history["global_lr"])
    assert strategy.history["replies"] == [2.0, 2.0, 2.0]
    assert privacy_report(strategy, delta=1e-5).epsilon == pytest.approx(
        privacy_report(fl, delta=1e-5).epsilon, rel=1e-9)


# ------------------------------------------------------- the four steps with a stand-in Grid
class _Grid:
    """A Grid stand-in: three connected nodes that answer queries with their client ids."""

    def __init__(self, nodes=(10, 11, 12)):
        self.nodes = list(nodes)

    def get_node_ids(self):
        return self.nodes

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for i, m in enumerate(messages):
            replies.append(Reply(RecordDict({"config": ConfigRecord(
                {"client-id": self.nodes.index(m.metadata.dst_node_id)})}),
                m.metadata.dst_node_id))
        return replies


def _strategy(**kw):
    return HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, num_clients=3, seed=0,
                              **kw)


def test_configure_train_counts_the_asked_clients_and_sends_only_the_protocols_config(in_a_run):
    strategy = _strategy()
    with strategy.own_loop():
        messages = list(strategy.configure_train(1, strategy.initial_arrays(),
                                                 ConfigRecord({"lr-note": 1.5}), _Grid()))
    assert len(messages) == 2
    assert {m.metadata.message_type for m in messages} == {"train"}
    config = messages[0].content["config"]
    assert config["round"] == 0 and config["local-epochs"] == 1 and config["lr-note"] == 1.5
    assert set(messages[0].content.keys()) == {"weights", "config"}
    # asked is counted, before any reply
    ledger = strategy.privacy_ledger()
    assert [(ledger.units_seen(k), ledger.total(k)) for k in ledger.kinds] == [(2, 1)]


def test_the_strategy_takes_the_weights_flower_hands_it_and_refuses_wrong_ones(in_a_run):
    strategy = _strategy()
    arrays = [np.full_like(w, 0.5) for w in strategy.initial_arrays().to_numpy_ndarrays()]
    with strategy.own_loop():
        msgs = list(strategy.configure_train(1, ArrayRecord(numpy_ndarrays=arrays),
                                             ConfigRecord(), _Grid()))
    sent = msgs[0].content["weights"].to_numpy_ndarrays()
    assert all(np.all(w == 0.5) for w in sent)
    with pytest.raises(ValueError, match="`arrays` must hold the model's 4 trainable weights"), \
            strategy.own_loop():
        strategy.configure_train(2, ArrayRecord(numpy_ndarrays=arrays[:2]), ConfigRecord(),
                                 _Grid())


def test_too_few_good_replies_leave_the_model_unchanged_and_return_no_arrays(caplog, in_a_run):
    strategy = _strategy(min_replies=2)
    before = [w.copy() for w in strategy.model.get_weights()]
    with strategy.own_loop():
        messages = list(strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(),
                                                 _Grid()))
    stray = Message(RecordDict({"config": ConfigRecord({"client-id": 0})}), dst_node_id=1,
                    message_type="train")
    stray.metadata.__dict__["_src_node_id"] = 99  # a node that was not asked
    replies = [Reply(None, messages[0].metadata.dst_node_id, error="boom\nsecret trace"), stray]
    with caplog.at_level(logging.WARNING, logger="keras_fedpriv.flower"):
        arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is None
    assert metrics["replies"] == 0.0 and metrics["dropped"] == 2.0
    for a, b in zip(before, strategy.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    reasons = [r for _, _, r in strategy.rejected]
    assert reasons[0] == "error reply: boom" and "secret trace" not in caplog.text
    assert reasons[1] == "a reply from a node that was not asked"
    assert "fewer than min_replies=2" in caplog.text


def test_steps_out_of_order_and_bad_settings_are_refused(in_a_run):
    strategy = _strategy()
    with pytest.raises(ValueError, match="without its configure_train"):
        strategy.aggregate_train(1, [])
    with pytest.raises(ValueError, match="server_round"), strategy.own_loop():
        strategy.configure_train(0, strategy.initial_arrays(), ConfigRecord(), _Grid())
    with pytest.raises(ValueError, match="min_replies"):
        _strategy(min_replies=3)
    with pytest.raises(TypeError, match="`magrr` must be a MagRR"):
        _strategy(magrr=3.0)
    with pytest.raises(ValueError, match="batch_norm"):
        _strategy(batch_norm="mean")
    # no Laplace evaluation: Flower's evaluate step sends nothing
    assert list(strategy.configure_evaluate(1, strategy.initial_arrays(), ConfigRecord(),
                                            _Grid())) == []
    assert strategy.aggregate_evaluate(1, []) is None


def test_every_history_key_has_one_entry_per_round_when_a_round_falls_short(in_a_run):
    """A round with too few good replies logs NaN for what it could not compute."""
    strategy = _strategy(min_replies=2)
    scheme = strategy.upload
    delta = np.zeros(strategy.server.dim, np.float32)
    wire = {k: np.asarray(v) for k, v in scheme.to_wire(scheme.client_message(delta, 5)).items()}
    from flwr.app import Array

    def good(node, cid):
        reply = Message(RecordDict({"upload": ArrayRecord({k: Array(v) for k, v in wire.items()}),
                                    "config": ConfigRecord({"client-id": cid})}),
                        dst_node_id=1, message_type="train")
        reply.metadata.__dict__["_src_node_id"] = node
        return reply

    grid = _Grid()
    answered = []
    for rnd in (1, 2, 3):
        with strategy.own_loop():  # a user's own loop of the four steps
            messages = list(strategy.configure_train(rnd, strategy.initial_arrays(),
                                                     ConfigRecord(), grid))
        nodes = [m.metadata.dst_node_id for m in messages]
        replies = [good(n, grid.nodes.index(n)) for n in nodes]
        if rnd == 2:  # one client fails: 1 good reply < min_replies
            replies[1] = Reply(None, nodes[1], error="boom")
        arrays, _ = strategy.aggregate_train(rnd, replies)
        answered.append(arrays is not None)
        assert strategy.aggregate_evaluate(rnd, []) is None
    assert answered == [True, False, True]
    history = strategy.history
    assert history["replies"] == [2.0, 1.0, 2.0]
    assert {k: len(v) for k, v in history.items()} == dict.fromkeys(history, 3)
    assert np.isnan(history["global_lr"][1]) and not np.isnan(history["global_lr"][0])
    assert history["payload_bytes_up"][1] == history["payload_bytes_up"][0] / 2 > 0
    assert strategy.run_result().history == history
