"""The two halves of vertical FL: what a follower runs and what the leader runs.

Neither half knows how messages travel. `VerticalModel` runs the same pieces
inside one Keras ``train_step``; `keras_fedpriv.federated.vertical_driver`
drives the standalone halves in one process, and
`keras_fedpriv.federated.flower_vertical` drives them as Flower apps.

* `PartyBottom`: one party's bottom model and, for a follower, its
  protection (an `EmbeddingDPLayer`, any Keras layer, or none; a `VAEBottom`
  is a bottom whose own sampling protects). Its ``forward`` and
  ``gradients`` are the graph pieces every runtime uses.
* `VerticalFollower` (a `PartyBottom` with its own optimizer): ``embed``
  returns the wire message of a batch (`encode_embedding`: packed bits for
  an `EmbeddingDPLayer`, the float embedding otherwise) and records the
  release; ``apply_gradients`` takes the cut gradient the leader sent back
  and updates the bottom.
* `VerticalLeader`: the labels (with `LabelDPLayer` applied once per
  example), its own bottom if any, the top model, the loss and its
  optimizer. ``step`` takes the embeddings received and returns the cut
  gradient of every follower.

`split_parties` (or `VerticalModel.split_parties`) hands out the halves of a
built `VerticalModel`, sharing its layers: build one model with the same
seeds everywhere, give each party its half.

**How a follower computes its gradients.** The leader's answer comes after
the follower's forward pass, possibly in another process (Flower's
Deployment Engine starts a process per message). So ``embed`` keeps the
batch and the state of its layers from before the pass (random counters,
release counts, seed generators; see `keras_fedpriv.layers.local_state`),
and ``apply_gradients`` runs the forward pass again from that state, under a
tape: the same counters give the same noise, so the recomputed message is the
one that was sent (checked: bit for bit for packed bits, else to float
rounding), and the gradient is the one ``VerticalModel`` computes. The state
after the first pass is then restored: the second pass is neither a new
draw nor a new release.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
import math
import re
from typing import Any, Callable, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf
from keras import tree
# No public equivalents (Keras 3.15): symbolic tracing of a party's forward pass without
# building a model, and the loss container Keras' compile() builds.
from keras.src import backend as keras_backend
from keras.src.trainers.compile_utils import CompileLoss

from keras_fedpriv.federated.messages import EXAMPLE_IDS_KEY
from keras_fedpriv.layers import label_formats
from keras_fedpriv.layers.embedding_dp import EmbeddingDPLayer
from keras_fedpriv.layers.input_checks import InputErrorFlagMixin
from keras_fedpriv.layers.label_dp import LabelDPLayer
from keras_fedpriv.layers.local_state import load_local_state, local_state
from keras_fedpriv.layers.secret_rng import SecretRandomMixin, _LocalVariable
from keras_fedpriv.mechanisms.ledger import (
    EXAMPLE,
    ReleaseKind,
    ReleaseLedger,
    is_protection,
    non_private_event,
)

__all__ = ["EmbeddingSpec", "MalformedMessage", "PartyBottom", "VerticalFollower",
           "VerticalLeader", "VerticalParties", "decode_embedding", "decode_gradient",
           "derive_party_seed", "encode_embedding", "encode_gradient", "split_parties"]

logger = logging.getLogger("keras_fedpriv.vertical")

PARTY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class MalformedMessage(ValueError):
    """A received vertical-FL message that is not what the protocol promises (never used)."""


def derive_party_seed(seed: int, party: str, bits: int = 64) -> int:
    """The seed of ``party``'s copy of a seeded protection layer.

    ``int.from_bytes(sha256(f"keras_fedpriv/party-seed/{seed}/{party}")[:8])``,
    reduced to ``bits`` bits: deterministic, distinct per party, and no party's
    seed reveals another's without the original seed.

    Args:
        seed: the seed of the layer given to `VerticalModel`.
        party: the party's name.
        bits: the width of the result (64 for keras_fedpriv layers, 31 for
            Keras' own).

    Returns:
        A non-negative int below ``2 ** bits``.
    """
    digest = hashlib.sha256(f"keras_fedpriv/party-seed/{int(seed)}/{party}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2 ** bits)


def validate_party_name(party: Any, owner: str, what: str = "party names") -> str:
    """``party`` if it is an identifier and not the reserved ids key, else a ValueError."""
    if not isinstance(party, str) or not PARTY_NAME.match(party):
        raise ValueError(f"{owner}: {what} must be identifiers (a letter, then letters, digits "
                         f"or '_'); got {party!r}.")
    if party == EXAMPLE_IDS_KEY:
        raise ValueError(f"{owner}: {EXAMPLE_IDS_KEY!r} is a reserved input key, not a valid "
                         "party name.")
    return party


def copy_protection(layer: keras.layers.Layer, party: str, owner: str) -> keras.layers.Layer:
    """``party``'s own copy of a protection layer, from its config (a seed becomes the party's)."""
    config = dict(layer.get_config())
    config["name"] = f"{layer.name}_{party}"
    seed = config.get("seed")
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        bits = 64 if isinstance(layer, SecretRandomMixin) else 31
        config["seed"] = derive_party_seed(seed, party, bits=bits)
    try:
        return type(layer).from_config(config)
    except Exception as error:  # pragma: no cover - exotic layers
        raise TypeError(f"{owner}: could not copy the `embedding_dp` layer {layer.name!r} for "
                        f"party {party!r} from its config ({error}); pass a dict party -> layer "
                        "instead.") from error


def is_bit_protection(layer: Any) -> bool:
    """Whether a protection's output is sent as packed bits (an `EmbeddingDPLayer`)."""
    return isinstance(layer, EmbeddingDPLayer)


def takes_example_ids(layer: Any) -> bool:
    """Whether a layer's ``call`` accepts ``example_ids``."""
    try:
        return "example_ids" in inspect.signature(layer.call).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic layers
        return False


def _spec_of(t):
    return keras.KerasTensor(tuple(t.shape), dtype=t.dtype)


def batch_signature(spec: Any) -> Any:
    """The `tf.TensorSpec` (batch dimension None) of each KerasTensor of a structure."""
    return tree.map_structure(
        lambda t: tf.TensorSpec((None,) + tuple(t.shape[1:]),
                                keras.backend.standardize_dtype(t.dtype)), spec)


def bottom_input_spec(party: str, bottom: keras.layers.Layer, owner: str) -> Any:
    """Symbolic inputs (KerasTensors, possibly nested) of a built bottom model."""
    struct = getattr(bottom, "_inputs_struct", None)
    if struct is not None:
        return tree.map_structure(_spec_of, struct)
    try:
        inputs = bottom.inputs
    except (AttributeError, ValueError):
        inputs = None
    if inputs:
        return _spec_of(inputs[0]) if len(inputs) == 1 else [_spec_of(t) for t in inputs]
    shapes = getattr(bottom, "_build_shapes_dict", None) or {}
    if bottom.built and len(shapes) == 1:
        shape = next(iter(shapes.values()))
        if shape is not None and not isinstance(shape, dict):
            return keras.KerasTensor(tuple(shape), dtype=bottom.input_dtype)
    raise ValueError(f"{owner}: the bottom model of party {party!r} has no known input "
                     "shape. Give it one: a functional model (keras.Input), a Sequential "
                     "starting with keras.Input, or call bottom.build(input_shape) first.")


_LABEL_ASSERT = re.compile(r"assertion failed: \[(LabelDPLayer\(mode=.*?); first bad row:\] "
                           r"\[(\d+)\]")


