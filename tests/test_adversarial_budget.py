"""Issue 18, cases 3-6: a `PrivacyBudget` a party can trust, tried as an attacker would.

3. A reply that carries anything without DP (BatchNormalization statistics and the data size,
   with ``batch_norm="average"``) never fits a client's budget: its composed eps is inf.
4. A party restarted within a run (fresh node state, same run id) still counts what it sent in
   that run: a release is added to its run's entry (numbered after the run's largest release
   number), never overwriting it; folding a run's releases into one entry keeps the composed
   eps exactly and the file small.
5. Runs that share the file, in real concurrent processes, never spend past the cap together
   and never lose an entry (check and record are one step under a lock on the file's folder,
   which removing files beside the budget does not break; the replace is synced).
6. A symlinked path is followed consistently (the real file is locked and replaced); a relative
   path and a file with two names (hard links) are refused; a file with negative, non-integer
   or out-of-range contents, or nested too deeply, is unreadable, never accepted.

The Flower client apps are called directly (``app(message, context)``), as a SuperNode would
call them, without starting Flower.
"""

import json
import math
import multiprocessing
import os
import stat
import time

import keras
import numpy as np
import pytest

from keras_fedpriv.mechanisms.ledger import CLIENT, ReleaseKind, ReleaseLedger
from keras_fedpriv.mechanisms.randomized_response import randomized_response_dp_event
from keras_fedpriv.privacy import BudgetExhausted, PrivacyBudget, privacy_report

pytestmark = pytest.mark.timeout(300)

KIND = ReleaseKind("test RR", "client data", CLIENT, randomized_response_dp_event(2.0))
RUN, NODE = 1, 7


def _ledger(count, unit=0):
    ledger = ReleaseLedger()
    ledger.record(KIND, [unit], count=count)
    return ledger


def _eps(event, count):
    """The composed eps of ``count`` releases of ``event`` about one unit (delta 1e-5)."""
    ledger = ReleaseLedger()
    ledger.record(ReleaseKind("test", "client data", CLIENT, event), [0], count=count)
    return privacy_report(_Holder(ledger), delta=1e-5).epsilon


class _Holder:
    def __init__(self, ledger):
        self.ledger = ledger

    def privacy_ledger(self):
        return self.ledger


def _cap_allowing(event, count):
    """A cap that lets exactly ``count`` releases of ``event`` out."""
    low, high = _eps(event, count), _eps(event, count + 1)
    assert low < high
    return (low + high) / 2


# ------------------------------------------------------------------ Flower, called directly
@pytest.fixture
def flower(monkeypatch):
    """Flower builds a Message only inside a run: a stand-in run for these tests."""
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", RUN)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0)
    import flwr.app

    yield flwr.app
    _forget_the_process_cache()


def _context(flower, node_config):
    return flower.Context(run_id=RUN, node_id=NODE, node_config=dict(node_config),
                          state=flower.RecordDict(), run_config={})


RNG = np.random.default_rng(0)
HX = RNG.normal(size=(32, 6)).astype("float32")
HY = RNG.integers(0, 3, size=32).astype("int32")


def bn_model_fn():
    """A small classifier with BatchNormalization (seeded initializers)."""
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([keras.Input((6,)),
                              keras.layers.Dense(32, kernel_initializer=init(seed=0)),
                              keras.layers.BatchNormalization(),
                              keras.layers.Dense(3, kernel_initializer=init(seed=1))])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _train_message(flower, model, rnd):
    from keras_fedpriv.federated.horizontal.parties import batch_norm_statistics

    content = flower.RecordDict({
        "weights": flower.ArrayRecord(numpy_ndarrays=[v.numpy()
                                                      for v in model.trainable_variables]),
        "config": flower.ConfigRecord({"round": rnd, "local-epochs": 1})})
    content["batch-norm"] = flower.ArrayRecord(
        numpy_ndarrays=[v.numpy() for v in batch_norm_statistics(model)])
    return flower.Message(content, dst_node_id=NODE, message_type="train")


