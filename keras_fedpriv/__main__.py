"""Command line: ``python -m keras_fedpriv demo`` (or the ``keras-fedpriv`` script)."""

from __future__ import annotations

import argparse
import sys

# Light: the demo module imports nothing heavy beyond what the package already does.
from keras_fedpriv.demo import DEFAULT_EPOCHS, QUICK_EPOCHS, run_demo
from keras_fedpriv.demo_horizontal import DEFAULT_ROUNDS, run_horizontal_demo


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {value}")
    return value


def _seed(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer in [0, 2**31); got {text!r}") from None
    if not 0 <= value < 2**31:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**31); got {value}")
    return value


def build_parser():
    """The argparse parser (subcommand ``demo``)."""
    parser = argparse.ArgumentParser(
        prog="keras-fedpriv",
        description="keras-fedpriv: Keras layers for private federated learning.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="vertical FL with label/embedding DP, then horizontal FL with SignDS",
        description="Vertical part: train a two-party vertical (split) model on scikit-learn's "
                    "breast cancer data with no protection, LabelDP, EmbeddingDP, both and a "
                    "VAE bottom; print test accuracy and label-attack AUCs. Horizontal part: a "
                    "few rounds of FedAvg, SignDS, SignDS+MagRR and a Gaussian baseline on "
                    "digits split among 100 clients; print accuracy and upload bytes.")
    demo.add_argument("--epochs", type=_positive_int, default=None,
                      help="training epochs per configuration (default "
                           f"{DEFAULT_EPOCHS}; {QUICK_EPOCHS} with --quick)")
    demo.add_argument("--seed", type=_seed, default=None,
                      help="seed the models and every privacy mechanism (default: unseeded; "
                           "the privacy layers draw secrets from OS entropy)")
    demo.add_argument("--rounds", type=_positive_int, default=None,
                      help=f"federated rounds per horizontal configuration (default "
                           f"{DEFAULT_ROUNDS})")
    demo.add_argument("--part", choices=("all", "vertical", "horizontal"), default="all",
                      help="which part to run (default: all)")
    demo.add_argument("--quick", action="store_true",
                      help="fewer configurations, epochs and rounds")
    return parser


def main(argv=None):
    """Entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "demo":
        if args.part in ("all", "vertical"):
            run_demo(epochs=args.epochs, seed=args.seed, quick=args.quick, out=sys.stdout)
        if args.part == "all":
            print(file=sys.stdout)
        if args.part in ("all", "horizontal"):
            run_horizontal_demo(rounds=args.rounds, seed=args.seed, quick=args.quick,
                                out=sys.stdout)
        return 0
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