def label_assert_message(error: BaseException) -> str | None:
    """The short text of a `LabelDPLayer` label check that failed in a traced step, or None.

    The graph error carries the whole TensorFlow stack trace; the rule and the
    first bad row of the batch are all the user needs.
    """
    match = _LABEL_ASSERT.search(str(getattr(error, "message", error)).replace("\\'", "'"))
    if match is None:
        return None
    return (f"{match.group(1)}; row {match.group(2)} of a training batch breaks the rule "
            "(the labels come from the dataset, so they were checked inside the training step).")


def rows_of(t: Any) -> tf.Tensor:
    """The batch size of a tensor, as a scalar tensor."""
    return tf.shape(t)[0]


def sum_losses(losses: Sequence[Any]) -> tf.Tensor | None:
    """A party's own losses (``add_loss``, regularizers) as one scalar, as Keras adds them.

    Each loss is cast to ``floatx`` if it is not floating and summed, then all are
    added; None when there is none.
    """
    if not losses:
        return None
    out = []
    for loss in losses:
        if not keras.backend.is_float_dtype(loss.dtype):
            loss = keras.ops.cast(loss, keras.backend.floatx())
        out.append(keras.ops.sum(loss))
    return tf.add_n(out)


def leader_loss(compiled: Callable[..., Any] | None, y: Any, y_pred: Any, sample_weight: Any,
                extra_losses: Sequence[Any]) -> tf.Tensor:
    """The leader's loss: the compiled loss plus the top's own losses (`sum_losses` rule)."""
    losses = []
    if compiled is not None:
        loss = compiled(y, y_pred, sample_weight)
        if loss is not None:
            losses.append(loss)
    for loss in extra_losses:
        losses.append(sum_losses([loss]))
    if not losses:
        raise ValueError("No loss to compute. Provide a `loss` argument in `compile()`.")
    return losses[0] if len(losses) == 1 else tf.add_n(losses)


def validate_class_weight(class_weight: Any, owner: str) -> dict[int, float]:
    """``class_weight`` as a dict class index -> float weight, or a clear error."""
    if not isinstance(class_weight, dict) or not class_weight:
        raise TypeError(f"{owner}: `class_weight` must be a non-empty dict class "
                        f"index -> weight; got {type(class_weight).__name__}.")
    out = {}
    for c, w in class_weight.items():
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0:
            raise ValueError(f"{owner}: `class_weight` keys must be class indices "
                             f"(integers >= 0); got {c!r}.")
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) \
                or not math.isfinite(float(w)) or w < 0:
            raise ValueError(f"{owner}: `class_weight[{int(c)}]` must be a finite "
                             f"real >= 0; got {w!r}.")
        out[int(c)] = float(w)
    return out


# --------------------------------------------------------------------------- the wire

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
    a = _wire_array(arrays, "embedding", "an embedding message")
    if a.dtype != np.dtype(spec.dtype) or a.shape != (rows,) + spec.shape:
        raise MalformedMessage(f"embedding message 'embedding' must be {spec.dtype} of shape "
                               f"{(rows,) + spec.shape}; got {a.dtype} {a.shape}.")
    if not np.isfinite(a).all():
        raise MalformedMessage("embedding message 'embedding' has non-finite values.")
    return a


def encode_gradient(gradient: Any, spec: EmbeddingSpec) -> dict[str, np.ndarray]:
    """The wire arrays of a cut gradient: ``{"gradient": <spec.dtype> (rows,) + shape}``."""
    return {"gradient": np.ascontiguousarray(np.asarray(gradient).astype(spec.dtype, copy=False))}


def decode_gradient(arrays: Mapping[str, Any], spec: EmbeddingSpec, rows: int) -> np.ndarray:
    """A received cut gradient, checked (`MalformedMessage`: keys, dtype, shape, non-finite)."""
    a = _wire_array(arrays, "gradient", "a gradient message")
    if a.dtype != np.dtype(spec.dtype) or a.shape != (rows,) + spec.shape:
        raise MalformedMessage(f"gradient message must be {spec.dtype} of shape "
                               f"{(rows,) + spec.shape}; got {a.dtype} {a.shape}.")
    if not np.isfinite(a).all():
        raise MalformedMessage("gradient message has non-finite values.")
    return a


# ----------------------------------------------------------------------- the halves

class _Counter:
    """One slot of an int64 counter variable: what a party sent without a DP mechanism.

    A `VerticalModel` holds one variable with a slot per follower and one for
    the leader; the halves it hands out count into their own slots.
    """

    def __init__(self, variable: tf.Variable | None = None, slot: int = 0) -> None:
        if variable is None:
            variable = _LocalVariable(np.zeros(1, np.int64), trainable=False,
                                      name="unprotected_releases")
            slot = 0
        self.variable = variable
        self.slot = int(slot)

    def count(self, rows: Any) -> Any:
        size = int(self.variable.shape[0])
        update = tf.one_hot(self.slot, size, dtype=tf.int64)
        return self.variable.assign_add(update * tf.cast(rows > 0, tf.int64))

    def value(self) -> int:
        return int(self.variable.numpy()[self.slot])


def follower_unprotected_ledger(party: str, protection: Any, count: int) -> ReleaseLedger:
    """The record of a follower's embeddings sent without a DP mechanism."""
    ledger = ReleaseLedger()
    if count:
        what = ("no protection" if protection is None else
                f"its protection {type(protection).__name__} has no DP accounting")
        ledger.record(ReleaseKind(f"VerticalModel follower {party!r}", "features", EXAMPLE,
                                  non_private_event(),
                                  f"its embedding is sent without a DP mechanism ({what})"),
                      units=None, count=int(count))
    return ledger


def leader_unprotected_ledger(count: int) -> ReleaseLedger:
    """The record of training steps whose cut gradients come from the true labels."""
    ledger = ReleaseLedger()
    if count:
        ledger.record(ReleaseKind("VerticalModel leader", "labels", EXAMPLE, non_private_event(),
                                  "no label_dp: the gradients sent to the followers are "
                                  "computed from the true labels"),
                      units=None, count=int(count))
    return ledger


def _optimizer_copy(optimizer):
    return keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))


def _make_optimizer(optimizer, owner):
    if optimizer is None:
        raise ValueError(f"{owner}: `optimizer` is required (a Keras optimizer or its name).")
    try:
        return keras.optimizers.get(optimizer)
    except (ValueError, TypeError) as error:
        raise TypeError(f"{owner}: `optimizer` must be a Keras optimizer or its name; got "
                        f"{optimizer!r} ({error}).") from None


