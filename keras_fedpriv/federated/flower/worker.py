"""A party's long-lived ClientApp worker, and the thin relay ClientApp that hands it messages.

Flower 1.41's Deployment Engine starts a new ``flwr-clientapp`` process for
every message, and that process imports the app (TensorFlow, Keras) and
builds and traces the model again: seconds per message. Flower has no
long-lived ClientApp, so this module builds one from Flower's own pieces:

* `serve_worker` (``keras-fedpriv worker --app MODULE:ATTR --socket PATH``):
  a process the party starts beside its SuperNode. It imports the real
  ClientApp once, keeps TensorFlow, the models, traced functions and caches
  alive, and answers messages on a Unix domain socket: each connection is
  read in its own thread, and the ClientApp handles one message at a time,
  always on the thread that runs the worker (the main thread of
  ``keras-fedpriv worker``, the one that imported the app: Keras keeps its
  global dtype policy, distribution and layer names per thread).
* `relay_client_app` (``relay_client_app("my_app.client:app")``): the
  ClientApp the app's ``pyproject.toml`` names. In the ``flwr-clientapp``
  process it imports only Flower and the standard library, sends the
  Message and Context to the worker named by the node config key
  ``worker-socket`` and returns the worker's reply and updated
  ``context.state``. Without that key it imports the target ClientApp and
  runs it in its own process (slow, as without a worker).

Messages and contexts cross the socket as Flower's own protobuf
serialization (`flwr.common.serde`), never pickle. This is local IPC within
one party: the transport between parties stays Flower's.

Security: the socket lives in a folder that belongs to the worker's user and
that no one else may open (mode 0700, checked at start and again just before
binding); a socket path owned by another user is refused. Both ends check the
other's user with ``SO_PEERCRED`` (Linux; the worker refuses to start where
the system cannot tell) before a byte of payload moves: the worker answers
only processes of its own user, and the relay hands a message to no listener
of another user (one that made a socket at the configured path first).
Requests are length-prefixed and capped (``max_frame``, checked from the
prefix before anything is allocated) and must arrive whole within
``read_timeout``; a malformed, oversized or slow request, or a ClientApp that
raises or returns no Message, gets an error reply and the worker keeps
serving. Each accepted connection is read in a thread of its own (at most
``max_connections`` at once; more wait in the socket's backlog), so a peer
that connects and sends nothing, or stops half-way, holds up no one else.
Before it reads a request's body, a connection reserves the body's size
from a byte budget all connections share (``max_buffered``, default twice
``max_frame``; a frame of at most 4 KiB, such as a ping, reserves nothing)
and keeps it until its reply is sent, so requests waiting for the ClientApp
hold at most that much memory; a message is parsed only when the ClientApp
is about to handle it. A failed message's reply names the exception's type only (its text,
which may quote data, stays in the party's log) and its ``context.state``
changes are dropped, with or without a worker. The app name the relay sends
is compared with ``--app`` to catch a misconfiguration (a relay for another
app); it is not an authentication: any process of the party's user may talk
to the worker, as it may read the party's files.
"""

from __future__ import annotations

import collections
import importlib
import json
import logging
import os
import pathlib
import signal
import socket
import stat
import struct
import sys
import threading
import time
from typing import Any, Sequence

from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.serde import (
    context_from_proto,
    context_to_proto,
    message_from_proto,
    message_to_proto,
)
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.proto.message_pb2 import Message as ProtoMessage

__all__ = ["DEFAULT_MAX_CONNECTIONS", "DEFAULT_MAX_FRAME", "DEFAULT_READ_TIMEOUT", "SMALL_FRAME",
           "SOCKET_KEY", "TIMEOUT_KEY",
           "ByteBudget", "FrameError", "PartyWorker", "check_peer", "check_private_folder", "decode_frame",
           "encode_frame", "ping", "relay", "relay_client_app", "serve_worker"]

logger = logging.getLogger("keras_fedpriv.flower")

