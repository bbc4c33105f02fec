"""A party's own privacy budget across runs: `PrivacyBudget`, `BudgetExhausted`.

A server's ledger says what the server received; a client that must show its
users a bound keeps its own. `PrivacyBudget` keeps a party's releases in a
file on the party's machine and refuses a release that would take the
composed eps over the cap: the party reserves each message *before* it
leaves (`PrivacyBudget.reserve`), so what it refuses is never released.

What the budget guarantees:

* **Every entry counts.** The file keeps one entry per run, keyed by run id
  and the number of the run's last release, holding the summed counts of
  every release of that run. A new release is folded into its run's entry
  (numbered after the largest release number saved for the run); nothing is
  ever subtracted or dropped. Folding is exact: the composed eps depends
  only on the summed counts per kind of release and per unit, and every
  write checks that the folded file holds exactly the counts it was given.
  The composed eps is that of every run in the file (this one's and every
  past one's) plus the release about to be sent, so a party restarted
  within a run (fresh node state, same run id) goes on from what the file
  holds. A release that carries nothing is not written.
* **Non-private is inf.** A release without DP (a reply carrying anything
  in the clear) makes the composed eps inf, so it never fits a budget, and
  such a release is never subtracted away: a ledger that holds one is inf.
* **One at a time.** The check and the record are one step under an
  exclusive lock (``fcntl.flock``) on the folder that holds the file (a
  folder that holds the budget cannot be removed casually, unlike a lock
  file), and the file is replaced atomically and synced with its folder:
  runs that share the file cannot both pass the check, and no release is
  lost.
* **One file, one name, an absolute path.** The path must be absolute; a
  symlink is resolved (`os.path.realpath`) when the budget is made, and the
  lock, the read and the atomic replace all act on the real file. A file
  with more than one name (hard links) is refused: replacing one name would
  leave the other with a count of its own.
* **Malformed is unreadable.** A file that is not exactly what this class
  writes (bad JSON, negative or non-integer counts, unknown or out-of-range
  DP events, repeated entries) refuses every release (`BudgetExhausted`)
  until the party's operator fixes or removes it.

Two ways to count. A horizontal-FL client's releases are all about its own
data, so by default the budget counts them as releases about one unit (the
sum over the ids the ledgers used: a client whose id changed between runs is
still one person's data). A vertical-FL party's releases are about records
(example ids that stay the same across runs): with ``per_record=True`` the cap
holds for the busiest record.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

try:
    import fcntl
except ImportError:  # not a POSIX system: no file lock, so no release (see _locked)
    fcntl = None

from keras_fedpriv.mechanisms.ledger import SECRETS, UNITS, ReleaseLedger
from keras_fedpriv.mechanisms.validation import validate_eps, validate_real

__all__ = ["BudgetExhausted", "PrivacyBudget"]

_VERSION = 2


class BudgetExhausted(RuntimeError):
    """A release would take a party's composed eps over its `PrivacyBudget`, or the
    budget cannot tell (its file is unreadable or stays locked)."""


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


def _kind_key(item: dict[str, Any]) -> tuple:
    """The identity of a kind in `ReleaseLedger.to_dict`'s form."""
    return (item["mechanism"], item["protects"], item["unit"], item["note"],
            json.dumps(item["event"], sort_keys=True, default=repr))


def _counts(ledger: ReleaseLedger) -> dict[tuple, tuple]:
    """What composition depends on: each kind's anonymous and nonzero per-unit counts."""
    out = {}
    for item in ledger.to_dict()["kinds"]:
        units = {u: c for u, c in item["units"].items() if c}
        if item["everyone"] or units:
            out[_kind_key(item)] = (item["everyone"], units, item["approximate"])
    return out


class _LockTimeout(Exception):
    pass


class _LockFailed(Exception):
    pass


