"""Flower's central DP beside keras-fedpriv's uploads: `central_dp`, and what is refused."""

import dp_accounting
import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict  # noqa: E402
from flwr.clientapp.mod import LocalDpMod, fixedclipping_mod  # noqa: E402
from flwr.serverapp import (  # noqa: E402
    NeighboringRelation,
    PrivacyConfig,
    RdpAccountant,
    SamplingMethod,
    ServerApp,
)
from flwr.serverapp.exception import PrivacyBudgetExhausted  # noqa: E402
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from keras_fedpriv.callbacks import MagRR  # noqa: E402
from keras_fedpriv.datasets import digits_clients  # noqa: E402
from keras_fedpriv.federated.flower import HorizontalStrategy, horizontal_client_app  # noqa: E402
from keras_fedpriv.federated.flower.central_dp import (  # noqa: E402
    CentralDP,
    ClippedSum,
    central_dp,
    refuse_dp_mods,
)
from keras_fedpriv.federated.uploads import (  # noqa: E402
    ClientUpload,
    FedAvgUpload,
    GaussianUpload,
)
from keras_fedpriv.optimizers import SignDSEncoder  # noqa: E402
from keras_fedpriv.privacy import privacy_report  # noqa: E402

from flower_stubs import AppGrid, Reply, model_fn  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.timeout(300)]
DELTA = 1e-5


def _accountant(population=2, max_epsilon=None):
    return RdpAccountant(PrivacyConfig(target_delta=DELTA, population_size=population,
                                       neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                       sampling_method=SamplingMethod.NO_AMPLIFICATION,
                                       max_epsilon=max_epsilon))


def _hand_epsilon(z, rounds, delta=DELTA):
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.GaussianDpEvent(z), rounds)
    return acc.get_epsilon(delta)


def test_central_dp_fedavg_on_flower_reports_flowers_accountant(in_a_run):
    """A user's ServerApp with central DP, its messages carried to the real ClientApp by the
    stand-in SuperLink (`flower_stubs.AppGrid`); the guide's run below is the same on
    Flower's Simulation Engine."""
    clients, _ = digits_clients(2, seed=0)
    accountant = _accountant()
    out = {}
    app = ServerApp()

    @app.main()
    def main(grid, context):
        strategy = central_dp(HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2,
                                                 num_clients=2, seed=0),
                              noise_multiplier=1.5, clipping_norm=0.5, accountant=accountant)
        result = strategy.start(grid, strategy.initial_arrays(), num_rounds=2, timeout=120)
        out.update(strategy=strategy, result=result)

    client = horizontal_client_app(model_fn, lambda ctx: clients[ctx.node_config["partition-id"]],
                                   seed=1)
    with AppGrid(client, [{"partition-id": i, "num-partitions": 2} for i in range(2)],
                 workers=2) as grid:
        app(grid, grid.context())
    strategy, result = out["strategy"], out["result"]
    assert accountant.num_releases == 2
    report = privacy_report(strategy, delta=DELTA)
    # the central figure is Flower's accountant's, and equals dp-accounting composed by hand
    assert report.central_epsilon == pytest.approx(_hand_epsilon(1.5, 2), rel=1e-9)
    assert report.central_epsilon == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-9)
    # the local releases (FedAvg updates the server sees in the clear) stay a separate figure
    assert report.epsilon == float("inf")
    assert "Central DP (another threat model" in str(report)
    # the released model is the noised one, in Flower's result and in the strategy
    for a, b in zip(strategy.model.trainable_weights, result.arrays.to_numpy_ndarrays()):
        np.testing.assert_array_equal(np.asarray(a), b)
    assert [result.train_metrics_clientapp[r]["central_noise_std"] for r in (1, 2)] == \
        pytest.approx([1.5 * 0.5 / 2] * 2)
    # passing the same accountant again does not count it twice
    again = privacy_report(strategy, delta=DELTA, flower_accountant=accountant)
    assert again.central_epsilon == pytest.approx(report.central_epsilon, rel=1e-12)