#: node config key naming the worker's socket (``flower-supernode --node-config``)
SOCKET_KEY = "worker-socket"
#: node config key: seconds the relay waits for the worker's reply (default 3600)
TIMEOUT_KEY = "worker-timeout"
#: the largest request or reply, in bytes (a frame is refused from its length prefix)
DEFAULT_MAX_FRAME = 1 << 30
_MAGIC = b"KFW1"
_HEAD = struct.Struct("!4sQ")
_PART = struct.Struct("!Q")
#: seconds a connected peer has to send its whole request (the relay sends it at once)
DEFAULT_READ_TIMEOUT = 10.0
#: connections read at once; more wait in the socket's backlog
DEFAULT_MAX_CONNECTIONS = 32
#: a request body of at most this many bytes (a ping) is read without reserving from the budget
SMALL_FRAME = 4096


class FrameError(ValueError):
    """A request or reply on the worker's socket that is malformed or too large."""


def encode_frame(parts: Sequence[bytes]) -> bytes:
    """One frame: magic, the body's length, then each part with its length.

    Args:
        parts: the byte strings to send.

    Returns:
        The frame's bytes.
    """
    body = b"".join(_PART.pack(len(p)) + p for p in parts)
    return _HEAD.pack(_MAGIC, len(body)) + body


