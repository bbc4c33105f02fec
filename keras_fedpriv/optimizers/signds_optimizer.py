"""`SignDS`: a client-side optimizer wrapper whose round update is a SignDS message.

Local steps use the wrapped optimizer unchanged. A *round* starts with
`SignDS.begin_round` (snapshot of the weights) and ends with `SignDS.end_round`:
the net update since the snapshot is encoded by a `SignDSEncoder` into a
`SignDSMessage` (a sign and h indices, what the client uploads), and the
weights go back to the snapshot (a client keeps nothing of its plain update;
its next model is the server's). The `SignDSRounds` callback does this from
``model.fit``: one round every ``epochs_per_round`` epochs.

Example:
    >>> opt = SignDS(keras.optimizers.SGD(0.05), SignDSEncoder(k=0.2, eps=10))
    >>> model.compile(opt, "sparse_categorical_crossentropy")
    >>> rounds = SignDSRounds(epochs_per_round=2, on_message=upload)
    >>> model.fit(x, y, epochs=10, callbacks=[rounds])   # 5 messages to `upload`
    >>> opt.messages[-1].indices, opt.messages[-1].nbytes
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import keras
import numpy as np

from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int
from keras_fedpriv.optimizers.signds import SignDSEncoder, decode, flatten_update, unflatten_update

if TYPE_CHECKING:
    from keras_fedpriv.optimizers.signds import SignDSMessage

__all__ = ["SignDS", "SignDSRounds"]


# Base `keras.optimizers.Optimizer` arguments and their defaults: the wrapper's own
# would be ignored (its apply() hands the gradients to the inner optimizer).
_BASE_OPTIMIZER_DEFAULTS = {
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def _unwrap_signds(optimizer):
    """The `SignDS` optimizer itself, or inside a `LossScaleOptimizer`; else None."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer if isinstance(optimizer, SignDS) else None


class _RoundState:
    """The round's model variables and start values, kept out of the optimizer's variables.

    Keras tracks every variable (or list of variables) assigned to an
    optimizer attribute as an optimizer variable; a plain holder object is not
    inspected, so the model's weights are neither saved with the optimizer
    nor counted by `stateless_apply`.
    """

    def __init__(self):
        self.clear()

    def clear(self):
        self.variables = None
        self.start = None