class PartyBottom:
    """One party's bottom model and, for a follower, its protection: the graph pieces.

    Args:
        name: the party's name (an identifier).
        bottom: the party's built Keras model (or layer) over its features.
        protection: a follower's protection layer, or None.
        sends: True for a follower (its embedding leaves it: sent without a
            protection that keeps a ledger, it is recorded as a release
            without DP); False for the leader's own bottom.
        counter: where unprotected releases are counted (internal).
        owner: the name used in error messages.
    """

    def __init__(self, name: str, bottom: keras.layers.Layer,
                 protection: keras.layers.Layer | None = None, sends: bool = True,
                 counter: _Counter | None = None, owner: str | None = None) -> None:
        owner = owner or type(self).__name__
        self._owner = owner
        self.name = validate_party_name(name, owner, "party names")
        if not isinstance(bottom, keras.layers.Layer):
            raise TypeError(f"{owner}: `bottoms[{name!r}]` must be a Keras model or layer; got "
                            f"{type(bottom).__name__}.")
        if protection is not None and not isinstance(protection, keras.layers.Layer):
            raise TypeError(f"{owner}: `embedding_dp[{name!r}]` must be a Keras layer or None; "
                            f"got {type(protection).__name__}.")
        if protection is not None and not sends:
            raise ValueError(f"{owner}: `embedding_dp[{name!r}]`: {name!r} is the leader, whose "
                             "embedding never leaves it; only followers are protected.")
        self.bottom = bottom
        self.protection = protection
        self.sends = bool(sends)
        self._counter = counter if counter is not None else (_Counter() if sends else None)
        if not bottom.built:
            raise ValueError(f"{owner}: the bottom model of party {name!r} is not built. "
                             "Give it an input (keras.Input / functional model / Sequential "
                             "starting with keras.Input) or call bottom.build(shape) first.")
        self.input_spec = bottom_input_spec(name, bottom, owner)

    def _build_spec(self):
        """Trace the forward pass symbolically: the embedding's KerasTensor, checked."""
        spec = keras_backend.compute_output_spec(
            lambda f: self.forward(f, training=False, count=False)[1], self.input_spec)
        return self._check_spec(spec)

    def _check_spec(self, spec):
        p, owner = self.name, self._owner
        if not isinstance(spec, keras.KerasTensor) or len(spec.shape) < 2:
            raise ValueError(f"{owner}: party {p!r} must produce one embedding tensor "
                             f"of rank >= 2 (batch, ...); got {spec!r}.")
        if not keras.backend.is_float_dtype(spec.dtype):
            raise ValueError(f"{owner}: party {p!r} produces a {spec.dtype} embedding; "
                             "embeddings must be floating point (gradients flow back).")
        if any(d is None for d in spec.shape[1:]):
            raise ValueError(f"{owner}: party {p!r} embedding shape {spec.shape} must "
                             "be fully known apart from the batch dimension.")
        self.embedding_tensor = spec
        self.spec = EmbeddingSpec(tuple(int(d) for d in spec.shape[1:]),
                                  keras.backend.standardize_dtype(spec.dtype),
                                  self.sends and is_bit_protection(self.protection))
        return spec

    @property
    def layers(self) -> list[keras.layers.Layer]:
        """The party's layers: its bottom and its protection (if any)."""
        return [self.bottom] + ([self.protection] if self.protection is not None else [])

    @property
    def trainable_variables(self) -> list[Any]:
        """The party's trainable variables (bottom, then protection)."""
        return [v for layer in self.layers for v in layer.trainable_variables]

    def forward(self, features: Any, example_ids: Any = None, training: bool = False,
                count: bool = True) -> tuple[Any, Any, list[Any]]:
        """The party's forward pass: ``(raw embedding, what it sends, its own losses)``.

        A follower's message is a release: its protection records it (with
        ``example_ids`` when it takes them); without a protection that keeps
        a ledger, the party's counter records it as a release without DP.

        Args:
            features: the party's features (a tensor or the bottom's input
                structure).
            example_ids: None or int tensor (batch,).
            training: the bottom's and protection's training flag.
            count: False when the pass is a replay of one already counted.

        Returns:
            ``(z, sent, losses)``: the bottom's output, the protected message
            (``z`` without protection; the leader's own embedding is never
            protected) and the ``add_loss`` / regularizer losses of the
            party's layers.
        """
        z = self.bottom(features, training=training)
        losses = list(self.bottom.losses)
        protection = self.protection
        if self.sends and count and not is_protection(protection):
            self._counter.count(rows_of(z))
        if protection is None:
            return z, z, losses
        if example_ids is not None and tf.as_dtype(example_ids.dtype).is_integer and \
                takes_example_ids(protection):
            sent = protection(z, training=training, example_ids=example_ids)
        else:
            sent = protection(z, training=training)
        return z, sent, losses + list(protection.losses)

    def gradients(self, tape: tf.GradientTape, sent: Any, cut: Any,
                  local_scaled: Any = None) -> list[Any]:
        """The party's gradients from the cut gradient alone (plus its own losses).

        ``tape.gradient(sent, variables, output_gradients=cut)``, plus the
        gradient of the party's own (scaled) losses.

        Returns:
            One gradient (or None) per `trainable_variables` entry.
        """
        variables = self.trainable_variables
        if not variables:
            return []
        targets, out_grads = [sent], [cut]
        if local_scaled is not None:
            targets.append(local_scaled)
            out_grads.append(tf.ones_like(local_scaled))
        return list(tape.gradient(targets, variables, output_gradients=out_grads))

    def unprotected_count(self) -> int:
        """How many calls sent this party's embedding without a DP mechanism."""
        return 0 if self._counter is None else self._counter.value()

    def check_input_errors(self) -> None:
        """Raise if the protection met invalid inputs in a compiled (XLA) call."""
        if isinstance(self.protection, InputErrorFlagMixin):
            self.protection.check_input_errors()


@dataclasses.dataclass
class _Pending:
    """A follower's batch awaiting its cut gradient."""

    features: Any
    example_ids: np.ndarray | None
    sent: np.ndarray
    state_before: dict[str, np.ndarray]


def _as_numpy_features(spec, x, owner, party):
    def convert(s, a):
        return np.asarray(a, dtype=keras.backend.standardize_dtype(s.dtype))

    try:
        return tree.map_structure(convert, spec, x)
    except (ValueError, TypeError) as error:
        raise TypeError(f"{owner}: the features of party {party!r} do not match its bottom "
                        f"model's inputs ({type(error).__name__}).") from None


def _num_rows(x):
    sizes = {int(np.shape(a)[0]) for a in tree.flatten(x)}
    return sizes.pop() if len(sizes) == 1 else None


