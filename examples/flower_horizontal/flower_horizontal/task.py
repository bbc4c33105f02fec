"""What both sides agree on: the model, the upload scheme's settings, the data split, the run.

Public choices only: nothing here is secret. Each client draws its noise from
OS entropy in its own process (no seed), and chooses its upload scheme in its
own node config (`client_upload_fn`).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any, Mapping

import keras

from keras_fedpriv.callbacks import MagRR
from keras_fedpriv.datasets import digits_clients
from keras_fedpriv.optimizers import SignDSEncoder

# SignDS: the top-k fraction and eps of one upload (the index set is eps-LDP); MagRR's eps
K, EPS, EPS_RR = 0.1, 30.0, 3.0
LEARNING_RATE = 0.2  # each client's local SGD step
ALPHA = 1.0  # Dirichlet(alpha) label skew of the split among clients (non-IID)
DELTA = 1e-5  # the delta of every eps the app prints
PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def model_fn() -> keras.Model:
    """The compiled model: the global model on the server, the local one on a client.

    A softmax regression 64 -> 10 (650 weights): SignDS moves h coordinates
    per upload, so a small model learns in few rounds.

    Returns:
        A compiled `keras.Sequential` (SGD, logits, an ``accuracy`` metric).
    """
    keras.utils.set_random_seed(0)  # the same initial weights everywhere (a public choice)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(LEARNING_RATE),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _scheme(config: Mapping[str, Any]) -> str:
    scheme = str(config.get("upload", "signds"))
    if scheme not in ("signds", "fedavg"):
        raise ValueError(f"'upload' must be 'signds' or 'fedavg'; got {scheme!r}.")
    return scheme


def upload_scheme(scheme: str, seed: int | None = None) -> Any:
    """The upload scheme by name: SignDS (k = `K`, eps = `EPS`) or FedAvg (no protection).

    Args:
        scheme: ``"signds"`` or ``"fedavg"``.
        seed: None (the app: a fresh OS-entropy secret per release, nothing
            to leak) or an int (a reproducible simulation in one process).

    Returns:
        A `SignDSEncoder` or ``"fedavg"``.
    """
    scheme = _scheme({"upload": scheme})
    return SignDSEncoder(k=K, eps=EPS, seed=seed) if scheme == "signds" else "fedavg"


def client_upload_fn(context: Any) -> Any:
    """The client's scheme, from ITS node config (the client's operator decides, not the
    server: `flower-supernode --node-config "... upload='fedavg'"` opts in to no protection).

    Args:
        context: Flower's `Context` (its ``node_config`` is read).

    Returns:
        A `SignDSEncoder` or ``"fedavg"``.
    """
    return upload_scheme(_scheme(context.node_config))


def server_upload_fn(context: Any) -> Any:
    """The server's copy, from the run config; replies of another scheme are dropped.

    Args:
        context: Flower's `Context` (its ``run_config`` is read).

    Returns:
        A `SignDSEncoder` or ``"fedavg"``.
    """
    return upload_scheme(_scheme(context.run_config))


def client_eps_rr(context: Any) -> float | None:
    """MagRR sets SignDS's server step; FedAvg needs none.

    Args:
        context: Flower's `Context` (its ``node_config`` is read).

    Returns:
        MagRR's eps on this client, or None (FedAvg).
    """
    return EPS_RR if _scheme(context.node_config) == "signds" else None


def client_data(partition_id: int, num_partitions: int) -> tuple[Any, Any]:
    """A client's share of the digits training rows (a Dirichlet label split).

    Args:
        partition_id: this client's partition, in [0, num_partitions).
        num_partitions: the number of clients the rows are split among.

    Returns:
        ``(x, y)``: pixels / 16 (float32) and labels.
    """
    if not 0 <= int(partition_id) < int(num_partitions):
        raise ValueError(f"'partition-id' must be in [0, num-partitions={num_partitions}); "
                         f"got {partition_id!r}.")
    clients, _ = digits_clients(int(num_partitions), alpha=ALPHA, seed=0)
    return clients[int(partition_id)]


def server_validation_data() -> tuple[Any, Any]:
    """The server's own held-out rows (360 of 1,797; the same for any number of clients).

    Returns:
        ``(x_val, y_val)``.
    """
    _, test = digits_clients(1, seed=0)
    return test


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The run config keys of ``pyproject.toml`` (``[tool.flwr.app.config]``), checked.

    Attributes:
        upload: the server's scheme, ``"signds"`` or ``"fedavg"``.
        num_clients: clients the server waits for before the first round
            (each client's node config says ``num-partitions``: the same number).
        rounds: federated rounds (``num-server-rounds``).
        clients_per_round: clients asked to train each round.
        local_epochs: epochs of local training per client and round.
        min_replies: the fewest good replies that make a round.
        round_timeout: seconds the server waits for a round's replies.
        magrr_r_init: MagRR's first guess of a client's step size.
        magrr_switch_after: rounds in range before MagRR starts halving its step.
        result_path: a folder for history.json, ledger.json and weights.npz, or "".
    """

    upload: str = "signds"
    num_clients: int = 5
    rounds: int = 10
    clients_per_round: int = 5
    local_epochs: int = 2
    min_replies: int = 3
    round_timeout: float = 120.0
    magrr_r_init: float = 0.02
    magrr_switch_after: int = 5
    result_path: str = ""

    def magrr(self, seed: int | None = None) -> MagRR | None:
        """The server's MagRR (None for FedAvg): its step estimate from the clients' bits.

        The server announces each round's cut to the clients, so its
        ``r_init`` and ``switch_after`` need not be the clients' (only
        ``eps_rr`` must match).

        Args:
            seed: None (fresh noise) or an int (one process, reproducible).

        Returns:
            A fresh `MagRR`, or None.
        """
        if self.upload != "signds":
            return None
        return MagRR(eps_rr=EPS_RR, r_init=self.magrr_r_init,
                     switch_after=self.magrr_switch_after, seed=seed)