def _horizontal_app(eps, tmp_path, **kwargs):
    from keras_fedpriv.federated.flower import horizontal_client_app
    from keras_fedpriv.optimizers import SignDSEncoder

    return horizontal_client_app(bn_model_fn, lambda ctx: (HX, HY),
                                 lambda: SignDSEncoder(k=0.2, eps=eps), seed=1,
                                 budget_path=str(tmp_path / "client.json"), **kwargs)


def _forget_the_process_cache():
    """A restarted SuperNode process: no cached client or follower of this run."""
    from keras_fedpriv.federated.flower.horizontal import _caches
    from keras_fedpriv.federated.flower.vertical import _followers

    _caches()[1].pop((RUN, NODE), None)
    _followers().pop((RUN, NODE), None)


def test_case3_a_reply_with_batch_norm_statistics_in_the_clear_never_fits_a_budget(flower,
                                                                                 tmp_path):
    """Case 3: SignDS at eps 1 against a cap of 3 fits, but the reply would also carry the BN
    statistics and num-examples without DP: the client's budget says inf, as the server's
    report does, and the reply is an error that carries neither."""
    model = bn_model_fn()
    app = _horizontal_app(1.0, tmp_path, max_epsilon=3.0, batch_norm="average")
    context = _context(flower, {"partition-id": 0})
    reply = app(_train_message(flower, model, 0), context)
    assert reply.has_error() and reply.error.code == 2
    assert "privacy budget is spent" in reply.error.reason
    assert not os.path.exists(tmp_path / "client.json")  # nothing was recorded as sent
    # FedBN (batch_norm="local") keeps the statistics: the same SignDS reply fits
    _forget_the_process_cache()
    app = _horizontal_app(1.0, tmp_path, max_epsilon=3.0, batch_norm="local")
    reply = app(_train_message(flower, model, 0), _context(flower, {"partition-id": 0}))
    assert not reply.has_error()
    assert set(reply.content.keys()) == {"upload", "config"}
    saved = PrivacyBudget(3.0, path=str(tmp_path / "client.json")).past()
    assert [saved.total(kind) for kind in saved.kinds] == [1]


def test_case4_a_horizontal_client_restarted_within_a_run_sends_no_more_than_the_cap(flower,
                                                                                   tmp_path):
    """Case 4: the cap allows 2 SignDS replies; the node state is lost after them (same run
    id); the restarted client must refuse, not skip and overwrite the run's entry."""
    from keras_fedpriv.optimizers import SignDSEncoder

    model = bn_model_fn()
    cap = _cap_allowing(SignDSEncoder(k=0.2, eps=1.0).dp_event(), 2)
    app = _horizontal_app(1.0, tmp_path, max_epsilon=cap, batch_norm="local")
    sent = []
    for life in range(2):  # the first process, then the restarted one
        context = _context(flower, {"partition-id": 0})  # fresh node state, same run id
        for rnd in range(3):
            reply = app(_train_message(flower, model, rnd), context)
            sent.append((life, reply.error.code if reply.has_error() else "sent"))
        _forget_the_process_cache()
    # code 2: refused by the budget (code 1 would be a failure)
    assert sent == [(0, "sent"), (0, "sent"), (0, 2), (1, 2), (1, 2), (1, 2)]
    budget = PrivacyBudget(cap, path=str(tmp_path / "client.json"))
    entries = json.loads((tmp_path / "client.json").read_text())["entries"]
    assert [(e["run"], e["release"]) for e in entries] == [(str(RUN), 1)]  # releases 0 and 1
    assert budget.epsilon(ReleaseLedger()) <= cap


def _follower_fn(party):
    import keras_fedpriv as kf
    from keras_fedpriv.federated import VerticalModel

    def bottom(k, seed):
        return keras.Sequential([keras.Input((k,)), keras.layers.Dense(
            4, kernel_initializer=keras.initializers.GlorotUniform(seed=seed))])

    top = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")])
    model = VerticalModel({"f1": bottom(3, 0), "lead": bottom(2, 1)}, top, leader="lead",
                          embedding_dp=kf.EmbeddingDPLayer(eps=1.0),
                          label_dp=kf.LabelDPLayer(eps=2.0))
    model.compile("sgd", "binary_crossentropy")
    return model.split_parties().followers[party]