def _as_ids(example_ids, rows, owner):
    if example_ids is None:
        return None
    ids = np.asarray(example_ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{owner}: `example_ids` must be integers; got dtype {ids.dtype}.")
    ids = ids.reshape(-1).astype(np.int64)
    if ids.size != rows:
        raise ValueError(f"{owner}: `example_ids` has {ids.size} entries for {rows} rows of "
                         "features; give one id per row.")
    return ids


class VerticalFollower(PartyBottom):
    """A follower: its bottom model, its protection and its own optimizer.

    ``embed`` computes and encodes what the follower sends for a batch and
    records the release (in the protection's ledger, or as a release without
    DP); ``apply_gradients`` takes the cut gradient the leader sent back and
    updates the bottom (see the module docstring for how the gradient is
    computed after the round trip).

    Args:
        name: the follower's party name (an identifier).
        bottom: its built Keras model (or layer) over its features.
        protection: its protection layer (`EmbeddingDPLayer`: packed bits on
            the wire; any other Keras layer: floats), or None.
        optimizer: its optimizer (a Keras optimizer or its name).

    Example:
        >>> parties = model.split_parties()          # a compiled VerticalModel
        >>> follower = parties.followers["party_a"]
        >>> message = follower.embed(xa[:32], example_ids=ids[:32])   # {"bits": uint8}
        >>> follower.apply_gradients(gradient_from_leader)
    """

    def __init__(self, name: str, bottom: keras.layers.Layer,
                 protection: keras.layers.Layer | None = None,
                 optimizer: str | keras.optimizers.Optimizer | None = "adam", *,
                 _counter: _Counter | None = None, _owner: str | None = None) -> None:
        super().__init__(name, bottom, protection, sends=True, counter=_counter,
                         owner=_owner or "VerticalFollower")
        self._build_spec()
        self.optimizer = _make_optimizer(optimizer, self._owner)
        if self.trainable_variables:
            self.optimizer.build(self.trainable_variables)
        self._pending: _Pending | None = None
        self._fns: dict[Any, Any] = {}

    # -- traced pieces (one trace each: batch dimension None) --------------------------------
    def _function(self, kind, has_ids):
        """The traced ``"train"`` / ``"infer"`` forward pass or the ``"replay"``."""
        key = (kind, has_ids)
        if key in self._fns:
            return self._fns[key]
        signature = [batch_signature(self.input_spec)]
        if has_ids:
            signature.append(tf.TensorSpec((None,), tf.int64))
        if kind == "replay":
            signature.append(tf.TensorSpec((None,) + self.spec.shape, self.spec.dtype))

            def fn(features, *rest):
                ids = rest[0] if has_ids else None
                return self._traced_replay(features, ids, rest[-1])
        else:
            training = kind == "train"

            def fn(features, *rest):
                ids = rest[0] if has_ids else None
                return self.forward(features, ids, training=training)[1]

        self._fns[key] = tf.function(fn, input_signature=signature)
        return self._fns[key]

    def _traced_replay(self, features, example_ids, cut):
        scale = self.optimizer.scale_loss
        with tf.GradientTape() as tape:
            _, sent, losses = self.forward(features, example_ids, training=True, count=False)
            local = sum_losses(losses)
            local_scaled = None if local is None else scale(local)
        grads = self.gradients(tape, sent, tf.cast(cut, sent.dtype), local_scaled)
        grads = [tf.zeros_like(v) if g is None else g
                 for g, v in zip(grads, self.trainable_variables)]
        return sent, grads, (tf.zeros((), tf.float32) if local is None
                             else tf.cast(local, tf.float32))

    def _apply(self, grads):
        if "apply" not in self._fns:
            variables = self.trainable_variables

            def apply(gradients):
                self.optimizer.apply(gradients, variables)

            self._fns["apply"] = tf.function(
                apply, input_signature=[[tf.TensorSpec(v.shape, v.dtype) for v in variables]])
        self._fns["apply"](grads)

    # -- the protocol ----------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether a training batch awaits its cut gradient."""
        return self._pending is not None

    @property
    def wire_format(self) -> dict[str, Any]:
        """How this follower's messages are encoded and their size per example."""
        s = self.spec
        return {"up": "1-bit packed" if s.bits else s.dtype,
                "up_bytes_per_example": s.bytes_up_per_example,
                "down": s.dtype, "down_bytes_per_example": s.bytes_down_per_example}

    def embed(self, x: Any, example_ids: Any = None, training: bool = True
              ) -> dict[str, np.ndarray]:
        """What the follower sends for a batch: its protected embedding, encoded.

        The call is a release, recorded by the protection (per example id
        when ``example_ids`` are given). With ``training=True`` the batch is
        kept for `apply_gradients`; a batch still waiting is dropped (the
        leader skipped it: its release stays recorded).

        Args:
            x: the follower's features of the batch (rows in the order of
                ``example_ids``).
            example_ids: None or integer ids, one per row.
            training: True for a training step (the leader answers with a
                gradient), False for inference.

        Returns:
            The wire arrays (`encode_embedding`): ``{"bits": uint8}`` with an
            `EmbeddingDPLayer`, else ``{"embedding": float}``.
        """
        if not isinstance(training, bool):
            raise TypeError(f"{self._owner}.embed: `training` must be a bool; got {training!r}.")
        x = _as_numpy_features(self.input_spec, x, self._owner, self.name)
        rows = _num_rows(x)
        if rows is None:
            raise ValueError(f"{self._owner}.embed: the feature arrays of party {self.name!r} "
                             "have different numbers of rows.")
        ids = _as_ids(example_ids, rows, f"{self._owner}.embed")
        if self._pending is not None:
            logger.debug("follower %r: a batch awaiting its gradient was dropped", self.name)
            self._pending = None
        before = local_state(self.layers) if training else None
        fn = self._function("train" if training else "infer", ids is not None)
        sent = fn(x, ids) if ids is not None else fn(x)
        self.check_input_errors()
        sent = np.asarray(sent)
        message = encode_embedding(sent, self.spec)
        if training:
            self._pending = _Pending(x, ids, sent, before)
        return message

    def discard(self) -> None:
        """Forget the batch awaiting its gradient (its release stays recorded)."""
        self._pending = None

    def receive_gradient(self, arrays: Mapping[str, Any]) -> np.ndarray:
        """A received gradient message, checked against the batch awaiting it.

        Raises:
            MalformedMessage: no batch awaits a gradient, or the arrays are not
                a finite gradient of the embedding's dtype and shape.
        """
        if self._pending is None:
            raise MalformedMessage(f"follower {self.name!r} received a gradient but no batch "
                                   "awaits one.")
        return decode_gradient(arrays, self.spec, int(self._pending.sent.shape[0]))

    def apply_gradients(self, cut_gradient: Any) -> dict[str, float]:
        """Update the bottom (and protection) from the cut gradient of the batch sent last.

        Args:
            cut_gradient: ``d loss / d embedding`` for the batch of the last
                ``embed(training=True)``: an array of the embedding's shape
                and dtype (or the wire arrays ``{"gradient": ...}``).

        Returns:
            ``{"local_loss": ...}``: the party's own losses (e.g. a VAE
            bottom's KL term) on the batch; they stay with the follower.

        Raises:
            MalformedMessage: no batch awaits a gradient, or the gradient has
                the wrong shape or dtype, or non-finite values.
            RuntimeError: the recomputed message differs from the one sent
                (the bottom or protection draws randomness outside the state
                the follower keeps); nothing is updated.
        """
        if not isinstance(cut_gradient, Mapping):
            cut_gradient = {"gradient": np.asarray(cut_gradient)}
        gradient = self.receive_gradient(cut_gradient)
        pending, self._pending = self._pending, None
        after = local_state(self.layers)
        load_local_state(self.layers, pending.state_before)
        try:
            fn = self._function("replay", pending.example_ids is not None)
            args = [pending.features] + ([pending.example_ids]
                                         if pending.example_ids is not None else [])
            sent, grads, local = fn(*args, gradient)
        finally:
            load_local_state(self.layers, after)
        sent = np.asarray(sent)
        same = (np.array_equal(sent, pending.sent) if self.spec.bits else
                np.allclose(sent, pending.sent, rtol=1e-5, atol=1e-6))
        if not same:
            raise RuntimeError(f"follower {self.name!r}: the embedding recomputed for the gradient "
                               "differs from the one sent; a layer draws randomness outside the "
                               "party's state (use the package's protection layers or Keras "
                               "layers with seed generators). Nothing was updated.")
        if self.trainable_variables:
            self._apply(grads)
        return {"local_loss": float(local)}

    # -- state across processes --------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything the follower needs to go on in another process (its own secrets included).

        The trainable weights, the optimizer's variables, the layers' local
        state (`keras_fedpriv.layers.local_state`: random counters and keys,
        release counts) and the batch awaiting its gradient. Keep it where the
        party keeps its data (e.g. Flower's node state on its SuperNode).
        """
        out = {f"weights/{i}": np.array(v.numpy())
               for i, v in enumerate(self.trainable_variables)}
        out.update({f"optimizer/{i}": np.array(v.numpy())
                    for i, v in enumerate(self.optimizer.variables)})
        out.update({f"local/{k}": v for k, v in local_state(self.layers).items()})
        if self._counter is not None:
            out["unprotected"] = np.array([self._counter.value()], np.int64)
        p = self._pending
        if p is not None:
            flat = tree.flatten(p.features)
            out.update({f"pending/x/{i}": np.asarray(a) for i, a in enumerate(flat)})
            out["pending/sent"] = np.asarray(p.sent)
            if p.example_ids is not None:
                out["pending/ids"] = p.example_ids
            out.update({f"pending/before/{k}": v for k, v in p.state_before.items()})
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` (taken from this follower or a copy built the same way)."""
        try:
            for i, v in enumerate(self.trainable_variables):
                v.assign(np.reshape(state[f"weights/{i}"], v.shape))
            for i, v in enumerate(self.optimizer.variables):
                v.assign(np.reshape(state[f"optimizer/{i}"], v.shape))
        except KeyError as error:
            raise ValueError(f"{self._owner}.load_state_dict: the state lacks {error}; it was "
                             "taken from a follower of another structure.") from None
        load_local_state(self.layers, {k[len("local/"):]: v for k, v in state.items()
                                       if k.startswith("local/")})
        if self._counter is not None and "unprotected" in state:
            var = self._counter.variable
            value = var.numpy().copy()
            value[self._counter.slot] = int(np.asarray(state["unprotected"]).reshape(-1)[0])
            var.assign(value)
        self._pending = None
        if "pending/sent" in state:
            n = len(tree.flatten(self.input_spec))
            flat = [np.asarray(state[f"pending/x/{i}"]) for i in range(n)]
            before = {k[len("pending/before/"):]: v for k, v in state.items()
                      if k.startswith("pending/before/")}
            ids = state.get("pending/ids")
            self._pending = _Pending(tree.pack_sequence_as(self.input_spec, flat),
                                     None if ids is None else np.asarray(ids, np.int64),
                                     np.asarray(state["pending/sent"]), before)

    # -- privacy ---------------------------------------------------------------------------
    def privacy_ledger(self) -> ReleaseLedger:
        """What this follower sent without a DP mechanism (its protection keeps the rest)."""
        return follower_unprotected_ledger(self.name, self.protection, self.unprotected_count())

    def privacy_protections(self) -> list[Any]:
        """The follower's layers (its protection's ledger is found through them)."""
        return self.layers


class VerticalLeader:
    """The leader: labels (with label DP), its own bottom if any, the top, the loss.

    ``step`` is one training step of the protocol from the leader's side: it
    randomizes the batch's labels (``label_dp``, once per example id), runs
    the top on the embeddings received (and its own), computes the loss, the
    cut gradient of every follower and the gradients of its own variables,
    and applies the latter with its optimizer.

    Args:
        top: the top Keras model (or layer) over the embeddings; the same input
            rule as `VerticalModel` (a dict keyed by party name if the top has
            several or dict inputs, else the concatenation in sorted party
            order).
        followers: follower name -> its `EmbeddingSpec` (what it sends; a
            follower's ``spec``).
        bottom: the leader's own bottom model, or None.
        name: the leader's party name (required with ``bottom``).
        label_dp: None or a `LabelDPLayer`, applied to the labels of every
            training step (keyed by example id unless ``per_batch``).
        labels_privatized: True if the labels given to ``step`` were already
            randomized; else, without ``label_dp``, every step is recorded as
            a release of the true labels without DP.
        loss: the loss (anything `keras.Model.compile` accepts for one output).
        optimizer: the leader's optimizer (for the top and its own bottom).
        metrics: metrics (names or `keras.metrics.Metric` objects) that
            `evaluate` reports besides the loss.
        class_weight: None or a dict class -> weight, applied to the
            randomized labels (see `VerticalModel.fit`).
        label_free_sample_weight: True to allow ``sample_weight`` with
            ``label_dp`` (you confirm the weights do not depend on the labels).

    Example:
        >>> leader = model.split_parties().leader
        >>> received = {"party_a": leader.receive("party_a", message, rows=32)}
        >>> cut, logs = leader.step(received, y[:32], example_ids=ids[:32], x=xb[:32])
    """

    def __init__(self, top: keras.layers.Layer, followers: Mapping[str, EmbeddingSpec], *,
                 bottom: keras.layers.Layer | None = None, name: str | None = None,
                 label_dp: LabelDPLayer | None = None, labels_privatized: bool = False,
                 loss: Any = None, optimizer: Any = "adam", metrics: Sequence[Any] | None = None,
                 class_weight: Mapping[int, float] | None = None,
                 label_free_sample_weight: bool = False,
                 _counter: _Counter | None = None, _owner: str | None = None,
                 _own_bottom: PartyBottom | None = None, _standalone: bool = True) -> None:
        owner = _owner or "VerticalLeader"
        self._owner = owner
        if not isinstance(top, keras.layers.Layer):
            raise TypeError(f"{owner}: `top` must be a Keras model or layer; got "
                            f"{type(top).__name__}.")
        if not isinstance(followers, Mapping) or not followers:
            raise TypeError(f"{owner}: `followers` must be a non-empty dict follower name -> "
                            f"EmbeddingSpec; got {type(followers).__name__}.")
        for p, spec in followers.items():
            validate_party_name(p, owner, "follower names")
            if not isinstance(spec, EmbeddingSpec):
                raise TypeError(f"{owner}: `followers[{p!r}]` must be an EmbeddingSpec (a "
                                f"follower's `.spec`); got {type(spec).__name__}.")
        if not isinstance(labels_privatized, bool):
            raise TypeError(f"{owner}: `labels_privatized` must be a bool; got "
                            f"{labels_privatized!r}.")
        if labels_privatized and label_dp is not None:
            raise ValueError(f"{owner}: `labels_privatized=True` says the labels given to "
                             "fit were randomized before training; with `label_dp` the model "
                             "randomizes them itself. Pass one or the other.")
        if label_dp is not None and not isinstance(label_dp, LabelDPLayer):
            raise TypeError(f"{owner}: `label_dp` must be None or a "
                            f"keras_fedpriv.LabelDPLayer; got {type(label_dp).__name__}.")
        if not isinstance(label_free_sample_weight, bool):
            raise TypeError(f"{owner}: `label_free_sample_weight` must be a bool; got "
                            f"{label_free_sample_weight!r}.")
        self.top = top
        self.label_dp = label_dp
        self.labels_privatized = labels_privatized
        self.label_free_sample_weight = label_free_sample_weight
        self.class_weight = (None if class_weight is None
                             else validate_class_weight(dict(class_weight), owner))
        self.follower_specs = {p: followers[p] for p in sorted(followers)}
        self._counter = _counter if _counter is not None else _Counter()
        if _own_bottom is not None:
            self.own = _own_bottom
        elif bottom is not None:
            if name is None:
                raise ValueError(f"{owner}: `name` (the leader's party name) is required with "
                                 "`bottom`.")
            self.own = PartyBottom(name, bottom, None, sends=False, owner=owner)
            self.own._build_spec()
        else:
            self.own = None
        self.name = self.own.name if self.own is not None else name
        if self.name is not None:
            validate_party_name(self.name, owner, "the leader's name")
            if self.name in self.follower_specs:
                raise ValueError(f"{owner}: the leader {self.name!r} is also among the "
                                 "followers.")
        self.parties = tuple(sorted(list(self.follower_specs) +
                                    ([self.own.name] if self.own is not None else [])))
        self._resolve_top()
        if self.label_dp is not None:
            self.check_label_classes(self.declared_label_classes(), "label_dp")
        self._standalone = _standalone
        if _standalone:
            self.optimizer = _make_optimizer(optimizer, owner)
            if loss is None:
                raise ValueError(f"{owner}: `loss` is required (e.g. 'binary_crossentropy').")
            self._compiled_loss = CompileLoss(loss)
            self.metrics = [keras.metrics.get(m) if isinstance(m, str) else m
                            for m in (metrics or [])]
            variables = self.trainable_variables
            if variables:
                self.optimizer.build(variables)
            self._fns: dict[Any, Any] = {}

    # -- the top's input rule --------------------------------------------------------------
    def embedding_tensors(self) -> dict[str, keras.KerasTensor]:
        """Every party's embedding as a KerasTensor (batch dimension None), by party."""
        out = {p: keras.KerasTensor((None,) + s.shape, dtype=s.dtype)
               for p, s in self.follower_specs.items()}
        if self.own is not None:
            out[self.own.name] = self.own.embedding_tensor
        return {p: out[p] for p in sorted(out)}

    def _resolve_top(self):
        sent = self.embedding_tensors()
        self.top_takes_dict = self._resolve_top_rule(sent)
        try:
            self.top_output_spec = keras_backend.compute_output_spec(
                lambda m: self.top(self.combine(m), training=False), sent)
        except Exception as error:
            shapes = {p: tuple(s.shape) for p, s in sent.items()}
            rule = ("a dict keyed by party" if self.top_takes_dict else
                    "the concatenation of the embeddings along the last axis in sorted party "
                    "order")
            raise ValueError(f"{self._owner}: the top model cannot take the embeddings "
                             f"{shapes} as {rule}: {error}") from error

    def _resolve_top_rule(self, sent):
        owner = self._owner
        struct = getattr(self.top, "_inputs_struct", None)
        names = None
        if isinstance(struct, dict):
            names = list(struct)
        elif struct is not None and len(tree.flatten(struct)) > 1:
            names = [t.name for t in tree.flatten(struct)]
        if names is None:  # one input: the concatenation
            if len({s.shape[1:-1] for s in sent.values()}) > 1 or \
                    len({len(s.shape) for s in sent.values()}) > 1:
                raise ValueError(f"{owner}: the top model has one input, so it receives the "
                                 "concatenation of the embeddings along the last axis, but their "
                                 "shapes differ elsewhere: "
                                 f"{ {p: tuple(s.shape) for p, s in sent.items()} }.")
            if len({keras.backend.standardize_dtype(s.dtype) for s in sent.values()}) > 1:
                raise ValueError(f"{owner}: the embeddings have different dtypes "
                                 f"{ {p: s.dtype for p, s in sent.items()} }; the top's single "
                                 "input needs one dtype.")
            expected = getattr(self.top, "inputs", None) if self.top.built else None
            if expected:
                want = expected[0].shape[-1]
                got = sum(int(s.shape[-1]) for s in sent.values())
                if want is not None and want != got:
                    raise ValueError(
                        f"{owner}: the top model's input has last dimension {want}, but the "
                        f"concatenated embeddings (sorted party order "
                        f"{ {p: int(s.shape[-1]) for p, s in sent.items()} }) have {got}.")
            return False
        if sorted(names) != sorted(self.parties):
            raise ValueError(f"{owner}: the top model has inputs named {names}; a top with "
                             "several (or dict) inputs must name them exactly after the parties "
                             f"{list(self.parties)} (it then receives a dict party -> "
                             "embedding). A top with one input receives the concatenation.")
        return True

    def combine(self, sent: Mapping[str, Any]) -> Any:
        """What the top takes: a dict by party, or the concatenation in sorted party order."""
        if self.top_takes_dict:
            return {p: sent[p] for p in self.parties}
        parts = [sent[p] for p in self.parties]
        return parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)

    # -- labels ----------------------------------------------------------------------------
    def declared_label_classes(self) -> int | None:
        """The number of classes ``label_dp``'s settings fix before any label is seen, or None."""
        layer = self.label_dp
        if layer.mode == "binary":
            return 2
        return layer.num_classes  # sparse / onehot / auto: None until the labels are seen

    def top_output_size(self) -> int | None:
        """The last dimension of the top's (single) output, or None when not known."""
        spec = self.top_output_spec
        if not isinstance(spec, keras.KerasTensor) or len(spec.shape) < 2:
            return None
        return spec.shape[-1]

    def check_label_classes(self, num_classes: int | None, source: str) -> None:
        """Raise if ``label_dp``'s ``num_classes`` cannot match the top model's output size.

        Randomized labels take any of the ``num_classes`` values, so a top
        with fewer outputs fails deep inside the loss on a label the user
        never wrote. Two classes fit a top with 1 output (sigmoid) or 2
        (softmax); K > 2 classes need exactly K outputs.

        Args:
            num_classes: the number of classes of the labels, or None (skip).
            source: where ``num_classes`` comes from, for the message.
        """
        outputs = self.top_output_size()
        if num_classes is None or outputs is None:
            return
        allowed = (1, 2) if num_classes == 2 else (num_classes,)
        if outputs not in allowed:
            if num_classes == 2:
                fix = ("2 classes need a top with 1 output (sigmoid) or 2 (softmax); for "
                       f"{outputs} classes use LabelDPLayer(mode='sparse', "
                       f"num_classes={outputs}) (or mode='onehot' for one-hot labels)")
            else:
                fix = (f"the randomized labels take every class id in [0, {num_classes}), so "
                       f"the top needs {num_classes} outputs: set `num_classes` to the number "
                       "of classes the top predicts (or change the top)")
            raise ValueError(f"{self._owner}: {source} has {num_classes} classes but the top "
                             f"model has {outputs} output(s); {fix}.")

    def validate_labels(self, y: Any) -> None:
        """Check array labels against ``label_dp`` eagerly, before anything is traced.

        The same row-by-row rule as `LabelDPLayer` on eager labels, plus the
        number of classes against the top's output size. Labels that are
        neither numpy arrays nor eager tensors are checked inside the step.
        """
        if self.label_dp is None:
            return
        if isinstance(y, tf.Tensor) and hasattr(y, "numpy"):
            y = y.numpy()
        if not isinstance(y, np.ndarray) or y.ndim == 0:
            return
        layer = self.label_dp
        mode, k = label_formats.resolve_mode(layer.mode, y.shape, layer.num_classes)
        label_formats.validate_eager(y, mode, k)
        self.check_label_classes(k, f"LabelDPLayer(mode={mode!r}) on these labels")

    def privatize_labels(self, y: Any, example_ids: Any) -> Any:
        """The labels the leader trains on: ``label_dp`` applied (a release), or ``y``.

        Without ``label_dp`` and ``labels_privatized``, the step is counted as
        a release of the true labels without DP.
        """
        if y is None:
            return y
        if self.label_dp is None:
            if not self.labels_privatized:
                self._counter.count(rows_of(tree.flatten(y)[0]))
            return y
        if example_ids is None and not self.label_dp.per_batch:
            raise ValueError(
                f"{self._owner}(label_dp=LabelDPLayer(...)) randomizes each training label once, "
                f"so it needs example ids: add an int64 {EXAMPLE_IDS_KEY!r} entry (shape "
                "(batch,), unique per example) to the input dict, e.g. with "
                "keras_fedpriv.federated.with_example_ids(x) (before shuffling). Alternatively "
                "privatize the labels once before training with keras_fedpriv.privatize_labels "
                "and pass label_dp=None, or use LabelDPLayer(per_batch=True) (fresh noise every "
                "epoch: E epochs cost E * eps).")
        return self.label_dp(y, example_ids=example_ids, training=True)

    def label_sample_weight(self, y_train: Any, sample_weight: Any,
                            class_weight: Mapping[int, float] | None,
                            label_free_sample_weight: bool, refusal: str) -> Any:
        """With ``label_dp``: refuse label-derived sample weights; class weights from ``y_train``.

        Args:
            y_train: the randomized labels.
            sample_weight: the batch's sample weights, or None.
            class_weight: None or a validated dict class -> weight.
            label_free_sample_weight: whether sample weights are allowed.
            refusal: the message of the ValueError for refused sample weights.
        """
        if self.label_dp is None:
            return sample_weight
        if sample_weight is not None and not label_free_sample_weight:
            raise ValueError(refusal)
        if class_weight is None or y_train is None:
            return sample_weight
        mode, k = self.label_dp._resolved
        keys = sorted(class_weight)
        if keys[-1] >= k:
            raise ValueError(f"{self._owner}: `class_weight` has the class {keys[-1]} but the "
                             f"labels have {k} classes; allowed keys: 0..{k - 1}.")
        table = np.ones(k, np.float32)
        for c, w in class_weight.items():
            table[c] = w
        if mode == "onehot":
            classes = tf.argmax(y_train, axis=-1)
        else:
            classes = tf.cast(tf.round(tf.cast(tf.reshape(y_train, [-1]), tf.float32)), tf.int32)
        weights = tf.gather(tf.constant(table), classes)
        if sample_weight is None:
            return weights
        sample_weight = tf.convert_to_tensor(sample_weight)
        return sample_weight * tf.reshape(tf.cast(weights, sample_weight.dtype),
                                          tf.shape(sample_weight))

    # -- the top's backward pass -------------------------------------------------------------
    def top_backward(self, received: Mapping[str, Any], y_train: Any, sample_weight: Any,
                     loss_fn: Callable[[Any, Any, Any], Any], scale: Callable[[Any], Any]
                     ) -> tuple[Any, Any, dict[str, Any], list[tuple[Any, Any]]]:
        """Top forward, loss, and ``d loss / d embedding`` of every party (graph piece).

        Args:
            received: every party's embedding (followers' as received, the
                leader's own), without autograd history.
            y_train: the labels trained on.
            sample_weight: the batch's weights, or None.
            loss_fn: ``loss_fn(y, y_pred, sample_weight)`` -> the scalar loss.
            scale: the optimizer's loss scaling.

        Returns:
            ``(loss, y_pred, cut, top_grads)``: ``cut`` maps every party to
            the gradient of its embedding (zeros where the loss does not
            depend on it), ``top_grads`` is a list of (gradient, variable).
        """
        top_vars = list(self.top.trainable_variables)
        with tf.GradientTape() as tape:
            for t in received.values():
                tape.watch(t)
            y_pred = self.top(self.combine(received), training=True)
            loss = loss_fn(y_train, y_pred, sample_weight)
            scaled = scale(loss)
        grads = tape.gradient(scaled, [received[p] for p in self.parties] + top_vars)
        n = len(self.parties)
        cut = {p: (g if g is not None else tf.zeros_like(received[p]))
               for p, g in zip(self.parties, grads[:n])}
        return loss, y_pred, cut, list(zip(grads[n:], top_vars))

    # -- standalone ------------------------------------------------------------------------
    def _require_standalone(self, what):
        if not self._standalone:
            raise RuntimeError(f"{self._owner}.{what}: this leader is the one a VerticalModel "
                               "runs inside its train_step; use model.split_parties() for "
                               "standalone halves.")

    @property
    def trainable_variables(self) -> list[Any]:
        """The leader's trainable variables: the top's, then its own bottom's."""
        own = self.own.trainable_variables if self.own is not None else []
        return list(self.top.trainable_variables) + own

    def loss(self, y: Any, y_pred: Any, sample_weight: Any = None) -> tf.Tensor:
        """The leader's loss: the compiled loss plus the top's own losses."""
        return leader_loss(self._compiled_loss, y, y_pred, sample_weight, list(self.top.losses))

    def receive(self, party: str, arrays: Mapping[str, Any], rows: int) -> np.ndarray:
        """A follower's message, checked and decoded (`decode_embedding`).

        Raises:
            MalformedMessage: an unknown sender, or arrays that are not what the
                follower's `EmbeddingSpec` promises.
        """
        if party not in self.follower_specs:
            raise MalformedMessage(f"a message from {party!r}, who is not a follower.")
        return decode_embedding(arrays, self.follower_specs[party], int(rows))

    def _traced_train(self, received, y, example_ids, x, sample_weight):
        scale = self.optimizer.scale_loss
        sent = {p: received[p] for p in self.follower_specs}
        own_tape = own_sent = local = local_scaled = None
        if self.own is not None:
            own_tape = tf.GradientTape()
            with own_tape:
                _, own_sent, losses = self.own.forward(x, example_ids, training=True)
                local = sum_losses(losses)
                local_scaled = None if local is None else scale(local)
            sent[self.own.name] = own_sent
        arrived = {p: tf.stop_gradient(sent[p]) for p in self.parties}
        y_train = self.privatize_labels(y, example_ids)
        sample_weight = self.label_sample_weight(
            y_train, sample_weight, self.class_weight, self.label_free_sample_weight,
            f"{self._owner}.step: `sample_weight` with label_dp: sample weights derived from the "
            "labels would reveal the true labels through the gradients sent to the followers. "
            "Use class_weight= (applied to the randomized labels), or pass "
            "label_free_sample_weight=True if your weights do not depend on the labels.")
        loss, _, cut, pairs = self.top_backward(arrived, y_train, sample_weight, self.loss, scale)
        if self.own is not None:
            pairs += list(zip(self.own.gradients(own_tape, own_sent, cut[self.own.name],
                                                 local_scaled), self.own.trainable_variables))
        if pairs:
            self.optimizer.apply([g for g, _ in pairs], [v for _, v in pairs])
        total = loss if local is None else loss + tf.cast(local, loss.dtype)
        return {p: cut[p] for p in self.follower_specs}, loss, total

    def _inputs(self, received, rows, x, what):
        missing = sorted(set(self.follower_specs) - set(received))
        unknown = sorted(set(received) - set(self.follower_specs))
        if missing or unknown:
            raise ValueError(f"{self._owner}.{what}: `received` must hold every follower's "
                             f"embedding; missing {missing}, unknown {unknown}.")
        out = {}
        for p, spec in self.follower_specs.items():
            a = np.asarray(received[p])
            if a.shape != (rows,) + spec.shape or a.dtype != np.dtype(spec.dtype):
                raise ValueError(f"{self._owner}.{what}: `received[{p!r}]` must be {spec.dtype} "
                                 f"of shape {(rows,) + spec.shape}; got {a.dtype} {a.shape} "
                                 "(decode messages with `receive`).")
            out[p] = a
        if self.own is not None:
            if x is None:
                raise ValueError(f"{self._owner}.{what}: `x` (the leader's own features) is "
                                 "required: the leader has a bottom model.")
            x = _as_numpy_features(self.own.input_spec, x, self._owner, self.own.name)
            if _num_rows(x) != rows:
                raise ValueError(f"{self._owner}.{what}: `x` must have {rows} rows, one per "
                                 "example of the batch.")
        elif x is not None:
            raise ValueError(f"{self._owner}.{what}: `x` must be None: the leader has no "
                             "bottom model.")
        return out, x

    def step(self, received: Mapping[str, Any], y: Any, example_ids: Any = None, x: Any = None,
             sample_weight: Any = None) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """One training step on the leader's side.

        Args:
            received: follower name -> its decoded embedding of the batch
                (`receive`), rows in batch order.
            y: the batch's labels (true labels; ``label_dp`` randomizes them).
            example_ids: the batch's example ids (needed by ``label_dp``
                unless ``per_batch``).
            x: the leader's own features of the batch (with a bottom).
            sample_weight: None, or per-example weights (see
                ``label_free_sample_weight``).

        Returns:
            ``(cut, logs)``: follower name -> the cut gradient to send it
            (numpy, the embedding's shape and dtype), and ``{"loss": ...,
            "total_loss": ...}`` (the leader's loss, and with its own
            bottom's losses added).
        """
        self._require_standalone("step")
        y = np.asarray(y)
        rows = int(y.shape[0]) if y.ndim else 0
        if rows < 1:
            raise ValueError(f"{self._owner}.step: `y` must hold one label per example of the "
                             "batch.")
        received, x = self._inputs(received, rows, x, "step")
        ids = _as_ids(example_ids, rows, f"{self._owner}.step")
        self.validate_labels(y)
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight, np.float32)
        try:
            fn = self._function("train", y, ids is not None, sample_weight)
            args = [received, y] + [a for a in (ids, x, sample_weight) if a is not None]
            cut, loss, total = fn(*args)
        except tf.errors.InvalidArgumentError as error:
            short = label_assert_message(error)
            if short is None:
                raise
            raise ValueError(f"{self._owner}.step: {short}") from None
        self.check_input_errors()
        return ({p: np.asarray(g) for p, g in cut.items()},
                {"loss": float(loss), "total_loss": float(total)})

    def _function(self, kind, y, has_ids, sample_weight):
        """The traced ``"train"`` step or ``"predict"`` (batch dimension None: one trace)."""
        key = (kind, None if y is None else (y.dtype.str, y.shape[1:]), has_ids,
               None if sample_weight is None else sample_weight.shape[1:])
        if key in self._fns:
            return self._fns[key]
        signature = [{p: tf.TensorSpec((None,) + s.shape, s.dtype)
                      for p, s in self.follower_specs.items()}]
        if kind == "train":
            signature.append(tf.TensorSpec((None,) + y.shape[1:], y.dtype))
        if has_ids:
            signature.append(tf.TensorSpec((None,), tf.int64))
        if self.own is not None:
            signature.append(batch_signature(self.own.input_spec))
        if sample_weight is not None:
            signature.append(tf.TensorSpec((None,) + sample_weight.shape[1:],
                                           sample_weight.dtype))

        def fn(received, *rest):
            rest = list(rest)
            y_ = rest.pop(0) if kind == "train" else None
            ids = rest.pop(0) if has_ids else None
            x = rest.pop(0) if self.own is not None else None
            weights = rest.pop(0) if sample_weight is not None else None
            if kind == "train":
                return self._traced_train(received, y_, ids, x, weights)
            return self._traced_predict(received, x)

        self._fns[key] = tf.function(fn, input_signature=signature)
        return self._fns[key]

    def _traced_predict(self, received, x):
        sent = dict(received)
        if self.own is not None:
            sent[self.own.name] = self.own.forward(x, None, training=False)[1]
        return self.top(self.combine(sent), training=False)

    def predict(self, received: Mapping[str, Any], x: Any = None) -> np.ndarray:
        """The top's prediction from the followers' inference embeddings (and ``x``)."""
        self._require_standalone("predict")
        rows = int(np.shape(next(iter(received.values())))[0]) if received else 0
        received, x = self._inputs(received, rows, x, "predict")
        fn = self._function("predict", None, False, None)
        return np.asarray(fn(received, x) if x is not None else fn(received))

    def evaluate(self, received: Mapping[str, Any], y: Any, x: Any = None) -> dict[str, float]:
        """``{"loss": ..., <metric>: ...}`` on true labels (no label DP at evaluation)."""
        y_pred = self.predict(received, x)
        y = np.asarray(y)
        logs = {"loss": float(self.loss(y, tf.convert_to_tensor(y_pred)))}
        for metric in self.metrics:
            metric.reset_state()
            metric.update_state(y, y_pred)
            logs[metric.name] = float(metric.result())
        return logs

    # -- checks and privacy ----------------------------------------------------------------
    def check_input_errors(self) -> None:
        """Raise if ``label_dp`` met invalid inputs in a compiled (XLA) step."""
        if isinstance(self.label_dp, InputErrorFlagMixin):
            self.label_dp.check_input_errors()

    def unprotected_count(self) -> int:
        """Training steps whose cut gradients came from the true labels."""
        return self._counter.value()

    def privacy_ledger(self) -> ReleaseLedger:
        """What the leader sent without a DP mechanism (``label_dp`` keeps its own ledger)."""
        return leader_unprotected_ledger(self.unprotected_count())

    def privacy_protections(self) -> list[Any]:
        """The leader's layers (``label_dp``'s ledger is found through them)."""
        out = [self.top] + ([self.label_dp] if self.label_dp is not None else [])
        return out + (self.own.layers if self.own is not None else [])