def _recv_exactly(conn: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes; with ``deadline`` (``time.monotonic()``) all of them by then."""
    chunks, left = [], n
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FrameError(f"the request was not whole within the read timeout "
                                 f"({n - left} of {n} bytes)")
            conn.settimeout(remaining)
        try:
            chunk = conn.recv(min(left, 1 << 20))
        except TimeoutError:
            if deadline is None:
                raise
            raise FrameError(f"the request was not whole within the read timeout "
                             f"({n - left} of {n} bytes)") from None
        if not chunk:
            raise FrameError(f"the peer closed the connection {n - left} bytes into a "
                             f"{n}-byte read")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def decode_frame(body: bytes, num_parts: int) -> list[bytes]:
    """Split a frame's body into its ``num_parts`` length-prefixed parts.

    Args:
        body: the bytes after the frame's header.
        num_parts: how many parts the frame must hold.

    Returns:
        The parts.

    Raises:
        FrameError: a length runs past the body, or the part count differs.
    """
    parts, at = [], 0
    while at < len(body):
        if len(parts) == num_parts:  # stop here: a crafted frame may hold millions
            raise FrameError(f"a frame must hold {num_parts} parts; got more")
        if at + _PART.size > len(body):
            raise FrameError("a part's length prefix runs past the frame")
        (size,) = _PART.unpack_from(body, at)
        at += _PART.size
        if size > len(body) - at:
            raise FrameError(f"a part of {size} bytes runs past the frame")
        parts.append(body[at:at + size])
        at += size
    if len(parts) != num_parts:
        raise FrameError(f"a frame must hold {num_parts} parts; got {len(parts)}")
    return parts


def _read_head(conn: socket.socket, max_frame: int, deadline: float | None = None) -> int:
    """Read a frame's header; the size of its body (checked against ``max_frame``)."""
    head = _recv_exactly(conn, _HEAD.size, deadline)
    magic, size = _HEAD.unpack(head)
    if magic != _MAGIC:
        raise FrameError("not a keras-fedpriv worker frame (bad magic)")
    if size > max_frame:
        raise FrameError(f"a frame of {size} bytes is over the limit of {max_frame} bytes")
    return size


def _read_frame(conn: socket.socket, max_frame: int, num_parts: int = 3,
                deadline: float | None = None) -> list[bytes]:
    size = _read_head(conn, max_frame, deadline)
    return decode_frame(_recv_exactly(conn, size, deadline), num_parts)


class ByteBudget:
    """Bytes that requests reserve before their bodies are read, shared by all connections.

    Args:
        capacity: the most bytes reserved at once (a positive int; every
            reservation must be at most this).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.reserved = 0
        self.waiting = 0  # how many reservations wait now
        self.peak = 0  # the most bytes reserved at once so far
        self._cond = threading.Condition()

    def reserve(self, size: int, stop: threading.Event) -> bool:
        """Wait until ``size`` more bytes fit and reserve them; False if ``stop`` is set first.

        Raises:
            ValueError: ``size`` is over the capacity (it would never fit).
        """
        if size > self.capacity:
            raise ValueError(f"`size` must be at most the budget's {self.capacity} bytes; "
                             f"got {size}.")
        with self._cond:
            self.waiting += 1
            try:
                while self.reserved + size > self.capacity:
                    if stop.is_set():
                        return False
                    self._cond.wait(timeout=0.2)
            finally:
                self.waiting -= 1
            self.reserved += size
            self.peak = max(self.peak, self.reserved)
            return True

    def release(self, size: int) -> None:
        """Give back ``size`` reserved bytes."""
        with self._cond:
            self.reserved -= size
            self._cond.notify_all()


class _Request:
    """A message read whole, waiting for the ClientApp's thread, and its reply once made."""

    def __init__(self, header: dict[str, Any], message_part: bytes, context_part: bytes) -> None:
        self.parts = (header, message_part, context_part)
        self.reply: bytes | None = None
        self.done = threading.Event()

    def answer(self, reply: bytes) -> None:
        """Set the reply and wake the connection that waits for it."""
        self.reply = reply
        self.parts = None  # the request's bytes are not needed any more
        self.done.set()


def _header(part: bytes) -> dict[str, Any]:
    try:
        header = json.loads(part.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise FrameError("the frame's header is not JSON") from None
    if not isinstance(header, dict):
        raise FrameError("the frame's header is not a JSON object")
    return header


def _error_frame(reason: str) -> bytes:
    return encode_frame([json.dumps({"ok": False, "error": reason}).encode(), b"", b""])


# --------------------------------------------------------------------------- checks
def check_private_folder(folder: str | os.PathLike[str],
                         what: str = "the worker's socket folder") -> pathlib.Path:
    """Check that ``folder`` is a directory of this user that no one else may open.

    Args:
        folder: the folder that holds (or will hold) the worker's socket, or
            another of the party's private files.
        what: how error messages name the folder.

    Returns:
        The folder as a `pathlib.Path`.

    Raises:
        ValueError: it is missing, a symbolic link or not a directory.
        PermissionError: another user owns it, or its group or others have
            any permission on it (``chmod 700`` it).
    """
    path = pathlib.Path(folder)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ValueError(f"{what} {str(path)!r} does not exist; create "
                         f"it with `install -d -m 700 {path}`.") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{what} {str(path)!r} must be a directory "
                         f"(not a symbolic link or a file).")
    if info.st_uid != os.getuid():
        raise PermissionError(f"{what} {str(path)!r} belongs to uid "
                              f"{info.st_uid}, not to this user (uid {os.getuid()}).")
    if info.st_mode & 0o077:
        raise PermissionError(f"{what} {str(path)!r} has mode "
                              f"{stat.S_IMODE(info.st_mode):o}: its group or others may open "
                              f"it; allowed: 700 (chmod 700 {path}).")
    return path


def check_peer(peer_uid: int, own_uid: int | None = None) -> None:
    """Refuse a connection from a process of another user.

    Args:
        peer_uid: the connecting process's user id (``SO_PEERCRED``).
        own_uid: the worker's user id (default: this process's).

    Returns:
        None.

    Raises:
        PermissionError: the ids differ.
    """
    own = os.getuid() if own_uid is None else own_uid
    if peer_uid != own:
        raise PermissionError(f"a process of uid {peer_uid} connected; this worker answers "
                              f"only its own user (uid {own}).")


def _peer_uid(conn: socket.socket) -> int:
    if not hasattr(socket, "SO_PEERCRED"):  # pragma: no cover - not Linux
        raise PermissionError("this system cannot tell the peer's user (no SO_PEERCRED)")
    # the connecting process's user (worker side), or the listener's (relay side)
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _clear_socket_path(path: pathlib.Path) -> None:
    """Remove a stale socket of this user at ``path``; refuse anything else there."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if info.st_uid != os.getuid():
        raise PermissionError(f"{str(path)!r} belongs to uid {info.st_uid}, not to this user.")
    if not stat.S_ISSOCK(info.st_mode):
        raise ValueError(f"{str(path)!r} exists and is not a socket; refusing to replace it.")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        if probe.connect_ex(str(path)) == 0:
            raise RuntimeError(f"another worker already listens on {str(path)!r}.")
    path.unlink()


def _load_app(ref: str) -> ClientApp:
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"`app` must be 'package.module:attribute'; got {ref!r}.")
    app = importlib.import_module(module_name)
    for name in attr.split("."):
        app = getattr(app, name)
    if not isinstance(app, ClientApp):
        raise TypeError(f"`app` {ref!r} must name a flwr.clientapp.ClientApp; got "
                        f"{type(app).__name__}.")
    return app


def _answer(app: ClientApp, message: Message, context: Context) -> tuple[Message, bool]:
    """Run ``app`` on one message: its reply and True; or, when it raises or returns no
    Message, an error reply that names the exception's type only (the text, which may quote
    data, goes to this process's log) and False: ``context.state`` must then not be kept."""
    try:
        reply = app(message, context)
        if not isinstance(reply, Message):
            raise TypeError(f"the ClientApp returned {type(reply).__name__}, not a Message")
        return reply, True
    except Exception as ex:  # noqa: BLE001 - the app's error stays in this log
        logger.exception("the ClientApp raised on a %r message", message.metadata.message_type)
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                             reason=f"the ClientApp raised {type(ex).__name__} (details in "
                             f"the party's own log)"), reply_to=message), False