def test_case4_a_vertical_follower_restarted_within_a_run_sends_no_more_than_the_cap(flower,
                                                                                   tmp_path):
    """Case 4, vertical: per record, the cap allows each example to be embedded twice."""
    import keras_fedpriv as kf
    from keras_fedpriv.federated.flower.vertical import vertical_client_app

    features = RNG.normal(size=(16, 3)).astype("float32")
    cap = _cap_allowing(kf.EmbeddingDPLayer(eps=1.0).dp_event(4), 2)
    app = vertical_client_app(_follower_fn, lambda party: features, max_epsilon=cap,
                              budget_path=str(tmp_path / "follower.json"))
    ids = flower.ArrayRecord({"0/ids": flower.Array(np.arange(8, dtype=np.int64))})
    sent = []
    for life in range(2):
        context = _context(flower, {"party": "f1"})  # fresh node state, same run id
        for step in range(3):
            message = flower.Message(flower.RecordDict({
                "ids": ids, "config": flower.ConfigRecord({"epoch": life, "step": step})}),
                dst_node_id=NODE, message_type="train")
            reply = app(message, context)
            sent.append((life, "embedding" in reply.content))
            if "embedding" not in reply.content:
                assert "BudgetExhausted" in reply.content["error"]["reason"]
        _forget_the_process_cache()
    assert sent == [(0, True), (0, True), (0, False), (1, False), (1, False), (1, False)]
    budget = PrivacyBudget(cap, path=str(tmp_path / "follower.json"), per_record=True)
    assert budget.epsilon(ReleaseLedger()) <= cap
    counts = [c for kind in budget.past().to_dict()["kinds"] for c in kind["units"].values()]
    assert sorted(counts) == [2] * 8  # every example embedded twice, none a third time


def _entry(run, release, ledger):
    return {"run": run, "release": release, "ledger": ledger.to_dict()}


def test_case4_folding_a_long_run_keeps_the_composed_eps_exactly_and_the_file_small(tmp_path):
    """Case 4 at scale: a vertical follower's file of 400 releases (batches of 32 of 64 records,
    in two runs) is folded into one entry per run at the next release. The counts per kind and
    record are exactly those of every release, so the composed eps is the same number; a
    release that carries nothing writes nothing."""
    import keras_fedpriv as kf

    kind = ReleaseKind("EmbeddingDPLayer 'f1'", "features", "example",
                       kf.EmbeddingDPLayer(eps=1.0).dp_event(4))

    def batch(i):
        ledger = ReleaseLedger()
        ledger.record(kind, (np.arange(32) + 32 * i) % 64)
        return ledger

    path = tmp_path / "follower.json"
    path.write_text(json.dumps({"version": 2, "entries": [
        _entry("1" if i < 300 else "2", i if i < 300 else i - 300, batch(i)) for i in range(400)]}))
    unfolded_size = path.stat().st_size
    budget = PrivacyBudget(1e9, path=str(path), per_record=True)
    eps = budget.reserve(batch(400), run_id=2)  # composed from the 400 entries as written
    assert math.isfinite(eps) and eps > 0
    entries = json.loads(path.read_text())["entries"]
    assert [(e["run"], e["release"]) for e in entries] == [("1", 299), ("2", 100)]
    assert path.stat().st_size < unfolded_size / 50
    counts = budget.past().to_dict()["kinds"]
    assert len(counts) == 1 and counts[0]["units"] == {str(r): 201 if r < 32 else 200
                                                       for r in range(64)}
    assert budget.epsilon(ReleaseLedger()) == eps  # the same counts compose to the same eps
    before = path.read_bytes()
    budget.reserve(batch(1), run_id=2, before=batch(1))  # a gradient-only request: nothing new
    assert path.read_bytes() == before


