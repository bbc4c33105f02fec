"""``flwr run`` with an exit status that says whether the run succeeded.

Flower 1.41's ``flwr run APP CONNECTION --stream`` exits with 0 when the run
it started fails on the SuperLink (a ServerApp that raises, e.g. a vertical
run whose follower stayed away, or a horizontal run with too many failed
rounds, ends ``finished:failed``), so a script or a CI job cannot tell a
failed run from a good one. `flwr_run` runs the same command, streams its
output, then asks the SuperLink for the run's status (``flwr list CONNECTION
--run-id N --format json``) and returns 0 only for ``finished:completed``.
``keras-fedpriv flwr-run APP CONNECTION [--run-config ...]`` is the same from
the command line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import IO, Mapping

__all__ = ["COMPLETED", "flwr_run", "run_status"]

COMPLETED = "finished:completed"


def _flwr(bindir: str | None) -> str:
    return shutil.which("flwr", path=bindir) or "flwr"


def run_status(connection: str, output: str, env: Mapping[str, str] | None = None,
               bindir: str | None = None, timeout: float = 60.0) -> str:
    """The status (``finished:completed``, ``finished:failed``, ...) of the run that ``flwr
    run`` reported starting in ``output``, from the SuperLink of ``connection``;
    ``"unknown"`` if it cannot be read."""
    match = re.search(r"Successfully started run (\d+)", output)
    if match is None:
        return "unknown"
    try:
        done = subprocess.run([_flwr(bindir), "list", connection, "--run-id", match.group(1),
                               "--format", "json"], capture_output=True, text=True,
                              env=None if env is None else dict(env), timeout=timeout)
        runs = json.loads(done.stdout).get("runs", [])
    except (subprocess.TimeoutExpired, ValueError, AttributeError, OSError):
        return "unknown"
    return str(runs[0].get("status", "unknown")) if runs else "unknown"


def flwr_run(app_dir: str | os.PathLike[str], connection: str, run_config: str | None = None,
             *, env: Mapping[str, str] | None = None, bindir: str | None = None,
             timeout: float | None = None, echo: IO[str] | None = None
             ) -> subprocess.CompletedProcess:
    """``flwr run APP_DIR CONNECTION --stream [--run-config RUN_CONFIG]``, bounded in time,
    with a return code from the run's status on the SuperLink.

    Args:
        app_dir: the Flower app folder (with its ``pyproject.toml``).
        connection: the connection's name in the Flower configuration.
        run_config: None, or the ``--run-config`` text (``"num-server-rounds=3 ..."``).
        env: the environment of ``flwr`` (default: this process's).
        bindir: where to find ``flwr`` first (default: ``PATH``).
        timeout: None, or seconds after which ``flwr run`` is killed
            (`subprocess.TimeoutExpired` is raised).
        echo: None, or a text stream that gets every output line as it comes.

    Returns:
        The `subprocess.CompletedProcess`, stdout and stderr merged in
        ``stdout`` with a last line ``run status: STATUS``; the return code
        is ``flwr run``'s when that is not 0, else 0 only for
        ``finished:completed`` (1 for any other status, ``unknown`` included).
    """
    args = [_flwr(bindir), "run", os.fspath(app_dir), connection, "--stream"]
    if run_config:
        args += ["--run-config", run_config]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=None if env is None else dict(env), start_new_session=True,
                            text=True)
    lines: list[str] = []
    if timeout is not None:
        import threading

        timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if echo is not None:
                echo.write(line)
                echo.flush()
        proc.wait()
    finally:
        if timeout is not None:
            timer.cancel()
    out = "".join(lines)
    if proc.returncode == -signal.SIGKILL and timeout is not None:
        raise subprocess.TimeoutExpired(args, timeout, output=out)
    code = proc.returncode
    status = run_status(connection, out, env=env, bindir=bindir)
    if code == 0 and status != COMPLETED:
        code = 1
    return subprocess.CompletedProcess(args, code, f"{out}\nrun status: {status}\n", "")


def main(app_dir: str, connection: str, run_config: str | None) -> int:
    """``keras-fedpriv flwr-run``: run, stream, print the status; the exit status."""
    done = flwr_run(app_dir, connection, run_config, echo=sys.stdout)
    status = done.stdout.rstrip().rsplit("run status: ", 1)[-1]
    print(f"run status: {status}", file=sys.stdout if done.returncode == 0 else sys.stderr)
    if done.returncode != 0 and status != "unknown" and status != COMPLETED:
        print(f"the run did not complete ({status}); the ServerApp's error is in the output "
              "above", file=sys.stderr)
    return done.returncode