# --------------------------------------------------------------------------- the worker
class PartyWorker:
    """Serve one ClientApp on a Unix socket in a long-lived process.

    `serve` accepts connections on a helper thread; each accepted connection
    is read in a thread of its own, with its own deadline (``read_timeout``
    for the frame's header, then again for its body), so a peer that sends
    nothing or stops half-way holds up no other connection; at most
    ``max_connections`` are read at once (more wait in the socket's backlog
    until one ends). Before reading a body of more than `SMALL_FRAME` bytes a
    connection reserves its size from a `ByteBudget` of ``max_buffered``
    bytes, kept until its reply is sent. Pings are answered at once, by
    their connection's thread. A message is queued for the thread that
    called `serve`, which parses it and runs the ClientApp: **one message at
    a time**, whatever the run or node, always on that one thread (Keras'
    per-thread global state, such as a dtype policy the app set when it was
    imported on that thread, holds in every handler). No two messages draw
    from one node's random state at once, and the app's caches and
    TensorFlow's state, which all runs share, are never used by two messages
    at once. Messages of two runs at once are handled in turn.

    Args:
        app: the ClientApp's ``"package.module:attribute"``; the relay names
            the same string and the worker refuses a request for another.
        socket_path: where to listen; its folder must pass
            `check_private_folder`.
        app_dir: None or a folder to put first on ``sys.path`` (the app's folder).
        max_frame: the largest request accepted, in bytes.
        client_app: the ClientApp object to serve (default: import ``app``).
        read_timeout: seconds a connected peer has to send its whole request
            (and to take the whole reply).
        max_connections: how many connections are read at once.
        max_buffered: the most bytes of request bodies held at once (read,
            or waiting for the ClientApp); an int >= ``max_frame``, default
            ``2 * max_frame``.

    Raises:
        OSError: the system cannot tell a connecting process's user
            (no ``SO_PEERCRED``: not Linux); the worker would serve anyone
            who can reach the socket.
    """

    def __init__(self, app: str, socket_path: str | os.PathLike[str],
                 app_dir: str | os.PathLike[str] | None = None,
                 max_frame: int = DEFAULT_MAX_FRAME, client_app: ClientApp | None = None,
                 read_timeout: float = DEFAULT_READ_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_buffered: int | None = None) -> None:
        if not hasattr(socket, "SO_PEERCRED"):
            raise OSError(f"the party worker needs SO_PEERCRED (Linux) to check which user "
                          f"connects; {sys.platform} has none: run the ClientApp without a "
                          f"worker there.")
        if isinstance(max_frame, bool) or not isinstance(max_frame, int) or max_frame < 1024:
            raise ValueError(f"`max_frame` must be an integer >= 1024; got {max_frame!r}.")
        if isinstance(read_timeout, bool) or not isinstance(read_timeout, (int, float)) \
                or not 0 < read_timeout < float("inf"):
            raise ValueError(f"`read_timeout` must be a positive number of seconds; got "
                             f"{read_timeout!r}.")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
                or not 1 <= max_connections <= 4096:
            raise ValueError(f"`max_connections` must be an integer from 1 to 4096; got "
                             f"{max_connections!r}.")
        if max_buffered is None:
            max_buffered = 2 * max_frame
        if isinstance(max_buffered, bool) or not isinstance(max_buffered, int) \
                or max_buffered < max_frame:
            raise ValueError(f"`max_buffered` must be an integer >= `max_frame` ({max_frame}); "
                             f"got {max_buffered!r}.")
        self.read_timeout = float(read_timeout)
        self.max_connections = max_connections
        self.socket_path = pathlib.Path(socket_path).absolute()
        check_private_folder(self.socket_path.parent)
        if len(os.fsencode(self.socket_path)) > 100:
            raise ValueError(f"`socket_path` must be at most 100 bytes long (a Unix socket "
                             f"limit); got {len(os.fsencode(self.socket_path))}.")
        self.app_ref, self.max_frame = app, max_frame
        if app_dir is not None:
            sys.path.insert(0, str(pathlib.Path(app_dir).absolute()))
        self.app = client_app if client_app is not None else _load_app(app)
        self.handled = 0
        self.stop_event = threading.Event()
        self._listener: socket.socket | None = None
        self._app_lock = threading.Lock()  # one message in the ClientApp at a time
        self._slots = threading.BoundedSemaphore(max_connections)
        self.budget = ByteBudget(max_buffered)
        # messages waiting for the ClientApp's thread; `_accepting` False once it stopped
        self._queue: collections.deque[_Request] = collections.deque()
        self._queue_cond = threading.Condition()
        self._accepting = True
        self._threads: set[threading.Thread] = set()
        self._threads_lock = threading.Lock()

    @property
    def connections(self) -> int:
        """How many connections are being read or answered now."""
        with self._threads_lock:
            return len(self._threads)

    def listen(self) -> PartyWorker:
        """Bind and listen on the socket (a stale socket of this user is replaced).

        Returns:
            This worker.
        """
        check_private_folder(self.socket_path.parent)  # again: importing the app took a while
        _clear_socket_path(self.socket_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.socket_path))
        finally:
            os.umask(old)
        listener.listen(64)
        listener.settimeout(0.2)  # how often an idle worker looks at stop_event
        self._listener = listener
        return self

    def handle(self, header: dict[str, Any], message_part: bytes, context_part: bytes) -> bytes:
        """Answer one request (already framed and checked for size) here; return the reply frame.

        A ping is answered at once; a message is parsed and handed to the
        ClientApp on the calling thread (one message at a time) and is
        refused, unhandled, if the worker was told to stop meanwhile. `serve`
        calls it for each message on its own thread.

        Args:
            header: the request's header (``{"kind": "message", "app": ...}``
                or ``{"kind": "ping"}``).
            message_part: Flower's serialized ``Message``.
            context_part: Flower's serialized ``Context``.

        Returns:
            The reply frame: a header, the reply ``Message`` and, on success,
            the updated ``Context``.
        """
        if header.get("kind") == "ping":
            return encode_frame([json.dumps({"ok": True, "app": self.app_ref}).encode(),
                                 b"", b""])
        if header.get("kind") != "message":
            raise FrameError("the header's kind must be 'message' or 'ping'")
        if header.get("app") != self.app_ref:
            logger.error("refused a message for ClientApp %r: this worker serves %r",
                         header.get("app"), self.app_ref)
            return _error_frame("this worker serves another ClientApp")
        try:
            message = message_from_proto(ProtoMessage.FromString(message_part))
            context = context_from_proto(ProtoContext.FromString(context_part))
        except Exception:  # noqa: BLE001 - protobuf raises several types
            raise FrameError("the message or context does not parse") from None
        with self._app_lock:
            if self.stop_event.is_set():
                return _error_frame("the worker is stopping; the message was not handled")
            return self._run_app(message, context)

    def _run_app(self, message: Message, context: Context) -> bytes:
        """Run the ClientApp on one message (the caller holds the app lock); the reply frame."""
        started = time.perf_counter()
        reply, ok = _answer(self.app, message, context)
        out = context_to_proto(context) if ok else None
        self.handled += 1
        seconds = time.perf_counter() - started
        print(f"handled {message.metadata.message_type} (run {context.run_id}) in "
              f"{seconds * 1e3:.1f} ms", flush=True)
        return encode_frame([json.dumps({"ok": True, "seconds": seconds}).encode(),
                             message_to_proto(reply).SerializeToString(),
                             b"" if out is None else out.SerializeToString()])

    def serve_connection(self, conn: socket.socket) -> None:
        """Check the peer, read one request, answer it; never raises for a bad request.

        A ping is answered here; a message is queued for the thread running
        `serve` and answered once that thread has handled (or refused) it.

        Args:
            conn: an accepted connection; the peer's user is checked before
                anything is read.

        Returns:
            None (the reply, or an error reply, is sent on ``conn``).
        """
        conn.settimeout(self.read_timeout)
        try:
            check_peer(_peer_uid(conn))
        except PermissionError as err:
            logger.error("refused a connection: %s", err)
            self._send(conn, _error_frame("refused: the worker answers its own user only"))
            return
        reserved = 0
        try:
            size = _read_head(conn, self.max_frame, time.monotonic() + self.read_timeout)
            if size > SMALL_FRAME and self.budget.reserve(size, self.stop_event):
                reserved = size
            if size > SMALL_FRAME and not reserved:  # told to stop while waiting
                reply = _error_frame("the worker is stopping; the message was not handled")
            else:
                body = _recv_exactly(conn, size, time.monotonic() + self.read_timeout)
                header, message_part, context_part = decode_frame(body, 3)
                del body
                reply = self._reply_to(_header(header), message_part, context_part)
        except (FrameError, OSError) as err:
            logger.error("refused a malformed request: %s", err)
            reply = _error_frame(f"malformed request: {err}")
        except Exception:  # noqa: BLE001 - one bad request must not stop the worker
            logger.exception("failed on a request")
            reply = _error_frame("the worker failed on this request (details in its log)")
        try:
            conn.settimeout(self.read_timeout)  # the reply: the whole sendall within it
            self._send(conn, reply)
        finally:
            if reserved:
                self.budget.release(reserved)

    def _reply_to(self, header: dict[str, Any], message_part: bytes,
                  context_part: bytes) -> bytes:
        """A ping's reply at once; a message's from the ClientApp's thread (queued, waited for)."""
        if header.get("kind") != "message":
            return self.handle(header, message_part, context_part)  # a ping, or refused
        request = _Request(header, message_part, context_part)
        with self._queue_cond:
            if not self._accepting:
                return _error_frame("the worker is stopping; the message was not handled")
            self._queue.append(request)
            self._queue_cond.notify_all()
        request.done.wait()  # `serve` answers every queued request, or refuses it as it stops
        assert request.reply is not None
        return request.reply

    def _next_request(self) -> _Request | None:
        """The next queued message (waiting for one); None once the worker is told to stop."""
        with self._queue_cond:
            while not self._queue:
                if self.stop_event.is_set():
                    return None
                self._queue_cond.wait(timeout=0.2)
            if self.stop_event.is_set():
                return None
            return self._queue.popleft()

    def _handle_requests(self) -> None:
        """Run the ClientApp on each queued message, on this thread, until told to stop."""
        while (request := self._next_request()) is not None:
            try:
                reply = self.handle(*request.parts)
            except FrameError as err:
                logger.error("refused a malformed request: %s", err)
                reply = _error_frame(f"malformed request: {err}")
            except Exception:  # noqa: BLE001 - one bad request must not stop the worker
                logger.exception("failed on a request")
                reply = _error_frame("the worker failed on this request (details in its log)")
            request.answer(reply)

    def _refuse_waiting(self) -> None:
        """Stop queueing, and refuse (unhandled) every message still waiting."""
        with self._queue_cond:
            self._accepting = False
            waiting = list(self._queue)
            self._queue.clear()
        for request in waiting:
            request.answer(_error_frame("the worker is stopping; the message was not handled"))

    @staticmethod
    def _send(conn: socket.socket, frame: bytes) -> None:
        try:
            conn.sendall(frame)
        except OSError as err:  # the relay went away; nothing to answer
            logger.warning("could not send a reply: %s", err)

    def _connection_thread(self, conn: socket.socket) -> None:
        """Serve ``conn`` and close it; then free its slot (runs in its own thread)."""
        try:
            with conn:
                self.serve_connection(conn)
        finally:
            with self._threads_lock:
                self._threads.discard(threading.current_thread())
            self._slots.release()

    def _take_slot(self) -> bool:
        """Wait for a free connection slot; False if told to stop meanwhile."""
        while not self.stop_event.is_set():
            if self._slots.acquire(timeout=0.2):
                return True
        return False

    def _accept_connections(self) -> None:
        """Accept connections, each served in its own thread, until `stop_event` is set."""
        assert self._listener is not None
        while self._take_slot():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                self._slots.release()
                continue
            conn.settimeout(None)
            thread = threading.Thread(target=self._connection_thread, args=(conn,),
                                      name="kfp-worker-connection", daemon=True)
            with self._threads_lock:
                self._threads.add(thread)
            thread.start()

    def serve(self) -> None:
        """Answer requests until `stop_event` is set; then close and remove the socket.

        Connections are accepted on a helper thread and each is read in its
        own; the ClientApp runs on the thread that called `serve`. Once
        stopped, no connection is accepted; a message already in the
        ClientApp is finished and answered, those still waiting for it are
        refused unhandled.
        """
        if self._listener is None:
            self.listen()
        acceptor = threading.Thread(target=self._accept_connections,
                                    name="kfp-worker-accept", daemon=True)
        acceptor.start()
        try:
            self._handle_requests()
        finally:
            self.stop_event.set()
            acceptor.join()
            self.close()
            self._refuse_waiting()
            self._join_connections()

    def _join_connections(self) -> None:
        """Wait for the connections in hand: the message in the ClientApp, the replies."""
        with self._threads_lock:
            threads = list(self._threads)
        for thread in threads:
            # a reading thread ends by its read deadline; the ClientApp by itself
            while thread.is_alive():
                thread.join(timeout=self.read_timeout)

    def close(self) -> None:
        """Stop listening and remove the socket file."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass


def serve_worker(app: str, socket_path: str | os.PathLike[str],
                 app_dir: str | os.PathLike[str] | None = None,
                 max_frame: int = DEFAULT_MAX_FRAME,
                 read_timeout: float = DEFAULT_READ_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_buffered: int | None = None) -> None:
    """Run a party's worker until SIGTERM or SIGINT (``keras-fedpriv worker``).

    Imports the ClientApp, listens, prints ``worker ready`` and answers
    messages (each connection read in its own thread, the ClientApp handling
    one message at a time on the main thread, which imported it); on SIGTERM / SIGINT it finishes the message in
    hand, closes and removes its socket, and returns.

    Args:
        app: the ClientApp's ``"package.module:attribute"``.
        socket_path: the socket, in a folder of mode 0700 of this user.
        app_dir: None or a folder to put first on ``sys.path``.
        max_frame: the largest request accepted, in bytes.
        read_timeout: seconds a connected peer has to send its whole request.
        max_connections: how many connections are read at once.
        max_buffered: the most bytes of requests held at once (default
            ``2 * max_frame``).

    Returns:
        None, once stopped.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    worker = PartyWorker(app, socket_path, app_dir=app_dir, max_frame=max_frame,
                         read_timeout=read_timeout, max_connections=max_connections,
                         max_buffered=max_buffered).listen()

    def stop(signum: int, frame: Any) -> None:
        worker.stop_event.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    print(f"worker ready: serving {app} on {worker.socket_path} (pid {os.getpid()})",
          flush=True)
    worker.serve()
    print(f"worker stopped after {worker.handled} message(s)", flush=True)