def test_case4_a_release_is_numbered_after_the_largest_number_of_its_run(tmp_path):
    """Case 4: numbering a run's release by its count of entries repeats a number after a gap
    (entries 0 and 2: the next was numbered 2), and a repeated entry makes the file unreadable:
    every later release of every run refused."""
    path = tmp_path / "budget.json"
    path.write_text(json.dumps({"version": 2, "entries": [_entry("1", 0, _ledger(1)),
                                                          _entry("1", 2, _ledger(1))]}))
    budget = PrivacyBudget(100.0, path=str(path))
    budget.reserve(_ledger(1), run_id=1)
    budget.reserve(_ledger(1), run_id=2)
    entries = json.loads(path.read_text())["entries"]
    assert [(e["run"], e["release"]) for e in entries] == [("1", 3), ("2", 0)]
    assert budget.past().total(KIND) == 4


# ------------------------------------------------------------------ concurrent processes
def _spend_until_refused(path, cap, barrier, results):
    """One run sharing the budget file: reserve releases until the budget refuses."""
    budget = PrivacyBudget(cap, path=path)
    barrier.wait(timeout=120)
    sent = 0
    for _ in range(4):
        try:
            budget.reserve(_ledger(1), run_id=f"run-{os.getpid()}")
        except BudgetExhausted:
            break
        sent += 1
    results.put(sent)


def _save_one(path, barrier, results):
    """One run recording one release (unchecked) in the shared file."""
    barrier.wait(timeout=120)
    PrivacyBudget(100.0, path=path).save(_ledger(1), run_id=f"run-{os.getpid()}")
    results.put(1)


