"""Run this Flower app on one machine as separate processes: one command, loopback only.

    python examples/flower_horizontal/run_loopback.py [--rounds 5] [--upload fedavg]

Starts a SuperLink and three SuperNodes on 127.0.0.1 (free ports, no TLS, a
temporary FLWR_HOME), runs the app once with `flwr run`, prints the server's
log (per-round metrics and the privacy report) and stops exactly the processes
it started. For separate machines see docs/flower.md.
"""

import argparse
import pathlib
import sys

from keras_fedpriv.federated.flower.loopback import LoopbackDeployment

APP = pathlib.Path(__file__).resolve().parent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--upload", choices=["signds", "fedavg"], default="signds")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the run")
    args = parser.parse_args(argv)
    # each client's scheme is its own choice (node config), the server's is the run config's
    nodes = [{"partition-id": i, "num-partitions": 3, "upload": args.upload} for i in range(3)]
    with LoopbackDeployment(3, node_configs=nodes) as deployment:
        done = deployment.run(APP, {"num-server-rounds": args.rounds, "upload": args.upload},
                              timeout=args.timeout)
    print(done.stdout)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
