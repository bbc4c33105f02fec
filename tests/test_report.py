"""Privacy reports: events collected from models and runs, composed with dp-accounting."""

import math

import dp_accounting
import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

import keras_fedpriv as kf
from keras_fedpriv.callbacks import MagRR
from keras_fedpriv.federated import (
    GaussianUpload,
    HorizontalFL,
    VerticalModel,
    partition,
    with_example_ids,
)
from keras_fedpriv.mechanisms import randomized_response_dp_event
from keras_fedpriv.mechanisms.gaussian import gaussian_epsilon
from keras_fedpriv.optimizers import SignDSEncoder
from keras_fedpriv.privacy import EpsilonLogger, compose_epsilon, privacy_report

pytestmark = [pytest.mark.jax]


def _vertical(label_dp=None, embedding_dp=None):
    rng = np.random.default_rng(0)
    xa = rng.normal(size=(128, 6)).astype("float32")
    xb = rng.normal(size=(128, 4)).astype("float32")
    y = (xa[:, 0] + xb[:, 0] > 1).astype("float32")
    bottom = lambda n: keras.Sequential([keras.Input((n,)), keras.layers.Dense(8)])  # noqa: E731
    top = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1, activation="sigmoid")])
    model = VerticalModel({"party_a": bottom(6), "party_b": bottom(4)}, top, leader="party_b",
                          label_dp=label_dp, embedding_dp=embedding_dp)
    model.compile("adam", "binary_crossentropy")
    return model, with_example_ids({"party_a": xa, "party_b": xb}), y


def _rows(report):
    return {r["mechanism"].split()[0]: r for r in report.rows()}


def test_label_dp_once_is_one_release_and_embedding_dp_one_per_epoch():
    model, x, y = _vertical(kf.LabelDPLayer(eps=1.0, seed=0), kf.EmbeddingDPLayer(eps=2.0))
    logger = EpsilonLogger(delta=1e-6)
    history = model.fit(x, y, epochs=3, batch_size=64, verbose=0, callbacks=[logger])
    report = privacy_report(history, delta=1e-6)
    rows = _rows(report)
    assert rows["LabelDPLayer"]["releases"] == 1
    assert rows["LabelDPLayer"]["eps_per_release"] == pytest.approx(1.0, abs=1e-3)
    assert rows["LabelDPLayer"]["eps_composed"] == pytest.approx(1.0, abs=1e-3)
    emb = rows["EmbeddingDPLayer"]
    assert emb["releases"] == 3
    # 8 coordinates, each binary RR at eps/2 = 1: 8 per release (pure), at most 24 for three
    assert emb["eps_per_release"] == pytest.approx(8.0, rel=1e-3)
    assert 8.0 < emb["eps_composed"] <= 24.0 + 1e-6
    assert report.epsilon >= emb["eps_composed"]
    eps = history.history["epsilon"]
    assert len(eps) == 3 and eps[0] < eps[1] < eps[2]
    assert eps[-1] == pytest.approx(report.epsilon, rel=1e-6)
    text = str(report)
    assert "LabelDPLayer" in text and "worst unit, all releases" in text


def test_per_batch_label_dp_is_one_release_per_epoch():
    model, x, y = _vertical(kf.LabelDPLayer(eps=1.0, per_batch=True, seed=0))
    history = model.fit(x, y, epochs=4, batch_size=64, verbose=0)
    row = _rows(privacy_report(history))["LabelDPLayer"]
    assert row["releases"] == 4
    assert 1.0 < row["eps_composed"] <= 4.0 + 1e-6


def test_composition_matches_dp_accounting_accountants():
    rr = randomized_response_dp_event(1.5, 4)
    acc = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.ComposedDpEvent([rr] * 7))
    assert compose_epsilon([(rr, 7)], 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-3)
    gauss = GaussianUpload(1.0, 2.0, seed=0).dp_event()
    assert compose_epsilon([(gauss, 5)], 1e-5) == pytest.approx(
        gaussian_epsilon(2.0, 1e-5, count=5), rel=1e-3)
    # mixed events compose to more than either alone, less than the sum
    both = compose_epsilon([(rr, 7), (gauss, 5)], 1e-5)
    assert max(compose_epsilon([(rr, 7)], 1e-5), compose_epsilon([(gauss, 5)], 1e-5)) < both
    assert both < compose_epsilon([(rr, 7)], 1e-5) + compose_epsilon([(gauss, 5)], 1e-5) + 1e-6