def _in_processes(target, args, count):
    """Run ``target(*args, barrier, results)`` in ``count`` processes started together; the
    values they put, or a failure if any process fails or overruns."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["keras_fedpriv.privacy.budget", "keras_fedpriv.privacy.report"])
    barrier, results = ctx.Barrier(count), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, results)) for _ in range(count)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 240
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        assert [p.exitcode for p in procs] == [0] * count  # all ended, none failed
        return [results.get(timeout=10) for _ in range(count)]
    finally:
        for p in procs:  # only the processes this test started, and only if still running
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)


@pytest.mark.slow
def test_case5_runs_sharing_the_file_never_spend_past_the_cap_together(tmp_path):
    """Case 5: 12 runs in 12 processes race for a cap that allows 6 releases in all."""
    path = str(tmp_path / "shared.json")
    cap = _cap_allowing(KIND.event, 6)
    sent = _in_processes(_spend_until_refused, (path, cap), 12)
    assert sum(sent) == 6
    budget = PrivacyBudget(cap, path=path)
    assert budget.past().total(KIND) == 6  # every release that was let out is in the file
    entries = json.loads(open(path).read())["entries"]  # one per run, numbered 0, 1, ...
    assert sum(e["release"] + 1 for e in entries) == 6
    assert budget.epsilon(ReleaseLedger()) <= cap


@pytest.mark.slow
def test_case5_concurrent_saves_lose_no_entry(tmp_path):
    """Case 5: 16 runs record a release each at the same moment: 16 entries, none lost."""
    path = str(tmp_path / "shared.json")
    assert sum(_in_processes(_save_one, (path,), 16)) == 16
    assert PrivacyBudget(100.0, path=path).past().total(KIND) == 16


def _hold_the_lock(path, cap, inside, go, results):
    """A run that takes the budget's lock and keeps it (between its read and its record) until
    ``go`` is set."""
    budget = PrivacyBudget(cap, path=path)
    composed = budget._composed

    def slow(entries, release):
        inside.set()
        go.wait(timeout=120)
        return composed(entries, release)

    budget._composed = slow
    budget.reserve(_ledger(1), run_id="holder")
    results.put("sent")


@pytest.mark.slow
def test_case5_removing_files_beside_the_budget_while_it_is_locked_lets_no_run_in(tmp_path):
    """Case 5: a cleaner that removes a "stale" lock file while one run holds it let a second
    run take a new lock and spend past the cap. The lock is on the folder that holds the file:
    the second run waits (here: gives up, refused), and the cap allowing 1 holds."""
    path = str(tmp_path / "budget.json")
    cap = _cap_allowing(KIND.event, 1)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["keras_fedpriv.privacy.budget", "keras_fedpriv.privacy.report"])
    inside, go, results = ctx.Event(), ctx.Event(), ctx.Queue()
    holder = ctx.Process(target=_hold_the_lock, args=(path, cap, inside, go, results))
    holder.start()
    try:
        assert inside.wait(timeout=120)
        for name in os.listdir(tmp_path):
            if name.endswith(".lock"):
                os.unlink(tmp_path / name)
        late = PrivacyBudget(cap, path=path)
        late.lock_timeout = 0.5
        with pytest.raises(BudgetExhausted, match="stayed locked"):
            late.reserve(_ledger(1), run_id="late")
        go.set()
        holder.join(timeout=120)
        assert holder.exitcode == 0 and results.get(timeout=10) == "sent"
    finally:
        go.set()
        if holder.is_alive():  # only the process this test started
            holder.terminate()
            holder.join(timeout=10)
    assert PrivacyBudget(cap, path=path).past().total(KIND) == 1


def test_case5_the_replace_is_synced_with_its_folder(tmp_path, monkeypatch):
    """Case 5: after the atomic replace, the folder is synced, so the new name survives a
    crash (the file alone being synced is not enough)."""
    path = tmp_path / "budget.json"
    synced = []
    fsync = os.fsync

    def recording(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append((os.path.samestat(os.fstat(fd), os.stat(tmp_path)),
                           path.exists() and PrivacyBudget(9.0, path=str(path)).past()
                           .total(KIND)))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    PrivacyBudget(9.0, path=str(path)).reserve(_ledger(1), run_id=1)
    assert synced == [(True, 1)]  # this folder, after the replace


# ------------------------------------------------------------------ symlinks, malformed files
def test_case6_a_symlinked_path_is_followed_and_the_real_file_is_updated(tmp_path):
    """Case 6: os.replace on the link would turn it into a file of its own and split the
    budget; the budget resolves the link once and replaces (and locks) the real file."""
    real = tmp_path / "real" / "budget.json"
    real.parent.mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(real)
    cap = _cap_allowing(KIND.event, 3)
    via_link = PrivacyBudget(cap, path=str(link))
    via_real = PrivacyBudget(cap, path=str(real))
    via_link.save(_ledger(1), run_id=1)
    via_real.save(_ledger(1), run_id=2)
    assert link.is_symlink() and os.path.realpath(link) == str(real)
    assert via_link.past().total(KIND) == via_real.past().total(KIND) == 2
    via_link.reserve(_ledger(1), run_id=3)
    assert link.is_symlink() and os.path.realpath(link) == str(real)
    assert sorted(os.listdir(tmp_path)) == ["link.json", "real"]  # nothing beside the link
    with pytest.raises(BudgetExhausted):  # one budget, whichever path the 4th release takes
        via_real.reserve(_ledger(1), run_id=4)
    with pytest.raises(BudgetExhausted):
        via_link.reserve(_ledger(1), run_id=4)
    assert PrivacyBudget(cap, path=str(link)).past().total(KIND) == 3
    assert via_link.path == str(link)  # the path as given; the real file is what is used


def test_case6_a_budget_file_with_two_names_refuses(tmp_path):
    """Case 6: a hard link is a second name for the file; the atomic replace gives one name a
    new file and leaves the other with the old count, so the two names split the budget."""
    real, alias = tmp_path / "budget.json", tmp_path / "alias.json"
    cap = _cap_allowing(KIND.event, 3)
    PrivacyBudget(cap, path=str(real)).reserve(_ledger(1), run_id=0)
    os.link(real, alias)
    for i, name in enumerate([alias, real, alias, real]):
        with pytest.raises(BudgetExhausted, match=f"{str(name)!r} has 2 names"):
            PrivacyBudget(cap, path=str(name)).reserve(_ledger(1), run_id=i + 1)
    alias.unlink()  # one name again: the budget goes on from the one release
    assert PrivacyBudget(cap, path=str(real)).past().total(KIND) == 1


def test_case6_a_relative_path_is_refused(tmp_path, monkeypatch):
    """Case 6: a relative path names a different file from each working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="`path` must be an absolute path.*'budget.json'"):
        PrivacyBudget(8.0, path="budget.json")
    assert os.listdir(tmp_path) == []


