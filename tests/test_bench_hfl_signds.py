"""bench/hfl_signds.py's central DP-FedAvg baseline: the user-level eps it reports.

The bench composes ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` over the rounds with
dp-accounting's PLD accountant (add or remove one client). These tests recompute that eps
independently (one self-composed event, and the RDP accountant as an upper bound) for the
function and for every DP-FedAvg row saved in docs/results/hfl_signds.json and printed in
docs/results/hfl_signds.md. Its ``--quick`` mode (DP-FedAvg included) runs in tests/test_bench.py.
"""

import importlib.util
import json
import math
import pathlib

import dp_accounting
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("_bench_hfl_signds_eps",
                                                  REPO / "bench" / "hfl_signds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _independent_pld(z, q, rounds, delta):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds)
    accountant = dp_accounting.pld.PLDAccountant()  # add or remove one: DP-FedAvg's relation
    accountant.compose(event)
    return accountant.get_epsilon(delta)


def _rdp(z, q, rounds, delta):
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)),
                       rounds)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("z, q, rounds", [(1.0, 0.2, 100), (2.0, 0.2, 100), (0.8, 0.05, 30)])
def test_dpfedavg_epsilon_is_the_dp_accounting_composition(bench, z, q, rounds):
    eps = bench.dpfedavg_epsilon(z, rounds, q)
    assert eps == pytest.approx(_independent_pld(z, q, rounds, 1e-5), rel=1e-6)
    # PLD is tight, RDP an upper bound; both far below composing the rounds without sampling
    assert eps <= _rdp(z, q, rounds, 1e-5) * 1.001
    assert eps < bench.dpfedavg_epsilon(z, rounds, 1.0) / 2
    # one more round, or less noise, never costs less
    assert bench.dpfedavg_epsilon(z, rounds + 1, q) > eps
    assert bench.dpfedavg_epsilon(z * 0.9, rounds, q) > eps


def test_the_bench_samples_its_clients_at_the_other_rows_rate(bench):
    assert bench.sampling_rate() == bench.CLIENTS_PER_ROUND / bench.NUM_CLIENTS == 0.2


def _central_rows():
    saved = json.loads((RESULTS / "hfl_signds.json").read_text())
    rows = [r for r in saved["results"].values() if r.get("central")]
    return saved["meta"], rows


def test_saved_dpfedavg_eps_is_the_dp_accounting_composition():
    meta, rows = _central_rows()
    assert {r["split"] for r in rows} == {"IID", "non-IID"}
    for r in rows:
        assert (r["q"], r["rounds"], r["delta"]) == (0.2, meta["rounds"], 1e-5)
        assert len(r["curves"]) == len(meta["seeds"])  # the other rows' seeds
        expected = _independent_pld(r["noise_multiplier"], r["q"], r["rounds"], r["delta"])
        assert r["epsilon"] == pytest.approx(expected, rel=1e-6), r["name"]


def test_the_results_page_prints_the_saved_eps_of_every_row(bench):
    _, rows = _central_rows()
    page = (RESULTS / "hfl_signds.md").read_text()
    for r in rows:
        line = next(li for li in page.splitlines()
                    if li.startswith(f"| {r['split']} | {r['name']} |"))
        assert f"| {bench.fmt_eps(r['epsilon'])} |" in line, line
    saved = json.loads((RESULTS / "hfl_signds.json").read_text())["results"]
    local = [r for r in saved.values() if not r.get("central")]
    assert local and all("epsilon" in r for r in local)
    assert all(math.isinf(r["epsilon"]) == (r["name"] == "FedAvg") for r in local)