_KEYS = {"upload": ("upload", str), "num-clients": ("num_clients", int),
         "num-server-rounds": ("rounds", int), "clients-per-round": ("clients_per_round", int),
         "local-epochs": ("local_epochs", int), "min-replies": ("min_replies", int),
         "round-timeout": ("round_timeout", float), "magrr-r-init": ("magrr_r_init", float),
         "magrr-switch-after": ("magrr_switch_after", int),
         "result-path": ("result_path", str)}


def _pyproject_config() -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: Flower brings tomli
        import tomli as tomllib
    return tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]


def run_settings(run_config: Mapping[str, Any] | None = None) -> RunSettings:
    """The run's settings from Flower's run config (default: this app's ``pyproject.toml``).

    Args:
        run_config: ``context.run_config`` (keys missing from it keep the
            `RunSettings` defaults), or None to read ``pyproject.toml``.

    Returns:
        The checked `RunSettings`.
    """
    config = _pyproject_config() if run_config is None else run_config
    values: dict[str, Any] = {}
    for key, (field, kind) in _KEYS.items():
        if key not in config:
            continue
        value = config[key]
        if kind is str:
            values[field] = str(value)
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (kind is int and value != int(value)) \
                or not (value >= 1 if kind is int else math.isfinite(value) and value > 0):
            allowed = "an integer >= 1" if kind is int else "a finite number > 0"
            raise ValueError(f"run config {key!r} must be {allowed}; got {value!r}.")
        values[field] = kind(value)
    settings = RunSettings(**values)
    _scheme({"upload": settings.upload})
    if not settings.min_replies <= settings.clients_per_round <= settings.num_clients:
        raise ValueError("run config needs min-replies <= clients-per-round <= num-clients; "
                         f"got {settings.min_replies}, {settings.clients_per_round}, "
                         f"{settings.num_clients}.")
    return settings


def progress_line(server_round: int, settings: RunSettings, logs: Mapping[str, float],
                  epsilon: float, elapsed: float) -> str:
    """One round's line, as the server prints it (and the one-process run too).

    Args:
        server_round: the round just finished, counted from 1.
        settings: the run's settings (rounds, clients per round).
        logs: the round's logs (``replies``, ``val_accuracy``, ``round_time_s``).
        epsilon: the busiest client's composed eps so far.
        elapsed: seconds since the run started.

    Returns:
        ``round 3/10: 5/5 replies, val_accuracy 0.712, eps 99.0 so far, 0.4 s (total 2.1 s)``.
    """
    return (f"round {server_round}/{settings.rounds}: {int(logs['replies'])}/"
            f"{settings.clients_per_round} replies, val_accuracy {logs['val_accuracy']:.3f}, "
            f"eps {epsilon:.1f} so far, {logs['round_time_s']:.1f} s (total {elapsed:.1f} s)")