@keras.saving.register_keras_serializable(package="keras_fedpriv")
class SignDS(keras.optimizers.Optimizer):
    """Wrap a Keras optimizer so that a round's net update leaves as a SignDS message.

    Args:
        optimizer: the inner optimizer (instance or identifier such as
            ``"adam"``) that makes the local steps.
        encoder: a `SignDSEncoder` (default: ``SignDSEncoder()``).
        name: optimizer name.

    The base-optimizer arguments (``learning_rate``, ``clipnorm``,
    ``clipvalue``, ``global_clipnorm``, ``weight_decay``, ``use_ema``,
    ``loss_scale_factor``, ``gradient_accumulation_steps``, ...) belong on the
    inner optimizer, which makes the steps; passing one to `SignDS` raises a
    ValueError. Under the ``mixed_float16`` policy ``model.compile`` wraps
    `SignDS` in a `keras.optimizers.LossScaleOptimizer`; `SignDSRounds` accepts
    that.

    Attributes:
        messages: the `SignDSMessage` of every finished round, oldest first.
        last_magnitude: the last round's private top-k mean (for MagRR's
            client report; never part of the message).
    """

    def __init__(self, optimizer: str | keras.optimizers.Optimizer,
                 encoder: SignDSEncoder | None = None, name: str | None = None,
                 **kwargs: Any) -> None:
        for arg, value in kwargs.items():
            if arg in _BASE_OPTIMIZER_DEFAULTS and value == _BASE_OPTIMIZER_DEFAULTS[arg]:
                continue  # a default value (e.g. from an old config) changes nothing
            if arg in _BASE_OPTIMIZER_DEFAULTS or arg == "learning_rate":
                raise ValueError(
                    f"SignDS does not apply `{arg}`={value!r}: the inner optimizer makes the "
                    f"steps. Set it there instead, e.g. SignDS(keras.optimizers.SGD(0.1, "
                    f"{arg}=...), encoder).")
            raise TypeError(f"SignDS got an unexpected argument `{arg}`={value!r}; it takes "
                            f"`optimizer`, `encoder` and `name`.")
        super().__init__(learning_rate=0.0, name=name or "signds")
        self.inner_optimizer = keras.optimizers.get(optimizer)
        if encoder is None:
            encoder = SignDSEncoder()
        if not isinstance(encoder, SignDSEncoder):
            raise TypeError(f"`encoder` must be a SignDSEncoder; got {encoder!r}.")
        self.encoder = encoder
        self.messages = []
        self.last_magnitude = None
        self._round = _RoundState()

    # --- delegation to the inner optimizer (pattern of keras' LossScaleOptimizer)
    def build(self, var_list: list[Any]) -> None:
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def variables(self) -> list[Any]:
        return self._variables + self.inner_optimizer.variables

    def apply(self, grads: list[Any], trainable_variables: list[Any] | None = None) -> None:
        if not self.built:
            self.build(trainable_variables)
            self.built = True
        self.inner_optimizer.apply(grads, trainable_variables)

    def scale_loss(self, loss: Any) -> Any:
        """Scale the loss as the inner optimizer would (its ``loss_scale_factor``)."""
        return self.inner_optimizer.scale_loss(loss)

    def stateless_apply(self, optimizer_variables: list[Any], grads: list[Any],
                        trainable_variables: list[Any]) -> tuple[list[Any], list[Any]]:
        own = len(self._variables)
        new_tv, new_inner = self.inner_optimizer.stateless_apply(
            optimizer_variables[own:], grads, trainable_variables)
        # Values, not variables: keras' LossScaleOptimizer passes this optimizer's variables
        # themselves (read through its StatelessScope) and returns the result from an
        # `ops.cond`, which on JAX takes arrays only.
        own_values = [keras.ops.convert_to_tensor(v) for v in optimizer_variables[:own]]
        return new_tv, own_values + list(new_inner)

    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self.inner_optimizer.learning_rate = value

    @property
    def iterations(self) -> Any:
        return self.inner_optimizer.iterations

    def finalize_variable_values(self, var_list: list[Any]) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    def privacy_protections(self) -> list[SignDSEncoder]:
        """The encoder, which records every round's message (`privacy_report` reads it)."""
        return [self.encoder]

    # --- rounds
    def begin_round(self, variables: Iterable[Any]) -> None:
        """Snapshot ``variables`` (e.g. ``model.trainable_variables``) as the round's start."""
        self._round.variables = list(variables)
        self._round.start = [np.array(v.numpy()) for v in self._round.variables]

    @property
    def in_round(self) -> bool:
        """Whether `begin_round` was called and `end_round` not yet."""
        return self._round.variables is not None

    def end_round(self, server_lr: float | None = None) -> SignDSMessage:
        """Encode the net update since `begin_round`; reset the weights; return the message.

        Args:
            server_lr: None (default): the weights go back to the round's
                start, as on a client that waits for the server's next model.
                A float: the weights become ``start + server_lr * decode(message)``,
                i.e. what a server with this one client would apply (for
                single-process experiments).

        Returns:
            The round's `SignDSMessage` (also appended to ``messages``).
        """
        if not self.in_round:
            raise RuntimeError("end_round() without begin_round(): call "
                               "optimizer.begin_round(model.trainable_variables) first "
                               "(the SignDSRounds callback does both).")
        start = self._round.start
        current = [v.numpy() for v in self._round.variables]
        delta, shapes = flatten_update([c - s for c, s in zip(current, start)])
        message, magnitude = self.encoder.encode_with_magnitude(delta)
        new = start
        if server_lr is not None:
            server_lr = validate_eps(server_lr, "server_lr", lower_open=True)
            step = unflatten_update(np.float32(server_lr) * decode(message), shapes)
            new = [s + d.astype(s.dtype) for s, d in zip(start, step)]
        for v, value in zip(self._round.variables, new):
            v.assign(value)
        self.messages.append(message)
        self.last_magnitude = float(magnitude)
        self._round.clear()
        return message

    def discard_round(self) -> None:
        """End the round without a message: the weights go back to the round's start.

        Nothing of the un-uploaded (and un-noised) local update stays in the
        weights, so saving or sharing the model afterwards reveals nothing
        beyond the messages already sent. No-op outside a round.
        """
        if not self.in_round:
            return
        for v, value in zip(self._round.variables, self._round.start):
            v.assign(value)
        self._round.clear()

    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "encoder": self.encoder.get_config(),
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any],
                    custom_objects: Mapping[str, Any] | None = None) -> SignDS:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"),
                                                      custom_objects=custom_objects)
        # A seeded encoder rebuilt from its config encodes only after
        # optimizer.encoder.load_state_dict(...) (see SignDSEncoder.from_config).
        encoder = SignDSEncoder.from_config(config.pop("encoder"))
        return cls(inner, encoder=encoder, **config)


