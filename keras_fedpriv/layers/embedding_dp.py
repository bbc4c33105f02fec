"""EmbeddingDPLayer: one-bit quantization + randomized response."""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
import keras
import numpy as np
from keras import ops
from numpy.typing import ArrayLike

from keras_fedpriv import backend
from keras_fedpriv.layers import release_counter as rc
from keras_fedpriv.layers import input_checks
from keras_fedpriv.layers.secret_rng import SecretRandomMixin
from keras_fedpriv.mechanisms.events import pure_epsilon
from keras_fedpriv.mechanisms.ledger import (
    EXAMPLE,
    FEATURES,
    ReleaseKind,
    ReleaseLedger,
    non_private_event,
)
from keras_fedpriv.mechanisms.quantize import (
    quantize_realized_epsilon,
    quantize_rr,
    quantize_rr_dp_event,
)
from keras_fedpriv.mechanisms.validation import validate_eps

STE_MODES = ("identity", "hardtanh")


def _hardtanh(x):
    """``clip(x, -1, 1)`` whose gradient is 1 on ``[-1, 1]`` (boundaries included) and 0
    outside (``clip``'s own gradient at a boundary differs between backends)."""
    return ops.where(ops.abs(x) <= 1, x, ops.stop_gradient(ops.clip(x, -1, 1)))


