"""Central DP for `HorizontalStrategy`, and which of Flower's own DP tools are refused.

Flower 1.41 ships central DP as strategy wrappers
(``DifferentialPrivacy{Server,Client}Side{Fixed,Adaptive}Clipping``), ClientApp
mods (``fixedclipping_mod``, ``adaptiveclipping_mod``, ``LocalDpMod``) and a
privacy accountant (``flwr.serverapp.PrivacyAccountant``, RDP). Flower's
wrappers clip each reply's arrays as *model weights* (reply minus the global
weights) and add Gaussian noise to the aggregate. A `HorizontalStrategy` reply
is not model weights: it is the upload scheme's wire arrays (the flat update
and its data size, or SignDS's sign and h indices), so Flower's own wrappers
and mods cannot carry it. What works and what is refused:

* `CentralDP` (dense uploads: ``"fedavg"``, `GaussianUpload`): central
  DP-FedAvg (McMahan et al. 2018, "Learning Differentially Private Recurrent
  Language Models"), a decorator the strategy is given
  (``HorizontalStrategy(..., central_dp=CentralDP(z, C, accountant=acc))``, or
  `central_dp` on a built strategy). It decorates the strategy's upload with
  `ClippedSum`: the server clips each client's (server-scaled) update to
  ``clipping_norm`` in L2, sums the clipped updates and divides by
  ``clients_per_round`` (a missing reply counts as a zero update, so one
  client moves the aggregate by at most ``clipping_norm /
  clients_per_round``) and adds Gaussian noise of std ``noise_multiplier *
  clipping_norm / clients_per_round`` (Flower's formula) before the new
  global weights are set, scored (``val_*``) or returned. Each noised
  aggregate is one Gaussian release per round, user level,
  add-or-remove-one, without amplification by sampling: what Flower's
  accountant composes (`flwr.serverapp.PrivacyAccountant`,
  ``sampling_method="no-amplification"``) and what
  `keras_fedpriv.privacy.privacy_report` reports beside the local releases,
  as a different threat model (it trusts the server, which sees the uploads).
  `flower_central_release` reads what a Flower accountant recorded.
* Refused (ValueError naming the wrapper or mod, the upload and why):
  Flower's wrappers around a `HorizontalStrategy` (`refuse_flower_dp`: they
  would subtract the global weights from the flat update, or from SignDS's
  indices; found because they call the strategy's steps while its own
  ``start`` is not running, the client-side ones also by the clipping norm
  they put in the train config); `CentralDP` with SignDS (with or without
  MagRR: clipping or noising a message of h indices and a sign is
  meaningless, and the server's step is set from MagRR's reports, not from a
  clipped update) or with BatchNormalization statistics averaged in the
  clear (they would enter the released model unclipped and without noise);
  Flower's DP mods on `horizontal_client_app` (`refuse_dp_mods`: they
  rewrite the upload as if it were weights).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import dp_accounting
import numpy as np
from flwr.app import ConfigRecord
from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, compute_stdv
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, SamplingMethod

from keras_fedpriv.federated.uploads import ClientUpload, FedAvgUpload, GaussianUpload
from keras_fedpriv.mechanisms.ledger import ReleaseLedger
from keras_fedpriv.mechanisms.random import secret_generator
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_real
from keras_fedpriv.privacy.report import CentralRelease, register_central_reader

__all__ = ["CentralDP", "ClippedSum", "central_dp", "flower_central_release", "refuse_dp_mods",
           "refuse_flower_dp"]


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

    Example:
        >>> refuse_dp_mods([])
        []
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
                "DP (SignDS, GaussianUpload); for central DP-FedAvg give the server's "
                "strategy central DP (keras_fedpriv.federated.flower.central_dp.CentralDP) "
                "instead.")
        if not callable(mod):
            raise TypeError(f"`mods` must be a list of Flower mods; got {mod!r}.")
    return list(mods)


def _upload_name(upload: Any) -> str:
    return f"{type(upload).__name__} ({upload.describe()})" if hasattr(upload, "describe") \
        else type(upload).__name__


class ClippedSum:
    """The server's side of a dense upload with central DP: what `CentralDP.decorate` returns.

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

    Example:
        >>> clipped = ClippedSum(FedAvgUpload(), clipping_norm=1.0, clients_per_round=3)
        >>> clipped.aggregate([ClientUpload(np.array([3.0, 4.0]), nbytes=8, num_examples=10)])
        array([0.2       , 0.26666668], dtype=float32)
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




