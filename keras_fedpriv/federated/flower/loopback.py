"""Flower's Deployment Engine on one machine: a SuperLink and N SuperNodes on 127.0.0.1.

For trying a Flower app as real separate processes before taking it to other
machines, for the integration tests and for ``bench/flower.py``. Insecure
(no TLS) and bound to 127.0.0.1 only: never for a real deployment (see
``docs/flower.md`` for the TLS commands).

The processes are started in their own sessions (process groups) and stopped
by process group id; descendants that started sessions of their own (Flower
starts ``flower-superexec`` so) are found in the process tree and stopped by
process id. Nothing this object did not start is touched.

With ``worker_app``, each SuperNode gets a party worker beside it
(``keras-fedpriv worker``, `keras_fedpriv.federated.flower.worker`) on a
socket in a private temporary folder, named to the SuperNode by the node
config key ``worker-socket``; the app's ClientApp must be a
`relay_client_app` of ``worker_app``.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Mapping, Sequence

from keras_fedpriv.federated.flower.run_status import flwr_run, run_status

__all__ = ["LoopbackDeployment", "free_port", "kill_family", "process_family"]

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _descendants(pids: Sequence[int]) -> list[int]:
    """The live descendants of ``pids`` (from /proc; empty where /proc is missing)."""
    children: dict[int, list[int]] = {}
    proc = pathlib.Path("/proc")
    if not proc.is_dir():  # pragma: no cover - not Linux
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None if gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def process_family(pids: Sequence[int]) -> dict[int, str]:
    """The live descendants of ``pids``, each with its start time (to recognise it later).

    Args:
        pids: process ids.

    Returns:
        ``{pid: start time}`` for every live descendant (empty without /proc).
    """
    out = {}
    for pid in _descendants(pids):
        started = _start_time(pid)
        if started is not None:
            out[pid] = started
    return out


def kill_family(family: Mapping[int, str], wait: float = 10.0) -> list[int]:
    """SIGKILL the processes of ``family`` that still run as the processes it recorded.

    A process id whose start time changed belongs to another process now (the
    id was reused) and is left alone.

    Args:
        family: ``{pid: start time}`` from `process_family`.
        wait: seconds to wait for the killed processes to be gone.

    Returns:
        The ids of those still running after ``wait`` (empty when all are gone).
    """
    def same(pid: int) -> bool:
        return _start_time(pid) == family[pid]

    for pid in family:
        if same(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + wait
    while True:
        left = [pid for pid in family if same(pid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class LoopbackDeployment:
    """Start a SuperLink and ``num_supernodes`` SuperNodes on 127.0.0.1; stop them on exit.

    Args:
        num_supernodes: number of SuperNodes (clients), >= 1.
        node_configs: one dict per SuperNode for ``--node-config`` (default:
            ``{"partition-id": i, "num-partitions": num_supernodes}``).
        workdir: a folder for ``FLWR_HOME`` and the processes' logs
            (default: a new temporary folder, removed on exit unless
            ``keep=True``). The SuperLink keeps its state in memory.
        startup_timeout: seconds to wait for the SuperLink to listen.
        env: extra environment variables for every process.
        keep: keep ``workdir`` (logs) after exit.
        worker_app: None, or the ClientApp (``"package.module:attribute"``)
            that one party worker per SuperNode serves; the SuperNodes start
            once every worker answers.
        worker_app_dir: None or the folder a worker puts first on its import
            path (the app's folder).
        worker_startup_timeout: seconds to wait for each worker (it imports
            the app, TensorFlow included, before it answers).

    Example:
        >>> with LoopbackDeployment(3) as dep:
        ...     done = dep.run("examples/flower_horizontal", {"num-server-rounds": 3})
        ...     print(done.returncode, done.stdout[-500:])
    """

    def __init__(self, num_supernodes: int, node_configs: Sequence[Mapping[str, Any]] | None = None,
                 workdir: str | os.PathLike[str] | None = None, startup_timeout: float = 60.0,
                 env: Mapping[str, str] | None = None, keep: bool = False,
                 worker_app: str | None = None,
                 worker_app_dir: str | os.PathLike[str] | None = None,
                 worker_startup_timeout: float = 300.0) -> None:
        if isinstance(num_supernodes, bool) or not isinstance(num_supernodes, int) \
                or num_supernodes < 1:
            raise ValueError(f"`num_supernodes` must be an integer >= 1; got {num_supernodes!r}.")
        if node_configs is None:
            node_configs = [{"partition-id": i, "num-partitions": num_supernodes}
                            for i in range(num_supernodes)]
        if len(node_configs) != num_supernodes:
            raise ValueError(f"`node_configs` must hold one dict per SuperNode "
                             f"({num_supernodes}); got {len(node_configs)}.")
        self.num_supernodes = num_supernodes
        self.node_configs = [dict(c) for c in node_configs]
        self._own_dir = workdir is None
        self.workdir = pathlib.Path(workdir or tempfile.mkdtemp(prefix="kfp-flower-"))
        self.startup_timeout = float(startup_timeout)
        self.keep = bool(keep)
        bindir = str(pathlib.Path(sys.executable).parent)
        repo = str(pathlib.Path(__file__).resolve().parents[3])
        # not Flower's internal switches (they open other, insecure listeners)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_INTERNAL")}
        # SuperLink and SuperNode start flower-superexec by name: this environment's bin first
        self.env["PATH"] = bindir + os.pathsep + self.env.get("PATH", "")
        self.env["FLWR_HOME"] = str(self.workdir / "flwr-home")
        self.env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        self.env["PYTHONPATH"] = repo + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env.update(env or {})
        self._bin = bindir
        self.worker_app = worker_app
        self.worker_app_dir = None if worker_app_dir is None else str(worker_app_dir)
        self.worker_startup_timeout = float(worker_startup_timeout)
        self.worker_sockets: list[str] = []
        self._worker_dirs: list[str] = []
        self.superlink_port = 0
        self.supernode_ports: list[int] = []
        self.processes: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, Any] = {}

    # ----------------------------------------------------------------- start / stop
    def _spawn(self, name: str, args: list[str], append: bool = False) -> subprocess.Popen:
        # closed in close(); a restarted process appends to its predecessor's log
        log = open(self.workdir / f"{name}.log", "ab" if append else "wb")  # noqa: SIM115
        self._logs[name] = log
        exe = shutil.which(args[0], path=self._bin) or args[0]
        # a Flower home per process: Flower skips installing an app whose folder exists, so
        # processes sharing one could import another's half-copied app
        home = self.workdir / f"home-{name}"
        home.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "FLWR_HOME": str(home)}
        proc = subprocess.Popen([exe] + args[1:], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=str(self.workdir), start_new_session=True)
        self.processes[name] = proc
        return proc

    def start(self) -> LoopbackDeployment:
        """Start the SuperLink, wait until it listens, start the SuperNodes, write the connection."""
        (self.workdir / "flwr-home").mkdir(parents=True, exist_ok=True)
        try:
            if self.worker_app is not None:
                self._start_workers()
            self.superlink_port = free_port()
            # the app runs in this environment: no `uv sync` of its dependencies per run
            # (which would need a package index that serves keras-fedpriv)
            # state in memory (no --database): this SuperLink lives as long as the deployment,
            # and a file costs it twice the CPU per message (3-round run: 5.7 against 2.4 s)
            self._spawn("superlink", ["flower-superlink", "--insecure",
                                      "--disable-runtime-dependency-installation",
                                      "--host", HOST,
                                      "--port", str(self.superlink_port)])
            deadline = time.monotonic() + self.startup_timeout
            while not _listening(self.superlink_port):
                if self.processes["superlink"].poll() is not None:
                    raise RuntimeError(f"flower-superlink exited with code "
                                       f"{self.processes['superlink'].returncode}:\n"
                                       f"{self.log('superlink')[-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"flower-superlink did not listen on {HOST}:"
                                       f"{self.superlink_port} within {self.startup_timeout:g} s")
                time.sleep(0.2)
            for i in range(self.num_supernodes):
                self.supernode_ports.append(free_port())
                self._spawn(f"supernode-{i}", self._supernode_args(i))
            (self.workdir / "flwr-home" / "config.toml").write_text(
                f'[superlink.loopback]\naddress = "{HOST}:{self.superlink_port}"\n'
                f"insecure = true\n")
        except BaseException:
            self.close()
            raise
        return self

    def _start_workers(self) -> None:
        """One worker per SuperNode, each on a socket in its own 0700 temporary folder."""
        from keras_fedpriv.federated.flower.worker import SOCKET_KEY

        for i, config in enumerate(self.node_configs):
            folder = tempfile.mkdtemp(prefix="kfp-w-")  # mode 0700, a short path
            self._worker_dirs.append(folder)
            path = os.path.join(folder, "worker.sock")
            self.worker_sockets.append(path)
            config[SOCKET_KEY] = path
            self._spawn(f"worker-{i}", self._worker_args(i))
        deadline = time.monotonic() + self.worker_startup_timeout
        for i in range(len(self.worker_sockets)):
            self._wait_for_worker(i, deadline)

    def _wait_for_worker(self, index: int, deadline: float) -> None:
        """Return once worker ``index`` answers a ping; raise if it exits or ``deadline``
        (``time.monotonic()``) passes first."""
        from keras_fedpriv.federated.flower.worker import ping

        path = self.worker_sockets[index]
        while True:
            try:
                ping(path, timeout=5.0)
                return
            except OSError:
                pass
            proc = self.processes[f"worker-{index}"]
            if proc.poll() is not None:
                raise RuntimeError(f"worker {index} exited with code {proc.returncode}:\n"
                                   f"{self.log(f'worker-{index}')[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {index} did not answer on {path} within "
                                   f"{self.worker_startup_timeout:g} s")
            time.sleep(0.2)

    def __enter__(self) -> LoopbackDeployment:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _stop(self, proc: subprocess.Popen, grace: float) -> None:
        if proc.poll() is not None:
            try:  # its children may outlive it: stop the whole group
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL cannot stop
            pass

    def _kill(self, name: str) -> None:
        proc = self.processes[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def kill_supernode(self, index: int) -> None:
        """Kill SuperNode ``index`` (and what it spawned) at once, as a crashing client."""
        self._kill(f"supernode-{index}")

    def kill_worker(self, index: int) -> None:
        """Kill party worker ``index`` at once (its socket file stays, as after a crash)."""
        self._kill(f"worker-{index}")

    def restart_worker(self, index: int) -> None:
        """Start party worker ``index`` again on its socket; return once it answers."""
        if self.processes[f"worker-{index}"].poll() is None:
            raise RuntimeError(f"worker {index} is still running: kill_worker({index}) first.")
        self._logs.pop(f"worker-{index}").close()
        self._spawn(f"worker-{index}", self._worker_args(index), append=True)
        self._wait_for_worker(index, time.monotonic() + self.worker_startup_timeout)

    def _worker_args(self, index: int) -> list[str]:
        args = [sys.executable, "-m", "keras_fedpriv", "worker", "--app",
                str(self.worker_app), "--socket", self.worker_sockets[index]]
        if self.worker_app_dir is not None:
            args += ["--app-dir", self.worker_app_dir]
        return args

    def restart_supernode(self, index: int) -> None:
        """Start SuperNode ``index`` again, with the same node config and port, after
        `kill_supernode` (as a service manager would). Flower gives it a new node id unless
        the SuperLink authenticates SuperNodes by key."""
        if self.processes[f"supernode-{index}"].poll() is None:
            raise RuntimeError(f"SuperNode {index} is still running: kill_supernode({index}) "
                               "first.")
        self._logs.pop(f"supernode-{index}").close()
        self._spawn(f"supernode-{index}", self._supernode_args(index), append=True)

    def _supernode_args(self, index: int) -> list[str]:
        config = self.node_configs[index]
        node_config = " ".join(f"{k}={_toml_value(v)}" for k, v in config.items())
        return ["flower-supernode", "--insecure", "--superlink",
                f"{HOST}:{self.superlink_port}", "--port", str(self.supernode_ports[index]),
                "--node-config", node_config]

    def close(self, grace: float = 5.0) -> None:
        """Stop every process this object started (SuperNodes first), and their descendants.

        By process group first; then any descendant that started a session
        of its own (Flower starts ``flower-superexec`` that way) is killed by
        its process id, found from the started processes' process tree.
        """
        started = [p.pid for p in self.processes.values() if p.poll() is None]
        family = process_family(started)
        # SuperNodes, then workers, then the SuperLink
        order = {"superlink": 2, "worker": 1}
        for name in sorted(self.processes, key=lambda n: order.get(n.split("-")[0], 0)):
            self._stop(self.processes[name], grace)
        kill_family(family, wait=grace)
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        for folder in self._worker_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        self._worker_dirs.clear()
        if self._own_dir and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def alive(self) -> list[int]:
        """Process ids of the started processes, and their descendants, that still run."""
        started = [p.pid for p in self.processes.values() if p.poll() is None]
        return started + _descendants(started)

    def log(self, name: str) -> str:
        """The output so far of process ``name`` (``"superlink"``, ``"supernode-0"``,
        ``"worker-0"``, ...)."""
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------------------ run
    def run(self, app_dir: str | os.PathLike[str],
            run_config: Mapping[str, Any] | None = None,
            timeout: float = 300.0) -> subprocess.CompletedProcess:
        """``flwr run APP_DIR loopback --stream`` with ``run_config`` overrides, bounded in time.

        Args:
            app_dir: the Flower app folder (with its ``pyproject.toml``).
            run_config: keys of the app's ``[tool.flwr.app.config]`` to
                override.
            timeout: seconds; the ``flwr run`` process is killed after that
                (`subprocess.TimeoutExpired` is raised).

        Returns:
            The `subprocess.CompletedProcess` (stdout and stderr merged in
            ``stdout``: the streamed logs of the ServerApp). ``flwr run``
            exits with 0 even when the ServerApp fails, so the return code is
            set from the run's status on the SuperLink (``flwr list``): 0 only
            for ``finished:completed``; the status is appended to ``stdout``
            (`keras_fedpriv.federated.flower.run_status.flwr_run`).
        """
        text = None
        if run_config:
            text = " ".join(f"{k}={_toml_value(v)}" for k, v in run_config.items())
        return flwr_run(app_dir, "loopback", text, env=self.env, bindir=self._bin,
                        timeout=timeout)

    def run_status(self, output: str) -> str:
        """The status (``finished:completed``, ``finished:failed``, ...) of the run that
        ``flwr run`` reported starting in ``output``, from the SuperLink; ``"unknown"``
        if it cannot be read."""
        return run_status("loopback", output, env=self.env, bindir=self._bin)
