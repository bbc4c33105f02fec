"""The party worker and the relay ClientApp (keras_fedpriv/federated/flower/worker.py).

Stub ClientApps run in a worker thread of this process (no TensorFlow in them);
the test app's real ClientApp runs in one worker subprocess shared by the
module; a second subprocess serves the empty app to check SIGTERM. Every
process is started here, bounded in time and stopped by its pid.
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict  # noqa: E402
from flwr.app.message.message import make_message  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402

from keras_fedpriv.federated.flower import worker as w  # noqa: E402

from flower_stubs import APP, load_test_app  # noqa: E402

pytestmark = [pytest.mark.jax, pytest.mark.flower, pytest.mark.timeout(300)]

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
       "PYTHONPATH": os.pathsep.join([str(APP.parents[1]), os.environ.get("PYTHONPATH", "")])}


def _message(kind, content, run_id=7, node_id=5):
    metadata = Metadata(run_id=run_id, message_id=f"m-{kind}", src_node_id=0, dst_node_id=node_id,
                        reply_to_message_id="", group_id="1", created_at=time.time(), ttl=600.0,
                        message_type=kind)
    return make_message(metadata=metadata, content=content)


def _context(socket_path=None, run_id=7, partition=0):
    config = {"partition-id": partition, "num-partitions": 3}
    if socket_path is not None:
        config[w.SOCKET_KEY] = socket_path
    return Context(run_id=run_id, node_id=5, node_config=config, state=RecordDict(),
                   run_config={})


def _private_dir():
    return tempfile.mkdtemp(prefix="kfpw-")  # mode 0700, short (a socket path has <= 108 B)


# --------------------------------------------------------------------------- stub apps, one thread
stub = ClientApp()


@stub.query()
def _echo(msg, context):
    seen = context.state["seen"]["n"] + 1 if "seen" in context.state else 1
    context.state["seen"] = ConfigRecord({"n": seen})
    return Message(RecordDict({"echo": msg.content["config"]}), reply_to=msg)


@stub.train()
def _fail(msg, context):
    context.state["half-done"] = ConfigRecord({"x": 1})
    raise ValueError(f"label 7 of row {msg.content['config']['secret']}")


@stub.evaluate()
def _no_reply(msg, context):
    context.state["half-done"] = ConfigRecord({"x": 1})
    return None  # an app bug: no Message


IN_HANDLER = []  # how many messages the stub is handling at once, sampled in `_slow`


@stub.query("slow")
def _slow(msg, context):
    IN_HANDLER.append(1)
    try:
        time.sleep(0.5)
        return Message(RecordDict({"echo": ConfigRecord({"busy": len(IN_HANDLER)})}), reply_to=msg)
    finally:
        IN_HANDLER.pop()


BLOCK = threading.Event()       # `_blocked` waits for it
IN_BLOCK = threading.Event()    # set while `_blocked` is in the ClientApp


@stub.query("block")
def _blocked(msg, context):
    IN_BLOCK.set()
    try:
        assert BLOCK.wait(timeout=120), "the test never released the handler"
        return Message(RecordDict({"echo": ConfigRecord({"done": 1})}), reply_to=msg)
    finally:
        IN_BLOCK.clear()


def _serve_in_thread(**kwargs):
    """A stub worker serving in a thread of this process: (worker, its thread, its folder)."""
    folder = _private_dir()
    worker = w.PartyWorker("tests:stub", os.path.join(folder, "s.sock"), client_app=stub,
                           max_frame=1 << 16, **kwargs).listen()
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    return worker, thread, folder


def _stop_in_thread(worker, thread, folder):
    worker.stop_event.set()
    thread.join(timeout=120)
    assert not thread.is_alive()
    os.rmdir(folder)


def _wait_for(condition, what, seconds=60):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def stub_worker():
    folder = _private_dir()
    worker = w.PartyWorker("tests:stub", os.path.join(folder, "s.sock"), client_app=stub,
                           max_frame=1 << 16, read_timeout=2.0).listen()
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    yield worker
    worker.stop_event.set()
    thread.join(timeout=10)
    os.rmdir(folder)
    assert not thread.is_alive()


def _raw(path, data, shutdown=True):
    """Send raw bytes to the worker; return its reply frame's header."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(path)
        conn.sendall(data)
        if shutdown:
            conn.shutdown(socket.SHUT_WR)
        header, _, _ = w._read_frame(conn, 1 << 20)
    return json.loads(header)


