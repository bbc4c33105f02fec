"""MagRR: step-size estimation by randomized response (ALGORITHMS.md section 5)."""

import math

import dp_accounting
import keras
import numpy as np
import pytest
from dp_accounting import pld

from keras_fedpriv.callbacks import MagRR
from keras_fedpriv.federated.magrr import debiased_ones
from keras_fedpriv.mechanisms import flip_probability
from stats import SIGMAS, UNSEEDED_SIGMAS, assert_rate, assert_rejects

pytestmark = [pytest.mark.jax]


def _magnitudes_with_bits(bits, magrr):
    """Step sizes whose true bit under ``magrr``'s current rule is ``bits``."""
    cut = magrr.threshold * magrr.r_est
    return np.where(np.asarray(bits) == 1, 0.5 * cut, 2.0 * cut)


# --- debiasing ---------------------------------------------------------------

def test_huge_eps_reports_equal_the_true_bits():
    magrr = MagRR(eps_rr=60.0, seed=3)
    rng = np.random.default_rng(0)
    r = rng.uniform(0, 4e-5, size=5000)
    np.testing.assert_array_equal(magrr.client_reports(r), (r < 2e-5).astype(int))
    # The contraction rule uses contraction_threshold * r_est.
    magrr = MagRR(eps_rr=60.0, seed=3, contraction_threshold=0.5)
    magrr.load_state_dict({"r_est": 1e-3, "phase": "contraction", "rounds_in_range": 10})
    r = rng.uniform(0, 2e-3, size=5000)
    np.testing.assert_array_equal(magrr.client_reports(r), (r < 0.5e-3).astype(int))


def test_debiased_ones_is_the_seed_formula():
    for n_c, n, eps in [(30, 100, 1.0), (0, 10, 0.3), (7, 7, 5.0), (123, 1000, 2.5)]:
        p = math.exp(eps) / (1 + math.exp(eps))
        assert debiased_ones(n_c, n, eps) == pytest.approx((n_c - n + n * p) / (2 * p - 1))
    # No overflow at large eps: the reports are the truth.
    assert debiased_ones(30, 100, 800.0) == pytest.approx(30.0)


def test_debiased_count_is_unbiased_and_eps_matters():
    n, frac, eps = 200_000, 0.30, 1.0
    magrr = MagRR(eps_rr=eps, seed=11)
    bits = np.zeros(n, int)
    bits[: int(frac * n)] = 1
    reports = magrr.client_reports(_magnitudes_with_bits(bits, magrr))
    magrr.server_update(reports, n)
    n_t = magrr.last_debiased_ones
    q = flip_probability(eps)
    sd = math.sqrt(n * q * (1 - q)) / (1 - 2 * q)  # each report flips independently
    assert abs(n_t - frac * n) <= SIGMAS * sd, (n_t / n, sd / n)
    # A P computed with 2 * eps would be caught by the same tolerance.
    wrong = debiased_ones(int(reports.sum()), n, 2 * eps)
    assert abs(wrong - frac * n) > SIGMAS * sd, (wrong / n, sd / n)
    # 30% < 50%: B = 0 in the growth phase, so r_est grew by growth_factor.
    assert magrr.r_est == pytest.approx(1e-5 * 5.0) and magrr.phase == "growth"


# --- phase dynamics ----------------------------------------------------------

def test_tracks_a_synthetic_step_size():
    rng = np.random.default_rng(1234)
    magrr = MagRR(seed=99)
    num_clients, rounds = 100, 130
    r_true = [0.05 if t < 30 else 0.05 * 0.97 ** (t - 29) for t in range(rounds)]
    history = []
    switched_at = None
    for t in range(rounds):
        before, phase_before = magrr.r_est, magrr.phase
        r = r_true[t] * rng.lognormal(0.0, 0.1, size=num_clients)
        lr = magrr.round(r, num_clients)
        assert lr == pytest.approx(2.0 * magrr.r_est * num_clients)  # updated r_est
        if phase_before == "growth":
            grew = magrr.r_est > before
            in_range = float(np.median(r)) < 2 * before
            # B = 0 (the r are mostly above 2 r_est): strictly growing, by 5x.
            assert grew == (not in_range), (t, before, np.median(r))
            if grew:
                assert magrr.r_est == pytest.approx(5 * before)
        else:
            assert magrr.r_est <= before  # contraction only shrinks or keeps
        if switched_at is None and magrr.phase == "contraction":
            switched_at = t
        history.append(magrr.r_est)
    # 1e-5 * 5^k reaches the range [r/2, ...) of 0.05 after 5 growths, then
    # 10 rounds with B = 1: the switch happens at round 14.
    assert switched_at is not None and switched_at <= 20, switched_at
    assert magrr.rounds_in_range == 10
    ratio = np.array(history[-30:]) / np.array(r_true[-30:])
    assert np.all((ratio >= 0.25) & (ratio <= 4.0)), ratio
    assert history[-1] < 0.05 * 0.97 ** 60  # it did follow the shrinking steps
    assert magrr.num_releases == rounds