# ------------------------------------------------------- with a stand-in Grid
class _Grid:
    """Two connected nodes that answer queries with their client ids."""

    nodes = [10, 11]

    def get_node_ids(self):
        return self.nodes

    def send_and_receive(self, messages, timeout=None):
        return [Reply(RecordDict({"config": ConfigRecord(
            {"client-id": self.nodes.index(m.metadata.dst_node_id)})}), m.metadata.dst_node_id)
            for m in messages]


def _reply(strategy, node, cid, delta):
    wire = strategy.upload.to_wire(strategy.upload.client_message(delta, 5))
    reply = Message(RecordDict({"upload": ArrayRecord({k: Array(np.asarray(v))
                                                       for k, v in wire.items()}),
                                "config": ConfigRecord({"client-id": cid})}),
                    dst_node_id=1, message_type="train")
    reply.metadata.__dict__["_src_node_id"] = node
    return reply


def _signds():
    return SignDSEncoder(k=0.2, eps=10.0, seed=5)


@pytest.mark.parametrize("wrapper, upload, magrr, why", [
    (DifferentialPrivacyServerSideFixedClipping, "fedavg", None, "central_dp"),
    (DifferentialPrivacyClientSideFixedClipping, "fedavg", None, "central_dp"),
    (DifferentialPrivacyServerSideFixedClipping, _signds, MagRR(eps_rr=1.0), "SignDS message"),
])
def test_flowers_own_wrappers_are_refused_before_any_client_is_asked(in_a_run, wrapper, upload,
                                                                     magrr, why):
    strategy = HorizontalStrategy(model_fn(), upload() if callable(upload) else upload,
                                  clients_per_round=2, seed=0, magrr=magrr)
    wrapped = wrapper(strategy, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match=f"Flower's {wrapper.__name__} cannot wrap a "
                                         f"HorizontalStrategy with upload .*{why}"):
        wrapped.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid())
    with pytest.raises(ValueError, match=wrapper.__name__):
        wrapped.summary()  # what Strategy.start calls first
    ledger = strategy.privacy_ledger()
    assert sum(ledger.total(k) for k in ledger.kinds) == 0  # nobody was asked


def test_adaptive_clipping_is_refused_and_a_plain_strategy_still_runs(in_a_run):
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0)
    wrapped = DifferentialPrivacyServerSideAdaptiveClipping(strategy, 0.1, 2,
                                                            clipped_count_stddev=1.0)
    with pytest.raises(ValueError, match="DifferentialPrivacyServerSideAdaptiveClipping"):
        wrapped.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid())
    with strategy.own_loop():  # a user's own loop says so
        assert len(list(strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(),
                                                 _Grid()))) == 2


def test_central_dp_refuses_signds_magrr_batch_norm_and_amplified_accounting():
    with pytest.raises(ValueError, match="SignDS message"):
        central_dp(HorizontalStrategy(model_fn(), _signds()), noise_multiplier=1.0,
                   clipping_norm=1.0)
    with pytest.raises(ValueError, match="no-amplification"):
        poisson = RdpAccountant(PrivacyConfig(DELTA, 10, NeighboringRelation.ADD_OR_REMOVE_ONE,
                                              SamplingMethod.POISSON))
        central_dp(HorizontalStrategy(model_fn(), "fedavg"), noise_multiplier=1.0,
                   clipping_norm=1.0, accountant=poisson)
    with pytest.raises(ValueError, match="noise_multiplier"):
        central_dp(HorizontalStrategy(model_fn(), "fedavg"), noise_multiplier=0.0,
                   clipping_norm=1.0)
    with pytest.raises(TypeError, match="HorizontalStrategy"):
        central_dp("fedavg", noise_multiplier=1.0, clipping_norm=1.0)
    import keras

    bn = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(),
                           keras.layers.Dense(2)])
    bn.compile("sgd", "mse")
    with pytest.raises(ValueError, match="BatchNormalization statistics averaged"):
        central_dp(HorizontalStrategy(bn, "fedavg"), noise_multiplier=1.0, clipping_norm=1.0)
    central_dp(HorizontalStrategy(bn, "fedavg", batch_norm="local"), noise_multiplier=1.0,
               clipping_norm=1.0)