def test_the_relay_carries_the_message_and_brings_back_the_reply_and_state(stub_worker):
    path = str(stub_worker.socket_path)
    context = _context(path)
    app = w.relay_client_app("tests:stub")
    for expected in (1, 2):
        reply = app(_message("query", RecordDict({"config": ConfigRecord({"a": 3})})), context)
        assert not reply.has_error()
        assert reply.content["echo"]["a"] == 3
        assert reply.metadata.reply_to_message_id == "m-query"
        assert context.state["seen"]["n"] == expected  # the worker's state came back
    assert w.ping(path) == "tests:stub"


def test_a_handler_exception_is_an_error_reply_that_names_only_its_type(stub_worker):
    context = _context(str(stub_worker.socket_path))
    reply = w.relay_client_app("tests:stub")(
        _message("train", RecordDict({"config": ConfigRecord({"secret": 9431})})), context)
    assert reply.has_error()
    assert "ValueError" in reply.error.reason
    assert "9431" not in reply.error.reason and "label" not in reply.error.reason
    assert "half-done" not in context.state  # a failed message leaves the state as it was
    assert w.ping(str(stub_worker.socket_path)) == "tests:stub"


def test_a_handler_that_returns_no_message_gets_an_error_and_the_worker_keeps_serving(
        stub_worker):
    context = _context(str(stub_worker.socket_path))
    reply = w.relay_client_app("tests:stub")(
        _message("evaluate", RecordDict({"config": ConfigRecord({})})), context)
    assert reply.has_error() and "TypeError" in reply.error.reason
    assert "half-done" not in context.state
    assert w.ping(str(stub_worker.socket_path)) == "tests:stub"


def test_without_a_worker_a_failed_handler_keeps_no_state_and_its_text_stays_local():
    """The relay runs the target in its own process: as with a worker, the reply names the
    exception's type only and a half-done state is not kept (Flower would store it)."""
    context = _context(None)
    context.state["before"] = ConfigRecord({"n": 1})
    reply = w.relay_client_app(f"{__name__}:stub")(
        _message("train", RecordDict({"config": ConfigRecord({"secret": 9431})})), context)
    assert reply.has_error() and "ValueError" in reply.error.reason
    assert "9431" not in reply.error.reason and "label" not in reply.error.reason
    assert sorted(context.state.keys()) == ["before"] and context.state["before"]["n"] == 1


def test_two_relays_at_once_are_answered_one_after_the_other(stub_worker):
    """A SuperNode may run two ClientApp processes at once (two runs): both are read at
    once, but the ClientApp handles one message at a time (the stub sees itself alone);
    none fails."""
    path, replies = str(stub_worker.socket_path), []

    def one():
        replies.append(w.relay_client_app("tests:stub")(
            _message("query.slow", RecordDict({"config": ConfigRecord({})})), _context(path)))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(replies) == 2 and not any(r.has_error() for r in replies)
    assert [r.content["echo"]["busy"] for r in replies] == [1, 1]


def test_a_request_that_trickles_in_is_cut_off_at_the_read_timeout(stub_worker):
    """A peer that sends a byte now and then cannot hold the worker: the whole request must
    arrive within ``read_timeout`` (2 s here), not each read."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(stub_worker.socket_path))
        conn.sendall(w._HEAD.pack(b"KFW1", 1 << 15))
        answered, deadline = False, time.monotonic() + 60
        while not answered and time.monotonic() < deadline:
            try:
                conn.sendall(b"x")
            except OSError:  # the worker closed the connection
                break
            answered = bool(select.select([conn], [], [], 0.3)[0])
        assert answered, "the worker kept waiting for a trickling request"
        conn.settimeout(30)
        header, _, _ = w._read_frame(conn, 1 << 20)
    assert json.loads(header)["ok"] is False
    assert w.ping(str(stub_worker.socket_path)) == "tests:stub"


def _connect(path):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    return conn


def _answered(conn):
    """Whether the worker has answered (or closed) ``conn`` yet, without waiting."""
    return bool(select.select([conn], [], [], 0)[0])


def _open_stuck_connections(path):
    """Five connections that send nothing and one that stops half-way through a ping."""
    stuck = [_connect(path) for _ in range(5)]
    half = _connect(path)
    stuck.append(half)
    request = w.encode_frame([json.dumps({"kind": "ping"}).encode(), b"", b""])
    half.sendall(request[:len(request) // 2])
    return stuck


def test_silent_and_half_sent_connections_hold_up_no_message():
    """Five connections that send nothing and one that stops half-way through its request
    (a relay killed mid-send) are each read on their own: a ping and a message are answered
    while all six still wait for their read deadline (120 s: far longer than the ping and
    the message take, however loaded the machine). A worker that reads one connection at a
    time answers the ping only after 6 x 120 s, past the ping's 60 s timeout."""
    worker, thread, folder = _serve_in_thread(read_timeout=120.0)
    path = str(worker.socket_path)
    stuck = _open_stuck_connections(path)
    try:
        assert w.ping(path, timeout=60) == "tests:stub"
        reply = w.relay_client_app("tests:stub")(
            _message("query", RecordDict({"config": ConfigRecord({"a": 4})})), _context(path))
        assert not reply.has_error() and reply.content["echo"]["a"] == 4
        assert not any(_answered(c) for c in stuck)  # all six still open and unanswered
    finally:
        for conn in stuck:
            conn.close()
        _stop_in_thread(worker, thread, folder)