class CentralDP:
    """Central DP-FedAvg (McMahan et al. 2018): the decorator a `HorizontalStrategy` is given.

    Give it to the strategy (``HorizontalStrategy(model, "fedavg",
    central_dp=CentralDP(...))``, or `central_dp` on a built one): the
    strategy decorates its upload with the `ClippedSum` that `decorate`
    returns (clipping, the fixed denominator and the noise, where the
    aggregate is formed), asks `check_budget` before any client of a round is
    asked, and `count` after each aggregation, so that every noised aggregate
    made is composed into ``accountant``, even when something after it fails.
    One `CentralDP` decorates one strategy.

    Args:
        noise_multiplier: z > 0: the noise std is ``z * clipping_norm /
            clients_per_round``.
        clipping_norm: C > 0, the L2 bound of one client's update.
        accountant: None or Flower's ``PrivacyAccountant`` (e.g.
            ``flwr.serverapp.RdpAccountant``) with
            ``sampling_method="no-amplification"`` and ``population_size`` at
            least ``clients_per_round``; each noised aggregate is composed
            into it, and with its ``max_epsilon`` a round that would go over
            is refused before any client is asked (``PrivacyBudgetExhausted``).
            None: the noised aggregates are counted here, as the same events.

    Raises:
        ValueError: ``noise_multiplier`` or ``clipping_norm`` not > 0, or an
            accountant with amplification by sampling.

    Example:

    ```python
    from flwr.serverapp import PrivacyConfig, RdpAccountant

    accountant = RdpAccountant(PrivacyConfig(target_delta=1e-5, population_size=100,
        neighboring_relation="add-or-remove-one", sampling_method="no-amplification"))
    strategy = HorizontalStrategy(model, "fedavg", clients_per_round=10,
                                  central_dp=CentralDP(1.0, 0.5, accountant=accountant))
    strategy.start(grid, strategy.initial_arrays(), num_rounds=20)
    print(privacy_report(strategy))  # local releases, and the central eps beside them
    ```
    """

    def __init__(self, noise_multiplier: float, clipping_norm: float, *,
                 accountant: Any = None) -> None:
        self.noise_multiplier = validate_real(noise_multiplier, "noise_multiplier", low=0,
                                              low_open=True)
        self.clipping_norm = validate_real(clipping_norm, "clipping_norm", low=0, low_open=True)
        if accountant is not None:
            config = getattr(accountant, "config", None)
            if getattr(config, "sampling_method", None) is not SamplingMethod.NO_AMPLIFICATION:
                raise ValueError(
                    "`accountant` must be a Flower PrivacyAccountant with "
                    "sampling_method='no-amplification' (as Flower's fixed-clipping wrappers "
                    "require: each round's clients are a fixed-size sample, which this "
                    "accounting does not amplify); got sampling method "
                    f"{getattr(config, 'sampling_method', None)!r}.")
        self.accountant = accountant
        self.clipped: ClippedSum | None = None
        self._composed = 0  # noised aggregates composed into the accountant

    def __repr__(self) -> str:
        """The settings, as the report names the mechanism."""
        return (f"CentralDP(noise_multiplier={self.noise_multiplier:g}, "
                f"clipping_norm={self.clipping_norm:g})")

    def decorate(self, upload: Any, clients_per_round: int, *, magrr: Any = None,
                 clear_batch_norm: bool = False) -> ClippedSum:
        """The strategy's upload, clipped and noised on the server (what the strategy installs).

        Args:
            upload: the strategy's upload scheme (the server's copy).
            clients_per_round: n, the aggregate's fixed denominator.
            magrr: the strategy's MagRR, or None.
            clear_batch_norm: whether BatchNormalization statistics are
                averaged in the clear (``batch_norm="average"`` on a model with
                BatchNormalization layers).

        Returns:
            The `ClippedSum` around ``upload`` (it counts the noised aggregates).

        Raises:
            ValueError: a SignDS upload, MagRR, statistics in the clear, an
                accountant's population smaller than ``clients_per_round``,
                or this `CentralDP` decorates another strategy already.
        """
        n = validate_positive_int(clients_per_round, "clients_per_round")
        if self.clipped is not None:
            raise ValueError("this CentralDP decorates a strategy already (give each "
                             "HorizontalStrategy its own CentralDP, once).")
        _refuse_combination(upload, magrr, clear_batch_norm)
        if self.accountant is not None and n > self.accountant.config.population_size:
            raise ValueError("the accountant's population_size="
                             f"{self.accountant.config.population_size} is smaller than "
                             f"clients_per_round={n}.")
        self.clipped = ClippedSum(upload, self.clipping_norm, n, self.noise_multiplier)
        return self.clipped

    @property
    def releases(self) -> int:
        """The noised aggregates released so far (`ClippedSum` counts them where it noises)."""
        return 0 if self.clipped is None else self.clipped.releases

    @property
    def noise_std(self) -> float:
        """The std of the noise on each aggregate (``z * C / n``; 0 before `decorate`)."""
        return 0.0 if self.clipped is None else self.clipped.noise_std

    def _flower_event(self) -> GaussianPrivacyEvent:
        return GaussianPrivacyEvent(noise_multiplier=self.noise_multiplier,
                                    sample_size=self.clipped.clients_per_round,
                                    population_size=self.accountant.config.population_size)

    def check_budget(self) -> None:
        """Refuse a round over the accountant's ``max_epsilon`` (before any client is asked).

        Raises:
            PrivacyBudgetExhausted: one more noised aggregate would go over.
        """
        if (self.accountant is not None and self.clipped is not None
                and self.accountant.config.max_epsilon is not None
                and self.accountant.would_exceed(self._flower_event())):
            spent = self.accountant.get_privacy_spent()
            raise PrivacyBudgetExhausted(
                "The next private release would exceed max_epsilon (current epsilon: "
                f"{spent.epsilon}, delta: {spent.delta}).")

    def count(self) -> None:
        """Compose into the accountant every noised aggregate not composed yet."""
        if self.accountant is not None:
            while self._composed < self.releases:
                self.accountant.compose(self._flower_event())
                self._composed += 1

    def central_privacy(self, source: str) -> list[CentralRelease]:
        """The central releases (noised aggregates), as `privacy_report` shows them.

        With an accountant: what it recorded (`flower_central_release` of
        it); else this decorator's own count of noised aggregates (the same
        events).

        Args:
            source: who released, for the report.
        """
        if self.accountant is not None:
            return [flower_central_release(self.accountant, source=source)]
        n = 0 if self.clipped is None else self.clipped.clients_per_round
        return [CentralRelease(
            f"{source}: Gaussian noise on each round's aggregate",
            [(_central_event("no-amplification", self.noise_multiplier, n, n),
              self.releases)] if self.releases else [],
            "add-or-remove-one", note="counted by CentralDP (no Flower accountant given)")]


