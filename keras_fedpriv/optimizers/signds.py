"""SignDS client encoder and server decoder (MindSpore Federated's SignDS design).

Client: after local training, the update ``D = new - old`` is flattened into
one vector of length ``d`` (`flatten_update`) and `SignDSEncoder.encode`
turns it into a `SignDSMessage`: a fair-coin ``sign`` and ``h`` sorted int32
indices chosen by the exponential mechanism of
`keras_fedpriv.mechanisms.signds` (mostly from the top-k set in the sign's
direction). That is all that is uploaded: ``4 h + 1`` bytes instead of
``4 d``. The index set is eps-LDP; the sign is independent of the data.

Server: `decode` turns a message into a dense vector (``sign`` at the
indices, 0 elsewhere) and `aggregate` averages them (weighted by client data
size when given) and scales by the global learning rate, ``W += global_lr *
avg``; `unflatten_update` gives back per-variable arrays.

Example:
    >>> enc = SignDSEncoder(k=0.2, eps=10.0)
    >>> msg = enc.encode(update)            # client
    >>> step = aggregate([msg, ...], global_lr=0.1)   # server
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import warnings
from typing import Any, Iterable, Mapping, Sequence

import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms import signds as _signds
from keras_fedpriv.mechanisms.ledger import CLIENT, ReleaseKind, ReleaseLedger, non_private_event
from keras_fedpriv.mechanisms.random import SeededReleases
from keras_fedpriv.mechanisms.validation import (
    config_with_seed,
    validate_eps,
    validate_positive_int,
    validate_real,
    validate_seed,
)

__all__ = [
    "SignDSEncoder",
    "SignDSMessage",
    "decode",
    "aggregate",
    "flatten_update",
    "unflatten_update",
]

#: The original design's domain for ``sign_dim_out``.
MAX_DIM_OUT = 50
#: The reference server rejects messages with more indices than this.
DEFAULT_MAX_DIM_OUT = 100


def _to_numpy(x):
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    return np.asarray(x)


def flatten_update(tensors: Any) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Flatten and concatenate arrays/tensors into one float32 vector.

    Args:
        tensors: an array-like or tensor, or a list/tuple of them (e.g.
            ``model.trainable_variables`` differences).

    Returns:
        ``(flat, shapes)``: the float32 vector and the list of the input
        shapes (one tuple per input; a single input gives one shape), for
        `unflatten_update`.
    """
    if isinstance(tensors, (list, tuple)):
        arrays = [_to_numpy(t) for t in tensors]
    else:
        arrays = [_to_numpy(tensors)]
    shapes = [tuple(a.shape) for a in arrays]
    if not arrays:
        return np.zeros(0, np.float32), shapes
    if len(arrays) == 1:
        flat = arrays[0].reshape(-1).astype(np.float32, copy=False)
    else:
        flat = np.concatenate([a.reshape(-1).astype(np.float32, copy=False) for a in arrays])
    return flat, shapes