def test_silent_and_half_sent_connections_get_a_timeout_reply_at_their_deadline():
    """With a 1 s read timeout, each of the six stuck connections is answered with an error
    that names the read timeout (and the worker still answers a ping after)."""
    worker, thread, folder = _serve_in_thread(read_timeout=1.0)
    path = str(worker.socket_path)
    stuck = _open_stuck_connections(path)
    try:
        for conn in stuck:
            conn.settimeout(120)
            header = json.loads(w._read_frame(conn, 1 << 20)[0])
            assert header["ok"] is False and "read timeout" in header["error"]
        assert w.ping(path, timeout=60) == "tests:stub"
    finally:
        for conn in stuck:
            conn.close()
        _stop_in_thread(worker, thread, folder)


def test_a_large_request_waits_for_the_byte_budget_and_a_ping_does_not():
    """With a budget of one 64 KiB frame, a second large message is not read while the
    first (in the ClientApp) holds its bytes: it waits for the budget, a ping is answered
    meanwhile, and once the first is answered the second is read and handled; at no time
    were more bytes reserved than the budget."""
    BLOCK.clear()
    worker, thread, folder = _serve_in_thread(read_timeout=120.0, max_buffered=1 << 16)
    path, replies, pad = str(worker.socket_path), {}, "x" * 40_000

    def relay(name, kind):
        replies[name] = w.relay_client_app("tests:stub")(
            _message(kind, RecordDict({"config": ConfigRecord({"a": 1, "pad": pad})})),
            _context(path))

    first = threading.Thread(target=relay, args=("first", "query.block"))
    second = threading.Thread(target=relay, args=("second", "query"))
    try:
        first.start()
        assert IN_BLOCK.wait(timeout=60)
        assert 40_000 < worker.budget.reserved <= 1 << 16
        second.start()
        _wait_for(lambda: worker.budget.waiting == 1, "the second message to wait")
        assert w.ping(path, timeout=60) == "tests:stub"  # pings reserve nothing
        assert worker.handled == 0 and "second" not in replies
    finally:
        BLOCK.set()
        for t in (first, second):
            if t.ident is not None:
                t.join(timeout=60)
        _stop_in_thread(worker, thread, folder)
    assert not replies["first"].has_error() and not replies["second"].has_error()
    assert replies["second"].content["echo"]["pad"] == pad and worker.handled == 2
    assert worker.budget.peak <= 1 << 16 and worker.budget.reserved == 0


def test_the_client_app_runs_on_the_thread_that_serves_and_keeps_its_keras_policy():
    """An app that sets a global dtype policy when it is imported (on the main thread, as
    `keras-fedpriv worker` imports it) sees that policy in its handler through the worker:
    Keras keeps it per thread, so a handler run on a connection's thread would see float32."""
    import keras

    policy_app = ClientApp()

    @policy_app.query()
    def _policy(msg, context):
        return Message(RecordDict({"c": ConfigRecord({
            "policy": keras.mixed_precision.global_policy().name,
            "thread": threading.current_thread().name})}), reply_to=msg)

    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    folder, replies = _private_dir(), []
    try:
        worker = w.PartyWorker("tests:policy", os.path.join(folder, "s.sock"),
                               client_app=policy_app, max_frame=1 << 16).listen()

        def client():
            try:
                for _ in range(2):
                    replies.append(w.relay_client_app("tests:policy")(
                        _message("query", RecordDict()), _context(str(worker.socket_path))))
            finally:
                worker.stop_event.set()

        sender = threading.Thread(target=client, daemon=True)
        sender.start()
        worker.serve()  # on this (the main) thread, as serve_worker does
        sender.join(timeout=60)
    finally:
        keras.mixed_precision.set_global_policy(before)
        os.rmdir(folder)
    assert [r.content["c"]["policy"] for r in replies] == ["mixed_bfloat16"] * 2
    assert {r.content["c"]["thread"] for r in replies} == {threading.current_thread().name}