# --------------------------------------------------------------------------- the relay
def _exchange(socket_path: str, request: bytes, timeout: float,
              max_frame: int = DEFAULT_MAX_FRAME) -> tuple[dict[str, Any], bytes, bytes]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(socket_path)
        # nothing goes to a listener of another user (one that made a socket at this path)
        check_peer(_peer_uid(conn))
        conn.sendall(request)
        header, message_part, context_part = _read_frame(conn, max_frame)
    return _header(header), message_part, context_part


def ping(socket_path: str | os.PathLike[str], timeout: float = 5.0) -> str:
    """Ask the worker on ``socket_path`` which ClientApp it serves (a readiness check).

    Args:
        socket_path: the worker's socket.
        timeout: seconds to wait.

    Returns:
        The served ClientApp's ``"package.module:attribute"``.

    Raises:
        OSError: nothing answers there (PermissionError: a process of
            another user listens there).
        FrameError: the answer is not a worker's.
    """
    request = encode_frame([json.dumps({"kind": "ping"}).encode(), b"", b""])
    header, _, _ = _exchange(os.fspath(socket_path), request, timeout)
    if not header.get("ok"):
        raise FrameError(f"the worker refused the ping: {header.get('error')}")
    return str(header.get("app"))


def relay(socket_path: str, app: str, message: Message, context: Context,
          timeout: float = 3600.0) -> Message:
    """Hand one message to the worker; return its reply and update ``context.state``.

    Args:
        socket_path: the worker's socket.
        app: the ClientApp the worker must serve (``"package.module:attribute"``).
        message: the Message Flower gave this ClientApp.
        context: its Context; ``context.state`` is replaced by the worker's.
        timeout: seconds to wait for the reply.

    Returns:
        The worker's reply, or a Flower error reply (the reason names no
        data; details in this process's log) when the worker cannot be
        reached or refuses.
    """
    request = encode_frame([json.dumps({"kind": "message", "app": app}).encode(),
                            message_to_proto(message).SerializeToString(),
                            context_to_proto(context).SerializeToString()])
    try:
        header, message_part, context_part = _exchange(socket_path, request, timeout)
        if not header.get("ok"):
            raise FrameError(str(header.get("error")))
        reply = message_from_proto(ProtoMessage.FromString(message_part))
        if context_part:
            context.state = context_from_proto(ProtoContext.FromString(context_part)).state
    except Exception as err:  # noqa: BLE001 - OSError, FrameError, protobuf's DecodeError
        logger.error("the party's worker on %r did not answer: %s", socket_path, err)
        return Message(Error(code=ErrorCode.UNKNOWN, reason="the party's worker did not answer "
                             "(details in the client's own log)"), reply_to=message)
    return reply


