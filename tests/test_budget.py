"""`PrivacyBudget`: a party's own cap on its composed eps, across runs."""

import json

import pytest

from keras_fedpriv.federated.uploads import FedAvgUpload
from keras_fedpriv.mechanisms.ledger import CLIENT, ReleaseKind, ReleaseLedger
from keras_fedpriv.mechanisms.randomized_response import randomized_response_dp_event
from keras_fedpriv.privacy import BudgetExhausted, PrivacyBudget, privacy_report

pytestmark = [pytest.mark.jax]

KIND = ReleaseKind("test RR", "client data", CLIENT, randomized_response_dp_event(2.0))


def _ledger(count, unit=0):
    ledger = ReleaseLedger()
    ledger.record(KIND, [unit], count=count)
    return ledger


class _Holder:
    def __init__(self, ledger):
        self.ledger = ledger

    def privacy_ledger(self):
        return self.ledger


def test_the_cap_is_the_composed_eps_of_the_accountant():
    budget = PrivacyBudget(5.0, delta=1e-5)
    eps2 = privacy_report(_Holder(_ledger(2)), delta=1e-5).epsilon
    assert 2.0 < eps2 <= 4.0
    assert budget.check(_ledger(2)) == pytest.approx(eps2)
    assert budget.epsilon(ReleaseLedger()) == 0.0
    with pytest.raises(BudgetExhausted, match="over the budget max_epsilon=5; the message was "
                                              "not sent"):
        budget.check(_ledger(4))


def test_every_saved_release_counts_folded_into_one_entry_per_run(tmp_path):
    path = tmp_path / "sub" / "budget.json"
    budget = PrivacyBudget(12.0, path=str(path))
    budget.save(_ledger(2, unit=3), run_id=1)        # run 1: client id 3
    # two releases of run 2: one entry, keyed by run and its last release's number
    budget.save(_ledger(1, unit=5), run_id=2)
    budget.save(_ledger(1, unit=5), run_id=2)
    budget.save(ReleaseLedger(), run_id=2)           # a release that carries nothing
    entries = json.loads(path.read_text())["entries"]
    assert [(e["run"], e["release"]) for e in entries] == [("1", 0), ("2", 1)]
    assert entries[1]["ledger"]["kinds"][0]["units"] == {"5": 2}
    # the client's id changed between runs: still one person's data, 2 + 1 + 1 releases
    five = privacy_report(_Holder(_ledger(5)), delta=1e-5).epsilon
    assert budget.past().total(KIND) == 4
    assert budget.past(run_id=2).total(KIND) == 2
    # this run's saved entries count too: the release about to be sent is the 5th
    assert budget.check(_ledger(1, unit=5), run_id=2) == pytest.approx(five)
    with pytest.raises(BudgetExhausted):
        PrivacyBudget(five * 0.99, path=str(path)).check(_ledger(1, unit=5), run_id=2)
    # a fresh instance (a new process) reads the same file
    assert PrivacyBudget(12.0, path=str(path)).past(run_id=3).total(KIND) == 4


def test_reserve_records_only_what_is_new_since_before_and_only_if_it_fits(tmp_path):
    path = tmp_path / "budget.json"
    three = privacy_report(_Holder(_ledger(3)), delta=1e-5).epsilon
    four = privacy_report(_Holder(_ledger(4)), delta=1e-5).epsilon
    budget = PrivacyBudget((three + four) / 2, path=str(path))
    for n in (1, 2, 3):  # the party's cumulative ledger; each reserve adds one release
        budget.reserve(_ledger(n), run_id=9, before=_ledger(n - 1))
    assert budget.past().total(KIND) == 3
    with pytest.raises(BudgetExhausted, match="over the budget"):
        budget.reserve(_ledger(4), run_id=9, before=_ledger(3))
    entries = json.loads(path.read_text())["entries"]  # a refusal records nothing
    assert [(e["run"], e["release"]) for e in entries] == [("9", 2)]
    with pytest.raises(ValueError, match="`before` holds releases"):
        budget.reserve(_ledger(1), run_id=9, before=_ledger(2))
    # without a file the budget knows only the ledger it is given: all of it counts
    in_memory = PrivacyBudget((three + four) / 2)
    assert in_memory.reserve(_ledger(3), before=_ledger(2)) == pytest.approx(three)
    with pytest.raises(BudgetExhausted):
        in_memory.reserve(_ledger(4), before=_ledger(3))


def test_a_file_written_before_entries_were_append_only_still_counts(tmp_path):
    path = tmp_path / "budget.json"
    path.write_text(json.dumps({"runs": {"1": _ledger(2).to_dict(), "2": _ledger(1).to_dict()}}))
    budget = PrivacyBudget(50.0, path=str(path))
    assert budget.past().total(KIND) == 3
    budget.reserve(_ledger(1), run_id=3)
    assert budget.past().total(KIND) == 4
    assert len(json.loads(path.read_text())["entries"]) == 3


def test_a_release_without_dp_never_fits_a_budget():
    upload = FedAvgUpload()
    upload.client_message([0.0, 1.0], 3, client_id=0)
    with pytest.raises(BudgetExhausted, match="inf"):
        PrivacyBudget(100.0).check(upload.privacy_ledger())


@pytest.mark.parametrize("content", ["{not json", json.dumps({"runs": [1]}),
                                     json.dumps({"other": {}}),
                                     json.dumps({"runs": {"1": {"kinds": 3}}})])
def test_an_unreadable_budget_file_refuses_every_release(tmp_path, content):
    path = tmp_path / "budget.json"
    path.write_text(content)
    with pytest.raises(BudgetExhausted, match="cannot be read"):
        PrivacyBudget(50.0, path=str(path)).check(_ledger(1))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"max_epsilon": 0.0}, ValueError, "max_epsilon"),
    ({"max_epsilon": float("nan")}, ValueError, "max_epsilon"),
    ({"max_epsilon": 1.0, "delta": 1.5}, ValueError, "delta"),
    ({"max_epsilon": 1.0, "path": 3}, TypeError, "`path` must be None or a file path"),
    ({"max_epsilon": 1.0, "path": "budget.json"}, ValueError,
     "`path` must be an absolute path .*got 'budget.json'"),
    ({"max_epsilon": 1.0, "accountant": "gdp"}, ValueError, "accountant"),
])
def test_bad_budget_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        PrivacyBudget(**kwargs)


def test_per_record_budgets_cap_the_busiest_record_not_the_sum():
    ledger = ReleaseLedger()
    ledger.record(KIND, [0, 1, 2, 3], count=2)  # four records, two releases each
    two = privacy_report(_Holder(_ledger(2)), delta=1e-5).epsilon
    eight = privacy_report(_Holder(_ledger(8)), delta=1e-5).epsilon
    assert PrivacyBudget(50.0, per_record=True).check(ledger) == pytest.approx(two)
    assert PrivacyBudget(50.0).check(ledger) == pytest.approx(eight)  # one person's data
    with pytest.raises(TypeError, match="per_record"):
        PrivacyBudget(1.0, per_record="yes")