def test_contraction_rule_and_constants_deterministically():
    # eps huge: reports are the truth, so B is the true majority.
    magrr = MagRR(eps_rr=60.0, switch_after=2, contraction_factor=1.5, seed=0)
    ones, zeros = np.zeros(10), np.full(10, 1.0)
    magrr.round(zeros)
    assert magrr.r_est == pytest.approx(5e-5) and magrr.rounds_in_range == 0
    magrr.round(ones)
    assert magrr.phase == "growth" and magrr.rounds_in_range == 1
    magrr.round(zeros)  # B = 0 again: grows, the count of B = 1 rounds is kept
    assert magrr.r_est == pytest.approx(2.5e-4) and magrr.rounds_in_range == 1
    magrr.round(ones)
    assert magrr.phase == "contraction" and magrr.r_est == pytest.approx(2.5e-4)
    magrr.round(zeros)  # contraction, B = 0: keep
    assert magrr.r_est == pytest.approx(2.5e-4)
    magrr.round(ones)  # contraction, B = 1: divide by contraction_factor
    assert magrr.r_est == pytest.approx(2.5e-4 / 1.5)
    other = MagRR(eps_rr=60.0, growth_factor=3.0, growth_threshold=4.0, seed=0)
    other.round(np.full(10, 4.1e-5))  # r >= 4 r_est: B = 0, grow by 3
    assert other.r_est == pytest.approx(3e-5)
    other.round(np.full(10, 1.1e-4))  # r < 4 r_est = 1.2e-4: B = 1
    assert other.r_est == pytest.approx(3e-5) and other.rounds_in_range == 1
    # Full precision: far below the reference's 1e-6 floor.
    for _ in range(40):
        magrr.round(ones)
    assert 0 < magrr.r_est < 1e-10


def test_lr_global_and_fallback():
    magrr = MagRR(eps_rr=60.0, seed=0)
    lr = magrr.server_update(np.zeros(100, int), num_clients=80)
    assert magrr.r_est == pytest.approx(5e-5)
    assert lr == pytest.approx(2.0 * 5e-5 * 80) and magrr.last_lr_global == lr
    assert MagRR(lr_factor=3.0).server_update(np.ones(4), 4) == pytest.approx(3 * 1e-5 * 4)
    # Too few reports: 4 < 5% of 100. Fallback lr, state unchanged.
    state = magrr.state_dict()
    assert magrr.server_update(np.zeros(4, int), num_clients=100) == 1.0
    assert magrr.state_dict() == state
    assert magrr.server_update(np.zeros(0, int), num_clients=100) == 1.0
    assert math.isnan(magrr.last_debiased_ones)
    assert magrr.server_update([], None) == 1.0
    assert MagRR(fallback_lr=0.3).server_update(np.ones(1), 100) == 0.3
    # 5 of 100 is enough.
    assert magrr.server_update(np.zeros(5, int), 100) == pytest.approx(2 * 2.5e-4 * 100)
    # min_report_fraction = 0: a single report updates r_est.
    lone = MagRR(min_report_fraction=0.0, eps_rr=60.0)
    assert lone.server_update(np.zeros(1, int), 1000) == pytest.approx(2 * 5e-5 * 1000)
    # round() defaults num_clients to the number of clients.
    assert MagRR(eps_rr=60.0).round(np.ones(7)) == pytest.approx(2 * 5e-5 * 7)


