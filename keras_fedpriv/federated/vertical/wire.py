"""The vertical-FL wire format: what a follower sends, what the leader sends back, and the checks.

A follower's message is its protected embedding of a batch: packed bits when
its protection outputs exactly 0.0 / 1.0 (`EmbeddingDPLayer`), else the float
embedding. The leader's answer is the cut gradient, floats of the
embedding's shape. Every received message is decoded with its check:
anything that is not what the sender's `EmbeddingSpec` promises is a
`MalformedMessage` whose text names what is wrong, never a value.

One message may carry several batches (`pack_batches`): the arrays of batch
``i`` under the keys ``"<i>/<key>"``; `unpack_batches` checks that the
batches are numbered ``0 .. n - 1`` and that ``n`` is what was asked for.

A message's records (what any transport carries; the Flower adapter,
`keras_fedpriv.federated.flower.vertical`, puts them in a ``RecordDict``):
a request holds ``"ids"`` and ``"gradient"`` (`FollowerRequest.to_arrays`)
and ``"config"``, the request's numbers (`request_numbers`); a reply holds
``"embedding"``, read with its byte limit before anything in it is
deserialized (`read_embedding_reply`), or ``"error"``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from keras_fedpriv.federated.malformed import MalformedMessage

__all__ = ["CONFIG", "EMBEDDING", "ERROR", "GRADIENT", "IDS", "REQUEST_NUMBERS", "EmbeddingSpec",
           "MalformedMessage", "decode_embedding", "decode_gradient", "embedding_reply_limit",
           "encode_embedding", "encode_gradient", "pack_batches", "read_embedding_reply",
           "read_request_numbers", "request_numbers", "unpack_batches", "up_bytes"]

#: the records of a message: a request's example ids, cut gradients and numbers
IDS, GRADIENT, CONFIG = "ids", "gradient", "config"
#: the records of a reply: the follower's embeddings, or why it could not serve
EMBEDDING, ERROR = "embedding", "error"
#: a request's numbers besides its arrays (the fields of `FollowerRequest`)
REQUEST_NUMBERS = ("epoch", "step", "message", "answers")


@dataclasses.dataclass(frozen=True)
class EmbeddingSpec:
    """What one follower sends per example, and how.

    Attributes:
        shape: the embedding's shape without the batch dimension.
        dtype: its float dtype (also the dtype of the cut gradient sent back).
        bits: True when the follower's protection outputs exactly 0.0 / 1.0
            (`EmbeddingDPLayer`): the message is then packed, 8 coordinates a
            byte; else the float embedding is sent.
    """

    shape: tuple[int, ...]
    dtype: str
    bits: bool

    @property
    def coordinates(self) -> int:
        """Coordinates per example (the product of ``shape``)."""
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def itemsize(self) -> int:
        """Bytes of one float coordinate."""
        return int(np.dtype(self.dtype).itemsize)

    @property
    def bytes_up_per_example(self) -> int:
        """Bytes sent to the leader per example: ``ceil(d / 8)`` packed, else ``d * itemsize``."""
        return up_bytes(1, self.coordinates, self.itemsize, self.bits)

    @property
    def bytes_down_per_example(self) -> int:
        """Bytes of the cut gradient per example: ``d * itemsize``."""
        return self.coordinates * self.itemsize

    def to_config(self) -> dict[str, Any]:
        """A JSON-safe dict (what a follower announces to the leader)."""
        return {"shape": [int(d) for d in self.shape], "dtype": self.dtype, "bits": self.bits}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> EmbeddingSpec:
        """The spec of `to_config`; a `MalformedMessage` if it is not one."""
        try:
            shape = tuple(int(d) for d in config["shape"])
            dtype = str(config["dtype"])
            bits = config["bits"]
        except (KeyError, TypeError, ValueError) as error:
            raise MalformedMessage(f"an embedding spec needs 'shape', 'dtype' and 'bits' "
                                   f"({type(error).__name__}).") from None
        if not isinstance(bits, bool) or any(d < 1 for d in shape) or \
                np.dtype(dtype).kind != "f":
            raise MalformedMessage("an embedding spec needs positive dimensions, a float dtype "
                                   "and a bool 'bits'.")
        return cls(shape, dtype, bits)


def up_bytes(rows: Any, coordinates: Any, itemsize: int, bits: bool) -> Any:
    """Bytes of an embedding message of ``rows`` rows (ints or integer tensors)."""
    return rows * ((coordinates + 7) // 8) if bits else rows * coordinates * itemsize


def encode_embedding(sent: Any, spec: EmbeddingSpec) -> dict[str, np.ndarray]:
    """The wire arrays of a follower's message.

    Args:
        sent: what the follower's protection output, shape (rows,) + spec.shape.
        spec: the follower's `EmbeddingSpec`.

    Returns:
        ``{"bits": uint8 (rows, ceil(d / 8))}`` (`numpy.packbits` of each row,
        big-endian, zero padding) when ``spec.bits``, else
        ``{"embedding": <spec.dtype> (rows,) + shape}``.

    Raises:
        ValueError: a packed message whose values are not exactly 0.0 / 1.0.
    """
    a = np.asarray(sent)
    if spec.bits:
        flat = a.reshape(a.shape[0], -1)
        if not np.all((flat == 0) | (flat == 1)):
            raise ValueError("encode_embedding: a packed message holds values other than 0.0 and "
                             "1.0; the protection must output bits.")
        return {"bits": np.packbits(flat.astype(bool), axis=1)}
    return {"embedding": np.ascontiguousarray(a.astype(spec.dtype, copy=False))}


def _wire_array(arrays, key, owner):
    if not isinstance(arrays, Mapping):
        raise MalformedMessage(f"{owner} must be a mapping of named arrays; got "
                               f"{type(arrays).__name__}.")
    if set(arrays) != {key}:
        raise MalformedMessage(f"{owner} must hold exactly the array {key!r}; got "
                               f"{sorted(map(str, arrays))}.")
    a = arrays[key]
    if not isinstance(a, np.ndarray):
        raise MalformedMessage(f"{owner} array {key!r} must be a numpy array; got "
                               f"{type(a).__name__}.")
    return a


def decode_embedding(arrays: Mapping[str, Any], spec: EmbeddingSpec, rows: int) -> np.ndarray:
    """A received follower message as the embedding the leader's top takes, checked.

    Args:
        arrays: the wire arrays (`encode_embedding`'s output).
        spec: the sender's `EmbeddingSpec`, as the leader expects it.
        rows: the number of examples the leader asked for.

    Returns:
        A ``spec.dtype`` array of shape ``(rows,) + spec.shape``.

    Raises:
        MalformedMessage: other keys, dtype or shape than promised, nonzero
            padding bits, or non-finite floats. The reason never holds values.
    """
    if spec.bits:
        a = _wire_array(arrays, "bits", "an embedding message")
        width = (spec.coordinates + 7) // 8
        if a.dtype != np.uint8 or a.shape != (rows, width):
            raise MalformedMessage(f"embedding message 'bits' must be uint8 of shape "
                                   f"({rows}, {width}); got {a.dtype} {a.shape}.")
        spare = 8 * width - spec.coordinates
        if spare and np.any(a[:, -1] & np.uint8((1 << spare) - 1)):
            raise MalformedMessage(f"embedding message 'bits' has nonzero padding bits (the last "
                                   f"{spare} bits of every row must be 0).")
        bits = np.unpackbits(a, axis=1, count=spec.coordinates)
        return bits.reshape((rows,) + spec.shape).astype(spec.dtype)
    return _checked_floats(_wire_array(arrays, "embedding", "an embedding message"), spec,
                           rows, "embedding message 'embedding'")


def encode_gradient(gradient: Any, spec: EmbeddingSpec) -> dict[str, np.ndarray]:
    """The wire arrays of a cut gradient: ``{"gradient": <spec.dtype> (rows,) + shape}``."""
    return {"gradient": np.ascontiguousarray(np.asarray(gradient).astype(spec.dtype, copy=False))}


def decode_gradient(arrays: Mapping[str, Any], spec: EmbeddingSpec, rows: int) -> np.ndarray:
    """A received cut gradient, checked (`MalformedMessage`: keys, dtype, shape, non-finite)."""
    return _checked_floats(_wire_array(arrays, "gradient", "a gradient message"), spec, rows,
                           "gradient message")


def _checked_floats(a: np.ndarray, spec: EmbeddingSpec, rows: int, what: str) -> np.ndarray:
    """``a`` if it is ``spec.dtype`` of shape ``(rows,) + spec.shape`` and finite, else a
    `MalformedMessage` naming ``what`` (never a value)."""
    if a.dtype != np.dtype(spec.dtype) or a.shape != (rows,) + spec.shape:
        raise MalformedMessage(f"{what} must be {spec.dtype} of shape "
                               f"{(rows,) + spec.shape}; got {a.dtype} {a.shape}.")
    if not np.isfinite(a).all():
        raise MalformedMessage(f"{what} has non-finite values.")
    return a


_BATCH_KEY = re.compile(r"(0|[1-9][0-9]{0,8})/([A-Za-z_][A-Za-z0-9_]*)")


def pack_batches(messages: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The wire arrays of several batches in one message: batch ``i``'s ``key`` as ``"<i>/<key>"``.

    Args:
        messages: one mapping of named arrays per batch, in order.

    Returns:
        One flat mapping of named arrays.
    """
    return {f"{i}/{key}": a for i, message in enumerate(messages) for key, a in message.items()}


def unpack_batches(arrays: Mapping[str, Any], what: str, *, count: int | None = None,
                   max_count: int | None = None) -> list[dict[str, np.ndarray]]:
    """The batches of a `pack_batches` message, checked (each batch is decoded on its own after).

    Args:
        arrays: the received arrays.
        what: what the message is (for the error text).
        count: None, or the number of batches the message must hold.
        max_count: None, or the most batches it may hold.

    Returns:
        One dict of named numpy arrays per batch, in order.

    Raises:
        MalformedMessage: a key that is not ``"<i>/<name>"``, batches not
            numbered ``0 .. n - 1``, ``n`` other than ``count`` or above
            ``max_count``, or values that are not numpy arrays.
    """
    if not isinstance(arrays, Mapping):
        raise MalformedMessage(f"{what} must be a mapping of named arrays; got "
                               f"{type(arrays).__name__}.")
    groups: dict[int, dict[str, np.ndarray]] = {}
    for key, a in arrays.items():
        match = _BATCH_KEY.fullmatch(key) if isinstance(key, str) else None
        if match is None:
            raise MalformedMessage(f"{what}: every array key must be '<batch>/<name>'; got "
                                   f"{str(key)[:40]!r}.")
        if not isinstance(a, np.ndarray):
            raise MalformedMessage(f"{what}: array {key!r} must be a numpy array; got "
                                   f"{type(a).__name__}.")
        groups.setdefault(int(match.group(1)), {})[match.group(2)] = a
    n = len(groups)
    if max_count is not None and n > max_count:
        raise MalformedMessage(f"{what} holds {n} batches; at most {max_count} are allowed.")
    if sorted(groups) != list(range(n)):
        raise MalformedMessage(f"{what}: the batches must be numbered 0 .. {n - 1}.")
    if count is not None and n != count:
        raise MalformedMessage(f"{what} holds {n} batches; {count} were expected.")
    return [groups[i] for i in range(n)]


def request_numbers(request: Any) -> dict[str, int]:
    """The ``"config"`` record of a request: its epoch, step, message number and the number of
    the message its gradients answer (`REQUEST_NUMBERS`).

    Example:
        >>> import types
        >>> request_numbers(types.SimpleNamespace(epoch=0, step=4, message=3, answers=2))
        {'epoch': 0, 'step': 4, 'message': 3, 'answers': 2}
    """
    return {name: int(getattr(request, name)) for name in REQUEST_NUMBERS}


def read_request_numbers(config: Mapping[str, Any]) -> dict[str, int]:
    """A received ``"config"`` record's request numbers (0 where absent), as ints.

    Example:
        >>> read_request_numbers({"epoch": 1, "message": 2})
        {'epoch': 1, 'step': 0, 'message': 2, 'answers': 0}
    """
    return {name: int(config.get(name, 0)) for name in REQUEST_NUMBERS}


def embedding_reply_limit(example_ids: Sequence[Any] | None, spec: EmbeddingSpec) -> int:
    """The most bytes a follower's ``"embedding"`` record may hold for a request: a float64
    embedding of every row asked for, plus 4096 bytes of framing per batch.

    Args:
        example_ids: the request's example ids, one array per batch (None: no batch).
        spec: the follower's `EmbeddingSpec`.

    Example:
        >>> spec = EmbeddingSpec((4,), "float32", False)
        >>> embedding_reply_limit([[0, 1], [2]], spec)
        8288
    """
    batches = list(example_ids or [])
    rows = sum(len(i) for i in batches)
    return 8 * max(rows, 1) * spec.coordinates + 4096 * max(len(batches), 1)


def read_embedding_reply(content: Mapping[str, Any], example_ids: Sequence[Any] | None,
                         spec: EmbeddingSpec,
                         read_arrays: Callable[[Any, str, int], dict[str, np.ndarray]]
                         ) -> dict[str, np.ndarray] | str:
    """A follower's reply: its embedding arrays, read within their byte limit, or why not.

    Args:
        content: the reply's records (record name -> record).
        example_ids: the ids the request asked for, one array per batch.
        spec: the follower's `EmbeddingSpec`.
        read_arrays: ``read_arrays(record, name, max_bytes)``: the transport's
            reader of a record, which refuses one of more than ``max_bytes``
            bytes with a `MalformedMessage` before deserializing it (Flower's:
            `keras_fedpriv.federated.records.checked_arrays`).

    Returns:
        The record's named arrays (each batch is decoded on its own after:
        `unpack_batches`, `decode_embedding`), or the reason (a string) the
        reply cannot be used; never the reply's data.

    Example:
        >>> spec = EmbeddingSpec((2,), "float32", False)
        >>> read_embedding_reply({}, [[0]], spec, None)
        "the reply has no 'embedding' record"
    """
    if EMBEDDING not in content:
        return f"the reply has no {EMBEDDING!r} record"
    try:
        return read_arrays(content[EMBEDDING], EMBEDDING, embedding_reply_limit(example_ids, spec))
    except MalformedMessage as error:
        return f"malformed reply: {error}"
    except Exception as error:  # an array that does not decode
        return f"the reply's arrays do not decode ({type(error).__name__})"
