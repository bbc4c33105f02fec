"""MagRR: estimating the global step size with randomized response.

From MindSpore Federated's SignDS design.

SignDS clients upload only a sign and a set of coordinates, so the server does
not know how far to move along them. MagRR lets it
estimate the step size ``r`` of the clients' updates from one randomized bit
per client and round:

* client: ``b = 1 if r < threshold * r_est else 0``, reported through binary
  randomized response at ``eps_rr`` (`binary_randomized_response`);
* server: debias the count of ones, take the majority ``B`` and move
  ``r_est`` (grow it fast until it reaches the clients' range, then shrink it
  as the updates get smaller); ``lr_global = lr_factor * r_est * num_clients``.
"""

from __future__ import annotations


from typing import Any, Mapping

import dp_accounting
import keras
import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.events import pure_epsilon, repeat_event
from keras_fedpriv.mechanisms.ledger import CLIENT, ReleaseKind, ReleaseLedger, register_protection
from keras_fedpriv.mechanisms.random import SeededReleases
from keras_fedpriv.mechanisms.randomized_response import (
    flip_probability,
    randomized_response_dp_event,
    threshold_reports,
)
from keras_fedpriv.mechanisms.validation import (
    config_with_seed,
    validate_eps,
    validate_positive_int,
    validate_real,
    validate_seed,
)

__all__ = ["MagRR", "debiased_ones"]

GROWTH = "growth"
CONTRACTION = "contraction"
_PHASES = (GROWTH, CONTRACTION)


def debiased_ones(num_ones: float, num_reports: int, eps: float) -> float:
    """Unbiased estimate of how many clients hold ``b = 1``.

    With ``N`` binary-RR reports at ``eps`` of which ``N_C`` are ones and
    ``P = e^eps / (1 + e^eps)`` the probability of reporting the truth,
    ``E[N_C] = N_T P + (N - N_T)(1 - P)``, so
    ``N_T = (N_C - N + N P) / (2P - 1)``. Computed with the flip probability
    ``q = 1 - P`` as ``(N_C - N q) / (1 - 2 q)``, which does not overflow for
    large eps.

    Args:
        num_ones: ``N_C``, the number of reports equal to 1.
        num_reports: ``N``, the number of reports.
        eps: the randomized-response epsilon, > 0 (at eps = 0 the reports
            carry no information and nothing can be debiased).

    Returns:
        ``N_T`` as a float (it can fall outside [0, N] by chance).
    """
    eps = validate_eps(eps, "eps", lower_open=True)
    q = flip_probability(eps)
    return (float(num_ones) - float(num_reports) * q) / (1.0 - 2.0 * q)


