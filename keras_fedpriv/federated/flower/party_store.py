"""A party's durable state: its node's ``context.state``, kept on the party's own disk.

Flower keeps a ClientApp's ``context.state`` in the SuperNode's memory: a
SuperNode that crashes or is restarted loses it, and with it what a party
must never lose within a run (its random counters, release counts, a
follower's bottom model and optimizer, the secret key of an unseeded
protection). Restarted from nothing, a seeded party would draw the same noise
again for new data, and every party's own ledger would count from zero.

`PartyStore` keeps a copy of the whole ``context.state`` in a file on the
party's machine, and `durable_state_mod` (a Flower ClientApp mod, which
`horizontal_client_app` and `vertical_client_app` add when the node config
names a folder: ``--node-config "state-dir='/var/lib/fl-party'"``) keeps it
up to date:

* before the handler runs, the newest of the node's ``context.state`` and the
  file wins (each carries a version the mod increases by one per answered
  message); the file's copy replaces an older or empty node state;
* after the handler, and **before the reply leaves** (the mod returns it to
  Flower, or to the relay of a party worker), the state is written with the
  next version: atomically (a new file, flushed, renamed over the old), so a
  crash leaves either the old state or the new one, never half of one.

So a release that left the party is always in the file: a restarted party
continues its counters and never rewinds or replays them. A release that
the file holds but that never reached the other side (the party crashed
after writing, before its reply went out) is counted and its noise is never
drawn again: over-counting is the safe direction.

The file holds the party's secrets (a follower's bottom model, the secret
key of an unseeded protection): the folder must belong to the party's user
with mode 700 (as the worker's socket folder), and each file is created with
mode 600. One file per run and party (``run-<run id>-<party>.state``, the
party named by the node config's ``party`` or ``partition-id``, or by the
app): a folder shared by two parties by mistake never gives one party the
other's state (its counters, keys and, for a vertical follower, its rejoin
token), and a file whose recorded party is not the one asking is refused.
Two processes of one party at once (a restarted SuperNode while its
predecessor still answers a late message) take turns: the mod holds an
exclusive lock on ``run-<run id>-<party>.lock`` from reading the file until
the new state is written, so neither draws from a state the other has
already used. The files of all but the ``keep`` most recently written runs
are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import re
from typing import Any, Callable, Iterator

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from keras_fedpriv.federated.flower.worker import check_private_folder

__all__ = ["NODE_CONFIG_KEY", "PartyStore", "default_party", "durable_state_mod", "restore_newest",
           "state_version", "store_of"]

NODE_CONFIG_KEY = "state-dir"  # node config: the folder of a party's durable state
VERSION_KEY = "keras-fedpriv-store"  # in context.state: {"version": int}
_SUFFIX = ".state"
_PARTY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def state_version(state: RecordDict) -> int:
    """The version `durable_state_mod` last gave ``state`` (0: never written)."""
    if VERSION_KEY not in state:
        return 0
    return int(state[VERSION_KEY].get("version", 0))


def default_party(context: Context) -> str:
    """The party a node's state belongs to: its node config's ``party``, else
    ``partition-<partition-id>``.

    Raises:
        ValueError: the node config names neither.
    """
    config = context.node_config
    if "party" in config:
        return str(config["party"])
    if "partition-id" in config:
        return f"partition-{config['partition-id']}"
    raise ValueError(f"`{NODE_CONFIG_KEY}` needs the node config to name the party ('party' or "
                     f"'partition-id'), so that a restarted node finds its own state; got keys "
                     f"{sorted(config)}.")


class PartyStore:
    """The files of a party's durable node state, one per run, in a private folder.

    Args:
        folder: an absolute path to an existing folder of this user with mode
            700 (``install -d -m 700 FOLDER``).
        keep: the number of runs whose files are kept (the most recently
            written); older runs' files are removed when a run writes.

    Example:
        >>> store = PartyStore("/var/lib/fl-party")          # doctest: +SKIP
        >>> store.save(run_id, context.state)               # doctest: +SKIP
        >>> store.load(run_id)                               # doctest: +SKIP
    """

    def __init__(self, folder: str | os.PathLike[str], keep: int = 3) -> None:
        if not isinstance(folder, (str, os.PathLike)) or not os.path.isabs(os.fspath(folder)):
            raise ValueError(f"`{NODE_CONFIG_KEY}` must be an absolute path to a folder on the "
                             f"party's machine; got {folder!r}.")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"`keep` must be an integer >= 1; got {keep!r}.")
        self.folder = check_private_folder(folder, "the party's state folder")
        self.keep = keep

    def path(self, run_id: int, party: str) -> pathlib.Path:
        """The file of run ``run_id`` and ``party``."""
        if not isinstance(party, str) or not _PARTY.fullmatch(party):
            raise ValueError(f"a party's state needs a party name of 1 to 64 letters, digits, "
                             f"'_', '.' or '-'; got {party!r}.")
        return self.folder / f"run-{int(run_id)}-{party}{_SUFFIX}"

    @contextlib.contextmanager
    def locked(self, run_id: int, party: str) -> Iterator[None]:
        """Hold the exclusive lock of ``run_id`` and ``party`` (other processes wait)."""
        lock = self.path(run_id, party).with_suffix(".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def load(self, run_id: int, party: str) -> RecordDict | None:
        """The state last saved for ``run_id`` and ``party``, or None if there is none.

        Raises:
            ValueError: the file exists but does not parse (never silently a
                fresh state: that would rewind the party's counters), or it
                records another party.
        """
        path = self.path(run_id, party)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        proto = ProtoRecordDict()
        try:
            proto.ParseFromString(data)
            state = recorddict_from_proto(proto)
        except Exception as error:  # noqa: BLE001 - any failure means the file is unusable
            raise ValueError(f"the party's state file {str(path)!r} does not parse "
                             f"({type(error).__name__}); the party refuses to continue this "
                             "run rather than start its counters again. Restore the file, or "
                             "leave the run.") from None
        owner = state[VERSION_KEY].get("party") if VERSION_KEY in state else None
        if owner != party:
            raise ValueError(f"the state file {str(path)!r} records party {owner!r}, not "
                             f"{party!r}; each party needs its own state folder.")
        return state

    def save(self, run_id: int, party: str, state: RecordDict) -> None:
        """Write ``state`` as the file of ``run_id`` and ``party``, atomically, and forget
        old runs."""
        check_private_folder(self.folder, "the party's state folder")
        path = self.path(run_id, party)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        data = recorddict_to_proto(state).SerializeToString()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._forget_old_runs(path)

    def _forget_old_runs(self, newest: pathlib.Path) -> None:
        runs: dict[str, float] = {}  # run id -> when it last wrote (any party)
        for p in self.folder.glob(f"run-*{_SUFFIX}"):
            run = p.name.split("-")[1]
            runs[run] = max(runs.get(run, 0.0), p.stat().st_mtime)
        current = newest.name.split("-")[1]
        old = sorted((r for r in runs if r != current), key=runs.get, reverse=True)
        for run in old[self.keep - 1:]:
            for p in self.folder.glob(f"run-{run}-*"):
                p.unlink(missing_ok=True)


def store_of(context: Context, folder: str | Callable[[Context], str] | None
             ) -> PartyStore | None:
    """The party's `PartyStore`: the node config's ``state-dir``, else ``folder``; None
    without either."""
    where = context.node_config.get(NODE_CONFIG_KEY)
    if where is None:
        where = folder(context) if callable(folder) else folder
    return PartyStore(str(where)) if where else None


def restore_newest(context: Context, store: PartyStore, party: str) -> int:
    """Make ``context.state`` the newest of itself and the store's copy; its version."""
    saved = store.load(context.run_id, party)
    if saved is not None and state_version(saved) > state_version(context.state):
        for key in list(context.state.keys()):
            del context.state[key]
        for key, record in saved.items():
            context.state[key] = record
    return state_version(context.state)


def durable_state_mod(folder: str | Callable[[Context], str] | None = None,
                      party: Callable[[Context], str] | None = None
                      ) -> Callable[[Message, Context, Any], Message]:
    """A Flower ClientApp mod that keeps ``context.state`` in a `PartyStore`.

    Args:
        folder: the party's state folder, or ``folder(context)`` returning it;
            the node config key ``state-dir`` takes precedence. With neither,
            the mod does nothing.
        party: ``party(context)`` -> the party's name (letters, digits, '_',
            '.', '-'); default `default_party` (the node config's ``party``
            or ``partition-id``).

    Returns:
        A mod for ``ClientApp(mods=[...])``: the newest of the node state and
        the file is what the handler sees, and the state it leaves is written
        (with the next version) before the reply is returned. A handler that
        raises writes nothing.
    """

    def mod(msg: Message, context: Context, call_next: Any) -> Message:
        store = store_of(context, folder)
        if store is None:
            return call_next(msg, context)
        name = (party or default_party)(context)
        with store.locked(context.run_id, name):
            version = restore_newest(context, store, name)
            reply = call_next(msg, context)
            version = max(version, state_version(context.state)) + 1
            context.state[VERSION_KEY] = ConfigRecord({"version": version, "party": name})
            store.save(context.run_id, name, context.state)
        return reply

    return mod
