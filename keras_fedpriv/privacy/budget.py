"""A party's own privacy budget across runs: `PrivacyBudget`, `BudgetExhausted`.

A server's ledger says what the server received; a client that must show its
users a bound keeps its own. `PrivacyBudget` keeps a party's release ledger in
a file on the party's machine, one entry per run, composes every run's
releases with the current one, and refuses a release that would take the
composed eps over the cap: the party checks *before* its message leaves, so
what it refuses is never released.

Two ways to count. A horizontal-FL client's releases are all about its own
data, so by default the budget counts them as releases about one unit (the
sum over the ids the ledgers used: a client whose id changed between runs is
still one person's data). A vertical-FL party's releases are about records
(example ids that stay the same across runs): with ``per_record=True`` the cap
holds for the busiest record.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Any

from keras_fedpriv.mechanisms.ledger import ReleaseLedger
from keras_fedpriv.mechanisms.validation import validate_eps, validate_real

__all__ = ["BudgetExhausted", "PrivacyBudget"]


class BudgetExhausted(RuntimeError):
    """A release would take a party's composed eps over its `PrivacyBudget`."""


class _Holder:
    def __init__(self, ledger: ReleaseLedger) -> None:
        self._ledger = ledger

    def privacy_ledger(self) -> ReleaseLedger:
        return self._ledger


def _one_unit(ledger: ReleaseLedger) -> ReleaseLedger:
    """``ledger`` with every kind's releases counted about a single unit (0)."""
    state = ledger.to_dict()
    for kind in state["kinds"]:
        kind["units"] = {"0": int(kind.get("everyone", 0)) + sum(kind["units"].values())}
        kind["everyone"] = 0
    return ReleaseLedger.from_dict(state)


class PrivacyBudget:
    """A cap on the eps a party's releases compose to, over this run and past ones.

    Args:
        max_epsilon: the cap on the composed eps (at ``delta``), > 0.
        delta: the delta of the composed (eps, delta), in (0, 1).
        path: None (this run only, in memory) or a JSON file on the party's
            machine that keeps every run's ledger (created if missing; the
            party must keep it, and never share it between two parties).
        accountant: ``"pld"`` (default) or ``"rdp"``.
        per_record: False (default): every release is about the party's one
            person; True: releases are about records (the ledgers' unit ids,
            the same ids in every run) and the cap is on the busiest record.

    Example:
        >>> budget = PrivacyBudget(8.0, path="/var/lib/client/privacy.json")
        >>> budget.check(privacy_ledger(my_upload), run_id=7)   # BudgetExhausted if over
        >>> budget.save(privacy_ledger(my_upload), run_id=7)     # after the message left
    """

    def __init__(self, max_epsilon: float, delta: float = 1e-5, path: str | None = None,
                 accountant: str = "pld", per_record: bool = False) -> None:
        self.max_epsilon = validate_eps(max_epsilon, "max_epsilon", lower_open=True)
        self.delta = validate_real(delta, "delta", low=0, low_open=True, high=1, high_open=True)
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"`path` must be None or a file path; got {type(path).__name__}.")
        if accountant not in ("pld", "rdp"):
            raise ValueError(f"`accountant` must be 'pld' or 'rdp'; got {accountant!r}.")
        if not isinstance(per_record, bool):
            raise TypeError(f"`per_record` must be a bool; got {per_record!r}.")
        self.per_record = per_record
        self.path = None if path is None else os.fspath(path)
        self.accountant = accountant

    def _runs(self) -> dict[str, Any]:
        if self.path is None or not os.path.exists(self.path):
            return {}
        try:
            with open(self.path) as f:
                state = json.load(f)
            runs = state["runs"]
            if not isinstance(runs, dict):
                raise TypeError
            for ledger in runs.values():
                ReleaseLedger.from_dict(ledger)
        except (OSError, ValueError, KeyError, TypeError) as err:
            # an unreadable record of past releases: refuse rather than assume none
            raise BudgetExhausted(f"the privacy budget file {self.path!r} cannot be read "
                                  f"({type(err).__name__}); no release until it is fixed or "
                                  "removed by the party's operator.") from None
        return runs

    def past(self, run_id: Any = None) -> ReleaseLedger:
        """The ledger of every run in the file except ``run_id`` (about one unit, unless
        ``per_record``)."""
        runs = self._runs()
        return self._units(ReleaseLedger.merged(ReleaseLedger.from_dict(v)
                                                for k, v in runs.items() if k != str(run_id)))

    def _units(self, ledger: ReleaseLedger) -> ReleaseLedger:
        return ledger if self.per_record else _one_unit(ledger)

    def epsilon(self, ledger: ReleaseLedger, run_id: Any = None) -> float:
        """The composed eps of the past runs plus ``ledger`` (this run's releases so far)."""
        from keras_fedpriv.privacy.report import privacy_report

        total = self.past(run_id).merge(self._units(ledger))
        if not len(total):
            return 0.0
        return privacy_report(_Holder(total), delta=self.delta,
                              accountant=self.accountant).epsilon

    def check(self, ledger: ReleaseLedger, run_id: Any = None) -> float:
        """The composed eps with ``ledger``; `BudgetExhausted` if it is over ``max_epsilon``.

        Pass the ledger *including* the release about to be sent: a party
        calls this after computing its message and before sending it.
        """
        eps = self.epsilon(ledger, run_id)
        if not (eps <= self.max_epsilon) or math.isnan(eps):
            raise BudgetExhausted(f"this release would take the composed eps to {eps:.4g} "
                                  f"(delta={self.delta:g}), over the budget max_epsilon="
                                  f"{self.max_epsilon:g}; the message was not sent.")
        return eps

    def save(self, ledger: ReleaseLedger, run_id: Any = None) -> None:
        """Write ``ledger`` as run ``run_id``'s releases (atomically; no-op without a path)."""
        if self.path is None:
            return
        runs = self._runs()
        runs[str(run_id)] = ledger.to_dict()
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".privacy-budget-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"runs": runs}, f)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
