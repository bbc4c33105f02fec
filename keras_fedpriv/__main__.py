"""Command line: ``python -m keras_fedpriv demo`` (or the ``keras-fedpriv`` script)."""

from __future__ import annotations

import argparse
import sys

# Light: the demo module imports nothing heavy beyond what the package already does.
from keras_fedpriv.demo import DEFAULT_EPOCHS, QUICK_EPOCHS, run_demo


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
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**31); got {text!r}") from None
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
        "demo", help="train a two-party vertical model with label DP / embedding DP",
        description="Train a two-party vertical (split) model on scikit-learn's breast cancer "
                    "data with no protection, LabelDP, EmbeddingDP and both, and print the test "
                    "accuracy of each configuration.")
    demo.add_argument("--epochs", type=_positive_int, default=None,
                      help="training epochs per configuration (default "
                           f"{DEFAULT_EPOCHS}; {QUICK_EPOCHS} with --quick)")
    demo.add_argument("--seed", type=_seed, default=None,
                      help="seed the models and every privacy mechanism (default: unseeded; "
                           "the privacy layers draw secrets from OS entropy)")
    demo.add_argument("--quick", action="store_true",
                      help="fewer configurations and epochs")
    return parser


def main(argv=None):
    """Entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "demo":
        run_demo(epochs=args.epochs, seed=args.seed, quick=args.quick, out=sys.stdout)
        return 0
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