@keras.saving.register_keras_serializable(package="keras_fedpriv")
class EmbeddingDPLayer(rc.ReleaseCounterMixin, SecretRandomMixin, input_checks.InputErrorFlagMixin,
                       keras.layers.Layer):
    """Protect the embedding a follower sends: one-bit quantization + RR.

    Forward: ``B = 1 if x > 0 else 0``; with ``eps`` set, each coordinate of
    B is flipped with ``q = 1 / (e^(eps/2) + 1)`` (a 1 stays 1 with
    ``p = e^(eps/2) / (e^(eps/2) + 1)``, a 0 turns into 1 with q). Each
    coordinate is (eps/2)-DP; a d-dimensional embedding is (d * eps / 2)-DP
    per release by basic composition (`dp_event()` lets dp_accounting compose
    it exactly), and every call is a new release.

    The output is exactly 0.0 or 1.0, bit for bit. The usual
    ``x + stop_gradient(dp(x) - x)`` idiom is not: it carries the low bits of
    x and leaks the very embedding it protects. Here the output is
    ``dp(x) + (g(x) - stop_gradient(g(x)))``, whose second term is exactly 0
    for finite x while its gradient is g'(x).

    **Every call is a release** of each row's embedding, recorded where it
    happens (`privacy_ledger`): training passes, evaluation and prediction
    passes (with ``at_inference=True`` they are randomized too; with
    ``at_inference=False`` they release the plain sign pattern, which the
    ledger records as not private), and every call of a layer shared by
    several inputs. Pass ``example_ids`` to count per example (a
    `VerticalModel` does when its inputs have ``"example_ids"``); without
    ids each call counts as a release of every example.

    Non-finite inputs (NaN, inf): eagerly a ValueError naming the first
    offending index and that value only (Keras' "Arguments received" dump
    is suppressed); in a TensorFlow graph a `tf.debugging` check. Under XLA
    (``jit_compile=True``) and in traced JAX there is no run-time check:
    such coordinates are quantized as 0 (then randomized as usual), the
    straight-through term is 0 there, so the output stays exactly 0.0 /
    1.0, and the layer counts the event; `check_input_errors()` raises it on
    the host (`VerticalModel` calls it after every step).

    Backward (straight-through): ``ste="identity"`` passes the upstream
    gradient unchanged (g(x) = x); ``ste="hardtanh"`` zeroes it where
    ``|x| > 1`` (g(x) = clip(x, -1, 1), gradient 1 on [-1, 1]).

    Args:
        eps: None (quantize only, no DP) or a finite real >= 0.
        seed: None (default): a 64-bit secret from OS entropy that is never
            saved. An int makes the noise reproducible (and is saved).
        at_inference: apply randomized response at inference too (default,
            since in vertical FL the embedding is also sent at inference). If
            False, inference only quantizes, which releases the sign pattern
            without any DP guarantee.
        ste: ``"identity"`` or ``"hardtanh"``.
        id_capacity: how many example ids the per-example release counts tell
            apart: ids ``0 .. id_capacity - 1`` are counted exactly, in 4 bytes
            each (default 2**20: 4 MiB; 10**8 ids: 400 MB; at most 2**28).
            Other ids fold onto shared slots, and the report then counts every
            example as often as the busiest slot (an upper bound, said so).

    Call arguments:
        inputs: the embedding, a floating tensor (batch, ...).
        training: randomize (with ``at_inference=False``: only when True).
        example_ids: optional integer tensor (batch,) naming the rows, for
            per-example release counts.

    Returns (call):
        A tensor of the input's shape and dtype holding 0.0 and 1.0.

    Example:
        >>> bottom = keras.Sequential([keras.layers.Dense(16), EmbeddingDPLayer(eps=4.0)])
        >>> z = bottom(np.random.randn(8, 5).astype("float32"), training=True)
    """

    _rng_salt = 0x454D4244  # "EMBD"
    _input_error_reasons = ("non-finite embedding values (NaN or inf)",)

    def __init__(self, eps: float | None = None, seed: int | None = None, at_inference: bool = True,
                 ste: str = "identity", id_capacity: int = rc.ID_CAPACITY,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.eps = validate_eps(eps, allow_none=True)
        if not isinstance(at_inference, bool):
            raise TypeError(f"`at_inference` must be a bool; got {at_inference!r}.")
        if ste not in STE_MODES:
            raise ValueError(f"`ste` must be one of {STE_MODES}; got {ste!r}.")
        self.at_inference = at_inference
        self.ste = ste
        self._init_rng(seed)
        self._init_release_counter(id_capacity)
        self._init_input_errors()
        self._convert_input_args = False  # keep the input's dtype (no autocast)
        self._allow_non_tensor_positional_args = True
        self._num_coordinates = None

    @property
    def epsilon(self) -> float | None:
        """Pure eps of one release of one example's embedding (all d coordinates).

        ``d * eps' / 2`` where eps' is the realized per-coordinate budget;
        ``inf`` for ``eps=None``; None before the layer knows d (not built).
        """
        if self.eps is None:
            return float("inf")
        if self._num_coordinates is None:
            return None
        return pure_epsilon(self.dp_event())

    def build(self, input_shape: Any = None) -> None:
        self._record_shape(input_shape)
        self.built = True

    def _record_shape(self, shape):
        dims = list(shape)[1:] if shape is not None else []
        if dims and all(d is not None for d in dims):
            self._num_coordinates = int(np.prod(dims))

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def compute_output_spec(self, inputs: keras.KerasTensor, *args: Any,
                            **kwargs: Any) -> keras.KerasTensor:
        """Symbolic output: the input's shape and dtype (the layer keeps both).

        Args:
            inputs: the symbolic input; the other call arguments do not
                change the output's shape or dtype.

        Returns:
            A `keras.KerasTensor` of the input's shape and dtype.
        """
        return keras.KerasTensor(inputs.shape, dtype=inputs.dtype)

    @input_checks.private_errors
    def call(self, inputs: ArrayLike, training: bool | None = None,
             example_ids: ArrayLike | None = None) -> Any:
        x = ops.convert_to_tensor(inputs)
        self._record_shape(x.shape)
        dtype = keras.backend.standardize_dtype(x.dtype)
        if not keras.backend.is_float_dtype(dtype):
            raise TypeError(f"EmbeddingDPLayer: inputs must be a floating tensor; got dtype "
                            f"{dtype}.")
        traced = backend.impl().is_traced(x)
        if traced:
            finite = ops.isfinite(x)
            x = backend.impl().assert_all_finite(
                x, f"EmbeddingDPLayer: {input_checks.NOT_FINITE}")
        else:
            self._raise_if_not_finite(ops.convert_to_numpy(x))
        randomize = self.eps is not None and (bool(training) or self.at_inference)
        shape = ops.shape(x)
        self._count_coordinates(math.prod(shape[1:]))
        if randomize:
            noisy = quantize_rr(x, self.eps, noise=self._next_words(shape))
            self._count_fresh_release(shape[0], example_ids, "EmbeddingDPLayer")
        else:
            noisy = quantize_rr(x, None)
            self._count_release(rc.NON_PRIVATE, shape[0])
        g = x if self.ste == "identity" else _hardtanh(x)
        # Exactly zero for finite x, gradient g'(x): the output stays 0.0 / 1.0.
        straight_through = g - ops.stop_gradient(g)
        if traced:
            # Where the finiteness check is compiled away (XLA, JAX), NaN - NaN
            # would put NaN in the output: zero the term there instead.
            straight_through = ops.where(finite, straight_through, ops.zeros_like(x))
            self._count_input_errors([ops.logical_not(ops.all(finite))], deps=[x])
        return noisy + straight_through

    @staticmethod
    def _raise_if_not_finite(values):
        """Eagerly: a ValueError naming the first NaN / inf (its index and that value only)."""
        bad = ~np.isfinite(values)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"EmbeddingDPLayer: the embedding has {int(bad.sum())} non-finite "
                             f"value(s) (NaN or inf), first at index {index}: "
                             f"{values[index]!r}.")

    def dp_event(self, num_coordinates: int | None = None) -> dp_accounting.DpEvent:
        """dp_accounting event of one release of one example's embedding."""
        d = num_coordinates if num_coordinates is not None else self._num_coordinates
        if d is None:
            raise ValueError("EmbeddingDPLayer.dp_event: the layer is not built yet; pass "
                             "num_coordinates (the embedding size).")
        return quantize_rr_dp_event(self.eps, d)

    def _cost_in_words(self, d):
        """What ``eps`` costs an example per release, e.g. "eps=4 randomizes each of its 8
        coordinates at eps 2 (eps/2), so one release of an example's embedding is eps 16"."""
        per_coordinate = quantize_realized_epsilon(self.eps)
        return (f"eps={self.eps:g} randomizes each of its {d} coordinates at eps "
                f"{per_coordinate:.3g} ({self._why_per_coordinate(per_coordinate)}), so one "
                f"release of an example's embedding is eps {d * per_coordinate:.3g} "
                f"({d} x {per_coordinate:.3g})")

    def _why_per_coordinate(self, per_coordinate):
        """"eps/2" where the realized per-coordinate eps is that (to the 3 digits shown);
        else why it is less (a flip probability is a multiple of 2**-32, at least 2**-32:
        from eps ~44.4 on the realized value is pinned at ~22.18)."""
        if math.isclose(per_coordinate, self.eps / 2, rel_tol=1e-3):
            return "eps/2"
        return (f"below eps/2 = {self.eps / 2:g}: the flip probability is a multiple of 2**-32 "
                f"and at least 2**-32")

    def privacy_ledger(self) -> ReleaseLedger:
        """What this layer has released so far, as a `ReleaseLedger` (unit: example)."""
        totals = self._release_totals()
        ledger = ReleaseLedger()
        name = f"EmbeddingDPLayer {self.name!r}"
        if totals[rc.NON_PRIVATE]:
            ledger.record(ReleaseKind(name, FEATURES, EXAMPLE, non_private_event(),
                                      "the follower's embedding, quantization only (eps=None, "
                                      "or inference with "
                                      "at_inference=False): the sign pattern, no DP"),
                          units=None, count=int(totals[rc.NON_PRIVATE]))
        # Every release is priced at the largest row size released so far (a
        # layer that saw rows of several sizes is over-counted, never under).
        d = max(int(totals[rc.MAX_COORDINATES]), 0)
        if self.eps is None or d == 0:
            return ledger
        kind = ReleaseKind(name, FEATURES, EXAMPLE, self.dp_event(num_coordinates=d),
                           f"the follower's embedding: {self._cost_in_words(d)}; every call is a "
                           f"release of each row (counted per example id; calls without ids "
                           f"count for every example)")
        self._record_fresh_releases(ledger, kind, totals)
        return ledger

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"eps": self.eps, "seed": self.seed, "at_inference": self.at_inference,
                       "ste": self.ste, "id_capacity": self.id_capacity})
        return config