@keras.saving.register_keras_serializable(package="keras_fedpriv")
class MagRR(SeededReleases, keras.callbacks.Callback):
    """Server-side step-size estimation for SignDS by randomized response (MagRR).

    Each federated round, every participating client compares its private
    true step size ``r`` (e.g. ``|mean|`` of its update over its top-k set,
    in the chosen sign direction) with the server's current estimate
    ``r_est`` and reports one bit through binary randomized response at
    ``eps_rr``:

    * growth phase: ``b = 1 if r < growth_threshold * r_est`` (``2 r_est``);
    * contraction phase: ``b = 1 if r < contraction_threshold * r_est``.

    The server counts ``N_C`` ones among the ``N`` reports, debiases them to
    ``N_T = (N_C - N + N P) / (2P - 1)`` with ``P = e^eps_rr / (1 + e^eps_rr)``
    (`debiased_ones`) and takes ``B = 1 if N_T > N / 2``. Then:

    * growth: ``B = 0`` -> ``r_est *= growth_factor``; ``B = 1`` ->
      ``rounds_in_range += 1``, and once it reaches ``switch_after`` the phase
      becomes contraction (``B = 1`` rounds are counted, not required to be
      consecutive);
    * contraction: ``B = 1`` -> ``r_est /= contraction_factor``; ``B = 0`` ->
      keep ``r_est``.

    **Order.** As in the reference implementation, ``r_est`` is updated first
    and the round's learning rate is computed from the *updated* value:
    ``lr_global = lr_factor * r_est * num_clients``, where ``num_clients`` is
    the number of clients whose sparse updates are averaged this round.
    If fewer than ``min_report_fraction * num_clients`` reports arrive (or
    none), the round falls back to ``lr_global = fallback_lr`` and leaves
    ``r_est``, the phase and ``rounds_in_range`` unchanged.

    ``r_est`` is kept in full float64 precision. The reference rounds it to 6
    decimals after every update, so it can never go below 1e-6 (and its
    initial 1e-5 is nearly at that floor); this class does not round.

    In the contraction phase ``r_est`` can only shrink or stay: if the
    clients' steps grow again, the estimate does not follow (as in the original
    design and the reference implementation).

    **Privacy.** Each participating client releases one eps_rr-randomized
    bit per round it takes part in (`dp_event`), i.e. ``eps_rr``-LDP per
    round, composed over the rounds the client participates in. The bit is
    computed from ``r_est``, which is public (sent by the server).

    **Randomness.** ``seed=None`` (default): every call of `client_reports`
    draws a fresh 64-bit secret from OS entropy. With an int ``seed`` the
    n-th call draws its 63-bit noise seed from ``secret_generator(seed,
    stream=n)``, so a sequence of calls is reproducible; the seed is then
    saved in `get_config`, so treat it as a secret. `state_dict` holds n
    (``num_releases``), never randomness: a copy restored with
    `load_state_dict` continues with new noise, and a seeded copy rebuilt
    with `from_config` alone refuses to report until its state is loaded
    (it would replay the original's flips, and XOR-ing the two reports of
    one round would cancel them). In a real deployment each client randomizes on its own
    device; `client_reports` simulates all clients of a round at once.

    Use as a Keras callback: a federated driver calls `round` (or
    `client_reports` + `server_update`) once per federated round, before
    aggregation, then fires ``on_epoch_end``, which writes ``r_est``,
    ``magrr_phase`` (0 growth, 1 contraction) and ``magrr_debiased_ones``
    into the logs (so `History` records them), and the server step
    ``lr_global`` as ``global_lr`` unless the driver logged that already
    (`keras_fedpriv.federated.HorizontalFL` logs the step it applied, NaN in
    a round that did not count).
    Nothing here depends on the driver.

    Constants (this class's default = the original design's value; the reference is
    MindSpore Federated's implementation):

    ==========================  ==============  ===================
    argument                    default         reference
    ==========================  ==============  ===================
    ``eps_rr``                  5.0             5 (hard-coded)
    ``r_init``                  1e-5            1e-5
    ``growth_factor``           5.0             5 (design: none)
    ``switch_after``            10              10 (design: none)
    ``growth_threshold``        2.0             2.0
    ``contraction_threshold``   1.0             0.5
    ``contraction_factor``      2.0 (halve)     1.5
    ``lr_factor``               2.0             3.0
    ``min_report_fraction``     0.05            0.05
    ``fallback_lr``             1.0             ``sign_global_lr`` (1)
    ==========================  ==============  ===================

    Args:
        eps_rr: epsilon of each client's randomized-response bit, > 0.
        r_init: initial ``r_est``, finite and > 0.
        growth_factor: ``r_est`` multiplier in the growth phase, > 1.
        switch_after: number of growth rounds with ``B = 1`` after which the
            contraction phase starts, an integer >= 1.
        growth_threshold: a client reports ``b = 1`` in the growth phase when
            ``r < growth_threshold * r_est``; > 0.
        contraction_threshold: the same in the contraction phase; > 0.
        contraction_factor: ``r_est`` divisor in the contraction phase, > 1.
        lr_factor: ``lr_global = lr_factor * r_est * num_clients``; > 0.
        min_report_fraction: fall back to ``fallback_lr`` when fewer than this
            fraction of ``num_clients`` reports arrive; in [0, 1].
        fallback_lr: the fallback global learning rate, finite and > 0.
        seed: None (fresh OS-entropy secret per call) or an int for
            reproducible reports.

    Attributes:
        r_est: current estimate (float).
        phase: ``"growth"`` or ``"contraction"``.
        rounds_in_range: growth rounds with ``B = 1`` so far.
        last_lr_global: learning rate of the last `server_update` (None before).
        last_debiased_ones: ``N_T`` of the last `server_update` (NaN when it
            had no reports, None before any).
        num_releases: number of rounds in which `client_reports` released
            bits (each participating client released one bit per round).

    Example:
        >>> magrr = MagRR(eps_rr=5.0)
        >>> r = np.abs(np.random.default_rng(0).normal(0.05, 0.005, size=100))
        >>> lr = magrr.round(r)  # num_clients defaults to len(r)
        >>> magrr.r_est  # every r >= 2 * 1e-5: B = 0, so r_est grew 5x
        5e-05
    """

    def __init__(self, eps_rr: float = 5.0, r_init: float = 1e-5, growth_factor: float = 5.0,
                 switch_after: int = 10, growth_threshold: float = 2.0,
                 contraction_threshold: float = 1.0, contraction_factor: float = 2.0,
                 lr_factor: float = 2.0, min_report_fraction: float = 0.05,
                 fallback_lr: float = 1.0, seed: int | None = None) -> None:
        super().__init__()
        self.eps_rr = validate_eps(eps_rr, "eps_rr", lower_open=True)
        self.r_init = validate_real(r_init, "r_init", low=0, low_open=True)
        self.growth_factor = validate_real(growth_factor, "growth_factor", low=1, low_open=True)
        self.switch_after = validate_positive_int(switch_after, "switch_after")
        self.growth_threshold = validate_real(growth_threshold, "growth_threshold", low=0,
                                              low_open=True)
        self.contraction_threshold = validate_real(contraction_threshold, "contraction_threshold",
                                           low=0, low_open=True)
        self.contraction_factor = validate_real(contraction_factor, "contraction_factor",
                                        low=1, low_open=True)
        self.lr_factor = validate_real(lr_factor, "lr_factor", low=0, low_open=True)
        self.min_report_fraction = validate_real(min_report_fraction, "min_report_fraction",
                                         low=0, low_open=False, high=1)
        self.fallback_lr = validate_real(fallback_lr, "fallback_lr", low=0, low_open=True)
        self.seed = validate_seed(seed)
        self._init_releases()

        self.r_est = self.r_init
        self.phase = GROWTH
        self.rounds_in_range = 0
        self.last_lr_global = None
        self.last_debiased_ones = None

    # --- privacy -----------------------------------------------------------

    @property
    def epsilon(self) -> float:
        """Pure eps of one client's report in one round (``eps_rr`` as realized)."""
        return pure_epsilon(self.dp_event())

    def privacy_ledger(self) -> ReleaseLedger:
        """Every report so far, per client (`ReleaseLedger`, unit: client)."""
        return self._ledger

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        register_protection(model, self)

    def dp_event(self, rounds: int = 1) -> dp_accounting.DpEvent:
        """The per-client `dp_accounting` event of ``rounds`` participations.

        One eps_rr binary randomized response per round the client takes part
        in, composed explicitly (`repeat_event`). Account it with a PLD
        accountant whose neighbouring relation is ``REPLACE_ONE``.
        """
        rounds = validate_positive_int(rounds, "rounds")
        return repeat_event(randomized_response_dp_event(self.eps_rr, 2), rounds)

    # --- client side -------------------------------------------------------

    @property
    def threshold(self) -> float:
        """The current multiplier of ``r_est`` in the clients' rule."""
        return self.growth_threshold if self.phase == GROWTH else self.contraction_threshold

    @property
    def cut(self) -> float:
        """``threshold * r_est``: the value the server announces to the round's clients."""
        return float(self.threshold * self.r_est)

    def client_reports(self, magnitudes: ArrayLike,
                       client_ids: ArrayLike | None = None,
                       cut: float | None = None) -> np.ndarray:
        """Randomized bits of the clients of one round.

        Args:
            magnitudes: 1-D array of the clients' private true step sizes
                ``r`` (finite, >= 0), one per client.
            client_ids: the clients' ids (integers >= 0), for per-client
                release counts; a seeded object then draws each client's bit
                from that client's own stream (the same bit whether one
                object serves every client or each client runs its own
                copy). None: each report counts for every client.
            cut: the server's announced ``threshold * r_est`` (`cut`), for a
                copy of this object that runs on a client; None: this
                object's own.

        Returns:
            int32 numpy array of 0/1: ``b = [r < cut]`` passed through binary
            randomized response at ``eps_rr``.
        """
        r = _validate_magnitudes(magnitudes)
        if cut is None:
            cut = self.cut
        elif (isinstance(cut, bool) or not isinstance(cut, (int, float, np.floating, np.integer))
              or not np.isfinite(cut) or cut <= 0):
            raise ValueError(f"`cut` must be a finite number > 0; got {cut!r}.")
        if client_ids is not None:
            client_ids = np.asarray(client_ids).reshape(-1)
            if client_ids.shape != r.shape or client_ids.dtype.kind not in "iu":
                raise ValueError(f"`client_ids` must hold one integer id per magnitude "
                                 f"({r.size}); got shape {client_ids.shape} and dtype "
                                 f"{client_ids.dtype}.")
        if r.size == 0:
            return np.zeros((0,), np.int32)
        # one uint32 noise word per client, one randomized-response call for the round
        if client_ids is None:
            words = self._release_generator().integers(0, 2**32, size=r.size, dtype=np.uint32)
        else:
            # each client's word from its own stream: the same bit whether one object serves
            # every client or each client runs its own copy
            words = np.fromiter((self._release_generator(int(c)).integers(0, 2**32,
                                                                           dtype=np.uint32)
                                 for c in client_ids), np.uint32, count=r.size)
        reports = keras.ops.convert_to_numpy(
            threshold_reports(r, float(cut), self.eps_rr, noise=words))
        kind = ReleaseKind("MagRR", "client data", CLIENT,
                           self.dp_event(1),
                           "its step size: one randomized-response bit per round a client "
                           "takes part in")
        if client_ids is None:
            self._ledger.record(kind, units=None, count=1)
        else:
            self._ledger.record(kind, units=client_ids)
        return np.asarray(reports, dtype=np.int32)

    # --- server side -------------------------------------------------------

    def server_update(self, reports: ArrayLike, num_clients: int | None = None) -> float:
        """Update ``r_est`` from one round's reports and return ``lr_global``.

        Args:
            reports: 1-D array of the clients' randomized 0/1 bits.
            num_clients: number of clients whose sparse updates are averaged
                this round (an integer >= 1); None means ``len(reports)``.

        Returns:
            ``lr_global = lr_factor * r_est * num_clients`` with the updated
            ``r_est``, or ``fallback_lr`` when fewer than
            ``min_report_fraction * num_clients`` reports (or none) arrived.
        """
        reports = _validate_reports(reports)
        n = int(reports.size)
        if num_clients is not None or n > 0:
            num_clients = validate_positive_int(n if num_clients is None else num_clients,
                                                "num_clients")
        if n == 0:
            self.last_debiased_ones = float("nan")
            self.last_lr_global = self.fallback_lr
            return self.last_lr_global
        n_t = debiased_ones(int(reports.sum()), n, self.eps_rr)
        self.last_debiased_ones = n_t
        if n < self.min_report_fraction * num_clients:
            self.last_lr_global = self.fallback_lr
            return self.last_lr_global
        majority = n_t > n / 2.0
        if self.phase == GROWTH:
            if majority:
                self.rounds_in_range += 1
                if self.rounds_in_range >= self.switch_after:
                    self.phase = CONTRACTION
            else:
                self.r_est *= self.growth_factor
        elif majority:
            self.r_est /= self.contraction_factor
        self.last_lr_global = self.lr_factor * self.r_est * num_clients
        return self.last_lr_global

    def round(self, magnitudes: ArrayLike, num_clients: int | None = None,
              client_ids: ArrayLike | None = None) -> float:
        """One federated round: `client_reports` then `server_update`.

        Args:
            magnitudes: the clients' true step sizes (see `client_reports`).
            num_clients: see `server_update`; None means ``len(magnitudes)``.

        Returns:
            This round's ``lr_global``.
        """
        if num_clients is not None:  # fail before any bit is released
            num_clients = validate_positive_int(num_clients, "num_clients")
        return self.server_update(self.client_reports(magnitudes, client_ids), num_clients)

    # --- Keras callback ----------------------------------------------------

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Write `log_values` into logs, and ``global_lr`` (``lr_global``) if it is absent."""
        if isinstance(logs, dict):
            logs.update(self.log_values())
            logs.setdefault("global_lr", float("nan") if self.last_lr_global is None
                            else float(self.last_lr_global))

    def log_values(self) -> dict[str, Any]:
        """The estimator's numeric state for the Keras logs (NaN where undefined).

        Returns:
            ``r_est``, ``magrr_phase`` and ``magrr_debiased_ones``. The server
            step is logged once, as ``global_lr``, by the driver that applies
            it (or by `on_epoch_end` when no driver did).
        """
        nan = float("nan")
        return {
            "r_est": float(self.r_est),
            "magrr_phase": 0 if self.phase == GROWTH else 1,
            "magrr_debiased_ones": (nan if self.last_debiased_ones is None
                                    else float(self.last_debiased_ones)),
        }

    # --- (de)serialization and checkpoints ----------------------------------

    def get_config(self) -> dict[str, Any]:
        """Every constructor argument; ``seed`` only if one was given."""
        config = {
            "eps_rr": self.eps_rr,
            "r_init": self.r_init,
            "growth_factor": self.growth_factor,
            "switch_after": self.switch_after,
            "growth_threshold": self.growth_threshold,
            "contraction_threshold": self.contraction_threshold,
            "contraction_factor": self.contraction_factor,
            "lr_factor": self.lr_factor,
            "min_report_fraction": self.min_report_fraction,
            "fallback_lr": self.fallback_lr,
        }
        return config_with_seed(config, self.seed)

    # `from_config`, `state_dict` and `load_state_dict` come from `SeededReleases`: the server
    # state (r_est, phase, rounds_in_range) beside the stream positions and the ledger, no
    # randomness. ``num_releases`` is optional (the counter is kept) while this object has
    # released nothing, except on a seeded copy rebuilt by `from_config`, which needs it to
    # continue the stream. A state behind this object's releases is refused.

    def _own_state(self) -> dict[str, Any]:
        return {"r_est": float(self.r_est), "phase": self.phase,
                "rounds_in_range": int(self.rounds_in_range)}

    def _parse_own_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        missing = [k for k in ("r_est", "phase", "rounds_in_range") if k not in state]
        if missing:
            raise ValueError(f"`state` is missing {missing}; expected the keys of "
                             f"MagRR.state_dict().")
        r_est = validate_real(state["r_est"], "state['r_est']", low=0, low_open=True)
        phase = state["phase"]
        if phase not in _PHASES:
            raise ValueError(f"`state['phase']` must be one of {_PHASES}; got {phase!r}.")
        rounds = validate_positive_int(state["rounds_in_range"], "state['rounds_in_range']",
                                       minimum=0)
        return {"r_est": r_est, "phase": phase, "rounds_in_range": rounds}


def _client_vector(values, name, *, what, one, accept_bool, valid, rule):
    """``values`` as a 1-D numpy array with one entry per client, or an error naming ``name``.

    ``what`` names the entries (``"finite reals >= 0"``), ``one`` one entry (``"step
    size"``); ``valid(array)`` marks the allowed entries and ``rule`` says the rule they
    break. Booleans are numbers only with ``accept_bool``.
    """
    try:
        array = np.asarray(values)
    except Exception as err:  # pragma: no cover - exotic inputs
        raise TypeError(f"`{name}` must be a 1-D array of {what}; got "
                        f"{type(values).__name__}.") from err
    numeric = np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    if not (numeric or (accept_bool and array.dtype == bool)):
        raise TypeError(f"`{name}` must be a 1-D array of {what}; got dtype {array.dtype}.")
    array = np.atleast_1d(array)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D (one {one} per client); got shape "
                         f"{array.shape}.")
    bad = ~valid(array)
    if bad.any():
        raise ValueError(f"`{name}` must {rule}; got {array[bad][:5].tolist()} at positions "
                         f"{np.flatnonzero(bad)[:5].tolist()}.")
    return array


def _validate_magnitudes(magnitudes):
    return _client_vector(magnitudes, "magnitudes", what="finite reals >= 0", one="step size",
                          accept_bool=False, valid=lambda r: np.isfinite(r) & (r >= 0),
                          rule="be finite reals >= 0").astype(np.float64)


def _validate_reports(reports):
    return _client_vector(reports, "reports", what="0/1 values", one="bit", accept_bool=True,
                          valid=lambda b: (b == 0) | (b == 1),
                          rule="hold only 0/1 values").astype(np.int64)
