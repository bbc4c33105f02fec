"""`PrivacyBudget`: a party's own cap on its composed eps, across runs."""

import json

import pytest

from keras_fedpriv.federated.uploads import FedAvgUpload
from keras_fedpriv.mechanisms.ledger import CLIENT, ReleaseKind, ReleaseLedger
from keras_fedpriv.mechanisms.randomized_response import randomized_response_dp_event
from keras_fedpriv.privacy import BudgetExhausted, PrivacyBudget, privacy_report

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


def test_past_runs_in_the_file_count_and_the_current_run_is_not_counted_twice(tmp_path):
    path = tmp_path / "sub" / "budget.json"
    budget = PrivacyBudget(7.0, path=str(path))
    budget.save(_ledger(2, unit=3), run_id=1)        # run 1: client id 3
    # saving run 2's progress twice replaces its entry, it does not add to it
    budget.save(_ledger(1, unit=5), run_id=2)
    budget.save(_ledger(1, unit=5), run_id=2)
    assert set(json.loads(path.read_text())["runs"]) == {"1", "2"}
    # the client's id changed between runs: still one person's data, 2 + 1 + 1 releases
    four = privacy_report(_Holder(_ledger(4)), delta=1e-5).epsilon
    assert budget.check(_ledger(1, unit=5), run_id=2) == pytest.approx(
        privacy_report(_Holder(_ledger(3)), delta=1e-5).epsilon)
    assert budget.epsilon(_ledger(2, unit=5), run_id=2) == pytest.approx(four)
    with pytest.raises(BudgetExhausted):
        PrivacyBudget(four * 0.99, path=str(path)).check(_ledger(2, unit=5), run_id=2)
    # a fresh instance (a new process) reads the same file
    assert PrivacyBudget(7.0, path=str(path)).past(run_id=3).total(KIND) == 3


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