def test_central_dp_is_a_decorator_the_strategy_is_given_once(in_a_run):
    accountant = _accountant()
    given = CentralDP(1.0, 0.5, accountant=accountant)
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0,
                                  central_dp=given)
    assert strategy.central is given and isinstance(strategy.server.upload, ClippedSum)
    assert strategy.server.upload.noise_std == pytest.approx(1.0 * 0.5 / 2)
    with pytest.raises(ValueError, match="given twice"):
        central_dp(strategy, noise_multiplier=1.0, clipping_norm=1.0)
    with pytest.raises(ValueError, match="decorates a strategy already"):
        HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, central_dp=given)
    with pytest.raises(TypeError, match="`central_dp` must be a CentralDP or None; got float"):
        HorizontalStrategy(model_fn(), "fedavg", central_dp=1.0)
    with pytest.raises(ValueError, match="population_size=2 is smaller than clients_per_round=3"):
        HorizontalStrategy(model_fn(), "fedavg", clients_per_round=3,
                           central_dp=CentralDP(1.0, 0.5, accountant=_accountant()))
    # a plain strategy reports no central release; the decorated one reports its accountant's
    assert HorizontalStrategy(model_fn(), "fedavg").central_privacy() == []
    accountant.compose(GaussianPrivacyEvent(1.0, 2, 2), count=3)
    (release,) = strategy.central_privacy()
    assert release.releases == 3 and "CentralDP(noise_multiplier=1" in release.mechanism


def test_central_dp_given_after_a_round_is_refused(in_a_run):
    """Rounds aggregated in the clear before the decorator would be outside the central
    figure: central DP is only taken before the strategy's first round."""
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0)
    with strategy.own_loop():
        list(strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid()))
    with pytest.raises(ValueError, match=r"before the strategy's first round: .* asked "
                                         r"clients in 1 round\(s\)"):
        central_dp(strategy, noise_multiplier=1.0, clipping_norm=1.0)
    assert strategy.central is None and not isinstance(strategy.server.upload, ClippedSum)


def test_central_dp_and_the_strategy_do_not_import_each_other():
    import ast
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("keras_fedpriv.federated.flower.central_dp")
    tree = ast.parse(pathlib.Path(spec.origin).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "keras_fedpriv.federated.flower.strategy" not in imported  # one way: no circle


def test_clipped_sum_bounds_each_client_and_divides_by_clients_per_round():
    big, small = np.array([3.0, 4.0], np.float32), np.array([0.1, 0.0], np.float32)
    clipped = ClippedSum(FedAvgUpload(), clipping_norm=1.0, clients_per_round=3)
    uploads = [ClientUpload(big, 8, 100), ClientUpload(small, 8, 1)]
    # equal weights (not by data size), the big one clipped to norm 1, the sum over 3
    np.testing.assert_allclose(clipped.aggregate(uploads), ([0.6, 0.8] + small) / 3, rtol=1e-6)
    np.testing.assert_allclose(clipped.aggregate(uploads, global_lr=0.5),
                               ([0.6, 0.8] + small / 2) / 3, rtol=1e-6)
    assert clipped.releases == 2 and clipped.noise_std == 0.0
    with pytest.raises(ValueError, match="3 uploads, more than clients_per_round=2"):
        ClippedSum(FedAvgUpload(), 1.0, 2).aggregate(uploads + uploads[:1])  # the bound C / n


def test_clipped_sum_noise_has_flowers_std_and_each_call_is_one_release():
    noisy = ClippedSum(FedAvgUpload(), clipping_norm=2.0, clients_per_round=4,
                       noise_multiplier=3.0)
    out = noisy.aggregate([ClientUpload(np.zeros(20000, np.float32), 8, 1)])
    assert noisy.noise_std == pytest.approx(3.0 * 2.0 / 4)
    assert np.std(out) == pytest.approx(1.5, rel=0.05) and noisy.releases == 1


def test_noise_and_accounting_happen_once_per_released_aggregate(in_a_run):
    accountant = _accountant()
    strategy = central_dp(HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2,
                                             min_replies=2, seed=0),
                          noise_multiplier=1.0, clipping_norm=1e-3, accountant=accountant)
    dim = strategy.server.dim
    grid = _Grid()
    start = [w.copy() for w in strategy.initial_arrays().to_numpy_ndarrays()]
    with strategy.own_loop():
        list(strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), grid))
    replies = [_reply(strategy, 10, 0, np.ones(dim, np.float32)),
               _reply(strategy, 11, 1, np.ones(dim, np.float32))]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert accountant.num_releases == 1 and metrics["central_noise_std"] == 1.0 * 1e-3 / 2
    moved = np.concatenate([(b - a).ravel() for a, b in zip(start, arrays.to_numpy_ndarrays())])
    # clipped step (norm 1e-3) plus noise of std 5e-4 per coordinate: not the unclipped +1
    assert np.abs(moved).max() < 0.05 and np.std(moved) > 1e-4
    for v, w in zip(strategy.model.trainable_weights, arrays.to_numpy_ndarrays()):
        np.testing.assert_array_equal(np.asarray(v), w)
    # a round with too few replies releases nothing: no noise, no event
    with strategy.own_loop():
        list(strategy.configure_train(2, arrays, ConfigRecord(), grid))
    assert strategy.aggregate_train(2, replies[:1])[0] is None
    assert accountant.num_releases == 1