@contextlib.contextmanager
def _folder_lock(folder: str, timeout: float) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``folder``; yield the folder's descriptor.

    The lock is checked to be on the folder the path names *after* it is
    taken (a folder removed and made again in between is a different one):
    otherwise it is let go and taken again.
    """
    if fcntl is None:
        raise _LockFailed("this system has no POSIX file locks (fcntl)")
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError as err:
            raise _LockFailed(err.strerror) from None
        try:
            pause = 0.005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise _LockTimeout from None
                    time.sleep(pause)
                    pause = min(2 * pause, 0.1)
                except OSError as err:  # e.g. a file system without flock
                    raise _LockFailed(err.strerror) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(folder))
            except FileNotFoundError:
                same = False
            if same:
                yield fd
                return
        finally:
            os.close(fd)  # the only descriptor of this open: closing it lets the lock go


# ------------------------------------------------------------------ strict reading
class _Malformed(ValueError):
    pass


def _checked_ledger(state: Any) -> ReleaseLedger:
    """The ledger ``state`` holds, if it is exactly what `ReleaseLedger.to_dict` writes."""
    if not isinstance(state, dict) or set(state) != {"kinds"} or not isinstance(
            state["kinds"], list):
        raise _Malformed("a ledger must be {'kinds': [...]}")
    for item in state["kinds"]:
        keys = {"mechanism", "protects", "unit", "note", "event", "everyone", "units",
                "approximate"}
        if not isinstance(item, dict) or set(item) != keys:
            raise _Malformed("a ledger kind has other keys")
        if not (isinstance(item["mechanism"], str) and isinstance(item["note"], str)
                and item["protects"] in SECRETS and item["unit"] in UNITS
                and isinstance(item["approximate"], bool) and isinstance(item["units"], dict)):
            raise _Malformed("a ledger kind is malformed")
    try:  # counts, unit ids and events: ReleaseLedger.from_dict reads them strictly
        return ReleaseLedger.from_dict(state)
    except ValueError as err:
        raise _Malformed(str(err).rstrip(".")) from None


def _no_constants(name: str) -> Any:
    raise _Malformed(f"{name} is not a count")


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Malformed("a key is repeated")
    return out


def _is_non_private(event: dict[str, Any]) -> bool:
    kind = event["type"]
    return (kind == "non_private"
            or (kind == "composed" and any(_is_non_private(e) for e in event["events"]))
            or (kind == "self_composed" and event["count"] > 0
                and _is_non_private(event["event"])))


def _release(ledger: ReleaseLedger, before: ReleaseLedger | None) -> ReleaseLedger:
    """What ``ledger`` holds beyond ``before``: the release about to be sent.

    Releases without DP are never subtracted: a ledger holding one is inf.
    """
    if not isinstance(ledger, ReleaseLedger):
        raise TypeError(f"`ledger` must be a ReleaseLedger; got {type(ledger).__name__}.")
    if before is None:
        return ledger
    if not isinstance(before, ReleaseLedger):
        raise TypeError(f"`before` must be None or a ReleaseLedger; got "
                        f"{type(before).__name__}.")

    def behind(item):
        return ValueError(f"`before` holds releases of {item['mechanism']!r} that `ledger` "
                          "does not: pass the same party's ledger from before the release.")

    earlier = {_kind_key(item): item for item in before.to_dict()["kinds"]}
    kinds = []
    for item in ledger.to_dict()["kinds"]:
        old = earlier.pop(_kind_key(item), None)
        if old is not None and not _is_non_private(item["event"]):
            item["everyone"] -= old["everyone"]
            units = {u: c - old["units"].get(u, 0) for u, c in item["units"].items()}
            if item["everyone"] < 0 or min(units.values(), default=0) < 0 or any(
                    u not in units for u in old["units"]):
                raise behind(item)
            item["units"] = {u: c for u, c in units.items() if c}
        kinds.append(item)
    for old in earlier.values():
        if old["everyone"] or any(old["units"].values()):
            raise behind(old)
    return ReleaseLedger.from_dict({"kinds": kinds})


# ------------------------------------------------------------------ the budget
class PrivacyBudget:
    """A cap on the eps a party's releases compose to, over this run and past ones.

    With a file, the composed eps is that of every release the file holds
    (one entry per run, the run's releases summed) plus the release about to
    be sent; `reserve` checks it and records the release in one step under
    the lock on the file's folder. Without a file the budget knows only the
    ledger it is given: pass the party's releases of this run so far
    (``before`` is then not used).

    Args:
        max_epsilon: the cap on the composed eps (at ``delta``), > 0.
        delta: the delta of the composed (eps, delta), in (0, 1).
        path: None (this run only, in memory) or the absolute path of a JSON
            file on the party's machine that keeps every release of every
            run (created if missing; the party must keep it, give it one
            name (no hard links), and never share it between two parties).
            A symlink is resolved once, here: the budget then locks the real
            file's folder, reads the real file and replaces it. A budget made
            after a symlinked folder on the path was pointed elsewhere uses
            the file it now leads to: a new budget.
        accountant: ``"pld"`` (default) or ``"rdp"``.
        per_record: False (default): every release is about the party's one
            person; True: releases are about records (the ledgers' unit ids,
            the same ids in every run) and the cap is on the busiest record.

    Example:
        >>> budget = PrivacyBudget(8.0, path="/var/lib/client/privacy.json")
        >>> before = privacy_ledger(my_upload)              # before the message is made
        >>> message = my_upload.client_message(delta, n)
        >>> budget.reserve(privacy_ledger(my_upload), run_id=7, before=before)
        >>> send(message)                                   # only if reserve did not raise
    """

    #: Seconds to wait for the file's lock before refusing the release.
    lock_timeout: float = 60.0

    def __init__(self, max_epsilon: float, delta: float = 1e-5, path: str | None = None,
                 accountant: str = "pld", per_record: bool = False) -> None:
        self.max_epsilon = validate_eps(max_epsilon, "max_epsilon", lower_open=True)
        self.delta = validate_real(delta, "delta", low=0, low_open=True, high=1, high_open=True)
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"`path` must be None or a file path; got {type(path).__name__}.")
        if path is not None and not os.path.isabs(os.fspath(path)):
            raise ValueError(f"`path` must be an absolute path (a relative one would name a "
                             f"different file from each working directory); got "
                             f"{os.fspath(path)!r}.")
        if accountant not in ("pld", "rdp"):
            raise ValueError(f"`accountant` must be 'pld' or 'rdp'; got {accountant!r}.")
        if not isinstance(per_record, bool):
            raise TypeError(f"`per_record` must be a bool; got {per_record!r}.")
        self.per_record = per_record
        self.path = None if path is None else os.fspath(path)
        # followed once: every later step acts on the real file, never on the link
        self._file = None if self.path is None else os.path.realpath(self.path)
        self.accountant = accountant

    # -- the file ---------------------------------------------------------------------
    def _unreadable(self, why: str) -> BudgetExhausted:
        return BudgetExhausted(f"the privacy budget file {self.path!r} cannot be read ({why}); "
                               "no release until it is fixed or removed by the party's "
                               "operator.")

    def _entries(self) -> list[dict[str, Any]]:
        """Every entry of the file, checked (`BudgetExhausted` if anything is malformed)."""
        if self._file is None or not os.path.lexists(self._file):
            return []
        try:
            with open(self._file) as f:
                names = os.fstat(f.fileno()).st_nlink
                if names > 1:
                    raise BudgetExhausted(
                        f"the privacy budget file {self.path!r} has {names} names (hard "
                        "links): each name would keep a count of its own once the file is "
                        "replaced. No release until the party's operator leaves it one name.")
                state = json.load(f, parse_constant=_no_constants,
                                  object_pairs_hook=_no_repeats)
            if not isinstance(state, dict):
                raise _Malformed("not an object")
            if set(state) == {"runs"} and isinstance(state["runs"], dict):
                # written before entries were kept: each run's ledger, one entry each
                entries = [{"run": str(k), "release": 0, "ledger": v}
                           for k, v in state["runs"].items()]
            elif set(state) == {"version", "entries"} and state["version"] == _VERSION \
                    and isinstance(state["entries"], list):
                entries = state["entries"]
            else:
                raise _Malformed("not a privacy budget file")
            seen = set()
            for entry in entries:
                if not isinstance(entry, dict) or set(entry) != {"run", "release", "ledger"} \
                        or not isinstance(entry["run"], str):
                    raise _Malformed("an entry must hold 'run', 'release' and 'ledger'")
                release = entry["release"]
                if isinstance(release, bool) or not isinstance(release, int) or release < 0:
                    raise _Malformed("a release number must be an integer >= 0")
                if (entry["run"], release) in seen:
                    raise _Malformed("an entry is repeated")
                seen.add((entry["run"], entry["release"]))
                entry["_ledger"] = _checked_ledger(entry["ledger"])
        except _Malformed as err:
            raise self._unreadable(str(err)) from None
        except RecursionError:
            raise self._unreadable("nested too deeply") from None
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise self._unreadable(type(err).__name__) from None
        return entries

    def _write(self, folder: int, entries: list[dict[str, Any]], release: ReleaseLedger,
               run_id: Any) -> None:
        """Replace the file by ``entries`` plus ``release`` (run ``run_id``), one entry per run.

        Under the lock on the file's folder (descriptor ``folder``). Each run's
        entries are folded into one, numbered by the run's last release; the
        new release is numbered after the largest number saved for its run.
        """
        folded: dict[str, list] = {}  # run -> [last release number, its ledgers]
        for entry in entries:
            run = folded.setdefault(entry["run"], [entry["release"], []])
            run[0] = max(run[0], entry["release"])
            run[1].append(entry["_ledger"])
        run = folded.setdefault(str(run_id), [-1, []])
        run[0] += 1
        run[1].append(release)
        kept = [{"run": name, "release": last, "ledger": ReleaseLedger.merged(ledgers).to_dict()}
                for name, (last, ledgers) in folded.items()]
        # folding sums counts per kind and unit, all that composition depends on: check that
        # the file about to be written holds exactly the counts it was given, as it will be read
        given = ReleaseLedger.merged([e["_ledger"] for e in entries] + [release])
        written = ReleaseLedger.merged(ReleaseLedger.from_dict(e["ledger"]) for e in kept)
        if _counts(written) != _counts(given):
            raise BudgetExhausted(f"folding the privacy budget file {self.path!r} would change "
                                  "its counts; nothing was written and the message was not "
                                  "sent.")
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self._file), prefix=".privacy-budget-",
                                   suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"version": _VERSION, "entries": kept}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._file)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        os.fsync(folder)  # the replace itself survives a crash

    @contextlib.contextmanager
    def _locked(self, refused: str) -> Iterator[int]:
        """The lock on the file's folder (its descriptor); `BudgetExhausted` if it stays taken."""
        folder = os.path.dirname(self._file)
        os.makedirs(folder, exist_ok=True)
        try:
            with _folder_lock(folder, self.lock_timeout) as fd:
                yield fd
        except _LockTimeout:
            raise BudgetExhausted(f"the privacy budget file {self.path!r} stayed locked for "
                                  f"{self.lock_timeout:g} s; {refused}") from None
        except _LockFailed as err:
            raise BudgetExhausted(f"the folder of the privacy budget file {self.path!r} cannot "
                                  f"be locked ({err}); {refused}") from None

    def _units(self, ledger: ReleaseLedger) -> ReleaseLedger:
        return ledger if self.per_record else _one_unit(ledger)

    def _composed(self, entries: list[dict[str, Any]], release: ReleaseLedger) -> float:
        from keras_fedpriv.privacy.report import privacy_report

        total = self._units(ReleaseLedger.merged([e["_ledger"] for e in entries] + [release]))
        if not len(total):
            return 0.0
        return privacy_report(_Holder(total), delta=self.delta,
                              accountant=self.accountant).epsilon

    def _over(self, eps: float) -> BudgetExhausted | None:
        if eps <= self.max_epsilon and not math.isnan(eps):
            return None
        return BudgetExhausted(f"this release would take the composed eps to {eps:.4g} "
                               f"(delta={self.delta:g}), over the budget max_epsilon="
                               f"{self.max_epsilon:g}; the message was not sent.")

    def _considered(self, ledger: ReleaseLedger, before: ReleaseLedger | None) -> ReleaseLedger:
        # without a file nothing is saved between messages: the whole ledger counts
        return _release(ledger, None if self._file is None else before)

    # -- public -----------------------------------------------------------------------
    def past(self, run_id: Any = None) -> ReleaseLedger:
        """The releases the file holds (about one unit, unless ``per_record``).

        Args:
            run_id: None (every entry), or a run whose entries are left out.

        Returns:
            The merged `ReleaseLedger` of those entries (empty without a file).
        """
        return self._units(ReleaseLedger.merged(
            e["_ledger"] for e in self._entries() if run_id is None or e["run"] != str(run_id)))

    def epsilon(self, ledger: ReleaseLedger, run_id: Any = None,
                before: ReleaseLedger | None = None) -> float:
        """The composed eps of every entry in the file plus the release ``ledger`` - ``before``.

        Args:
            ledger: the party's ledger including the release about to be sent.
            run_id: kept for compatibility: every saved entry counts, this run's too.
            before: the same party's ledger before that release (None: all of
                ``ledger`` is new). Not used without a file.

        Returns:
            The composed eps at ``delta`` (``inf`` if anything was released without DP).
        """
        return self._composed(self._entries(), self._considered(ledger, before))

    def check(self, ledger: ReleaseLedger, run_id: Any = None,
              before: ReleaseLedger | None = None) -> float:
        """The composed eps with the release; `BudgetExhausted` if it is over ``max_epsilon``.

        Records nothing: use `reserve` before sending a message (a check
        followed by `save` can race another run sharing the file).

        Args:
            ledger, run_id, before: as in `epsilon`.

        Returns:
            The composed eps (<= ``max_epsilon``).
        """
        eps = self.epsilon(ledger, run_id, before)
        error = self._over(eps)
        if error is not None:
            raise error
        return eps

    def reserve(self, ledger: ReleaseLedger, run_id: Any = None,
                before: ReleaseLedger | None = None) -> float:
        """Check the release ``ledger`` - ``before`` and record it, in one step under the lock.

        Call it after computing a message and before sending it; send only if
        it returns. A refused release is not recorded, nor is a release that
        carries nothing. Without a file it is `check` of the whole ``ledger``.

        Args:
            ledger: the party's ledger including the release about to be sent.
            run_id: the run the release belongs to (its entry in the file).
            before: the same party's ledger before that release (None: all of
                ``ledger`` is new).

        Returns:
            The composed eps with the release (<= ``max_epsilon``).
        """
        release = self._considered(ledger, before)
        if self._file is None:
            return self.check(release)
        with self._locked("the message was not sent.") as folder:
            entries = self._entries()
            eps = self._composed(entries, release)
            error = self._over(eps)
            if error is not None:
                raise error
            if len(release):
                self._write(folder, entries, release, run_id)
        return eps

    def save(self, ledger: ReleaseLedger, run_id: Any = None,
             before: ReleaseLedger | None = None) -> None:
        """Add the release ``ledger`` - ``before`` to run ``run_id``'s entry, unchecked.

        Under the lock, as `reserve` (no-op without a file or for a release
        that carries nothing). Prefer `reserve`, which checks in the same step.

        Args:
            ledger, run_id, before: as in `reserve`.

        Returns:
            None.
        """
        if self._file is None:
            return
        release = _release(ledger, before)
        if not len(release):
            return
        with self._locked("nothing was saved.") as folder:
            self._write(folder, self._entries(), release, run_id)
