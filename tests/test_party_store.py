"""The party's durable node state: newest wins, written before the reply, private files."""

import os

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict  # noqa: E402

from keras_fedpriv.federated.flower.party_store import (  # noqa: E402
    PartyStore,
    durable_state_mod,
    state_version,
)

pytestmark = [pytest.mark.jax]


@pytest.fixture()
def folder(tmp_path):
    path = tmp_path / "party"
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    return path


def _context(folder, run_id=7, node_id=1, state=None, party="f1"):
    return Context(run_id=run_id, node_id=node_id,
                   node_config={"state-dir": str(folder), "party": party},
                   state=state if state is not None else RecordDict(), run_config={})


def _count(msg, context):
    """A handler that advances a counter in the node state, as a party does per release."""
    n = int(context.state["c"]["n"]) if "c" in context.state else 0
    context.state["c"] = ConfigRecord({"n": n + 1})
    return f"reply {n + 1}"


def test_a_restarted_node_continues_from_the_file_and_never_rewinds(folder):
    mod = durable_state_mod()
    first = _context(folder)
    assert [mod(None, first, _count) for _ in range(3)] == ["reply 1", "reply 2", "reply 3"]
    # a SuperNode restarted: a new node id and an empty node state
    again = _context(folder, node_id=99)
    assert mod(None, again, _count) == "reply 4"
    assert state_version(again.state) == 4
    # a node state behind the file (a reply that never reached the SuperNode) is replaced
    behind = _context(folder, state=RecordDict({
        "keras-fedpriv-store": ConfigRecord({"version": 2}), "c": ConfigRecord({"n": 2})}))
    assert mod(None, behind, _count) == "reply 5"


def test_the_state_is_written_before_the_reply_is_returned(folder):
    store = PartyStore(str(folder))
    seen = []

    def handler(msg, context):
        context.state["x"] = ArrayRecord(numpy_ndarrays=[np.arange(4)])
        seen.append(store.load(7, "f1"))
        return "r"

    mod = durable_state_mod()
    mod(None, _context(folder), handler)
    assert seen == [None]  # nothing on disk while the handler ran
    saved = store.load(7, "f1")
    assert saved["x"].to_numpy_ndarrays()[0].tolist() == [0, 1, 2, 3]
    assert state_version(saved) == 1


def test_a_handler_that_raises_writes_nothing(folder):
    def boom(msg, context):
        context.state["c"] = ConfigRecord({"n": 100})
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        durable_state_mod()(None, _context(folder), boom)
    assert PartyStore(str(folder)).load(7, "f1") is None


def test_files_are_private_and_runs_are_separate(folder):
    mod = durable_state_mod()
    for run in (1, 2, 3, 4):
        mod(None, _context(folder, run_id=run), _count)
    files = sorted(p.name for p in folder.iterdir())
    assert files == [f"run-{r}-f1.{e}" for r in (2, 3, 4) for e in ("lock", "state")]  # keep=3
    assert all(os.stat(folder / f).st_mode & 0o777 == 0o600 for f in files)
    # a new run starts its own state, never another run's
    assert mod(None, _context(folder, run_id=5), _count) == "reply 1"


def test_bad_folders_and_files_are_refused_with_the_reason(folder, tmp_path):
    with pytest.raises(ValueError, match="absolute path"):
        PartyStore("relative/dir")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o755)
    with pytest.raises(PermissionError, match="the party's state folder .* mode 755"):
        PartyStore(str(open_dir))
    (folder / "run-7-f1.state").write_bytes(b"\xff\xfe not a record")
    os.chmod(folder / "run-7-f1.state", 0o600)
    with pytest.raises(ValueError, match="does not parse"):
        durable_state_mod()(None, _context(folder), _count)


def test_without_a_folder_the_mod_does_nothing(tmp_path):
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    assert durable_state_mod()(None, context, _count) == "reply 1"
    assert state_version(context.state) == 0


def test_two_parties_sharing_a_folder_never_get_each_others_state(folder):
    mod = durable_state_mod()
    for _ in range(3):
        mod(None, _context(folder, party="f1"), _count)
    # f2 starts on the same folder by mistake: it gets a state of its own, not f1's
    assert mod(None, _context(folder, party="f2", node_id=2), _count) == "reply 1"
    assert mod(None, _context(folder, party="f1", node_id=3), _count) == "reply 4"
    # a file renamed to another party is refused, never loaded as that party's
    os.replace(folder / "run-7-f1.state", folder / "run-7-f3.state")
    with pytest.raises(ValueError, match="records party 'f1', not 'f3'"):
        mod(None, _context(folder, party="f3"), _count)


def test_a_node_config_without_a_party_name_is_refused(folder):
    context = Context(run_id=1, node_id=1, node_config={"state-dir": str(folder)},
                      state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="'party' or 'partition-id'"):
        durable_state_mod()(None, context, _count)
    named = Context(run_id=1, node_id=1, node_config={"state-dir": str(folder),
                                                      "partition-id": 3},
                    state=RecordDict(), run_config={})
    assert durable_state_mod()(None, named, _count) == "reply 1"
    assert (folder / "run-1-partition-3.state").exists()
    with pytest.raises(ValueError, match="party name"):
        durable_state_mod(party=lambda c: "../f1")(None, _context(folder), _count)


def test_two_live_nodes_of_one_party_take_turns_and_never_reuse_a_state(folder):
    """A restarted SuperNode and its predecessor answering a late message at once: the
    second one waits for the first one's state, so no counter value is used twice."""
    import threading

    mod = durable_state_mod()
    entered, release = threading.Event(), threading.Event()
    replies = {}

    def slow(msg, context):
        entered.set()
        assert release.wait(timeout=60)
        return _count(msg, context)

    old = threading.Thread(target=lambda: replies.setdefault(
        "old", mod(None, _context(folder, node_id=1), slow)))
    old.start()
    assert entered.wait(timeout=60)
    new = threading.Thread(target=lambda: replies.setdefault(
        "new", mod(None, _context(folder, node_id=2), _count)))
    new.start()
    new.join(timeout=0.5)
    assert new.is_alive()  # waiting for the lock, not drawing from the same state
    release.set()
    old.join(timeout=60)
    new.join(timeout=60)
    assert replies == {"old": "reply 1", "new": "reply 2"}
    assert int(PartyStore(str(folder)).load(7, "f1")["c"]["n"]) == 2
