"""Run this Flower app on one machine as separate processes: one command, loopback only.

    python examples/flower_horizontal/run_loopback.py [--clients 5] [--rounds 10] [--upload fedavg]
        [--no-workers]

Starts a SuperLink and one SuperNode per client on 127.0.0.1 (free ports, no
TLS, a temporary FLWR_HOME), and a party worker beside each SuperNode (the
app's ClientApp relays each message to it; --no-workers: none, a ClientApp
process per message, as Flower alone); runs the app once with `flwr run`, prints
the server's output as it comes (one line per round: replies, val_accuracy,
eps so far, seconds; then the privacy report) and stops exactly the processes
it started. Options left out keep the run config of pyproject.toml. For
separate machines see README.md.
"""

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

from keras_fedpriv.logs import quiet_tensorflow

quiet_tensorflow()  # here and in every process it starts (KERAS_FEDPRIV_TF_LOGS=1: logs)

from keras_fedpriv.federated.flower.loopback import LoopbackDeployment  # noqa: E402

APP = pathlib.Path(__file__).resolve().parent


def _relay_target():
    """The real ClientApp ("module:attr") if the app's ClientApp relays to a worker, else None."""
    sys.path.insert(0, str(APP))
    try:
        from flower_horizontal import client_app
    finally:
        sys.path.remove(str(APP))
    target = getattr(client_app.app, "target", None)
    return target if isinstance(target, str) else None


def _flwr_run(deployment, run_config, timeout):
    """``flwr run APP loopback --stream``, echoing its output line by line; the run's status."""
    flwr = pathlib.Path(sys.executable).with_name("flwr")
    overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())
    proc = subprocess.Popen([str(flwr), "run", str(APP), "loopback", "--stream"]
                            + (["--run-config", overrides] if overrides else []),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=deployment.env, start_new_session=True)
    # past the time limit: stop the `flwr run` we started (its process group), nothing else
    timer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            print(line, end="", flush=True)
        proc.wait()
    finally:
        timer.cancel()
    return deployment.run_status("".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=5,
                        help="SuperNodes (num-clients and each node's num-partitions)")
    parser.add_argument("--rounds", type=int, default=None, help="num-server-rounds")
    parser.add_argument("--clients-per-round", type=int, default=None, help="clients-per-round")
    parser.add_argument("--local-epochs", type=int, default=None, help="local-epochs")
    parser.add_argument("--upload", choices=["signds", "fedavg"], default="signds",
                        help="every client's scheme (node config) and the server's (run config)")
    parser.add_argument("--result-path", default="", help="a folder for history.json")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the run")
    parser.add_argument("--no-workers", action="store_true",
                        help="no party workers: a ClientApp process (and TensorFlow) per message")
    args = parser.parse_args(argv)
    # each client's partition and scheme are its own choice (node config); the server's
    # settings are the run config's
    nodes = [{"partition-id": i, "num-partitions": args.clients, "upload": args.upload}
             for i in range(args.clients)]
    config = {"num-clients": args.clients, "num-server-rounds": args.rounds,
              "clients-per-round": args.clients_per_round or args.clients,
              "local-epochs": args.local_epochs, "upload": args.upload,
              "result-path": args.result_path}
    target = None if args.no_workers else _relay_target()
    workers = {"worker_app": target, "worker_app_dir": APP} if target else {}
    started = time.perf_counter()
    with LoopbackDeployment(args.clients, node_configs=nodes, **workers) as deployment:
        print(f"SuperLink and {args.clients} SuperNodes up on 127.0.0.1"
              f"{' with party workers' if target else ''} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
        status = _flwr_run(deployment, {k: v for k, v in config.items() if v is not None},
                           args.timeout)
    print(f"run status: {status} ({time.perf_counter() - started:.1f} s in all)")
    return 0 if status == "finished:completed" else 1


if __name__ == "__main__":
    sys.exit(main())
