"""One party's bottom model (and a follower's protection): the pieces every runtime runs.

Shared by `VerticalModel` (inside its ``train_step``), `VerticalFollower` and
`VerticalLeader`: party names and validation, copies of a protection layer per
party, the party's forward pass and gradients from the cut gradient, the
losses, and the record of what a party sends without a DP mechanism.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import logging
import math
import operator
import re
from typing import Any, Callable, Sequence

import keras
import numpy as np
from keras import ops, tree

from keras_fedpriv import backend
from keras_fedpriv.backend import private
from keras_fedpriv.federated.messages import EXAMPLE_IDS_KEY
from keras_fedpriv.federated.vertical.wire import EmbeddingSpec
from keras_fedpriv.layers.embedding_dp import EmbeddingDPLayer
from keras_fedpriv.layers.input_checks import InputErrorFlagMixin, host_example_ids
from keras_fedpriv.layers.release_counter import replay_scope
from keras_fedpriv.layers.secret_rng import SecretRandomMixin
from keras_fedpriv.layers.vae_bottom import vae_release_scope
from keras_fedpriv.mechanisms.ledger import (
    EXAMPLE,
    ReleaseKind,
    ReleaseLedger,
    is_protection,
    non_private_event,
)


__all__ = ["PartyBottom", "PendingBatch", "SentCounter", "add_all", "as_example_ids",
           "as_numpy_features", "batch_signature", "bottom_input_spec", "copy_protection",
           "counter_variable", "derive_party_seed", "follower_unprotected_ledger",
           "is_bit_protection", "is_integer_tensor", "label_assert_message", "leader_loss",
           "leader_unprotected_ledger", "make_optimizer", "num_rows", "optimizer_copy",
           "rows_of", "sum_losses", "takes_example_ids", "validate_class_weight",
           "validate_party_name"]

logger = logging.getLogger("keras_fedpriv.vertical")

PARTY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

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
    """Each KerasTensor of a structure with its batch dimension None (a step's input
    signature, see the backend's ``party_function``)."""
    return tree.map_structure(
        lambda t: keras.KerasTensor((None,) + tuple(t.shape[1:]),
                                    keras.backend.standardize_dtype(t.dtype)), spec)


def bottom_input_spec(party: str, bottom: keras.layers.Layer, owner: str) -> Any:
    """Symbolic inputs (KerasTensors, possibly nested) of a built bottom model."""
    struct = private.inputs_struct(bottom)
    if struct is not None:
        return tree.map_structure(_spec_of, struct)
    try:
        inputs = bottom.inputs
    except (AttributeError, ValueError):
        inputs = None
    if inputs:
        return _spec_of(inputs[0]) if len(inputs) == 1 else [_spec_of(t) for t in inputs]
    shapes = private.build_shapes(bottom)
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


def rows_of(t: Any) -> Any:
    """The batch size of a tensor: an int where it is static, else a scalar tensor."""
    return keras.ops.shape(t)[0]


def is_integer_tensor(t: Any) -> bool:
    """Whether a tensor (or array) has an integer dtype."""
    return "int" in keras.backend.standardize_dtype(t.dtype)


def add_all(values: Sequence[Any]) -> Any:
    """The sum of a non-empty list of tensors, left to right."""
    return functools.reduce(operator.add, values)


def sum_losses(losses: Sequence[Any]) -> Any:
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
    return add_all(out)


def leader_loss(compiled: Callable[..., Any] | None, y: Any, y_pred: Any, sample_weight: Any,
                extra_losses: Sequence[Any]) -> Any:
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
    return add_all(losses)


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


def counter_variable(size: int) -> Any:
    """A new counter of ``size`` slots (zeros) that a restore can only move forward.

    Not a Keras weight (the backend's ``local_variable``): on TensorFlow an
    int64 variable whose checkpoint restore keeps the larger count; on JAX an
    int32 slot that a layer keeping it as an attribute carries through
    ``fit`` as state.
    """
    return backend.impl().local_variable(None, np.zeros(int(size), np.int64),
                                         "unprotected_releases", monotone=True)


def backend_variables(counter: Any) -> list[Any]:
    """The Keras variables behind a `counter_variable` (none on TensorFlow: a TensorFlow
    variable is read and updated in place)."""
    state = getattr(counter, "state", None)
    return [state] if isinstance(state, keras.Variable) else []


class SentCounter:
    """One slot of an integer counter variable: what a party sent without a DP mechanism.

    A `VerticalModel` holds one variable with a slot per follower and one for
    the leader; the halves it hands out count into their own slots.

    Example:
        >>> counter = SentCounter()  # a one-slot variable of its own  # doctest: +SKIP
        >>> _ = counter.count(32); counter.value()  # doctest: +SKIP
        1
    """

    def __init__(self, variable: Any = None, slot: int = 0) -> None:
        if variable is None:
            variable = counter_variable(1)
            slot = 0
        self.variable = variable
        self.slot = int(slot)

    def count(self, rows: Any) -> Any:
        """Add one to the slot when ``rows`` > 0 (a message was sent); graph-safe."""
        size = int(self.variable.shape[0])
        dtype = keras.backend.standardize_dtype(self.variable.dtype)
        update = keras.ops.one_hot(self.slot, size, dtype=dtype)
        return self.variable.assign_add(update * keras.ops.cast(rows > 0, dtype))

    def value(self) -> int:
        """The slot's count."""
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


def optimizer_copy(optimizer: Any) -> Any:
    """A new optimizer with ``optimizer``'s settings and fresh state (one per party half).

    Example:
        >>> optimizer_copy(keras.optimizers.Adam(0.01)).learning_rate  # doctest: +SKIP
        0.01
    """
    return keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))