def test_a_round_over_the_accountants_budget_is_refused_before_clients_are_asked(in_a_run):
    accountant = _accountant(max_epsilon=_hand_epsilon(1.0, 1) * 1.01)
    strategy = central_dp(HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0),
                          noise_multiplier=1.0, clipping_norm=1.0, accountant=accountant)
    accountant.compose(GaussianPrivacyEvent(1.0, 2, 2))  # one release already spent
    with pytest.raises(PrivacyBudgetExhausted), strategy.own_loop():
        strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid())
    ledger = strategy.privacy_ledger()
    assert sum(ledger.total(k) for k in ledger.kinds) == 0


def test_flowers_dp_mods_and_the_old_magrr_name_are_refused_clearly():
    with pytest.raises(ValueError, match="fixedclipping_mod"):
        horizontal_client_app(model_fn, lambda ctx: None, mods=[fixedclipping_mod])
    with pytest.raises(ValueError, match="LocalDpMod"):
        refuse_dp_mods([LocalDpMod(1.0, 1.0, 1.0, 1e-5)])
    assert refuse_dp_mods([]) == []
    with pytest.raises(TypeError, match="takes `eps_rr` now; `magrr_eps` was renamed"):
        horizontal_client_app(model_fn, lambda ctx: None, magrr_eps=3.0)


def _one_round(strategy, deltas):
    """Configure round 1 on the stand-in grid and aggregate the replies of ``deltas``."""
    with strategy.own_loop():
        list(strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid()))
    replies = [_reply(strategy, 10 + i, i, d) for i, d in enumerate(deltas)]
    return strategy.aggregate_train(1, replies)


def test_validation_metrics_score_the_noised_model_that_is_released(in_a_run):
    x = np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32)
    y = np.arange(64) % 10
    strategy = central_dp(HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0,
                                             validation_data=(x, y)),
                          noise_multiplier=2000.0, clipping_norm=1e-3)  # noise std 1 per weight
    dim = strategy.server.dim
    arrays, metrics = _one_round(strategy, [np.zeros(dim, np.float32)] * 2)
    model = model_fn()
    model.set_weights(arrays.to_numpy_ndarrays())  # what left the server
    released = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    start = model_fn().evaluate(x, y, verbose=0, return_dict=True)["loss"]
    assert abs(released - start) > 0.1  # the noise moved the model
    # the metric that leaves the server scores the released (noised) model, not the aggregate
    assert metrics["val_loss"] == pytest.approx(released, rel=1e-4)
    assert strategy.history["val_loss"][-1] == pytest.approx(released, rel=1e-4)


def test_without_an_accountant_central_dp_counts_the_same_events_itself(in_a_run):
    strategy = central_dp(HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0),
                          noise_multiplier=1.0, clipping_norm=1e-3)
    report = privacy_report(strategy, delta=DELTA)
    assert report.central[0].releases == 0 and report.central_epsilon == 0.0
    _one_round(strategy, [np.zeros(strategy.server.dim, np.float32)] * 2)
    report = privacy_report(strategy, delta=DELTA)
    assert report.central[0].releases == 1 and "counted by CentralDP" in str(report)
    assert report.central_epsilon == pytest.approx(_hand_epsilon(1.0, 1), rel=1e-9)