def test_at_most_max_connections_are_read_at_once():
    """With both slots held by silent connections, a ping waits in the backlog (its 1 s
    timeout runs out long before the 120 s read deadline); once they go, it is answered."""
    worker, thread, folder = _serve_in_thread(read_timeout=120.0, max_connections=2)
    path = str(worker.socket_path)
    silent = [_connect(path) for _ in range(2)]
    try:
        _wait_for(lambda: worker.connections == 2, "two connections")
        with pytest.raises(OSError):  # TimeoutError: nobody reads it
            w.ping(path, timeout=1)
        assert worker.connections == 2
    finally:
        for conn in silent:
            conn.close()
    try:
        assert w.ping(path, timeout=60) == "tests:stub"
    finally:
        _stop_in_thread(worker, thread, folder)


def test_stopping_finishes_the_message_in_hand_and_refuses_the_one_waiting():
    """A ping is answered while a message is in the ClientApp; a second message waits for
    the first (one at a time); a stop then lets the first finish and be answered and
    refuses the second unhandled (an error reply; its state is left as it was)."""
    BLOCK.clear()
    worker, thread, folder = _serve_in_thread(read_timeout=30.0)
    path, replies = str(worker.socket_path), {}
    second = _context(path)

    def relay(name, kind, context):
        replies[name] = w.relay_client_app("tests:stub")(
            _message(kind, RecordDict({"config": ConfigRecord({"a": 1})})), context)

    first = threading.Thread(target=relay, args=("first", "query.block", _context(path)))
    waiting = threading.Thread(target=relay, args=("second", "query", second))
    try:
        first.start()
        assert IN_BLOCK.wait(timeout=60)
        assert w.ping(path, timeout=30) == "tests:stub"  # not behind the ClientApp
        waiting.start()
        _wait_for(lambda: worker.connections == 2, "the second message")
        time.sleep(0.5)  # let it reach the ClientApp's lock (either way it is refused)
        worker.stop_event.set()
    finally:
        BLOCK.set()
        for t in (first, waiting):
            if t.ident is not None:  # started
                t.join(timeout=60)
        _stop_in_thread(worker, thread, folder)
    assert not replies["first"].has_error() and replies["first"].content["echo"]["done"] == 1
    assert replies["second"].has_error() and "seen" not in second.state
    assert worker.handled == 1


def test_the_relay_hands_nothing_to_a_socket_of_another_user(monkeypatch):
    """The relay checks the listener's user (SO_PEERCRED) before it sends the message: a
    socket another user made at the configured path gets neither message nor context."""
    folder = _private_dir()
    path, received = os.path.join(folder, "fake.sock"), []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def fake_worker():
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            try:
                received.append(conn.recv(1 << 16))
            except OSError:
                received.append(b"?")

    thread = threading.Thread(target=fake_worker, daemon=True)
    thread.start()
    monkeypatch.setattr(w, "_peer_uid", lambda conn: os.getuid() + 1)
    try:
        reply = w.relay_client_app("tests:stub")(
            _message("query", RecordDict({"config": ConfigRecord({"secret": 9431})})),
            _context(path))
        thread.join(timeout=30)
    finally:
        listener.close()
        os.unlink(path)
        os.rmdir(folder)
    assert reply.has_error() and "9431" not in reply.error.reason
    assert received == [b""]  # connected, then closed without a byte


def test_a_worker_refuses_a_peer_of_another_user_before_reading(stub_worker, monkeypatch):
    monkeypatch.setattr(w, "_peer_uid", lambda conn: os.getuid() + 1)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(str(stub_worker.socket_path))  # and sends nothing: the worker reads nothing
        header = json.loads(w._read_frame(conn, 1 << 20)[0])
    assert header["ok"] is False and "own user" in header["error"]
    assert "app" not in header