def test_rdp_accountant_is_valid_but_looser_for_pure_dp():
    rr = randomized_response_dp_event(1.0, 2)
    pld = compose_epsilon([(rr, 10)], 1e-5)
    rdp = compose_epsilon([(rr, 10)], 1e-5, accountant="rdp")
    assert pld <= 10.0 + 1e-6 and pld < rdp


def test_horizontal_run_counts_the_busiest_client_and_magrr():
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype("float32")
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    magrr = MagRR(eps_rr=2.0, seed=0)
    fl = HorizontalFL(model, partition(x[:200], y[:200], 10, seed=0),
                      upload=SignDSEncoder(k=0.2, eps=5.0, seed=0), seed=0)
    logger = EpsilonLogger(callbacks=[magrr])
    history = fl.fit(rounds=6, clients_per_round=4, callbacks=[magrr, logger], verbose=0)
    report = privacy_report(fl, callbacks=[magrr])
    rows = _rows(report)
    busiest = int(fl.participation.max())
    assert 3 <= busiest <= 6
    assert rows["SignDS"]["releases"] == busiest == rows["MagRR"]["releases"]
    assert rows["SignDS"]["eps_per_release"] == pytest.approx(5.0, rel=1e-3)
    assert rows["MagRR"]["eps_per_release"] == pytest.approx(2.0, rel=1e-3)
    assert report.epsilon <= busiest * 7.0 + 1e-6
    assert history.history["epsilon"][-1] == pytest.approx(report.epsilon, rel=1e-6)
    assert history.history["epsilon"][0] <= history.history["epsilon"][-1]


def test_unprotected_releases_are_infinite():
    model, x, y = _vertical(embedding_dp=kf.EmbeddingDPLayer(eps=None))
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    report = privacy_report(model)
    assert math.isinf(report.epsilon)
    assert "not private" in str(report)


def test_bad_arguments():
    with pytest.raises(ValueError, match="accountant"):
        privacy_report(keras.Sequential([keras.Input((2,))]), accountant="moments")
    with pytest.raises((TypeError, ValueError), match="delta"):
        privacy_report(keras.Sequential([keras.Input((2,))]), delta=-1.0)
    with pytest.raises(TypeError, match="cannot collect"):
        privacy_report("model.keras")


def _flower_state(sampling, relation, compositions, orders=None):
    """A Flower RDP accountant's ``state_dict()`` (schema 1), written out by hand."""
    return {"schema_version": 1, "backend": "rdp", "orders": orders or [],
            "config": {"target_delta": 1e-5, "population_size": 100,
                       "neighboring_relation": relation, "sampling_method": sampling,
                       "max_epsilon": None},
            "compositions": [{"event": {"noise_multiplier": z, "sample_size": n,
                                        "population_size": 100}, "count": c}
                             for z, n, c in compositions]}


def test_a_flower_accountant_is_reported_beside_the_local_releases_never_composed_into_them():
    pytest.importorskip("keras_fedpriv.federated.flower.central_dp")  # Flower's reader
    upload = GaussianUpload(clip_norm=1.0, noise_multiplier=2.0, seed=0)
    for _ in range(3):
        upload.client_message(np.ones(4, np.float32), 5, client_id=0)
    state = _flower_state("poisson", "add-or-remove-one", [(1.1, 10, 5), (2.0, 20, 3)])
    local = privacy_report(upload, delta=1e-5)
    report = privacy_report(upload, delta=1e-5, flower_accountant=state)
    hand = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    hand.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), 5)
    hand.compose(dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(2.0)), 3)
    assert report.central_epsilon == pytest.approx(hand.get_epsilon(1e-5), rel=1e-9)
    assert report.epsilon == pytest.approx(local.epsilon, rel=1e-12)  # the local figure as is
    assert report.central[0].releases == 8
    text = str(report)
    assert "Central DP (another threat model" in text and "8 noised aggregates" in text
    assert local.central_epsilon is None and "Central DP" not in str(local)