def _refuse_combination(upload: Any, magrr: Any, clear_batch_norm: bool) -> None:
    """Refuse central clipping and noise where they give no guarantee on the model."""
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
    if magrr is not None:
        raise ValueError("central DP cannot wrap a HorizontalStrategy with MagRR: MagRR sets "
                         "the server's step from its reports, unclipped.")
    if clear_batch_norm:
        raise ValueError(
            f"central DP cannot wrap a HorizontalStrategy whose model has BatchNormalization "
            f"statistics averaged in the clear (batch_norm='average', upload {name}): they "
            "would enter the released model unclipped and without noise. Use "
            "batch_norm='local' (FedBN) on both sides.")


def central_dp(strategy: Any, *, noise_multiplier: float, clipping_norm: float,
               accountant: Any = None) -> Any:
    """Give a built `HorizontalStrategy` central DP-FedAvg (server-side fixed clipping).

    The same as building it with ``central_dp=CentralDP(noise_multiplier,
    clipping_norm, accountant=accountant)``.

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
        ``strategy`` itself, now clipping and noising its aggregates (a
        Flower strategy: ``.start(grid, .initial_arrays(),
        num_rounds=...)``); ``privacy_report`` of it shows the local releases
        and, separately, the central guarantee.

    Raises:
        ValueError: SignDS, MagRR, BatchNormalization statistics in the clear,
            a bad setting, an accountant with amplification by sampling, or
            central DP given twice.
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
    use = getattr(strategy, "use_central_dp", None)
    if not callable(use):
        raise TypeError("`strategy` must be a HorizontalStrategy; got "
                        f"{type(strategy).__name__}.")
    use(CentralDP(noise_multiplier, clipping_norm, accountant=accountant))
    return strategy


# ------------------------------------------------------- Flower's own DP wrappers
_SERVER_SIDE = (DifferentialPrivacyServerSideFixedClipping.__name__,
                DifferentialPrivacyServerSideAdaptiveClipping.__name__)
_CLIENT_SIDE = (DifferentialPrivacyClientSideFixedClipping.__name__,
                DifferentialPrivacyClientSideAdaptiveClipping.__name__)


def refuse_flower_dp(upload: Any, magrr: Any = None, config: ConfigRecord | None = None, *,
                     driven: bool, step: str = "configure_train") -> None:
    """Refuse Flower's DP wrappers around a `HorizontalStrategy`: they cannot read its replies.

    What `HorizontalStrategy.summary` and ``configure_train`` call before any
    client is asked. Flower's wrappers drive the strategy they wrap through
    its steps from their own ``start`` (Flower's ``Strategy.start``), so the
    strategy's own ``start`` is never entered; the strategy knows whether its
    own ``start`` (or its ``own_loop()``) is running, and a step called while
    neither is (``driven=False``) is refused. Flower's client-side wrappers
    are also found by the clipping norm they put in the train config, which
    is refused however the strategy is driven.

    Args:
        upload: the strategy's upload scheme.
        magrr: the strategy's MagRR, or None.
        config: the round's train config, or None (``summary``).
        driven: whether the strategy's own ``start`` or ``own_loop()`` is
            running (False: something else calls its steps).
        step: the strategy's method that asks, for the message.

    Raises:
        ValueError: the config carries Flower's clipping norm, or the step is
            called from outside the strategy's own ``start`` and ``own_loop()``.

    Example:
        >>> refuse_flower_dp(FedAvgUpload(), config=ConfigRecord(), driven=True)
        >>> refuse_flower_dp(FedAvgUpload(), config=ConfigRecord({"clipping_norm": 1.0}),
        ...                  driven=True)
        Traceback (most recent call last):
        ValueError: the train config holds 'clipping_norm', which Flower's client-side ...
    """
    if config is not None and KEY_CLIPPING_NORM in config:
        found = (f"the train config holds {KEY_CLIPPING_NORM!r}, which Flower's client-side "
                 "clipping wrappers put there")
        wrappers = _CLIENT_SIDE
        todo = ""
    elif not driven:
        found = (f"HorizontalStrategy.{step} was called while neither the strategy's own "
                 "start() nor its own_loop() was running: something else drives it, as "
                 "Flower's DP wrappers do from their own start()")
        wrappers = _SERVER_SIDE + _CLIENT_SIDE
        todo = (" To run the strategy, call strategy.start(grid, strategy.initial_arrays(), "
                "num_rounds=...); to call its steps from a loop of your own (no wrapper), "
                "call them inside `with strategy.own_loop():`.")
    else:
        return
    name = f"{type(upload).__name__}" + (" with MagRR" if magrr is not None else "")
    if getattr(upload, "name", "") == "signds":
        why = ("clipping or adding Gaussian noise to a SignDS message (h indices and a "
               "sign) is meaningless: it gives the model no guarantee, and SignDS is "
               "already eps-LDP per upload (privacy_report counts it)")
    else:
        why = ("Flower clips each reply's arrays as model weights (reply minus the global "
               "weights), but a HorizontalStrategy reply carries the flat update and its "
               "data size, and Flower's client-side clipping mods would rewrite it; for "
               "central DP-FedAvg give the strategy central DP: HorizontalStrategy(..., "
               "central_dp=CentralDP(noise_multiplier, clipping_norm, accountant=...)) from "
               "keras_fedpriv.federated.flower.central_dp")
    others = ", ".join(wrappers[1:-1]) + (" or " if len(wrappers) > 2 else "") + wrappers[-1]
    raise ValueError(f"{found}. Flower's {wrappers[0]} cannot wrap a HorizontalStrategy with "
                     f"upload {name}, nor can its {others}: {why}.{todo}")


# ------------------------------------------------------- Flower's accountant
#: the (sampling method, neighboring relation) pairs Flower's PrivacyAccountant accepts
_FLOWER_MODELS = {"poisson": "add-or-remove-one", "without-replacement": "replace-one",
                  "no-amplification": "add-or-remove-one"}


def _central_event(sampling: str, noise_multiplier: float, sample_size: int,
                   population_size: int) -> dp_accounting.DpEvent:
    """The dp-accounting event Flower's RDP accountant composes for one noised aggregate."""
    gaussian = dp_accounting.GaussianDpEvent(float(noise_multiplier))
    if sampling == "poisson":
        return dp_accounting.PoissonSampledDpEvent(sample_size / population_size, gaussian)
    if sampling == "without-replacement":
        return dp_accounting.SampledWithoutReplacementDpEvent(population_size, sample_size,
                                                              gaussian)
    if sampling == "no-amplification":
        return gaussian
    raise ValueError(f"unknown sampling method {sampling!r} in the accountant state.")


def flower_central_release(accountant: Any, source: str = "Flower's PrivacyAccountant"
                           ) -> CentralRelease:
    """The releases a Flower ``PrivacyAccountant`` recorded, as dp-accounting events.

    Each composition of a ``GaussianPrivacyEvent`` becomes the event Flower's
    RDP accountant composes for its sampling method: ``GaussianDpEvent(z)``
    (no amplification), ``PoissonSampledDpEvent(sample_size /
    population_size, GaussianDpEvent(z))`` or
    ``SampledWithoutReplacementDpEvent(population_size, sample_size,
    GaussianDpEvent(z))``. `keras_fedpriv.privacy.privacy_report` calls it
    for its ``flower_accountant`` argument.

    Args:
        accountant: Flower's ``PrivacyAccountant`` (e.g. ``RdpAccountant``) or
            its ``state_dict()``.
        source: who released, for the report.

    Returns:
        A `CentralRelease`.

    Raises:
        ValueError: the state is not an RDP accountant's state of schema 1, or
            pairs a sampling method with a neighboring relation Flower's
            accountant does not (e.g. no amplification under replace-one,
            where the Gaussian event would understate).

    Example:

    ```python
    release = flower_central_release(accountant)     # after the run's last round
    release.epsilon(1e-5)                            # == accountant.get_epsilon(1e-5)
    ```
    """
    state = accountant.state_dict() if callable(getattr(accountant, "state_dict", None)) \
        else accountant
    if not isinstance(state, dict) or state.get("schema_version") != 1 \
            or state.get("backend") != "rdp":
        raise ValueError("`flower_accountant` must be Flower's PrivacyAccountant (RDP) or its "
                         "state_dict() (schema_version 1, backend 'rdp'); got "
                         f"{type(accountant).__name__}.")
    config = state["config"]
    sampling = str(getattr(config["sampling_method"], "value", config["sampling_method"]))
    relation = str(getattr(config["neighboring_relation"], "value",
                           config["neighboring_relation"]))
    if relation not in set(_FLOWER_MODELS.values()):
        raise ValueError(f"unknown neighboring relation {relation!r} in the accountant state.")
    if sampling in _FLOWER_MODELS and _FLOWER_MODELS[sampling] != relation:
        # e.g. no amplification under replace-one: a Gaussian event's eps is the same under
        # either relation in dp-accounting, but replacing a client doubles the sensitivity
        raise ValueError(f"the accountant state pairs sampling method {sampling!r} with "
                         f"neighboring relation {relation!r}, which Flower's accountant does "
                         f"not account; it pairs {sampling!r} with "
                         f"{_FLOWER_MODELS[sampling]!r} only.")
    events = []
    for item in state["compositions"]:
        e = item["event"]
        events.append((_central_event(sampling, e["noise_multiplier"], int(e["sample_size"]),
                                      int(e["population_size"])), int(item["count"])))
    orders = tuple(float(o) for o in state.get("orders") or ()) or None
    return CentralRelease(source, events, relation, orders,
                          f"recorded by Flower's accountant ({sampling}, {relation}, user "
                          f"level, target delta {config['target_delta']:g})")


register_central_reader("flower", flower_central_release)  # privacy_report(flower_accountant=)
