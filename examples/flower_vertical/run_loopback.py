"""Run this vertical Flower app on one machine as separate processes: one command, loopback only.

    python examples/flower_vertical/run_loopback.py [--epochs 2] [--batches-per-message 13]
        [--no-workers] [--dataset criteo-like --rows 100000 --batch-size 1024]

Starts a SuperLink and two SuperNodes (the followers f1 and f2; with
``--dataset criteo-like`` one, the follower 'follower') on 127.0.0.1
(free ports, no TLS, a temporary FLWR_HOME) and a party worker beside each
SuperNode (the app's ClientApp relays each message to it; --no-workers: none,
a ClientApp process per message, as Flower alone), runs the app once with `flwr
run` (the ServerApp is the leader), prints the leader's log (one line per
epoch: loss, validation AUC, seconds; then the privacy report of its labels)
and stops exactly the processes it started. Options left out keep the run
config of pyproject.toml. For separate machines see README.md and
docs/flower.md.
"""

import argparse
import pathlib
import sys
import time

from keras_fedpriv.logs import quiet_tensorflow

quiet_tensorflow()  # no TensorFlow start-up logs here or in the parties' processes

from keras_fedpriv.federated.flower.loopback import LoopbackDeployment  # noqa: E402

APP = pathlib.Path(__file__).resolve().parent


def _worker_app():
    """The real ClientApp ("module:attr") that the app's relay ClientApp hands messages to."""
    sys.path.insert(0, str(APP))
    try:
        from flower_vertical.client_app import app
    finally:
        sys.path.remove(str(APP))
    return app.target


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("breast-cancer", "criteo-like"), default=None,
                        help="dataset (criteo-like: one follower, Wide&Deep)")
    parser.add_argument("--rows", type=int, default=None, help="criteo-like: training rows")
    parser.add_argument("--epochs", type=int, default=None, help="num-epochs")
    parser.add_argument("--batch-size", type=int, default=None, help="batch-size")
    parser.add_argument("--batches-per-message", type=int, default=None,
                        help="K: batches per message to a follower (1: synchronous)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the run")
    parser.add_argument("--result-path", default="", help="a folder for history.json")
    parser.add_argument("--no-workers", action="store_true",
                        help="no party workers: a ClientApp process (and TensorFlow) per message")
    args = parser.parse_args(argv)
    followers = ("follower",) if args.dataset == "criteo-like" else ("f1", "f2")
    nodes = [{"party": party} for party in followers]  # each follower names its party
    workers = {} if args.no_workers else {"worker_app": _worker_app(), "worker_app_dir": APP}
    started = time.perf_counter()
    with LoopbackDeployment(len(nodes), node_configs=nodes, **workers) as deployment:
        print(f"SuperLink and {len(nodes)} SuperNode(s) up on 127.0.0.1"
              f"{'' if args.no_workers else ' with party workers'} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
        config = {"dataset": args.dataset, "rows": args.rows, "num-epochs": args.epochs,
                  "batch-size": args.batch_size,
                  "batches-per-message": args.batches_per_message,
                  "result-path": args.result_path}
        done = deployment.run(APP, {k: v for k, v in config.items() if v is not None},
                              timeout=args.timeout)
    print(done.stdout)
    print(f"{time.perf_counter() - started:.1f} s in all")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