def test_central_dp_with_a_gaussian_upload_clips_the_noisy_upload_and_counts_both(in_a_run):
    accountant = _accountant()
    upload = GaussianUpload(clip_norm=1.0, noise_multiplier=1.0, seed=3)
    strategy = central_dp(HorizontalStrategy(model_fn(), upload, clients_per_round=2, seed=0),
                          noise_multiplier=1.0, clipping_norm=1e-3, accountant=accountant)
    dim = strategy.server.dim
    start = np.concatenate([w.ravel() for w in strategy.initial_arrays().to_numpy_ndarrays()])
    arrays, metrics = _one_round(strategy, [np.full(dim, 10.0, np.float32)] * 2)
    moved = np.concatenate([w.ravel() for w in arrays.to_numpy_ndarrays()]) - start
    # each noisy Gaussian upload (norm ~ sqrt(dim)) was clipped to 1e-3 before the central
    # noise of std 1e-3 * 1 / 2: the step is that noise, nowhere near the uploads' scale
    assert np.std(moved) == pytest.approx(5e-4, rel=0.2) and np.abs(moved).max() < 0.01
    assert accountant.num_releases == 1 and metrics["central_noise_std"] == 5e-4
    report = privacy_report(strategy, delta=DELTA)
    one = GaussianUpload(clip_norm=1.0, noise_multiplier=1.0, seed=0)
    one.client_message(np.ones(dim, np.float32), 5, client_id=0)
    # local: one Gaussian release per client (the upload's own figure); central: one event
    assert report.epsilon == pytest.approx(privacy_report(one, delta=DELTA).epsilon, rel=1e-9)
    assert report.central_epsilon == pytest.approx(_hand_epsilon(1.0, 1), rel=1e-9)


class _Deep:
    """A pass-through wrapper that calls the strategy from many frames down."""

    def __init__(self, inner, depth=10):
        self.inner, self.depth = inner, depth

    def configure_train(self, *args):
        return self._down(self.depth, args)

    def _down(self, n, args):
        return self._down(n - 1, args) if n else self.inner.configure_train(*args)

    def summary(self):
        return self.inner.summary()


def test_flowers_wrapper_is_found_however_deep_it_calls_the_strategy(in_a_run):
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0)
    wrapped = DifferentialPrivacyServerSideFixedClipping(_Deep(strategy), 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="DifferentialPrivacyServerSideFixedClipping cannot"):
        wrapped.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid())
    ledger = strategy.privacy_ledger()
    assert sum(ledger.total(k) for k in ledger.kinds) == 0  # nobody was asked


@pytest.mark.parametrize("wrapper", [DifferentialPrivacyServerSideFixedClipping,
                                     DifferentialPrivacyServerSideAdaptiveClipping])
def test_a_wrapper_started_as_flower_runs_it_is_refused_and_leaves_no_driver(in_a_run, wrapper):
    """Flower's ``Strategy.start`` on the wrapper: the strategy's own start is never entered,
    so the wrapper's first call into it (summary) is refused; nobody is asked."""
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0)
    args = (1.0, 1.0, 2) if wrapper is DifferentialPrivacyServerSideFixedClipping else (0.1, 2)
    wrapped = wrapper(strategy, *args)
    with pytest.raises(ValueError, match=r"HorizontalStrategy.summary was called while neither "
                                         r"the strategy's own start\(\) nor its own_loop\(\)"
                                         r".* `with strategy.own_loop\(\):"):
        wrapped.start(_Grid(), strategy.initial_arrays(), num_rounds=1)
    ledger = strategy.privacy_ledger()
    assert sum(ledger.total(k) for k in ledger.kinds) == 0 and strategy.asked == []