def make_optimizer(optimizer: Any, owner: str) -> Any:
    """A Keras optimizer from ``optimizer`` (one, or its name); else an error naming ``owner``.

    Example:
        >>> type(make_optimizer("sgd", "VerticalLeader")).__name__  # doctest: +SKIP
        'SGD'
    """
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
                 counter: SentCounter | None = None, owner: str | None = None) -> None:
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
        self._counter = counter if counter is not None else (SentCounter() if sends else None)
        if not bottom.built:
            raise ValueError(f"{owner}: the bottom model of party {name!r} is not built. "
                             "Give it an input (keras.Input / functional model / Sequential "
                             "starting with keras.Input) or call bottom.build(shape) first.")
        self.input_spec = bottom_input_spec(name, bottom, owner)

    def build_spec(self) -> Any:
        """Trace the forward pass symbolically: the embedding's KerasTensor, checked (the
        halves and `VerticalModel` call it once their layers are built)."""
        spec = private.compute_output_spec(
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
        a ledger, a VAEBottom in the bottom model records it, or else the
        party's counter, as a release without DP (never both). A VAEBottom
        whose output is not what is sent records nothing.

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
        protection = self.protection
        # the bottom's output is released as computed: a VAEBottom inside records it (per
        # example id when the bottom is the VAEBottom and ids are given), else the party does
        released = self.sends and count and not is_protection(protection)
        with vae_release_scope(released) as recorders:
            if (released and example_ids is not None and is_protection(self.bottom)
                    and is_integer_tensor(example_ids)
                    and takes_example_ids(self.bottom)):
                z = self.bottom(features, training=training, example_ids=example_ids)
            else:
                z = self.bottom(features, training=training)
        losses = list(self.bottom.losses)
        if released and not recorders:
            self._counter.count(rows_of(z))
        if protection is None:
            return z, z, losses
        # a replay (count=False) recomputes a release already counted: the protection
        # counts nothing, so its per-example table needs no copy to be put back
        with contextlib.nullcontext() if count else replay_scope():
            if example_ids is not None and is_integer_tensor(example_ids) and \
                    takes_example_ids(protection):
                sent = protection(z, training=training, example_ids=example_ids)
            else:
                sent = protection(z, training=training)
        return z, sent, losses + list(protection.losses)

    def record_forward(self, features: Any, example_ids: Any, scale: Callable[[Any], Any],
                       count: bool = True) -> tuple[Any, Any, Callable[[list[Any]], Any]]:
        """The training forward pass, recorded for `gradients` (the backend's ``vjp``).

        Args:
            features: the party's features.
            example_ids: None or int tensor (batch,).
            scale: the optimizer's loss scaling (applied to the party's own losses).
            count: False when the pass is a replay of one already counted.

        Returns:
            ``(sent, local, pullback)``: what the party sends, its own losses
            (one scalar, or None) and what `gradients` takes.
        """
        def forward(_):
            _, sent, losses = self.forward(features, example_ids, training=True, count=count)
            local = sum_losses(losses)
            return [sent, None if local is None else scale(local)], local

        (sent, _), local, pullback = backend.impl().vjp(forward, self.trainable_variables)
        return sent, local, pullback

    def gradients(self, pullback: Callable[[list[Any]], Any], cut: Any) -> list[Any]:
        """The party's gradients from the cut gradient alone (plus its own losses).

        The gradient of ``sum(sent * cut) + scaled local losses`` with respect
        to the party's variables: ``pullback`` (from `record_forward`) with
        the output gradients ``[cut, 1]``.

        Returns:
            One gradient (or None) per `trainable_variables` entry.
        """
        if not self.trainable_variables:
            return []
        return list(pullback([cut, None])[0])

    @property
    def state_variables(self) -> list[Any]:
        """Every variable the party's steps read or update: its layers' (random state
        included) and its counter of releases without DP."""
        out = [v for layer in self.layers for v in layer.variables]
        if self._counter is not None:
            out += backend_variables(self._counter.variable)
        return out

    def unprotected_count(self) -> int:
        """How many calls sent this party's embedding without a DP mechanism."""
        return 0 if self._counter is None else self._counter.value()

    def check_input_errors(self) -> None:
        """Raise if the protection met invalid inputs in a compiled (XLA) call."""
        if isinstance(self.protection, InputErrorFlagMixin):
            self.protection.check_input_errors()


@dataclasses.dataclass
class PendingBatch:
    """A follower's batch awaiting its cut gradient (see `VerticalFollower.embed`).

    Example:
        >>> PendingBatch(x, None, sent, state_before={})  # doctest: +SKIP
    """

    features: Any
    example_ids: np.ndarray | None
    sent: np.ndarray
    # the layers' local state before the batch was embedded, without the per-example release
    # counts (name -> tensor, or numpy from a node state): what the replay restores
    state_before: dict[str, Any]
    # the trainable weights the batch was embedded with, once they have changed since (one
    # list shared by every batch embedded with them); None: the follower's current weights
    weights: list[np.ndarray] | None = None


def as_numpy_features(spec: Any, x: Any, owner: str, party: str) -> Any:
    """``x`` as numpy arrays of the dtypes of ``spec`` (a bottom's input spec), or a TypeError
    naming ``owner`` and ``party`` (never a value).

    Example:
        >>> as_numpy_features(bottom_input_spec(bottom), [[1, 2]], "embed", "f1")  # doctest: +SKIP
    """
    def convert(s, a):
        return np.asarray(a, dtype=keras.backend.standardize_dtype(s.dtype))

    try:
        return tree.map_structure(convert, spec, x)
    except (ValueError, TypeError) as error:
        raise TypeError(f"{owner}: the features of party {party!r} do not match its bottom "
                        f"model's inputs ({type(error).__name__}).") from None


def num_rows(x: Any) -> int | None:
    """The number of rows every array of ``x`` has, or None if they differ.

    Example:
        >>> num_rows({"a": np.zeros((3, 2)), "b": np.zeros(3)})
        3
    """
    sizes = {int(np.shape(a)[0]) for a in tree.flatten(x)}
    return sizes.pop() if len(sizes) == 1 else None


def as_example_ids(example_ids: Any, rows: int, owner: str) -> np.ndarray | None:
    """``example_ids`` as int64 numpy, one per row of the batch (None stays None); a
    ValueError naming ``owner`` otherwise.

    Example:
        >>> as_example_ids(np.array([5, 6]), 2, "VerticalFollower.embed").tolist()
        [5, 6]
    """
    if example_ids is None:
        return None
    if ops.is_tensor(example_ids):
        example_ids = ops.convert_to_numpy(example_ids)
    # refused past the backend's id dtype (on JAX, int32: larger ids would wrap onto others)
    ids = host_example_ids(example_ids, owner).reshape(-1).astype(np.int64)
    if ids.size != rows:
        raise ValueError(f"{owner}: `example_ids` has {ids.size} entries for {rows} rows of "
                         "features; give one id per row.")
    return ids
