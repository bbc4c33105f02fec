"""Clipping + Gaussian noise on a client update (MindSpore Federated's `DP_ENCRYPT` baseline).

A client clips its flat update to L2 norm ``clip_norm`` and adds independent
N(0, (noise_multiplier * clip_norm)^2) noise to every coordinate before it
uploads. One release is the Gaussian mechanism with L2 sensitivity
``clip_norm`` for add/remove of the client's whole update, i.e.
``dp_accounting.GaussianDpEvent(noise_multiplier)``; with ``REPLACE_ONE``
neighbours (local DP: any update replaced by any other) the sensitivity is
``2 * clip_norm`` and the event is ``GaussianDpEvent(noise_multiplier / 2)``
(`gaussian_dp_event(..., local=True)`, the default).

Noise is drawn with numpy's PCG64 from a 64-bit secret (`secret_generator`) unless
a seed is given. This is the floating-point Gaussian; like every textbook
float sampler it is not hardened against the low-order-bit attacks of Mironov
(2012) and is offered as a comparison baseline, not as the recommended defense.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.random import secret_generator
from keras_fedpriv.mechanisms.validation import validate_real

__all__ = ["clip_by_l2_norm", "gaussian_dp_event", "gaussian_epsilon", "gaussian_mechanism"]


def clip_by_l2_norm(update: ArrayLike, clip_norm: float) -> tuple[np.ndarray, float]:
    """``update * min(1, clip_norm / ||update||_2)`` as float32; also returns the norm.

    Raises:
        ValueError: ``clip_norm`` not a finite number > 0, or ``update`` has
            NaN or infinite entries.
    """
    clip_norm = validate_real(clip_norm, "clip_norm", low=0, low_open=True)
    update = np.asarray(update, dtype=np.float32).ravel()
    if not np.all(np.isfinite(update)):
        raise ValueError("`update` has NaN or infinite entries; clip a finite update.")
    norm = float(np.linalg.norm(update.astype(np.float64)))
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return (update * np.float32(scale)).astype(np.float32), norm


def gaussian_mechanism(update: ArrayLike, clip_norm: float, noise_multiplier: float,
                       rng: np.random.Generator | None = None) -> np.ndarray:
    """Clip ``update`` to ``clip_norm`` and add N(0, (noise_multiplier*clip_norm)^2) noise.

    Args:
        update: flat array-like of floats.
        clip_norm: L2 bound C (> 0).
        noise_multiplier: z (> 0); the noise std is ``z * C``.
        rng: a numpy Generator; None draws a fresh secret.

    Returns:
        The noisy float32 update (same length as ``update``).
    """
    noise_multiplier = validate_real(noise_multiplier, "noise_multiplier", low=0, low_open=True)
    clipped, _ = clip_by_l2_norm(update, clip_norm)
    rng = secret_generator() if rng is None else rng
    noise = rng.standard_normal(clipped.shape[0], dtype=np.float64) * (noise_multiplier * clip_norm)
    return (clipped + noise).astype(np.float32)


def gaussian_dp_event(noise_multiplier: float, local: bool = True) -> dp_accounting.GaussianDpEvent:
    """The dp_accounting event of one release.

    Args:
        noise_multiplier: z, noise std / clip_norm.
        local: True (default) for local DP (replace one client's update by any
            other: sensitivity 2C, so the effective multiplier is z / 2);
            False for add/remove of a client (sensitivity C).
    """
    z = validate_real(noise_multiplier, "noise_multiplier", low=0, low_open=True)
    return dp_accounting.GaussianDpEvent(z / 2.0 if local else z)


def gaussian_epsilon(noise_multiplier: float, delta: float, local: bool = True,
                     count: int = 1) -> float:
    """eps at ``delta`` of ``count`` releases, from dp-accounting's PLD accountant."""
    event = gaussian_dp_event(noise_multiplier, local)
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(event, int(count))
    return float(acc.get_epsilon(float(delta)))