def test_a_system_without_peer_credentials_refuses_to_start(monkeypatch):
    monkeypatch.delattr(socket, "SO_PEERCRED", raising=False)
    folder = _private_dir()
    try:
        with pytest.raises(OSError, match="SO_PEERCRED"):
            w.PartyWorker("tests:stub", os.path.join(folder, "s.sock"), client_app=stub)
    finally:
        os.rmdir(folder)


def test_a_message_for_another_app_is_refused(stub_worker):
    reply = w.relay_client_app("other.module:app")(
        _message("query", RecordDict({"config": ConfigRecord({})})),
        _context(str(stub_worker.socket_path)))
    assert reply.has_error() and "did not answer" in reply.error.reason


@pytest.mark.parametrize("frame", [
    b"GARBAGE-GARBAGE-GARBAGE",                                          # bad magic
    w._HEAD.pack(b"KFW1", 1 << 40),                                      # over the size cap
    w._HEAD.pack(b"KFW1", 20) + w._PART.pack(1 << 30) + b"x" * 12,       # a part past the end
    w.encode_frame([b"{}", b"", b""])[:14],                              # cut short
    w.encode_frame([b"not json", b"", b""]),                             # header not JSON
    w.encode_frame([json.dumps({"kind": "message", "app": "tests:stub"}).encode(),
                    b"\xff\xff\xff", b"\x01"]),                          # not protobuf
    w.encode_frame([b"{}", b""]),                                        # two parts
    w.encode_frame([b"{}"] + [b""] * 1000),                              # too many parts
])
def test_a_malformed_or_oversized_frame_gets_an_error_and_the_worker_keeps_serving(
        stub_worker, frame):
    path = str(stub_worker.socket_path)
    header = _raw(path, frame)
    assert header["ok"] is False and "malformed request" in header["error"]
    assert w.ping(path) == "tests:stub"


def test_an_unreachable_worker_is_an_error_reply_that_names_no_path():
    folder = _private_dir()
    try:
        reply = w.relay_client_app("tests:stub")(
            _message("query", RecordDict({"config": ConfigRecord({})})),
            _context(os.path.join(folder, "nobody.sock")))
    finally:
        os.rmdir(folder)
    assert reply.has_error() and folder not in reply.error.reason


def test_importing_the_relay_imports_neither_tensorflow_nor_keras():
    code = ("import sys, keras_fedpriv.federated.flower.worker as w; "
            "from keras_fedpriv.federated.flower import relay_client_app; "
            "import keras_fedpriv, keras_fedpriv.federated; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'keras_fedpriv.layers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_lazy_packages_export_every_name_they_list():
    import keras_fedpriv
    import keras_fedpriv.federated
    import keras_fedpriv.federated.flower

    for package in (keras_fedpriv, keras_fedpriv.federated, keras_fedpriv.federated.flower):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)
        assert set(package.__all__) <= set(dir(package))
    # an exported function wins over the submodule of the same name, as with eager imports
    import keras_fedpriv.federated.partition  # noqa: F401
    from keras_fedpriv.federated import partition
    assert callable(partition) and keras_fedpriv.federated.partition is partition
    with pytest.raises(AttributeError, match="no_such_name"):
        keras_fedpriv.federated.no_such_name  # noqa: B018


def test_a_peer_of_another_user_is_refused():
    w.check_peer(1000, own_uid=1000)
    with pytest.raises(PermissionError, match="uid 1001"):
        w.check_peer(1001, own_uid=1000)


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701, 0o707])
def test_a_socket_folder_others_may_open_is_refused_at_start(mode):
    folder = _private_dir()
    try:
        os.chmod(folder, mode)
        with pytest.raises(PermissionError, match=f"{mode:o}"):
            w.PartyWorker("tests:stub", os.path.join(folder, "s.sock"), client_app=stub)
        os.chmod(folder, 0o700)
        w.check_private_folder(folder)  # 0700 of this user passes
    finally:
        os.rmdir(folder)


