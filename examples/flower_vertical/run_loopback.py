"""Run this vertical Flower app on one machine as separate processes: one command, loopback only.

    python examples/flower_vertical/run_loopback.py [--epochs 3]

Starts a SuperLink and two SuperNodes (the followers f1 and f2) on 127.0.0.1
(free ports, no TLS, a temporary FLWR_HOME), runs the app once with `flwr
run` (the ServerApp is the leader), prints the leader's log (loss and AUC per
epoch, the privacy report of its labels) and stops exactly the processes it
started. For separate machines see docs/flower.md.
"""

import argparse
import pathlib
import sys

from keras_fedpriv.federated.flower.loopback import LoopbackDeployment

APP = pathlib.Path(__file__).resolve().parent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the run")
    parser.add_argument("--result-path", default="", help="a folder for history.json")
    args = parser.parse_args(argv)
    nodes = [{"party": party} for party in ("f1", "f2")]  # each follower names its party
    with LoopbackDeployment(2, node_configs=nodes) as deployment:
        done = deployment.run(APP, {"num-epochs": args.epochs, "result-path": args.result_path},
                              timeout=args.timeout)
    print(done.stdout)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