def test_state_dict_round_trip_and_config():
    magrr = MagRR(eps_rr=60.0, switch_after=1, seed=5)
    magrr.round(np.ones(10))
    magrr.round(np.zeros(10))
    state = magrr.state_dict()
    assert state["phase"] == "contraction" and state["rounds_in_range"] == 1
    other = MagRR()
    other.load_state_dict(state)
    assert other.state_dict() == state
    config = magrr.get_config()
    assert config["seed"] == 5 and config["switch_after"] == 1
    assert "seed" not in MagRR().get_config()
    clone = MagRR.from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(magrr))
    assert isinstance(restored, MagRR) and restored.get_config() == config
    assert set(MagRR().get_config()) == {
        "eps_rr", "r_init", "growth_factor", "switch_after", "growth_threshold",
        "contraction_threshold", "contraction_factor", "lr_factor", "min_report_fraction",
        "fallback_lr"}


def test_a_refused_state_changes_nothing():
    """SeededReleases' load_state_dict checks the whole state first: a state behind this
    object's releases is refused before r_est, the phase or the ledger move."""
    behind = MagRR(eps_rr=60.0, switch_after=1, seed=5)
    behind.round(np.ones(10))
    behind.round(np.zeros(10))
    state = behind.state_dict()
    live = MagRR(eps_rr=60.0, seed=6)
    for _ in range(3):
        live.round(np.ones(10))
    before = live.state_dict()
    with pytest.raises(ValueError, match="behind"):
        live.load_state_dict(state)
    assert live.state_dict() == before


# --- randomness ---------------------------------------------------------------

def test_flip_rate_matches_flip_probability():
    n, eps = 120_000, 1.5
    magrr = MagRR(eps_rr=eps, seed=21)
    bits = np.random.default_rng(3).integers(0, 2, size=n)
    reports = magrr.client_reports(_magnitudes_with_bits(bits, magrr))
    assert reports.dtype.kind == "i" and set(np.unique(reports)) <= {0, 1}
    flips = int(np.sum(reports != bits))
    assert_rate(flips, n, flip_probability(eps), "MagRR flips")
    assert_rejects(flips, n, flip_probability(2 * eps), "MagRR flips")
    assert_rejects(flips, n, flip_probability(eps / 2), "MagRR flips")


@pytest.mark.parametrize("seed", [21, None])
def test_per_client_reports_flip_with_the_formulas_probability(seed):
    """The vectorized per-client path (one noise word per client's own stream).

    Unseeded, the reports are fresh draws: each band is UNSEEDED_SIGMAS wide (8e-11 per check),
    on 1.69 times the clients of a seeded check, so it is no wider than at SIGMAS."""
    n, eps = 102_000, 1.5
    sigmas = SIGMAS if seed is not None else UNSEEDED_SIGMAS
    magrr = MagRR(eps_rr=eps, seed=seed)
    bits = np.random.default_rng(4).integers(0, 2, size=n)
    reports = magrr.client_reports(_magnitudes_with_bits(bits, magrr), np.arange(n))
    flips = int(np.sum(reports != bits))
    assert_rate(flips, n, flip_probability(eps), "MagRR per-client flips", sigmas)
    assert_rejects(flips, n, flip_probability(1.2 * eps), "MagRR per-client flips", sigmas)
    assert_rejects(flips, n, flip_probability(eps / 1.2), "MagRR per-client flips", sigmas)
    # both bits flip at the same rate (no bias towards 0 or 1)
    for b in (0, 1):
        assert_rate(int(np.sum(reports[bits == b] != b)), int(np.sum(bits == b)),
                    flip_probability(eps), f"MagRR flips of {b}", sigmas)


def test_a_clients_report_is_the_same_alone_or_in_a_batch_and_seeded_runs_repeat():
    r = np.random.default_rng(1).uniform(0, 4e-5, size=300)
    ids = np.arange(300) * 7
    batch = MagRR(eps_rr=0.5, seed=8).client_reports(r, ids)
    again = MagRR(eps_rr=0.5, seed=8).client_reports(r, ids)
    np.testing.assert_array_equal(batch, again)
    alone = [int(MagRR(eps_rr=0.5, seed=8).client_reports(r[i:i + 1], ids[i:i + 1])[0])
             for i in range(0, 300, 37)]
    np.testing.assert_array_equal(batch[::37], alone)
    reversed_order = MagRR(eps_rr=0.5, seed=8).client_reports(r[::-1], ids[::-1])
    np.testing.assert_array_equal(batch, reversed_order[::-1])
    assert np.any(batch != MagRR(eps_rr=0.5, seed=9).client_reports(r, ids))