def unflatten_update(flat: ArrayLike, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Split a flat vector back into arrays of ``shapes`` (inverse of `flatten_update`)."""
    flat = _to_numpy(flat).reshape(-1)
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    if sum(sizes) != flat.shape[0]:
        raise ValueError(f"`flat` has {flat.shape[0]} entries but `shapes` {list(shapes)} "
                         f"need {sum(sizes)}.")
    out, start = [], 0
    for shape, size in zip(shapes, sizes):
        out.append(flat[start:start + size].reshape(shape))
        start += size
    return out


@dataclasses.dataclass(frozen=True)
class SignDSMessage:
    """What one SignDS client uploads.

    Attributes:
        sign: +1 or -1 (a fair coin).
        indices: int32 array of the released coordinates, sorted and unique.
        dim: the update length ``d`` (public: the model's size).
        num_examples: optional aggregation weight (the client's data size).

    The number ``t`` of indices taken from the top-k set and the top-k mean
    are private and are not part of the message.
    """

    sign: int
    indices: np.ndarray
    dim: int
    num_examples: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.sign, (bool, np.bool_)) or self.sign not in (1, -1):
            raise ValueError(f"`sign` must be +1 or -1; got {self.sign!r}.")
        dim = validate_positive_int(self.dim, "dim")
        num_examples = validate_positive_int(self.num_examples, "num_examples", allow_none=True)
        indices = np.asarray(self.indices)
        if indices.ndim != 1 or (indices.size and indices.dtype.kind not in "iu"):
            raise ValueError(f"`indices` must be a 1-D integer array; got shape "
                             f"{indices.shape} and dtype {indices.dtype}.")
        if indices.size:
            if indices[0] < 0 or indices[-1] >= dim:
                raise ValueError(f"`indices` must lie in [0, dim={dim}); got values from "
                                 f"{indices.min()} to {indices.max()}.")
            if np.any(np.diff(indices) <= 0):
                raise ValueError("`indices` must be sorted and unique.")
        indices = indices.astype(np.int32)  # a private copy
        indices.flags.writeable = False
        object.__setattr__(self, "sign", int(self.sign))
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "dim", dim)
        object.__setattr__(self, "num_examples", num_examples)

    @property
    def nbytes(self) -> int:
        """Upload size: 4 bytes per int32 index plus one sign byte."""
        return 4 * len(self.indices) + 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SignDSMessage):
            return NotImplemented
        return (self.sign == other.sign and self.dim == other.dim
                and self.num_examples == other.num_examples
                and np.array_equal(self.indices, other.indices))

    def __hash__(self) -> int:
        return hash((self.sign, self.indices.tobytes(), self.dim, self.num_examples))


@functools.lru_cache(maxsize=256)
def _output_dim(d, k, eps, thr_ratio, max_dim):
    return _signds.optimal_output_dim(d, k, eps, thr_ratio, max_dim=max_dim)


@functools.lru_cache(maxsize=256)
def _threshold(d, k, h, eps):
    return _signds.optimal_threshold(d, k, h, eps)


class SignDSEncoder(SeededReleases):
    """Client-side SignDS encoder: a flat update -> a `SignDSMessage`.

    Args:
        k: fraction of coordinates in the top-k set, in (0, 0.25]
            (``sign_k``); the set has ``floor(k * d)`` members.
        eps: privacy parameter of the index selection, in (0, 100]
            (``sign_eps``).
        thr_ratio: in [0.5, 1] (``sign_thr_ratio``): the optimal output size
            is the largest ``h`` of the run where the expected fraction of
            released indices from the top-k set is at least this.
        dim_out: integer in [0, 50] (``sign_dim_out``): the number ``h`` of
            released indices, or 0 to compute the optimal one.
        max_dim_out: cap on the computed optimal ``h`` (integer >= 1, or None
            for no cap). The reference server rejects messages with more than
            100 indices, so the default caps the optimum at 100; pass a larger
            value (or None) to lift it. Ignored when ``dim_out`` is non-zero.
        seed: None (a fresh 64-bit secret from OS entropy, not stored in
            `get_config`) or a non-negative integer for reproducible
            messages. All randomness (the sign, ``t``, the indices) of the
            n-th message comes from ``secret_generator(seed, stream=n)``,
            never from numpy's global RNG. n is `state_dict`'s
            ``num_releases``: a copy restored with `load_state_dict`
            continues with new randomness, and a seeded copy rebuilt by
            `from_config` alone refuses to encode until its state is loaded
            (it would replay the original's messages).

    The index set of each message is ``eps``-LDP; `dp_event` gives the event
    to compose over rounds.
    """

    def __init__(self, k: float = 0.01, eps: float = 100.0, thr_ratio: float = 0.6,
                 dim_out: int = 0, max_dim_out: int | None = DEFAULT_MAX_DIM_OUT, seed: int | None = None) -> None:
        self.k = validate_real(k, "k", low=0, high=0.25, low_open=True)
        self.eps = validate_eps(eps, "eps", lower_open=True, upper=100)
        self.thr_ratio = validate_real(thr_ratio, "thr_ratio", low=0.5, high=1)
        if isinstance(dim_out, (bool, np.bool_)) or not isinstance(dim_out, numbers.Integral):
            raise TypeError(f"`dim_out` must be an integer in [0, {MAX_DIM_OUT}]; got "
                            f"{dim_out!r} of type {type(dim_out).__name__}.")
        if not 0 <= int(dim_out) <= MAX_DIM_OUT:
            raise ValueError(f"`dim_out` must be an integer in [0, {MAX_DIM_OUT}]; "
                             f"got {dim_out!r}.")
        self.dim_out = int(dim_out)
        self.max_dim_out = validate_positive_int(max_dim_out, "max_dim_out", allow_none=True)
        self.seed = validate_seed(seed)
        self._init_releases()
        self._warned = set()

    # -- parameters for a given d ------------------------------------------

    def num_topk(self, d: int) -> int:
        """``floor(k * d)``; a ValueError if it is 0, a warning if ``k * d <= 50``.

        The warning is given once per encoder and ``d``.
        """
        return self._num_topk(d, stacklevel=3)

    def _num_topk(self, d, stacklevel):
        d = validate_positive_int(d, "d")
        kd = self.k * d
        num = math.floor(kd)
        if num == 0:
            raise ValueError(f"The top-k set is empty: floor(k * d) = 0 for k={self.k!r} and "
                             f"d={d!r}; the update needs d >= {math.ceil(1 / self.k)} "
                             f"coordinates at this k (or raise `k`, at most 0.25).")
        if kd <= 50 and d not in self._warned:
            self._warned.add(d)
            warnings.warn(f"SignDS: k * d = {kd:g} <= 50 (k={self.k!r}, d={d!r}): the top-k set "
                          f"is tiny; the reference warns here too.", UserWarning,
                          stacklevel=stacklevel)
        return num

    def output_dim(self, d: int) -> int:
        """``h``: ``dim_out`` if non-zero, else `optimal_output_dim` capped at ``max_dim_out``."""
        return self._output_dim(d, self._num_topk(d, stacklevel=3))

    def _output_dim(self, d, num):
        if self.dim_out:
            if self.dim_out > d:
                raise ValueError(f"`dim_out`={self.dim_out} exceeds the update length d={d}.")
            return self.dim_out
        return _output_dim(int(d), num, self.eps, self.thr_ratio, self.max_dim_out)

    def threshold(self, d: int) -> int:
        """The optimal threshold for ``h = output_dim(d)``."""
        num = self._num_topk(d, stacklevel=3)
        return _threshold(int(d), num, self._output_dim(d, num), self.eps)

    # -- encoding ----------------------------------------------------------

    def _encode(self, update, num_examples, client_id=None):
        num_examples = validate_positive_int(num_examples, "num_examples", allow_none=True)
        client_id = validate_positive_int(client_id, "client_id", minimum=0, allow_none=True)
        flat, _ = flatten_update(update)
        d = flat.shape[0]
        if d == 0:
            raise ValueError("`update` is empty.")
        if not np.isfinite(flat).all():
            raise ValueError("`update` must be finite; it contains NaN or infinity.")
        k = self._num_topk(d, stacklevel=4)  # warns at the caller of encode()
        h = self._output_dim(d, k)
        thr = _threshold(d, k, h, self.eps)
        rng = self._release_generator(client_id)
        sign = 1 if rng.integers(0, 2) else -1
        indices, topk_mean = _signds.select_indices_unvalidated(flat, k, h, self.eps, thr, sign, rng)
        message = SignDSMessage(sign=sign, indices=indices, dim=d, num_examples=num_examples)
        units = None if client_id is None else [client_id]
        self._ledger.record(self._release_kind(), units=units)
        if num_examples is not None:  # the client's data size goes out in the clear
            self._ledger.record(ReleaseKind(
                "SignDS message", "client data", CLIENT, non_private_event(),
                "num_examples (the client's data size) sent in the clear as an aggregation "
                "weight"), units=units)
        return message, topk_mean

    def encode(self, update: Any, num_examples: int | None = None,
               client_id: int | None = None) -> SignDSMessage:
        """Encode an update into a `SignDSMessage` (a release, recorded in `privacy_ledger`).

        Args:
            update: a flat array-like or tensor, or a list of arrays/tensors
                (each is flattened and all are concatenated). Must be finite.
            num_examples: optional aggregation weight (integer >= 1).
            client_id: the client the update belongs to (an integer >= 0),
                for per-client release counts; None: this encoder's own
                client (counted as a release of every client).

        Returns:
            The `SignDSMessage` to upload.
        """
        return self._encode(update, num_examples, client_id)[0]

    def encode_with_magnitude(self, update: Any, num_examples: int | None = None,
                              client_id: int | None = None) -> tuple[SignDSMessage, float]:
        """Like `encode`, also returning the private ``|mean of the top-k values|``.

        The magnitude is what MagRR's client compares with the server's
        estimate; it must not be uploaded in the clear.

        Returns:
            ``(message, topk_mean)``.
        """
        return self._encode(update, num_examples, client_id)

    # -- privacy -----------------------------------------------------------

    @property
    def epsilon(self) -> float:
        """The per-message eps of the index selection."""
        return self.eps

    def dp_event(self) -> dp_accounting.DpEvent:
        """The `dp_accounting` event of one message (`signds_dp_event`)."""
        return _signds.signds_dp_event(self.eps)

    def _release_kind(self):
        return ReleaseKind("SignDS upload", "client data", CLIENT, self.dp_event(),
                           "the index set of its update (the sign is a fair coin): one "
                           "release per message a client uploads")

    def privacy_ledger(self) -> ReleaseLedger:
        """Every message encoded so far, per client (`ReleaseLedger`, unit: client)."""
        return self._ledger

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments; the seed only if one was passed explicitly."""
        config = {"k": self.k, "eps": self.eps, "thr_ratio": self.thr_ratio,
                  "dim_out": self.dim_out, "max_dim_out": self.max_dim_out}
        return config_with_seed(config, self.seed)

    def __repr__(self) -> str:
        return (f"SignDSEncoder(k={self.k!r}, eps={self.eps!r}, thr_ratio={self.thr_ratio!r}, "
                f"dim_out={self.dim_out!r}, max_dim_out={self.max_dim_out!r})")


def decode(message: SignDSMessage) -> np.ndarray:
    """Dense float32 vector of length ``message.dim``: ``sign`` at the indices, 0 elsewhere."""
    if not isinstance(message, SignDSMessage):
        raise TypeError(f"`message` must be a SignDSMessage; got {type(message).__name__}.")
    out = np.zeros(message.dim, dtype=np.float32)
    out[message.indices] = message.sign
    return out


def aggregate(messages: Iterable[SignDSMessage], global_lr: float = 1.0,
              weights: ArrayLike | None = None) -> np.ndarray:
    """Server side: ``global_lr *`` the (weighted) average of the decoded messages.

    Args:
        messages: non-empty list of `SignDSMessage` of the same ``dim``.
        global_lr: finite real > 0.
        weights: optional non-negative finite weights, one per message, not
            all zero. None: each message's ``num_examples`` if all messages
            carry one, else equal weights.

    Returns:
        float32 array of length ``dim``: the step to add to the global model.
    """
    messages = list(messages)
    if not messages:
        raise ValueError("`messages` must be a non-empty list of SignDSMessage.")
    for i, m in enumerate(messages):
        if not isinstance(m, SignDSMessage):
            raise TypeError(f"`messages[{i}]` must be a SignDSMessage; got {type(m).__name__}.")
    dims = {m.dim for m in messages}
    if len(dims) != 1:
        raise ValueError(f"All messages must have the same dim; got dims {sorted(dims)}.")
    global_lr = validate_eps(global_lr, "global_lr", lower_open=True)
    if weights is None:
        if all(m.num_examples is not None for m in messages):
            weights = [m.num_examples for m in messages]
        else:
            weights = [1.0] * len(messages)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (len(messages),):
        raise ValueError(f"`weights` must hold one weight per message ({len(messages)}); "
                         f"got shape {weights.shape}.")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"`weights` must be finite, non-negative and not all zero; "
                         f"got {weights.tolist()}.")
    coef = global_lr * weights / weights.sum()
    out = np.zeros(dims.pop(), dtype=np.float64)
    for c, m in zip(coef, messages):
        out[m.indices] += c * m.sign  # indices are unique within a message
    return out.astype(np.float32)