def _kinds(state):
    return state["kinds"][0]


@pytest.mark.parametrize("tamper", [
    pytest.param(lambda s: _kinds(s)["units"].update({"0": -5}), id="negative unit count"),
    pytest.param(lambda s: _kinds(s).update(everyone=-1), id="negative anonymous count"),
    pytest.param(lambda s: _kinds(s)["units"].update({"0": 2.5}), id="non-integer count"),
    pytest.param(lambda s: _kinds(s)["units"].update({"0": "3"}), id="count as text"),
    pytest.param(lambda s: _kinds(s)["units"].update({"0": True}), id="count as bool"),
    pytest.param(lambda s: _kinds(s)["units"].update({"x": 1}), id="unit id not an integer"),
    pytest.param(lambda s: _kinds(s)["event"].update(noise_parameter=1.5),
                 id="randomized response out of range"),
    pytest.param(lambda s: _kinds(s).update(event={"type": "gaussian", "noise_multiplier": -1}),
                 id="negative gaussian noise"),
    pytest.param(lambda s: _kinds(s).update(event={"type": "mystery", "eps": 0.0}),
                 id="unknown event"),
    pytest.param(lambda s: _kinds(s).update(event={"type": "laplace",
                                                   "noise_multiplier": float("nan")}),
                 id="NaN noise"),
    pytest.param(lambda s: _kinds(s).update(unit="household"), id="unknown unit"),
    pytest.param(lambda s: _kinds(s).update(extra=1), id="unknown key"),
])
@pytest.mark.parametrize("layout", ["runs", "entries"])
def test_case6_a_well_formed_file_with_impossible_contents_is_unreadable(tmp_path, tamper,
                                                                        layout):
    """Case 6: negative counts (which would pay the budget back) and the like are refused
    like any unreadable file, in the old one-ledger-per-run layout and in the entries one."""
    state = _ledger(2).to_dict()
    tamper(state)
    if layout == "runs":
        content = {"runs": {"1": state}}
    else:
        content = {"version": 2, "entries": [{"run": "1", "release": 0, "ledger": state}]}
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(content))
    with pytest.raises(BudgetExhausted, match="cannot be read"):
        PrivacyBudget(50.0, path=str(path)).check(_ledger(1))
    with pytest.raises(BudgetExhausted, match="cannot be read"):
        PrivacyBudget(50.0, path=str(path)).reserve(_ledger(1), run_id=2)
    assert json.loads(path.read_text()) == json.loads(json.dumps(content))  # left as it was


@pytest.mark.parametrize("content", [
    '{"version": 2, "entries": [{"run": "1", "release": 0, "ledger": {"kinds": []}},'
    ' {"run": "1", "release": 0, "ledger": {"kinds": []}}]}',
    '{"version": 2, "entries": [{"run": "1", "release": -1, "ledger": {"kinds": []}}]}',
    '{"version": 2, "version": 2, "entries": []}',
    '{"version": 3, "entries": []}',
    '{"version": 2, "entries": [], "runs": {}}',
    '{"version": 2, "entries": ' + "[" * 100000 + "]" * 100000 + "}",
], ids=["repeated entry", "negative release number", "repeated key", "unknown version",
        "both layouts", "nested too deeply"])
def test_case6_a_malformed_entries_file_is_unreadable(tmp_path, content):
    path = tmp_path / "budget.json"
    path.write_text(content)
    with pytest.raises(BudgetExhausted, match="cannot be read"):
        PrivacyBudget(50.0, path=str(path)).reserve(_ledger(1), run_id=2)