def test_reports_are_the_randomized_response_mechanism_once_per_round(monkeypatch):
    """MagRR reuses `binary_randomized_response` (one call for the round's clients) on one
    noise word per client drawn from that client's own stream: the n-th report of client c
    is keyed by (seed, c, n), so no two clients or rounds share a word."""
    import zlib

    from keras_fedpriv.mechanisms import binary_randomized_response
    from keras_fedpriv.mechanisms import randomized_response as rr_module
    from keras_fedpriv.mechanisms.random import secret_generator

    calls = []

    def spy(bits, eps, **kw):
        calls.append((np.asarray(bits).copy(), eps, np.asarray(kw["noise"]).copy()))
        return binary_randomized_response(bits, eps, **kw)

    # MagRR's report is `threshold_reports`, which calls binary_randomized_response
    monkeypatch.setattr(rr_module, "binary_randomized_response", spy)
    magrr = MagRR(eps_rr=0.7, seed=11)
    r = np.random.default_rng(2).uniform(0, 4e-5, size=5)
    ids = np.array([4, 0, 9, 2, 7])
    tag = zlib.crc32(b"MagRR")
    for n in range(2):  # two rounds: each client's stream moves on
        reports = magrr.client_reports(r, ids, cut=2e-5)
        bits, eps, words = calls[-1]
        assert len(calls) == n + 1 and eps == 0.7
        np.testing.assert_array_equal(bits, (r < 2e-5).astype(np.int32))
        want = [secret_generator(11, stream=n, unit=int(c), tag=tag).integers(
            0, 2**32, dtype=np.uint32) for c in ids]
        np.testing.assert_array_equal(words, want)
        np.testing.assert_array_equal(reports, np.asarray(binary_randomized_response(
            bits, 0.7, noise=words)))
    assert len({int(w) for _, _, ws in calls for w in ws}) == 10
    assert magrr.releases_by_unit == {int(c): 2 for c in ids}


def test_seeded_reproducible_and_unseeded_fresh():
    r = np.random.default_rng(0).uniform(0, 4e-5, size=2000)
    a, b = MagRR(eps_rr=0.1, seed=42), MagRR(eps_rr=0.1, seed=42)
    first = [a.client_reports(r) for _ in range(2)]
    second = [b.client_reports(r) for _ in range(2)]
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    assert np.any(first[0] != first[1])  # fresh noise every round
    assert np.any(first[0] != MagRR(eps_rr=0.1, seed=43).client_reports(r))
    u, v = MagRR(eps_rr=0.1), MagRR(eps_rr=0.1)
    assert np.any(u.client_reports(r) != v.client_reports(r))
    assert np.any(u.client_reports(r) != u.client_reports(r))


# --- Keras callback -----------------------------------------------------------

class _Driver(keras.callbacks.Callback):
    """Stands in for the federated driver: one MagRR round per epoch."""

    def __init__(self, magrr):
        super().__init__()
        self.magrr = magrr
        self.rng = np.random.default_rng(0)

    def on_epoch_end(self, epoch, logs=None):
        self.magrr.round(0.05 * self.rng.lognormal(0, 0.1, size=50), num_clients=50)


def test_logs_reach_history():
    magrr = MagRR(seed=1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0,
                        callbacks=[_Driver(magrr), magrr])
    h = history.history
    for key in ("r_est", "global_lr", "magrr_phase", "magrr_debiased_ones"):
        assert len(h[key]) == 3, (key, h)
    assert "lr_global" not in h  # the server step has one name in History
    np.testing.assert_allclose(h["r_est"], [5e-5, 2.5e-4, 1.25e-3])
    np.testing.assert_allclose(h["global_lr"], 2 * np.array(h["r_est"]) * 50)
    assert h["magrr_phase"] == [0, 0, 0]
    assert all(d < 25 for d in h["magrr_debiased_ones"])
    # Direct use, and logs that are not a dict are ignored.
    logs = {}
    magrr.on_epoch_end(3, logs)
    assert logs["r_est"] == magrr.r_est
    magrr.on_epoch_end(4, None)
    fresh = {}
    MagRR().on_epoch_end(0, fresh)
    assert math.isnan(fresh["global_lr"]) and fresh["magrr_phase"] == 0
    driven = {"global_lr": 0.5}  # a driver that logged the step it applied keeps its value
    magrr.on_epoch_end(5, driven)
    assert driven["global_lr"] == 0.5 and driven["r_est"] == magrr.r_est


# --- accounting ---------------------------------------------------------------

