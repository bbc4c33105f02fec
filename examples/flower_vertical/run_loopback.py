"""Run this vertical Flower app on one machine as separate processes: one command, loopback only.

    python examples/flower_vertical/run_loopback.py [--epochs 2] [--batches-per-message 13]

Starts a SuperLink and two SuperNodes (the followers f1 and f2) on 127.0.0.1
(free ports, no TLS, a temporary FLWR_HOME), runs the app once with `flwr
run` (the ServerApp is the leader), prints the leader's log (one line per
epoch: loss, validation AUC, seconds; then the privacy report of its labels)
and stops exactly the processes it started. Options left out keep the run
config of pyproject.toml. For separate machines see README.md and
docs/flower.md.
"""

import argparse
import pathlib
import sys

from keras_fedpriv.federated.flower.loopback import LoopbackDeployment

APP = pathlib.Path(__file__).resolve().parent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None, help="num-epochs")
    parser.add_argument("--batch-size", type=int, default=None, help="batch-size")
    parser.add_argument("--batches-per-message", type=int, default=None,
                        help="K: batches per message to a follower (1: synchronous)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the run")
    parser.add_argument("--result-path", default="", help="a folder for history.json")
    args = parser.parse_args(argv)
    nodes = [{"party": party} for party in ("f1", "f2")]  # each follower names its party
    with LoopbackDeployment(2, node_configs=nodes) as deployment:
        config = {"num-epochs": args.epochs, "batch-size": args.batch_size,
                  "batches-per-message": args.batches_per_message,
                  "result-path": args.result_path}
        done = deployment.run(APP, {k: v for k, v in config.items() if v is not None},
                              timeout=args.timeout)
    print(done.stdout)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