class SignDSRounds(keras.callbacks.Callback):
    """Run SignDS rounds inside ``model.fit``: one round every ``epochs_per_round`` epochs.

    The model must be compiled with a `SignDS` optimizer (or a
    `keras.optimizers.LossScaleOptimizer` wrapping one, as ``model.compile``
    makes under the ``mixed_float16`` policy). At the end of each
    round the callback calls ``optimizer.end_round()``, passes the message to
    ``on_message`` (your upload function), logs ``upload_bytes`` and
    ``upload_indices`` for that epoch, and starts the next round. Epochs after
    the last full round (when ``epochs`` is not a multiple of
    ``epochs_per_round``) are not uploaded, and at the end of training their
    update is discarded with a warning: the weights go back to the start of
    that partial round, so the model never holds a plain, un-noised local
    update.

    Args:
        epochs_per_round: local epochs per round (>= 1).
        on_message: optional callable ``f(message)``.
        server_lr: passed to `SignDS.end_round` (None: reset to the round's
            start, as a deployed client does).
    """

    def __init__(self, epochs_per_round: int = 1,
                 on_message: Callable[[SignDSMessage], Any] | None = None,
                 server_lr: float | None = None) -> None:
        super().__init__()
        self.epochs_per_round = validate_positive_int(epochs_per_round, "epochs_per_round")
        if on_message is not None and not callable(on_message):
            raise TypeError(f"`on_message` must be callable or None; got {on_message!r}.")
        self.on_message = on_message
        self.server_lr = (None if server_lr is None
                          else validate_eps(server_lr, "server_lr", lower_open=True))

    def _optimizer(self):
        opt = _unwrap_signds(self.model.optimizer)
        if opt is None:
            got = type(self.model.optimizer).__name__
            if isinstance(self.model.optimizer, keras.optimizers.LossScaleOptimizer):
                got += f" wrapping {type(self.model.optimizer.inner_optimizer).__name__}"
            raise TypeError("SignDSRounds needs a model compiled with a SignDS optimizer "
                            f"(or a LossScaleOptimizer wrapping one); got {got}.")
        return opt

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._optimizer().begin_round(self.model.trainable_variables)
        self._epochs_in_round = 0

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epochs_in_round = getattr(self, "_epochs_in_round", 0) + 1
        if (epoch + 1) % self.epochs_per_round:
            return
        self._epochs_in_round = 0
        opt = self._optimizer()
        message = opt.end_round(self.server_lr)
        if logs is not None:
            logs["upload_bytes"] = float(message.nbytes)
            logs["upload_indices"] = float(len(message.indices))
        if self.on_message is not None:
            self.on_message(message)
        opt.begin_round(self.model.trainable_variables)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        opt = _unwrap_signds(self.model.optimizer)
        if opt is not None and opt.in_round:
            # Partial round: nothing uploaded, and its plain update must not stay
            # in the weights.
            discarded = getattr(self, "_epochs_in_round", 0)
            opt.discard_round()
            if discarded:
                warnings.warn(
                    f"SignDSRounds: training ended {discarded} epoch(s) into a round of "
                    f"{self.epochs_per_round}; that partial round was not uploaded and its "
                    f"local update was discarded (the weights are back at the round's start). "
                    f"Use a number of epochs that is a multiple of epochs_per_round to use "
                    f"every epoch.", stacklevel=2)
            self._epochs_in_round = 0