def test_dp_event_composes():
    magrr = MagRR(eps_rr=2.0)
    assert magrr.epsilon == pytest.approx(2.0, abs=1e-8)  # as realized by the 32-bit threshold
    assert magrr.epsilon <= 2.0

    def eps_of(event):
        accountant = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(event)
        return accountant.get_epsilon(1e-9)

    one = eps_of(magrr.dp_event())
    assert one == pytest.approx(2.0, abs=0.03)
    ten_event = magrr.dp_event(rounds=10)
    assert isinstance(ten_event, dp_accounting.ComposedDpEvent) and len(ten_event.events) == 10
    ten = eps_of(ten_event)
    assert 2.5 < ten <= 20.0 + 1e-6


# --- validation ---------------------------------------------------------------

@pytest.mark.parametrize("kwargs,error", [
    ({"eps_rr": 0.0}, ValueError), ({"eps_rr": -1.0}, ValueError),
    ({"eps_rr": float("nan")}, ValueError), ({"eps_rr": "5"}, TypeError),
    ({"eps_rr": True}, TypeError), ({"eps_rr": None}, TypeError),
    ({"r_init": 0.0}, ValueError), ({"r_init": float("inf")}, ValueError),
    ({"r_init": None}, TypeError),
    ({"growth_factor": 1.0}, ValueError), ({"growth_factor": 0.5}, ValueError),
    ({"growth_factor": "5"}, TypeError),
    ({"contraction_factor": 1.0}, ValueError), ({"contraction_factor": float("nan")}, ValueError),
    ({"switch_after": 0}, ValueError), ({"switch_after": 2.5}, TypeError),
    ({"switch_after": True}, TypeError),
    ({"growth_threshold": 0.0}, ValueError), ({"growth_threshold": -2.0}, ValueError),
    ({"contraction_threshold": 0.0}, ValueError), ({"contraction_threshold": [1]}, TypeError),
    ({"lr_factor": 0.0}, ValueError), ({"lr_factor": float("inf")}, ValueError),
    ({"min_report_fraction": -0.1}, ValueError), ({"min_report_fraction": 1.5}, ValueError),
    ({"min_report_fraction": None}, TypeError),
    ({"fallback_lr": 0.0}, ValueError), ({"fallback_lr": float("inf")}, ValueError),
    ({"seed": -1}, ValueError), ({"seed": 1.5}, TypeError), ({"seed": "x"}, TypeError),
])
def test_bad_constructor_arguments(kwargs, error):
    (name,) = kwargs
    with pytest.raises(error, match=f"`{name}`"):
        MagRR(**kwargs)


def test_bad_call_arguments():
    magrr = MagRR(seed=0)
    with pytest.raises(ValueError, match="`magnitudes`"):
        magrr.client_reports([0.1, -0.2])
    with pytest.raises(ValueError, match="`magnitudes`"):
        magrr.client_reports([0.1, float("nan")])
    with pytest.raises(ValueError, match="`magnitudes`"):
        magrr.client_reports(np.ones((2, 2)))
    with pytest.raises(TypeError, match="`magnitudes`"):
        magrr.client_reports(["a", "b"])
    with pytest.raises(TypeError, match="`magnitudes`"):
        magrr.client_reports([True, False])
    with pytest.raises(ValueError, match="`reports`"):
        magrr.server_update([0, 1, 2], 3)
    with pytest.raises(ValueError, match="`reports`"):
        magrr.server_update([0, 0.5], 3)
    with pytest.raises(TypeError, match="`reports`"):
        magrr.server_update(["1"], 3)
    with pytest.raises(ValueError, match="`num_clients`"):
        magrr.server_update([0, 1], 0)
    with pytest.raises(TypeError, match="`num_clients`"):
        magrr.round([0.1], num_clients=2.0)
    with pytest.raises(ValueError, match="`rounds`"):
        magrr.dp_event(rounds=0)
    with pytest.raises(ValueError, match="phase"):
        magrr.load_state_dict({"r_est": 1e-3, "phase": "shrink", "rounds_in_range": 0})
    with pytest.raises(ValueError, match="r_est"):
        magrr.load_state_dict({"r_est": 0.0, "phase": "growth", "rounds_in_range": 0})
    with pytest.raises(ValueError, match="missing"):
        magrr.load_state_dict({"r_est": 1e-3})
    assert magrr.state_dict() == MagRR().state_dict()  # nothing above changed the state