class _RelayClientApp(ClientApp):
    """A ClientApp that relays every message to the party's worker (see `relay_client_app`)."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self._local: ClientApp | None = None

    def __call__(self, message: Message, context: Context) -> Message:
        path = context.node_config.get(SOCKET_KEY)
        if not path:  # no worker: run the target here (imports it: slow, as without a worker)
            if self._local is None:
                self._local = _load_app(self.target)
            before = context_to_proto(context)
            reply, ok = _answer(self._local, message, context)
            if not ok:  # Flower would store the failed handler's half-done state
                context.state = context_from_proto(before).state
            return reply
        timeout = float(context.node_config.get(TIMEOUT_KEY, 3600.0))
        return relay(str(path), self.target, message, context, timeout)


def relay_client_app(target: str) -> ClientApp:
    """The thin ClientApp to name in an app's ``pyproject.toml``: it hands messages to a worker.

    Args:
        target: the real ClientApp, ``"package.module:attribute"`` (what the
            party's ``keras-fedpriv worker --app`` serves).

    Returns:
        A `flwr.clientapp.ClientApp`. With the SuperNode's node config key
        ``worker-socket`` set, each message goes to the worker on that socket
        (``worker-timeout``: seconds to wait, default 3600); without it the
        target is imported and run in this process.
    """
    if not isinstance(target, str) or target.count(":") != 1 or target.startswith(":") \
            or target.endswith(":"):
        raise ValueError(f"`target` must be 'package.module:attribute'; got {target!r}.")
    return _RelayClientApp(target)