def test_a_bad_flower_accountant_is_refused_by_name():
    pytest.importorskip("keras_fedpriv.federated.flower.central_dp")  # Flower's reader
    upload = GaussianUpload(seed=0)
    with pytest.raises(ValueError, match="`flower_accountant` must be Flower's PrivacyAccountant"):
        privacy_report(upload, flower_accountant={"schema_version": 2})
    with pytest.raises(ValueError, match="sampling method 'sometimes'"):
        privacy_report(upload, flower_accountant=_flower_state(
            "sometimes", "add-or-remove-one", [(1.0, 1, 1)]))
    # a pairing Flower refuses: replacing a client doubles the sensitivity, which a plain
    # Gaussian event under replace-one would not show (its eps is the same as add-or-remove)
    with pytest.raises(ValueError, match="'no-amplification' with neighboring relation "
                                         "'replace-one'"):
        privacy_report(upload, flower_accountant=_flower_state(
            "no-amplification", "replace-one", [(1.0, 1, 1)]))


def test_a_flower_accountant_without_the_flower_adapter_says_what_to_import(monkeypatch):
    import sys

    report_module = sys.modules[privacy_report.__module__]
    monkeypatch.setattr(report_module, "_CENTRAL_READERS", {})  # as before the adapter loads
    with pytest.raises(ValueError, match="`flower_accountant` is read by keras-fedpriv's flower "
                                         "adapter.*import keras_fedpriv.federated.flower."
                                         "central_dp first"):
        privacy_report(GaussianUpload(seed=0), flower_accountant={"schema_version": 1})


def test_flowers_own_accountant_without_replacement_matches_its_own_figure():
    flwr = pytest.importorskip("flwr.serverapp")
    from flwr.supercore.privacy_accounting import GaussianPrivacyEvent
    pytest.importorskip("keras_fedpriv.federated.flower.central_dp")  # Flower's reader

    acc = flwr.RdpAccountant(flwr.PrivacyConfig(
        target_delta=1e-5, population_size=50,
        neighboring_relation=flwr.NeighboringRelation.REPLACE_ONE,
        sampling_method=flwr.SamplingMethod.WITHOUT_REPLACEMENT))
    acc.compose(GaussianPrivacyEvent(1.3, 5, 50), count=4)
    report = privacy_report(GaussianUpload(seed=0), flower_accountant=acc)
    assert report.central_epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_the_report_says_what_embedding_dp_eps_costs_an_example():
    """eps=4 on an 8-wide embedding is eps 16 per release (8 coordinates at eps 2): the report
    states both next to the figure, so the 16 is no surprise at the call site."""
    layer = kf.EmbeddingDPLayer(eps=4.0, seed=0)
    layer(np.ones((2, 8), "float32"), training=True, example_ids=np.arange(2))
    report = privacy_report(layer)
    (row,) = report.releases
    assert math.isclose(report.per_release_epsilon(row), 16.0, rel_tol=1e-3)
    assert ("eps=4 randomizes each of its 8 coordinates at eps 2 (eps/2), so one release of an "
            "example's embedding is eps 16 (8 x 2)") in str(report)


def test_the_embedding_dp_note_says_eps_over_2_only_where_it_is():
    """At eps=100 each coordinate is pinned at ~22.18 (the flip probability's 2**-32 floor),
    not eps/2 = 50: the note says so instead of "(eps/2)", and prices a 2-wide release at
    2 x 22.2."""
    layer = kf.EmbeddingDPLayer(eps=100.0, seed=0)
    layer(np.ones((2, 2), "float32"), training=True, example_ids=np.arange(2))
    text = str(privacy_report(layer))
    assert "(eps/2)" not in text
    assert ("eps=100 randomizes each of its 2 coordinates at eps 22.2 (below eps/2 = 50: the "
            "flip probability is a multiple of 2**-32 and at least 2**-32), so one release of "
            "an example's embedding is eps 44.4 (2 x 22.2)") in text