def test_steps_run_only_inside_the_strategys_own_start_or_own_loop(in_a_run):
    """Any outside driver is refused by name of the step, with what to do; own_loop() and start()
    are closed on leaving, also by an exception, so no later outside call slips through."""
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0)
    outside = r"HorizontalStrategy.configure_train was called while neither .* own_loop\(\)"
    with pytest.raises(ValueError, match=outside):
        strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid())
    with pytest.raises(ValueError, match="HorizontalStrategy.summary was called"):
        strategy.summary()
    with pytest.raises(RuntimeError, match="boom"), strategy.own_loop():
        strategy.summary()  # runs inside
        raise RuntimeError("boom")
    with pytest.raises(ValueError, match=outside):  # closed by the exception
        strategy.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid())

    class _Failing(_Grid):
        def send_and_receive(self, messages, timeout=None):
            if any(m.metadata.message_type == "train" for m in messages):
                raise RuntimeError("grid lost")
            return super().send_and_receive(messages, timeout)

    with pytest.raises(RuntimeError, match="grid lost"):
        strategy.start(_Failing(), strategy.initial_arrays(), num_rounds=1)
    assert len(strategy.asked) == 1  # start drove its own configure_train
    with pytest.raises(ValueError, match=outside):  # start's driver closed by the exception
        strategy.configure_train(2, strategy.initial_arrays(), ConfigRecord(), _Grid())
    with strategy.own_loop():
        with strategy.own_loop():
            pass
        strategy.summary()  # nested: the outer one is still open after the inner one
    with pytest.raises(ValueError, match=outside):
        strategy.configure_train(2, strategy.initial_arrays(), ConfigRecord(), _Grid())
    assert len(strategy.asked) == 1  # no refused call asked anyone


def test_inside_own_loop_a_wrapper_still_releases_no_update(in_a_run):
    """``own_loop()`` says nobody wraps the strategy; a client-side wrapper opened inside it is
    still refused by its config key, and a server-side one breaks its first round's replies:
    the asked clients are counted, no update is released."""
    strategy = HorizontalStrategy(model_fn(), "fedavg", clients_per_round=2, seed=0)
    client_side = DifferentialPrivacyClientSideFixedClipping(strategy, 1.0, 1.0, 2)
    wrapped = DifferentialPrivacyServerSideFixedClipping(strategy, 1.0, 1.0, 2)
    start = [w.copy() for w in strategy.initial_arrays().to_numpy_ndarrays()]
    with strategy.own_loop():
        with pytest.raises(ValueError, match="client-side clipping wrapper"):  # its config key
            client_side.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid())
        list(wrapped.configure_train(1, strategy.initial_arrays(), ConfigRecord(), _Grid()))
    dim = strategy.server.dim
    replies = [_reply(strategy, 10 + i, i, np.ones(dim, np.float32)) for i in range(2)]
    with pytest.raises(ValueError):  # Flower clips the flat update against the weights
        wrapped.aggregate_train(1, replies)
    for a, b in zip(start, strategy.initial_arrays().to_numpy_ndarrays()):
        np.testing.assert_array_equal(a, b)  # no update released
    ledger = strategy.privacy_ledger()
    assert sum(ledger.total(k) for k in ledger.kinds) > 0  # the clients' uploads are counted


@pytest.mark.simulation_engine  # the snippet starts Flower's Simulation Engine (Ray)
def test_the_guides_run_snippet_runs_as_written_and_reports_flowers_accountant():
    """docs/flower_dp.md's "A run" snippet, as written (Simulation Engine, 3 clients, 5 rounds)."""
    import pathlib
    import re

    guide = pathlib.Path(__file__).parent.parent / "docs" / "flower_dp.md"
    code = re.search(r"## A run\n\n```python\n(.*?)```", guide.read_text(), re.S).group(1)
    scope = {"__name__": "flower_dp_snippet"}
    exec(compile(code, str(guide), "exec"), scope)  # noqa: S102 - our own documentation
    report, accountant = scope["report"], scope["accountant"]
    expected = dp_accounting.rdp.RdpAccountant()
    expected.compose(dp_accounting.GaussianDpEvent(1.5), 5)  # z=1.5, one release per round
    assert report.central_epsilon == pytest.approx(expected.get_epsilon(1e-5), rel=1e-9)
    assert report.central_epsilon == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    assert report.epsilon == float("inf")  # dense FedAvg uploads: the server sees them