@dataclasses.dataclass
class VerticalParties:
    """The halves of a vertical model: one leader and its followers.

    Attributes:
        leader: the `VerticalLeader`.
        followers: follower name -> `VerticalFollower`, sorted by name.
    """

    leader: VerticalLeader
    followers: dict[str, VerticalFollower]

    def privacy_protections(self) -> list[Any]:
        """Every half (so `privacy_report(parties)` composes what each party recorded)."""
        return [self.leader, *self.followers.values()]


def _optimizer_factory(optimizer, model, owner):
    if optimizer is None:
        base = getattr(model, "optimizer", None)
        if base is None:
            raise ValueError(f"{owner}: the model is not compiled; pass `optimizer=`.")
        return lambda: _optimizer_copy(base)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return lambda: _optimizer_copy(optimizer)
    if isinstance(optimizer, str):
        return lambda: keras.optimizers.get(optimizer)
    if callable(optimizer):
        return optimizer
    raise TypeError(f"{owner}: `optimizer` must be None (a copy of the model's), a Keras "
                    f"optimizer, its name, or a function returning one; got "
                    f"{type(optimizer).__name__}.")


def split_parties(model: Any, *, optimizer: Any = None, loss: Any = None,
                  metrics: Sequence[Any] | None = None,
                  class_weight: Mapping[int, float] | None = None,
                  label_free_sample_weight: bool = False) -> VerticalParties:
    """The halves of a `VerticalModel`, sharing its layers.

    Every half gets its own optimizer (a copy of the model's, with the
    same settings and fresh state) and counts what it sends without a DP
    mechanism in its own slot of the model's counter, so
    ``privacy_report(parties)`` and ``privacy_report(model)`` agree.

    Args:
        model: a built `VerticalModel` (compiled, unless ``optimizer`` and
            ``loss`` are given).
        optimizer: None (copies of the model's optimizer), a Keras optimizer
            (copied per party), its name, or a function returning a new one.
        loss: None (the model's compiled loss) or a loss for the leader.
        metrics: metrics for `VerticalLeader.evaluate`.
        class_weight: the leader's class weights (applied to randomized
            labels).
        label_free_sample_weight: see `VerticalLeader`.

    Returns:
        A `VerticalParties` (``.leader``, ``.followers``).
    """
    owner = "split_parties"
    if not getattr(model, "_is_vertical_model", False):
        raise TypeError(f"{owner}: `model` must be a VerticalModel; got {type(model).__name__}.")
    make_optimizer = _optimizer_factory(optimizer, model, owner)
    if loss is None:
        loss = getattr(model, "loss", None)
        if loss is None:
            raise ValueError(f"{owner}: the model has no compiled loss; pass `loss=`.")
    variable = model.unprotected_releases
    followers = {}
    for i, p in enumerate(model.followers):
        followers[p] = VerticalFollower(p, model.bottoms[p], model.protections.get(p),
                                        optimizer=make_optimizer(),
                                        _counter=_Counter(variable, i))
    own = None
    if model.leader is not None:
        own = PartyBottom(model.leader, model.bottoms[model.leader], None, sends=False,
                          owner="VerticalLeader")
        own._build_spec()
    leader = VerticalLeader(model.top, {p: f.spec for p, f in followers.items()},
                            label_dp=model.label_dp, labels_privatized=model.labels_privatized,
                            loss=loss, optimizer=make_optimizer(), metrics=metrics,
                            class_weight=class_weight,
                            label_free_sample_weight=label_free_sample_weight,
                            _counter=_Counter(variable, len(model.followers)), _own_bottom=own)
    return VerticalParties(leader, followers)
