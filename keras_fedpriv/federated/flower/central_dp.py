"""Flower's central DP beside keras-fedpriv's uploads: `central_dp` and what is refused.

Flower 1.41 ships central DP as strategy wrappers
(``DifferentialPrivacy{Server,Client}Side{Fixed,Adaptive}Clipping``), ClientApp
mods (``fixedclipping_mod``, ``adaptiveclipping_mod``, ``LocalDpMod``) and a
privacy accountant (``flwr.serverapp.PrivacyAccountant``, RDP). Flower's
wrappers clip each reply's arrays as *model weights* (reply minus the global
weights) and add Gaussian noise to the aggregate. A `HorizontalStrategy` reply
is not model weights: it is the upload scheme's wire arrays (the flat update
and its data size, or SignDS's sign and h indices), so Flower's own wrappers
and mods cannot carry it. What works and what is refused:

* `central_dp` (dense uploads: ``"fedavg"``, `GaussianUpload`): central
  DP-FedAvg (McMahan et al. 2018). The strategy clips each client's
  (server-scaled) update to ``clipping_norm`` in L2, sums the clipped updates
  and divides by ``clients_per_round`` (a missing reply counts as a zero
  update, so one client moves the aggregate by at most
  ``clipping_norm / clients_per_round``) and adds Gaussian noise of std
  ``noise_multiplier * clipping_norm / clients_per_round`` (Flower's formula)
  before the new global weights are set, scored (``val_*``) or returned; the
  wrapper, a Flower ``DifferentialPrivacyServerSideFixedClipping``, counts
  each noised aggregate in Flower's accountant. Each noised aggregate
  is one Gaussian release per round, user level, add-or-remove-one, without
  amplification by sampling: what Flower's accountant composes
  (`flwr.serverapp.PrivacyAccountant`, ``sampling_method="no-amplification"``)
  and what `keras_fedpriv.privacy.privacy_report` reports beside the local
  releases, as a different threat model (it trusts the server, which sees the
  uploads).
* Refused (ValueError naming the wrapper or mod, the upload and why):
  Flower's wrappers around a `HorizontalStrategy` directly (they would
  subtract the global weights from the flat update, or from SignDS's
  indices); `central_dp` with SignDS (with or without MagRR: clipping or
  noising a message of h indices and a sign is meaningless, and the server's
  step is set from MagRR's reports, not from a clipped update) or with
  BatchNormalization statistics averaged in the clear (they would enter the
  released model unclipped and without noise); Flower's DP mods on
  `horizontal_client_app` (they rewrite the upload as if it were weights).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp import Grid
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping
from flwr.supercore.differential_privacy import compute_stdv
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, SamplingMethod

from keras_fedpriv.federated.flower.strategy import HorizontalStrategy
from keras_fedpriv.federated.uploads import ClientUpload, FedAvgUpload, GaussianUpload
from keras_fedpriv.mechanisms.ledger import ReleaseLedger
from keras_fedpriv.mechanisms.random import secret_generator
from keras_fedpriv.mechanisms.validation import validate_real
from keras_fedpriv.privacy.report import CentralRelease, flower_central_release

__all__ = ["CentralDPStrategy", "ClippedSum", "central_dp", "refuse_dp_mods"]

def _mod_name(mod: Any) -> str | None:
    if mod is fixedclipping_mod:
        return "fixedclipping_mod"
    if mod is adaptiveclipping_mod:
        return "adaptiveclipping_mod"
    if isinstance(mod, LocalDpMod):
        return "LocalDpMod"
    return None


def refuse_dp_mods(mods: Sequence[Any]) -> list[Any]:
    """The ClientApp mods, after refusing Flower's DP mods.

    Args:
        mods: Flower mods (callables ``mod(msg, context, call_next)``).

    Returns:
        The mods as a list.

    Raises:
        ValueError: one of them is ``fixedclipping_mod``,
            ``adaptiveclipping_mod`` or a ``LocalDpMod``.
        TypeError: ``mods`` is not a list of callables.
    """
    if isinstance(mods, (str, bytes)) or not isinstance(mods, (list, tuple)):
        raise TypeError(f"`mods` must be a list of Flower mods; got {type(mods).__name__}.")
    for mod in mods:
        name = _mod_name(mod)
        if name is not None:
            raise ValueError(
                f"`mods` holds Flower's {name}: it clips (and LocalDpMod noises) the reply's "
                "arrays as model weights, which rewrites this package's upload (the flat "
                "update with its data size, or SignDS's sign and h indices) into something "
                "the server cannot read or account for. The upload scheme carries the local "
                "DP (SignDS, GaussianUpload); for central DP-FedAvg wrap the server's "
                "strategy with keras_fedpriv.federated.flower.central_dp instead.")
        if not callable(mod):
            raise TypeError(f"`mods` must be a list of Flower mods; got {mod!r}.")
    return list(mods)


def _upload_name(upload: Any) -> str:
    return f"{type(upload).__name__} ({upload.describe()})" if hasattr(upload, "describe") \
        else type(upload).__name__


class ClippedSum:
    """The server's side of a dense upload with central DP: what `central_dp` installs.

    ``aggregate`` clips each client's update (scaled by the server's step)
    to ``clipping_norm`` in L2, divides the sum by ``clients_per_round``,
    however many replies arrived (a missing reply is a zero update), so that
    one client (added or removed) changes it by at most
    ``clipping_norm / clients_per_round``, and adds Gaussian noise of std
    ``noise_multiplier * clipping_norm / clients_per_round`` (Flower's
    formula) from a fresh OS-entropy secret. The noise is added here, where
    the aggregate is formed, so the global model, its ``val_*`` scores and
    everything else the server releases only ever see the noised aggregate;
    each call is one release (`releases`). Everything else (the wire format,
    the client's message and ledger) is the wrapped upload's.

    Args:
        upload: a `FedAvgUpload` or `GaussianUpload` (the server's copy).
        clipping_norm: the L2 bound C of one client's contribution.
        clients_per_round: the fixed denominator n.
        noise_multiplier: z >= 0 (0: clipping only, no guarantee).
    """

    def __init__(self, upload: Any, clipping_norm: float, clients_per_round: int,
                 noise_multiplier: float = 0.0) -> None:
        self.upload = upload
        self.clipping_norm = float(clipping_norm)
        self.clients_per_round = int(clients_per_round)
        self.noise_multiplier = float(noise_multiplier)
        self.noise_std = compute_stdv(self.noise_multiplier, self.clipping_norm,
                                      self.clients_per_round)
        self.releases = 0
        self.name = getattr(upload, "name", type(upload).__name__)

    def client_message(self, delta: Any, num_examples: int,
                       client_id: int | None = None) -> ClientUpload:
        """The wrapped upload's client message (clients do not clip: the server does)."""
        return self.upload.client_message(delta, num_examples, client_id=client_id)

    def privacy_ledger(self) -> ReleaseLedger:
        """The wrapped upload's ledger."""
        return self.upload.privacy_ledger()

    def dp_event(self) -> Any:
        """The wrapped upload's local event (None for FedAvg)."""
        return self.upload.dp_event()

    def to_wire(self, upload: ClientUpload) -> dict[str, np.ndarray]:
        """The wrapped upload's wire arrays."""
        return self.upload.to_wire(upload)

    def from_wire(self, arrays: Mapping[str, Any], dim: int) -> ClientUpload:
        """The wrapped upload's parser."""
        return self.upload.from_wire(arrays, dim)

    def aggregate(self, uploads: Sequence[ClientUpload],
                  global_lr: float | None = None) -> np.ndarray:
        """``sum_i clip(lr * update_i, C) / clients_per_round + N(0, noise_std^2)`` (float32).

        Raises:
            ValueError: more uploads than ``clients_per_round`` (the bound
                would not hold) or none with finite values.
        """
        if len(uploads) > self.clients_per_round:
            raise ValueError(f"ClippedSum.aggregate: {len(uploads)} uploads, more than "
                             f"clients_per_round={self.clients_per_round}.")
        lr = 1.0 if global_lr is None else float(global_lr)
        total = None
        for u in uploads:
            step = lr * np.asarray(u.message, np.float64)
            norm = float(np.linalg.norm(step))
            if not math.isfinite(norm):
                continue  # never aggregated (from_wire refuses non-finite values)
            step *= min(1.0, self.clipping_norm / norm) if norm > 0 else 1.0
            total = step if total is None else total + step
        if total is None:
            raise ValueError("ClippedSum.aggregate: no finite upload to aggregate.")
        total /= self.clients_per_round
        if self.noise_std > 0:
            total += secret_generator(None).normal(0.0, self.noise_std, total.shape)
        self.releases += 1
        return total.astype(np.float32)

    def describe(self) -> str:
        """The wrapped upload, clipped and noised centrally."""
        inner = self.upload.describe() if hasattr(self.upload, "describe") else self.name
        return (f"{inner}, clipped on the server at {self.clipping_norm:g}, central noise "
                f"z={self.noise_multiplier:g}")


class CentralDPStrategy(DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side fixed-clipping DP wrapper around a `HorizontalStrategy`.

    Build it with `central_dp`. It is a Flower
    ``DifferentialPrivacyServerSideFixedClipping`` (``strategy.start(...)``,
    ``privacy_spent()``, ``summary()`` work as in Flower); the clipping and
    the noise run in the wrapped strategy (`ClippedSum`, before the new
    global model is scored or returned), the accounting here.

    Args:
        strategy: the `HorizontalStrategy` (a dense upload).
        noise_multiplier: z > 0: the noise std is ``z * clipping_norm /
            clients_per_round``.
        clipping_norm: C > 0, the L2 bound of one client's update.
        accountant: None or Flower's ``PrivacyAccountant`` (e.g.
            ``flwr.serverapp.RdpAccountant``) with
            ``sampling_method="no-amplification"``; each noised aggregate is
            composed into it, and with its ``max_epsilon`` a round that would
            go over is refused before any client is asked
            (``PrivacyBudgetExhausted``).
    """

    def __init__(self, strategy: HorizontalStrategy, noise_multiplier: float,
                 clipping_norm: float, *, accountant: Any = None) -> None:
        if not isinstance(strategy, HorizontalStrategy):
            raise TypeError("`strategy` must be a HorizontalStrategy; got "
                            f"{type(strategy).__name__}.")
        z = validate_real(noise_multiplier, "noise_multiplier", low=0, low_open=True)
        c = validate_real(clipping_norm, "clipping_norm", low=0, low_open=True)
        _check_combination(strategy)
        n = strategy.clients_per_round
        if accountant is not None:
            config = getattr(accountant, "config", None)
            if getattr(config, "sampling_method", None) is not SamplingMethod.NO_AMPLIFICATION:
                raise ValueError(
                    "`accountant` must be a Flower PrivacyAccountant with "
                    "sampling_method='no-amplification' (as Flower's fixed-clipping wrappers "
                    "require: each round's clients are a fixed-size sample, which this "
                    "accounting does not amplify); got sampling method "
                    f"{getattr(config, 'sampling_method', None)!r}.")
            if n > config.population_size:
                raise ValueError(f"the accountant's population_size={config.population_size} "
                                 f"is smaller than clients_per_round={n}.")
        # Flower's own wrapper refuses an accountant around a strategy that is not FedAvg:
        # the events are composed here instead
        super().__init__(strategy, z, c, n, accountant=None)
        self.accountant = accountant
        self.inner = strategy
        self.clipped = strategy.clip_uploads(c, z)

    def __repr__(self) -> str:
        """Compute a string representation of the strategy."""
        return (f"central_dp(HorizontalStrategy, noise_multiplier={self.noise_multiplier:g}, "
                f"clipping_norm={self.clipping_norm:g})")

    def initial_arrays(self) -> ArrayRecord:
        """The wrapped strategy's initial global weights."""
        return self.inner.initial_arrays()

    def privacy_ledger(self) -> ReleaseLedger:
        """The local releases (what the server receives): the wrapped strategy's ledger."""
        return self.inner.privacy_ledger()

    def central_privacy(self) -> list[CentralRelease]:
        """The central releases (noised aggregates), as `privacy_report` shows them.

        With an accountant: what it recorded (its ``state_dict``); else this
        wrapper's own count of noised aggregates (the same events).
        """
        if self.accountant is not None:
            return [flower_central_release(self.accountant, source=repr(self))]
        return [CentralRelease(
            f"{repr(self)}: Gaussian noise on each round's aggregate",
            [(_event(self.noise_multiplier), self.releases)] if self.releases else [],
            "add-or-remove-one", note="counted by the wrapper (no Flower accountant given)")]

    def _event(self) -> GaussianPrivacyEvent:
        return GaussianPrivacyEvent(noise_multiplier=self.noise_multiplier,
                                    sample_size=self.num_sampled_clients,
                                    population_size=self.accountant.config.population_size)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Refuse a round over the accountant's ``max_epsilon``, then the strategy's step."""
        if (self.accountant is not None and self.accountant.config.max_epsilon is not None
                and self.accountant.would_exceed(self._event())):
            spent = self.accountant.get_privacy_spent()
            raise PrivacyBudgetExhausted(
                "The next private release would exceed max_epsilon (current epsilon: "
                f"{spent.epsilon}, delta: {spent.delta}).")
        self.current_arrays = arrays
        return self.inner.configure_train(server_round, arrays, config, grid)

    @property
    def releases(self) -> int:
        """The noised aggregates released so far (`ClippedSum` counts them where it noises)."""
        return self.clipped.releases

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The strategy's clipped and noised aggregate; each one made is composed in the accountant.

        The noise is added inside the strategy (`ClippedSum`), before the new
        global model is scored or returned, so ``val_*`` scores the released
        (noised) model.
        """
        before = self.clipped.releases
        try:
            arrays, metrics = self.inner.aggregate_train(server_round, replies)
        finally:  # a noised aggregate counts even if something after it failed
            if self.accountant is not None:
                for _ in range(self.clipped.releases - before):
                    self.accountant.compose(self._event())
        if arrays is not None and metrics is not None:
            metrics["central_noise_std"] = float(self.clipped.noise_std)
        return arrays, metrics


def _event(noise_multiplier: float) -> Any:
    import dp_accounting

    return dp_accounting.GaussianDpEvent(noise_multiplier)


def _check_combination(strategy: HorizontalStrategy) -> None:
    """Refuse central clipping and noise where they give no guarantee on the model."""
    upload = strategy.upload
    name = _upload_name(upload)
    if not isinstance(upload, (FedAvgUpload, GaussianUpload)):
        raise ValueError(
            f"central DP (clipping plus Gaussian noise on the aggregate) cannot wrap a "
            f"HorizontalStrategy with upload {name}: clipping or adding Gaussian noise to a "
            "SignDS message (h indices and a sign) is meaningless, and the server's step "
            "is set from MagRR's reports rather than from a clipped update, so the released "
            "model would carry no central guarantee. SignDS is already eps-LDP per upload "
            "(privacy_report counts it); for central DP-FedAvg use upload='fedavg' or a "
            "GaussianUpload.")
    if strategy.magrr is not None:
        raise ValueError("central DP cannot wrap a HorizontalStrategy with MagRR: MagRR sets "
                         "the server's step from its reports, unclipped.")
    if strategy.batch_norm == "average" and strategy.server.bn_variables:
        raise ValueError(
            f"central DP cannot wrap a HorizontalStrategy whose model has BatchNormalization "
            f"statistics averaged in the clear (batch_norm='average', upload {name}): they "
            "would enter the released model unclipped and without noise. Use "
            "batch_norm='local' (FedBN) on both sides.")


def central_dp(strategy: HorizontalStrategy, *, noise_multiplier: float, clipping_norm: float,
               accountant: Any = None) -> CentralDPStrategy:
    """Wrap a `HorizontalStrategy` in Flower's central DP (server-side fixed clipping).

    Args:
        strategy: a `HorizontalStrategy` with a dense upload (``"fedavg"`` or
            a `GaussianUpload`), no MagRR, and ``batch_norm="local"`` if the
            model has BatchNormalization layers.
        noise_multiplier: z > 0 (noise std ``z * clipping_norm /
            clients_per_round`` on the aggregate).
        clipping_norm: C > 0, the L2 bound of one client's update.
        accountant: None or Flower's ``PrivacyAccountant`` with
            ``sampling_method="no-amplification"`` (its ``population_size``:
            the number of clients).

    Returns:
        A `CentralDPStrategy` (a Flower strategy: ``.start(grid,
        .initial_arrays(), num_rounds=...)``); ``privacy_report`` of it shows
        the local releases and, separately, the central guarantee.

    Raises:
        ValueError: SignDS, MagRR, BatchNormalization statistics in the clear,
            a bad setting or an accountant with amplification by sampling.
        TypeError: ``strategy`` is not a `HorizontalStrategy`.

    Example:

    ```python
    from flwr.serverapp import PrivacyConfig, RdpAccountant

    accountant = RdpAccountant(PrivacyConfig(target_delta=1e-5, population_size=100,
        neighboring_relation="add-or-remove-one", sampling_method="no-amplification"))
    strategy = central_dp(HorizontalStrategy(model, "fedavg", clients_per_round=10),
                          noise_multiplier=1.0, clipping_norm=0.5, accountant=accountant)
    strategy.start(grid, strategy.initial_arrays(), num_rounds=20)
    print(privacy_report(strategy))  # local releases, and the central eps beside them
    ```
    """
    return CentralDPStrategy(strategy, noise_multiplier, clipping_norm, accountant=accountant)