def test_a_missing_folder_or_a_file_at_the_socket_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        w.check_private_folder(tmp_path / "missing")
    folder = _private_dir()
    try:
        target = os.path.join(folder, "s.sock")
        with open(target, "w") as f:
            f.write("not a socket")
        with pytest.raises(ValueError, match="not a socket"):
            w.PartyWorker("tests:stub", target, client_app=stub).listen()
        assert os.path.exists(target)  # not replaced
        os.unlink(target)
    finally:
        os.rmdir(folder)


def test_a_bad_target_is_refused():
    for bad in ("no_colon", ":app", "module:", 3):
        with pytest.raises(ValueError, match="target"):
            w.relay_client_app(bad)


def test_decode_frame_splits_parts_and_refuses_a_wrong_count():
    frame = w.encode_frame([b"ab", b"", b"c"])
    assert w.decode_frame(frame[w._HEAD.size:], 3) == [b"ab", b"", b"c"]
    with pytest.raises(w.FrameError, match="got more"):
        w.decode_frame(frame[w._HEAD.size:], 2)
    with pytest.raises(w.FrameError, match="got 3"):
        w.decode_frame(frame[w._HEAD.size:], 4)


# --------------------------------------------------------------------------- worker processes
def _start_worker(app, app_dir, folder=None):
    folder = folder or _private_dir()
    path = os.path.join(folder, "w.sock")
    proc = subprocess.Popen([sys.executable, "-m", "keras_fedpriv", "worker", "--app", app,
                             "--app-dir", str(app_dir), "--socket", path], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while True:
        try:
            assert w.ping(path) == app
            return proc, folder, path
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                raise RuntimeError(f"the worker did not start:\n{proc.communicate()[0][-2000:]}")
            time.sleep(0.2)


def _stop(proc, folder):
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    return out


def test_the_worker_stops_cleanly_on_sigterm_and_removes_its_socket():
    proc, folder, path = _start_worker("kfp_floor_app.apps:client", APP / "floor")
    try:
        reply = w.relay_client_app("kfp_floor_app.apps:client")(
            _message("train", RecordDict({"config": ConfigRecord({})})), _context(path))
        assert not reply.has_error() and reply.content["config"]["ok"] == 1
    finally:
        out = _stop(proc, folder)
    assert proc.returncode == 0, out[-2000:]
    assert not os.path.exists(path) and "worker stopped after 1 message(s)" in out
    os.rmdir(folder)


def test_a_worker_restarted_mid_run_answers_as_one_that_kept_running():
    """The test app's client through a worker that crashes (SIGKILL: its socket file stays)
    after round 0 and is started again at the same path, against the same messages run in
    this process without a worker: the new worker replaces the stale socket, rebuilds the
    client from ``context.state`` and gives the same uploads; the states match."""
    apps = load_test_app()
    weights = apps.model_fn().get_weights()
    app = w.relay_client_app("kfp_test_app.apps:client")

    def train(context, r):
        return app(_message("train", RecordDict({
            "weights": ArrayRecord(numpy_ndarrays=weights),
            "config": ConfigRecord({"round": r, "local-epochs": 1})}), run_id=11), context)

    def query(context):
        return app(_message("query", RecordDict({"config": ConfigRecord({})}), run_id=11),
                   context)

    proc, folder, path = _start_worker("kfp_test_app.apps:client", APP)
    try:
        with_worker = _context(path, run_id=11)
        q1, t1 = query(with_worker), [train(with_worker, 0)]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        assert os.path.exists(path)  # a crashed worker leaves its socket file behind
        assert train(with_worker, 1).has_error()  # nobody answers: an error reply
        proc, _, _ = _start_worker("kfp_test_app.apps:client", APP, folder)
        t1.append(train(with_worker, 1))
    finally:
        _stop(proc, folder)
    os.rmdir(folder)
    alone = _context(None, run_id=11)
    q2, t2 = query(alone), [train(alone, r) for r in range(2)]
    assert q1.content["config"]["client-id"] == q2.content["config"]["client-id"] == 0
    for a, b in zip(t1, t2):
        assert not a.has_error() and not b.has_error()
        up_a, up_b = a.content["upload"].to_numpy_ndarrays(), b.content["upload"].to_numpy_ndarrays()
        assert len(up_a) == len(up_b) > 0
        for x, y in zip(up_a, up_b):
            np.testing.assert_allclose(x, y, atol=1e-6)
    assert sorted(with_worker.state.keys()) == sorted(alone.state.keys())
    assert with_worker.state["keras-fedpriv"]["upload"] == alone.state["keras-fedpriv"]["upload"]
