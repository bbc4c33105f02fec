"""What a horizontal-FL client uploads, and how the server aggregates it.

Three schemes, one small class each, with the same two methods:

* ``client_message(delta, num_examples, client_id=None) -> ClientUpload``:
  on the client, from its flat float32 update ``delta = new - old``; the
  upload is a release about client ``client_id`` and is recorded in the
  scheme's `privacy_ledger` (FedAvg's as not private);
* ``aggregate(uploads, global_lr=None) -> np.ndarray``: on the server, the
  dense float32 step to add to the global weights.

Two more carry an upload across a process boundary without trusting it:

* ``to_wire(upload) -> dict[str, np.ndarray]``: the arrays a client sends
  (only what ``aggregate`` uses: SignDS and Gaussian send no data size);
* ``from_wire(arrays, dim) -> ClientUpload``: on the server, the upload
  rebuilt from received arrays, or `MalformedUpload` (a ``ValueError``) with
  the reason (missing or extra keys, wrong dtype or length, a non-finite
  value, unsorted, repeated or out-of-range indices) so nothing malformed is
  aggregated. The reason names what is wrong, never the values.

`FedAvgUpload` (dense float update, averaged with weights = client sizes; no
protection), `SignDSUpload` (SignDS: a sign and a few indices) and
`GaussianUpload` (clip + Gaussian noise per client, the original design's
`DP_ENCRYPT` baseline). The mechanisms themselves live in
`keras_fedpriv.mechanisms` and `keras_fedpriv.optimizers`; this module only
routes updates through them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.gaussian import gaussian_dp_event, gaussian_mechanism
from keras_fedpriv.federated.malformed import MalformedMessage
from keras_fedpriv.mechanisms.ledger import CLIENT, ReleaseKind, ReleaseLedger, non_private_event
from keras_fedpriv.mechanisms.random import SeededReleases
from keras_fedpriv.mechanisms.validation import config_with_seed, validate_eps, validate_seed
from keras_fedpriv.optimizers.signds import SignDSEncoder, SignDSMessage
from keras_fedpriv.optimizers.signds import aggregate as signds_aggregate

__all__ = ["ClientUpload", "FedAvgUpload", "GaussianUpload", "MalformedUpload", "SignDSUpload",
           "as_upload"]


class MalformedUpload(MalformedMessage):
    """A received upload that does not have the shape its scheme promises (never aggregated)."""


def _check_keys(arrays, expected):
    if not isinstance(arrays, Mapping):
        raise MalformedUpload(f"an upload must be a mapping of named arrays; got "
                              f"{type(arrays).__name__}.")
    keys = set(arrays)
    if keys != set(expected):
        raise MalformedUpload(f"an upload must hold exactly the arrays {sorted(expected)}; got "
                              f"{sorted(map(str, keys))}.")


def _wire_array(arrays, key, kinds, shape):
    """``arrays[key]`` as a numpy array of one of the dtype ``kinds`` and ``shape``."""
    try:
        a = np.asarray(arrays[key])
    except Exception:  # noqa: BLE001 - anything that is not an array is malformed
        raise MalformedUpload(f"upload array {key!r} is not an array.") from None
    if a.dtype.kind not in kinds:
        raise MalformedUpload(f"upload array {key!r} must have a dtype of kind {kinds!r}; got "
                              f"{a.dtype}.")
    if a.shape != shape:
        raise MalformedUpload(f"upload array {key!r} must have shape {shape}; got {a.shape}.")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise MalformedUpload(f"upload array {key!r} holds NaN or infinity.")
    return a


def _dense_from_wire(arrays, dim, with_size):
    expected = ("update", "num_examples") if with_size else ("update",)
    _check_keys(arrays, expected)
    update = _wire_array(arrays, "update", "f", (int(dim),))
    if update.dtype != np.float32:
        raise MalformedUpload(f"upload array 'update' must be float32; got {update.dtype}.")
    num_examples = 1
    if with_size:
        size = _wire_array(arrays, "num_examples", "iu", (1,))
        num_examples = int(size[0])
        if num_examples < 1:
            raise MalformedUpload("upload array 'num_examples' must be >= 1.")
    return ClientUpload(update.copy(), update.size * 4, num_examples)


@dataclasses.dataclass
class ClientUpload:
    """One client's upload in one round.

    Attributes:
        message: what crosses the wire (a float32 array, or a `SignDSMessage`).
        nbytes: its size in bytes.
        num_examples: the client's number of training examples.
        magnitude: SignDS only: the client's private step size (|mean of its
            update over its top-k set)), which never leaves the client except
            through MagRR's randomized response; None otherwise.
    """

    message: Any
    nbytes: int
    num_examples: int
    magnitude: float | None = None


def _mean(arrays, weights):
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / weights.sum()
    out = np.zeros_like(np.asarray(arrays[0], dtype=np.float64))
    for w, a in zip(weights, arrays):
        out += w * np.asarray(a, dtype=np.float64)
    return out.astype(np.float32)


def _units(client_id):
    return None if client_id is None else [int(client_id)]


class FedAvgUpload:
    """Plain FedAvg: the dense float32 update, averaged weighted by client data size.

    No protection: every upload is recorded as a release without DP.
    """

    name = "fedavg"

    def __init__(self) -> None:
        self._ledger = ReleaseLedger()

    def client_message(self, delta: ArrayLike, num_examples: int,
                       client_id: int | None = None) -> ClientUpload:
        delta = np.asarray(delta, dtype=np.float32)
        self._ledger.record(ReleaseKind("FedAvg upload", "client data", CLIENT,
                                        non_private_event(),
                                        "its update in the clear: not private"), _units(client_id))
        return ClientUpload(delta, delta.size * 4, int(num_examples))

    def privacy_ledger(self) -> ReleaseLedger:
        """Every upload so far, per client (all without DP)."""
        return self._ledger

    def aggregate(self, uploads: Sequence[ClientUpload],
                  global_lr: float | None = None) -> np.ndarray:
        lr = 1.0 if global_lr is None else global_lr
        return np.float32(lr) * _mean([u.message for u in uploads],
                                      [u.num_examples for u in uploads])

    def dp_event(self) -> None:
        return None

    def to_wire(self, upload: ClientUpload) -> dict[str, np.ndarray]:
        """``{"update": float32[d], "num_examples": int64[1]}``."""
        return {"update": np.asarray(upload.message, np.float32),
                "num_examples": np.array([upload.num_examples], np.int64)}

    def from_wire(self, arrays: Mapping[str, Any], dim: int) -> ClientUpload:
        """The upload from received arrays; `MalformedUpload` if they are not what `to_wire` sends."""
        return _dense_from_wire(arrays, dim, with_size=True)

    def describe(self) -> str:
        return "FedAvg (no protection)"


class SignDSUpload:
    """SignDS: each client uploads a fair-coin sign and h sorted int32 indices.

    The server averages the clients' sparse sign vectors with equal weights
    (client sizes are not uploaded) and scales by ``global_lr``, which a
    `keras_fedpriv.callbacks.MagRR` callback replaces every round when present.

    Args:
        encoder: a `SignDSEncoder` (or None for the default one).
        global_lr: the server's step when no MagRR estimate is available
            (the original design's ``sign_global_lr``).
    """

    name = "signds"

    def __init__(self, encoder: SignDSEncoder | None = None, global_lr: float = 1.0) -> None:
        if encoder is None:
            encoder = SignDSEncoder()
        if not isinstance(encoder, SignDSEncoder):
            raise TypeError(f"`encoder` must be a SignDSEncoder; got {encoder!r}.")
        self.encoder = encoder
        self.global_lr = validate_eps(global_lr, "global_lr", lower_open=True)

    def client_message(self, delta: ArrayLike, num_examples: int,
                       client_id: int | None = None) -> ClientUpload:
        message, magnitude = self.encoder.encode_with_magnitude(delta, client_id=client_id)
        return ClientUpload(message, message.nbytes, int(num_examples), float(magnitude))

    def privacy_protections(self) -> list[SignDSEncoder]:
        """The encoder, which records every message it encodes."""
        return [self.encoder]

    def aggregate(self, uploads: Sequence[ClientUpload],
                  global_lr: float | None = None) -> np.ndarray:
        lr = self.global_lr if global_lr is None else global_lr
        return signds_aggregate([u.message for u in uploads], global_lr=lr,
                                weights=[1.0] * len(uploads))

    def dp_event(self) -> dp_accounting.DpEvent:
        return self.encoder.dp_event()

    def to_wire(self, upload: ClientUpload) -> dict[str, np.ndarray]:
        """``{"sign": int8[1], "indices": int32[h]}``: the message, nothing else.

        The client's data size and its top-k magnitude stay on the client.
        """
        m = upload.message
        return {"sign": np.array([m.sign], np.int8), "indices": np.asarray(m.indices, np.int32)}

    def from_wire(self, arrays: Mapping[str, Any], dim: int) -> ClientUpload:
        """The upload from received arrays, checked against this encoder's promise.

        Raises:
            MalformedUpload: missing or extra arrays, a sign other than +1/-1,
                indices that are not int32, not ``h = encoder.output_dim(dim)``
                of them, unsorted, repeated, or outside ``[0, dim)``.
        """
        _check_keys(arrays, ("sign", "indices"))
        sign = _wire_array(arrays, "sign", "i", (1,))
        h = self.encoder.output_dim(int(dim))
        indices = _wire_array(arrays, "indices", "i", (h,))
        if indices.dtype != np.int32:
            raise MalformedUpload(f"upload array 'indices' must be int32; got {indices.dtype}.")
        if int(sign[0]) not in (1, -1):
            raise MalformedUpload("upload array 'sign' must be +1 or -1.")
        if h and (indices.min() < 0 or indices.max() >= dim):
            raise MalformedUpload(f"upload array 'indices' must lie in [0, {dim}).")
        if np.any(np.diff(indices) <= 0):
            raise MalformedUpload("upload array 'indices' must be sorted and unique.")
        message = SignDSMessage(sign=int(sign[0]), indices=indices, dim=int(dim))
        return ClientUpload(message, message.nbytes, 1)

    def describe(self) -> str:
        e = self.encoder
        return f"SignDS (k={e.k:g}, eps={e.epsilon:g})"


class GaussianUpload(SeededReleases):
    """Clip each client's update to ``clip_norm`` and add Gaussian noise before upload.

    The server takes the plain mean (equal weights). One round is
    `gaussian_dp_event(noise_multiplier)` per participating client (local DP).

    Args:
        clip_norm: L2 clipping bound C.
        noise_multiplier: noise std / C.
        seed: None (a fresh OS-entropy secret per message) or an int: the
            n-th message's noise comes from ``secret_generator(seed,
            stream=n)``, and `state_dict` / `load_state_dict` carry n, so a
            restored copy continues with new noise instead of replaying it.
    """

    name = "gaussian"

    def __init__(self, clip_norm: float = 1.0, noise_multiplier: float = 1.0,
                 seed: int | None = None) -> None:
        self.clip_norm = validate_eps(clip_norm, "clip_norm", lower_open=True)
        self.noise_multiplier = validate_eps(noise_multiplier, "noise_multiplier",
                                             lower_open=True)
        self.seed = validate_seed(seed)
        self._init_releases()

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments; the seed only if one was passed explicitly."""
        return config_with_seed({"clip_norm": self.clip_norm,
                                  "noise_multiplier": self.noise_multiplier}, self.seed)

    def client_message(self, delta: ArrayLike, num_examples: int,
                       client_id: int | None = None) -> ClientUpload:
        noisy = gaussian_mechanism(delta, self.clip_norm, self.noise_multiplier,
                                   self._release_generator(client_id))
        self._ledger.record(ReleaseKind("Gaussian upload", "client data", CLIENT,
                                        self.dp_event(), "its clipped update plus Gaussian "
                                        "noise: one release per upload"),
                            _units(client_id))
        return ClientUpload(noisy, noisy.size * 4, int(num_examples))

    def privacy_ledger(self) -> ReleaseLedger:
        """Every noisy update so far, per client."""
        return self._ledger

    def aggregate(self, uploads: Sequence[ClientUpload],
                  global_lr: float | None = None) -> np.ndarray:
        lr = 1.0 if global_lr is None else global_lr
        return np.float32(lr) * _mean([u.message for u in uploads], [1.0] * len(uploads))

    def dp_event(self) -> dp_accounting.GaussianDpEvent:
        return gaussian_dp_event(self.noise_multiplier)

    def to_wire(self, upload: ClientUpload) -> dict[str, np.ndarray]:
        """``{"update": float32[d]}``: the noisy update (no data size: equal weights)."""
        return {"update": np.asarray(upload.message, np.float32)}

    def from_wire(self, arrays: Mapping[str, Any], dim: int) -> ClientUpload:
        """The upload from received arrays; `MalformedUpload` if they are not what `to_wire` sends."""
        return _dense_from_wire(arrays, dim, with_size=False)

    def describe(self) -> str:
        return f"Gaussian (clip {self.clip_norm:g}, z={self.noise_multiplier:g})"


def as_upload(upload: Any) -> Any:
    """Normalize the ``upload=`` argument of `HorizontalFL`.

    Accepts ``"fedavg"``, ``"signds"`` (default encoder), a `SignDSEncoder`,
    or an upload object (`FedAvgUpload`, `SignDSUpload`, `GaussianUpload` or
    anything with ``client_message`` and ``aggregate``).
    """
    if isinstance(upload, str):
        if upload == "fedavg":
            return FedAvgUpload()
        if upload == "signds":
            return SignDSUpload()
        raise ValueError(f"`upload` must be 'fedavg', 'signds', a SignDSEncoder or an upload "
                         f"object (FedAvgUpload, SignDSUpload, GaussianUpload); got {upload!r}.")
    if isinstance(upload, SignDSEncoder):
        return SignDSUpload(upload)
    if hasattr(upload, "client_message") and hasattr(upload, "aggregate"):
        return upload
    raise TypeError(f"`upload` must be 'fedavg', 'signds', a SignDSEncoder or an upload object "
                    f"(FedAvgUpload, SignDSUpload, GaussianUpload); got {upload!r}.")
