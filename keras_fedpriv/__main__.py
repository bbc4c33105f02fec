"""Command line: ``keras-fedpriv demo|audit|plan|worker|flwr-run`` (or ``python -m keras_fedpriv ...``).

Each subcommand imports its code when it runs: ``--help`` and argument errors
import no TensorFlow. TensorFlow's start-up logs are hidden unless
``KERAS_FEDPRIV_TF_LOGS=1`` is set (`keras_fedpriv.logs.quiet_tensorflow`).
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap

from keras_fedpriv.mechanisms import registry

# The demos' defaults, for the help text without importing the demos (TensorFlow);
# tests/test_cli.py checks that they match keras_fedpriv.demo and keras_fedpriv.demo_horizontal.
DEFAULT_EPOCHS, QUICK_EPOCHS, DEFAULT_ROUNDS = 25, 15, 30


def _argument(convert, accept, allowed):
    """An argparse ``type``: ``convert`` the text, keep it if ``accept``, else say ``allowed``."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {text!r}") from None
        if not accept(value):
            shown = value if convert is int else repr(text)
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {shown}")
        return value
    return parse


def _int_at_least(minimum):
    return _argument(int, lambda v: v >= minimum, f"an integer >= {minimum}")


_positive_int = _int_at_least(1)
_seed = _argument(int, lambda v: 0 <= v < 2**31, "an integer in [0, 2**31)")
_positive_float = _argument(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
_delta = _argument(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
_confidence = _argument(float, lambda v: 0 < v < 1, "a number in (0, 1)")


def _wrap(text):
    return textwrap.fill(text, 78, break_on_hyphens=False)


def package_version():
    """The installed distribution's version, or ``keras_fedpriv.__version__`` when not installed.

    Returns:
        The version string, e.g. ``"0.1.0"``.
    """
    from importlib import metadata

    try:
        return metadata.version("keras-fedpriv")
    except metadata.PackageNotFoundError:
        import keras_fedpriv

        return keras_fedpriv.__version__


#: ``keras-fedpriv audit`` mechanisms: name -> (auditor in keras_fedpriv.privacy, what it audits,
#: the optional CLI arguments it takes).
AUDITS = {
    "binary_rr": ("audit_binary_rr", "binary randomized response", ()),
    "kary_rr": ("audit_kary_rr", "K-ary randomized response", ("num_classes",)),
    "quantize_rr": ("audit_quantize_rr", "quantize + RR of one coordinate (claim eps/2)", ()),
    "laplace": ("audit_laplace", "the Laplace mechanism (discrete sampler)", ()),
    "magrr": ("audit_magrr", "MagRR's client bit", ()),
    "signds": ("audit_signds", "SignDS's exponential mechanism (select_indices)", ()),
    "label_dp_layer": ("audit_label_dp_layer", "LabelDPLayer (binary, or sparse with "
                       "--num-classes)", ("num_classes",)),
    "embedding_dp_layer": ("audit_embedding_dp_layer", "EmbeddingDPLayer on "
                           "--num-coordinates coordinates", ("num_coordinates",)),
}

# The planners' facts come from the registry of mechanisms, which imports no TensorFlow.
#: ``keras-fedpriv plan --mechanism`` names (``gaussian``: a noise multiplier, the others: an eps).
PLAN_MECHANISMS = registry.names(alone=True)

_AUDIT_EPILOG = """mechanisms:
{mechanisms}

examples:
  keras-fedpriv audit binary_rr --eps 1
  keras-fedpriv audit kary_rr --eps 2 --num-classes 10 --trials 100000 --seed 0
  keras-fedpriv audit embedding_dp_layer --eps 4 --num-coordinates 4

A correct mechanism gives "lower bound <= claimed eps"; a bound close to the
claim means the audit is tight. The exit status is 1 when the bound exceeds
the claim (the claim is refuted), 0 otherwise.
"""

_PLAN_EPILOG = """examples:
  keras-fedpriv plan --target-eps 8 --releases 20 --mechanism label_dp --num-classes 10
  keras-fedpriv plan --target-eps 8 --releases 10 --mechanism embedding_dp --num-coordinates 16
  keras-fedpriv plan --target-eps 4 --delta 1e-6 --releases 50 --mechanism gaussian
  keras-fedpriv plan --target-eps 8 --mechanisms signds,magrr,laplace_eval \\
      --rounds 100 --clients-per-round 20 --num-clients 100 --evaluate-every 10 \\
      --eval-rows 50 --num-classes 10
  keras-fedpriv plan --target-eps 4 --mechanisms label_dp,embedding_dp --epochs 5 \\
      --num-coordinates 16

One mechanism (--mechanism):
{mechanisms}
--releases counts the releases of the busiest unit, in the release pattern
--pattern names (printed with the plan):
  per_example    (label_dp, embedding_dp default) the layer sees example ids:
                 1 for labels privatized once, the epochs (plus inference
                 passes) for EmbeddingDPLayer or a per-batch LabelDPLayer
  every_example  no example ids (e.g. a plain model.fit): every call counts
                 for every example, so releases = batches per epoch x epochs
  per_client     (signds, magrr, gaussian) the rounds a client takes part in
In Python: keras_fedpriv.privacy.plan_mechanism (its PlanCheck callback stops
a fit whose releases do not match the plan).

A whole run (--mechanisms): each secret (client data; labels; features) meets
the target on its own, as privacy_report(..., protects=...) reports it;
within a secret the releases compose, split by --weight. Client releases
are counted for the busiest client: with random sampling that is every round
unless --max-rounds-per-client states a smaller bound (an assumption
PlanCheck enforces). In Python: keras_fedpriv.privacy.plan. Default weights:
{weights}

A warning (stderr) says when a per-release setting is too small to learn.
"""


def _plan_epilog():
    """``keras-fedpriv plan``'s epilog, its mechanisms and default weights read from the registry."""
    mechanisms = "\n".join(f"  {name:14s} {registry.MECHANISMS[name].title}"
                           for name in PLAN_MECHANISMS)
    weights = ", ".join(f"{m.name}={m.weight:g}" for m in registry.MECHANISMS.values())
    return _PLAN_EPILOG.format(mechanisms=mechanisms, weights=textwrap.fill(
        weights, 78, initial_indent="  ", subsequent_indent="  "))


def build_parser():
    """The argparse parser (subcommands ``demo``, ``audit``, ``plan`` and ``worker``).

    Returns:
        An `argparse.ArgumentParser`.
    """
    parser = argparse.ArgumentParser(
        prog="keras-fedpriv",
        description="keras-fedpriv: Keras layers for private federated learning.",
        epilog="examples:\n"
               "  keras-fedpriv demo --quick\n"
               "  keras-fedpriv audit binary_rr --eps 1\n"
               "  keras-fedpriv plan --target-eps 8 --releases 20 --mechanism label_dp\n"
               "  keras-fedpriv plan --target-eps 8 --mechanisms signds,magrr --rounds 50 \\\n"
               "      --clients-per-round 10 --num-clients 100\n\n"
               "Run 'keras-fedpriv COMMAND --help' for a command's options.\n\n"
               "TensorFlow's start-up logs (oneDNN, CUDA drivers, cuInit) are hidden;\n"
               "KERAS_FEDPRIV_TF_LOGS=1 shows them (a TF_CPP_MIN_LOG_LEVEL you set is kept).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.set_defaults(command_parsers=sub.choices)  # name -> subparser, for `sub_parser`
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
    demo.add_argument("--figure", default=None, metavar="PATH",
                      help="write the vertical part's accuracy / attack-AUC figure to PATH "
                           "(PNG; default: no figure)")
    demo.add_argument("--quick", action="store_true",
                      help="fewer configurations, epochs and rounds")

    audit = sub.add_parser(
        "audit", help="empirical lower bound on a mechanism's eps",
        description=_wrap("Run a mechanism of the package many times on two neighbouring inputs "
                    "and print a lower bound on its eps that holds with the given confidence "
                    "(Clopper-Pearson), next to the eps the mechanism claims."),
        epilog=_AUDIT_EPILOG.format(mechanisms="\n".join(
            f"  {name:20s}{what}" for name, (_, what, _) in AUDITS.items())),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    audit.add_argument("mechanism", metavar="MECHANISM", choices=tuple(AUDITS),
                       help="what to audit (listed below)")
    audit.add_argument("--eps", type=_positive_float, required=True,
                       help="the mechanism's eps (> 0)")
    audit.add_argument("--trials", type=_int_at_least(100), default=None,
                       help="runs per input, >= 100 (default: the auditor's, 200000; "
                            "signds runs one Python call per trial, ~0.1 ms each)")
    audit.add_argument("--seed", type=_seed, default=None,
                       help="seed for a reproducible audit (default: OS entropy)")
    audit.add_argument("--confidence", type=_confidence, default=0.95,
                       help="probability with which the lower bound holds (default 0.95)")
    audit.add_argument("--num-classes", type=_int_at_least(2), default=None,
                       help="K for kary_rr (default 10) and label_dp_layer (sparse labels; "
                            "default: binary labels)")
    audit.add_argument("--num-coordinates", type=_positive_int, default=None,
                       help="embedding size for embedding_dp_layer (default 1)")

    plan = sub.add_parser(
        "plan", help="per-release eps (or Gaussian noise) that meets a total budget, for one "
                     "mechanism or a whole run",
        description=_wrap("Given the (eps, delta) a run may spend, print the eps to give each "
                    "release (or, for the Gaussian upload, the noise multiplier), calibrated "
                    "with dp-accounting's PLD accountant so the run's privacy report comes out "
                    "at or below the target: for one mechanism and its number of releases "
                    "(--mechanism, --releases), or for a whole run (--mechanisms and the run's "
                    "shape: every mechanism's setting, each secret within the target)."),
        epilog=_plan_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("--target-eps", type=_positive_float, required=True,
                      help="eps the whole run may spend (> 0; per secret with --mechanisms)")
    plan.add_argument("--delta", type=_delta, default=1e-5,
                      help="delta of the target, in [0, 1) (default 1e-5)")
    plan.add_argument("--num-classes", type=_int_at_least(2), default=None,
                      help="K for label_dp (and laplace_eval; default 2)")
    plan.add_argument("--num-coordinates", type=_positive_int, default=None,
                      help="embedding size d for embedding_dp (required there)")
    one = plan.add_argument_group("one mechanism")
    one.add_argument("--releases", type=_positive_int, default=None,
                     help="releases of the busiest unit (example or client)")
    one.add_argument("--mechanism", choices=PLAN_MECHANISMS, default=None,
                     help="the mechanism to plan (listed below)")
    one.add_argument("--pattern", choices=tuple(registry.PATTERNS), default=None,
                     help="release pattern --releases counts in (default: per_example for "
                          "label_dp and embedding_dp, per_client otherwise)")
    _add_whole_run_arguments(plan.add_argument_group(
        "a whole run (keras_fedpriv.privacy.plan)"))
    _add_worker_parser(sub)
    _add_flwr_run_parser(sub)
    return parser


#: ``keras-fedpriv plan --mechanisms`` names (keras_fedpriv.privacy.run_plan.RUN_MECHANISMS).
RUN_MECHANISMS = tuple(registry.MECHANISMS)
#: The whole-run options, and their defaults when --mechanisms is given.
_WHOLE_RUN = {"mechanisms": None, "rounds": None, "clients_per_round": None, "num_clients": None,
              "max_rounds_per_client": None, "epochs": None, "evaluate_every": 1,
              "eval_rows": None,
              "label_releases": 1, "k": 0.2, "weight": []}


def _add_whole_run_arguments(run):
    run.add_argument("--mechanisms", default=None, metavar="M1,M2,...",
                     help=f"plan a whole run: comma-separated, from {', '.join(RUN_MECHANISMS)}")
    for flag, what in (("--rounds", "federated rounds"),
                       ("--clients-per-round", "clients sampled per round"),
                       ("--num-clients", "clients in the run"),
                       ("--max-rounds-per-client", "an assumed bound on the rounds the busiest "
                                                   "client takes part in (default: every round)"),
                       ("--epochs", "training epochs (embedding_dp: one release per epoch)"),
                       ("--evaluate-every", "rounds between Laplace evaluations (default 1)"),
                       ("--eval-rows", "rows a client's Laplace evaluation reports (each row "
                                       "is a release about the client; required with "
                                       "laplace_eval)"),
                       ("--label-releases", "releases per label (default 1: randomized once; "
                                            "the epochs for per_batch)")):
        run.add_argument(flag, type=_positive_int, default=None, help=what)
    run.add_argument("--k", type=_positive_float, default=None,
                     help="SignDS's top-k fraction, for the too-small-to-learn check "
                          "(default 0.2)")
    run.add_argument("--weight", action="append", default=None, metavar="MECHANISM=W",
                     help="relative per-release eps within a secret (repeatable)")


def _run_whole_plan(parser, args, out, err):
    import warnings

    from keras_fedpriv.privacy import plan

    mechanisms = tuple(m.strip() for m in args.mechanisms.split(",") if m.strip())
    unknown = [m for m in mechanisms if m not in RUN_MECHANISMS]
    if unknown or not mechanisms:
        parser.error(f"argument --mechanisms: expected names from {', '.join(RUN_MECHANISMS)}; "
                     f"got {args.mechanisms!r}")
    weights = {}
    for item in args.weight or ():
        name, _, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            parser.error(f"argument --weight: expected MECHANISM=NUMBER; got {item!r}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = plan(args.target_eps, args.delta, mechanisms=mechanisms, rounds=args.rounds,
                          clients_per_round=args.clients_per_round, num_clients=args.num_clients,
                          max_rounds_per_client=args.max_rounds_per_client,
                          evaluate_every=args.evaluate_every or 1, epochs=args.epochs,
                          eval_rows=args.eval_rows,
                          label_releases=args.label_releases or 1, weights=weights or None,
                          num_classes=args.num_classes or 2,
                          num_coordinates=args.num_coordinates, k=args.k or 0.2)
        except (TypeError, ValueError) as error:
            parser.error(_as_options(str(error), args))
    print(result, file=out)
    for warning in caught:
        print(f"warning: {_as_options(str(warning.message), args)}", file=err)
    return 0


def _as_options(message, args):
    """``message`` with each Python argument name (`` `num_clients` ``) as its option."""
    for dest in vars(args):
        message = message.replace(f"`{dest}`", f"--{dest.replace('_', '-')}")
    return message


_WORKER_EPILOG = """examples:
  install -d -m 700 /run/fl-worker
  keras-fedpriv worker --app my_app.client:app --app-dir ./my_app --socket /run/fl-worker/w.sock
  flower-supernode ... --node-config "partition-id=0 worker-socket='/run/fl-worker/w.sock'"

The folder of --socket must belong to you and be closed to everyone else
(mode 700); the worker refuses to start otherwise, and answers only processes
of its own user. It stops on SIGTERM or Ctrl-C and removes its socket.
"""


def _add_worker_parser(sub):
    worker = sub.add_parser(
        "worker", help="a party's long-lived Flower ClientApp worker (beside its SuperNode)",
        description=_wrap("Import a Flower ClientApp once and answer the messages that "
                          "relay_client_app hands over on a Unix socket, keeping TensorFlow, "
                          "models and traced functions loaded between messages and runs."),
        epilog=_WORKER_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    worker.add_argument("--app", required=True, metavar="MODULE:ATTR",
                        help="the ClientApp this worker serves, e.g. my_app.client:app (the "
                             "target the app's relay_client_app names)")
    worker.add_argument("--socket", required=True, metavar="PATH",
                        help="the Unix socket to listen on, in a folder only you can open")
    worker.add_argument("--app-dir", default=None, metavar="DIR",
                        help="a folder to put first on the import path (the app's folder)")
    worker.add_argument("--max-frame-mib", type=_positive_int, default=None,
                        help="refuse a request larger than this many MiB (default 1024)")
    worker.add_argument("--read-timeout", type=_positive_float, default=None, metavar="SECONDS",
                        help="seconds a connection has to send its whole request (default 10); "
                             "each connection is read on its own, so a stuck one delays no other")
    worker.add_argument("--max-connections", default=None, metavar="N",
                        type=_argument(int, lambda v: 1 <= v <= 4096, "an integer from 1 to 4096"),
                        help="connections read at once (default 32); more wait for a free slot")


def _add_flwr_run_parser(sub):
    run = sub.add_parser(
        "flwr-run", help="flwr run --stream, exiting non-zero when the run does not complete",
        description=_wrap("Run `flwr run APP CONNECTION --stream` (Flower's own command), show "
                          "its output, then ask the SuperLink for the run's status: exit 0 "
                          "only when it is finished:completed. flwr run itself exits 0 when "
                          "the ServerApp fails (a vertical follower that stayed away, a "
                          "horizontal run with too many failed rounds)."))
    run.add_argument("app", metavar="APP", help="the Flower app folder")
    run.add_argument("connection", metavar="CONNECTION",
                     help="the connection's name in the Flower configuration")
    run.add_argument("--run-config", default=None, metavar="TEXT",
                     help="passed to flwr run, e.g. \"num-server-rounds=3\"")


def _run_worker(args):
    from keras_fedpriv.federated.flower.worker import DEFAULT_MAX_FRAME, serve_worker

    max_frame = DEFAULT_MAX_FRAME if args.max_frame_mib is None else args.max_frame_mib << 20
    options = {k: v for k, v in (("read_timeout", args.read_timeout),
                                 ("max_connections", args.max_connections)) if v is not None}
    serve_worker(args.app, args.socket, app_dir=args.app_dir, max_frame=max_frame, **options)
    return 0


def _run_audit(parser, args, out):
    from keras_fedpriv import privacy

    name, _, takes = AUDITS[args.mechanism]
    for option in ("num_classes", "num_coordinates"):
        if getattr(args, option) is not None and option not in takes:
            flag = "--" + option.replace("_", "-")
            parser.error(f"argument {flag}: not used by mechanism {args.mechanism!r} (used by "
                         + ", ".join(m for m, v in AUDITS.items() if option in v[2]) + ")")
    kwargs = {"seed": args.seed, "confidence": args.confidence}
    if args.trials is not None:
        kwargs["num_trials"] = args.trials
    if args.mechanism == "kary_rr" and args.num_classes is not None:
        kwargs["num_classes"] = args.num_classes
    if args.mechanism == "label_dp_layer" and args.num_classes is not None:
        kwargs.update(mode="sparse", num_classes=args.num_classes)
    if args.mechanism == "embedding_dp_layer" and args.num_coordinates is not None:
        kwargs["num_coordinates"] = args.num_coordinates
    result = getattr(privacy, name)(args.eps, **kwargs)
    verdict = ("REFUTED: the lower bound exceeds the claim" if result.violates_claim
               else "consistent: lower bound <= claimed eps")
    print(result.name, file=out)
    print(f"  claimed eps:          {result.claimed_eps:.4g}", file=out)
    print(f"  empirical lower bound: {result.eps_lower_bound:.4f}", file=out)
    print(f"  confidence:           {result.confidence:g}", file=out)
    print(f"  point estimate:       {result.eps_point_estimate:.4f}", file=out)
    print(f"  runs per input:       {result.num_trials}", file=out)
    print(f"  verdict:              {verdict}", file=out)
    return 1 if result.violates_claim else 0


def _run_plan(parser, args, out, err):
    if args.mechanisms is not None:
        for name in ("mechanism", "releases", "pattern"):
            if getattr(args, name) is not None:
                parser.error(f"argument --{name}: not used with --mechanisms (a whole run)")
        return _run_whole_plan(parser, args, out, err)
    for name in _WHOLE_RUN:
        if name != "mechanisms" and getattr(args, name) is not None:
            parser.error(f"argument --{name.replace('_', '-')}: only used with --mechanisms "
                         f"(a whole run)")
    missing = [f"--{n}" for n in ("releases", "mechanism") if getattr(args, n) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)} (or "
                     f"--mechanisms for a whole run)")
    return _run_one_plan(parser, args, out, err)


def _run_one_plan(parser, args, out, err):
    from keras_fedpriv.privacy import plan_epsilon, plan_noise_multiplier
    from keras_fedpriv.privacy.planning import release_pattern

    entry = registry.mechanism(args.mechanism)
    for size in ("num_classes", "num_coordinates"):
        flag, users = f"--{size.replace('_', '-')}", registry.names(alone=True, takes=size)
        if getattr(args, size) is not None and size not in entry.takes:
            parser.error(f"argument {flag}: only used with --mechanism {' or '.join(users)}")
    if "num_coordinates" in entry.takes and args.num_coordinates is None:
        parser.error(f"argument --num-coordinates: required with --mechanism {entry.name}")
    try:
        pattern = release_pattern(args.mechanism, args.pattern)
    except ValueError as err:
        parser.error(f"argument --pattern: {err}")
    budget = (f"target eps={args.target_eps:g}, delta={args.delta:g} over "
              f"{args.releases} release(s)")
    assumes = f"  release pattern: {pattern}: {registry.PATTERNS[pattern]}"
    try:
        if entry.parameter == "noise_multiplier":
            z = plan_noise_multiplier(args.target_eps, args.delta, releases=args.releases)
            print(f"gaussian: {budget}", file=out)
            print(f"  noise multiplier: {z:.4f}", file=out)
            print(assumes, file=out)
            return 0
        kwargs = {}
        if args.num_classes is not None:
            kwargs["num_classes"] = args.num_classes
        if args.num_coordinates is not None:
            kwargs["num_coordinates"] = args.num_coordinates
        eps = plan_epsilon(args.target_eps, args.delta, releases=args.releases,
                           mechanism=args.mechanism, **kwargs)
    except ValueError as err:
        parser.error(str(err))
    print(f"{args.mechanism}: {budget}", file=out)
    print(f"  per-release eps: {eps:.4f}", file=out)
    print(assumes, file=out)
    why = entry.too_small_to_learn(eps, num_classes=args.num_classes or 2)
    if why is not None:
        print(f"warning: {why} Raise the target or plan fewer releases.", file=err)
    return 0


def sub_parser(parser, name):
    """The subparser ``name`` of ``parser`` (for errors that carry its usage line).

    Example:
        >>> sub_parser(build_parser(), "plan").error("argument --releases: ...")  # exits 2
    """
    parsers = parser.get_default("command_parsers") or {}
    if name in parsers:
        return parsers[name]
    raise ValueError(f"`name` must be a subcommand of the parser; got {name!r}.")


def main(argv=None):
    """Entry point of ``keras-fedpriv``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``). With the default (a
            real command line) TensorFlow's start-up logs are hidden first
            (`keras_fedpriv.logs.quiet_tensorflow`); a call with ``argv`` from
            Python leaves the environment alone.

    Returns:
        The exit status (0 on success; 1 when ``audit`` refutes the claim;
        argparse exits with 2 on bad arguments).
    """
    if argv is None:
        from keras_fedpriv.logs import quiet_tensorflow

        quiet_tensorflow()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "demo":
        from keras_fedpriv.demo import run_demo
        from keras_fedpriv.demo_horizontal import run_horizontal_demo

        if args.part in ("all", "vertical"):
            run_demo(epochs=args.epochs, seed=args.seed, quick=args.quick, out=sys.stdout,
                     figure=args.figure or None)
        if args.part == "all":
            print(file=sys.stdout)
        if args.part in ("all", "horizontal"):
            run_horizontal_demo(rounds=args.rounds, seed=args.seed, quick=args.quick,
                                out=sys.stdout)
        return 0
    if args.command == "audit":
        return _run_audit(sub_parser(parser, "audit"), args, sys.stdout)
    if args.command == "plan":
        return _run_plan(sub_parser(parser, "plan"), args, sys.stdout, sys.stderr)
    if args.command == "worker":
        return _run_worker(args)
    if args.command == "flwr-run":
        from keras_fedpriv.federated.flower.run_status import main as flwr_run_main

        return flwr_run_main(args.app, args.connection, args.run_config)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    sys.exit(main())
