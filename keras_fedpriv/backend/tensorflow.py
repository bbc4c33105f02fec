"""The TensorFlow implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf
from keras import tree

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==



# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==



# == end of input checks ==


# == Philox and mechanisms (mechanisms/) ==



# == end of Philox ==


# == training steps (federated/: VerticalModel, LocalTrainer) ==



# -- vertical --
# VerticalModel's steps and the parties' gradients (keras_fedpriv/federated/vertical.py,
# vertical_parties/): a tape per party.


def counter_variable(initial: Any, name: str) -> Any:
    """An int64 counter variable (no Keras weight) whose checkpoint restore keeps the
    larger count elementwise: restoring never rewinds it."""
    from keras_fedpriv.layers.secret_rng import _MonotoneVariable

    return _MonotoneVariable(np.asarray(initial, np.int64), trainable=False, name=name)


def vjp(fn: Callable[[Any], tuple[list[Any], Any]], variables: list[Any],
        inputs: Any = None) -> tuple[list[Any], Any, Callable[[list[Any]], Any]]:
    """``fn(inputs)`` with what its gradients need: ``(outputs, aux, pullback)``.

    ``fn`` returns ``(outputs, aux)``: a list of tensors (or None) and anything
    else. ``pullback(cotangents)`` (one per output; None: ones) returns
    ``(gradients of variables, gradients of inputs)`` (None where an output
    does not depend on one). Here a `tf.GradientTape` records ``fn``
    (watching ``inputs``); ``pullback`` is ``tape.gradient`` with those
    output gradients, called at most once.
    """
    flat_inputs = tree.flatten(inputs) if inputs is not None else []
    with tf.GradientTape() as tape:
        for t in flat_inputs:
            tape.watch(t)
        outputs, aux = fn(inputs)

    def pullback(cotangents):
        pairs = [(o, tf.ones_like(o) if c is None else c)
                 for o, c in zip(outputs, cotangents) if o is not None]
        sources = list(variables) + flat_inputs
        if not sources:
            return [], inputs
        grads = tape.gradient([o for o, _ in pairs], sources,
                              output_gradients=[c for _, c in pairs])
        n = len(variables)
        return (list(grads[:n]),
                None if inputs is None else tree.pack_sequence_as(inputs, grads[n:]))

    return outputs, aux, pullback


def stateful_call(variables: list[Any], fn: Callable[[], Any]) -> Any:
    """``fn()``, which reads and updates ``variables`` (TensorFlow: as is)."""
    del variables
    return fn()


def party_function(fn: Callable[..., Any], signature: list[Any],
                   variables: Callable[[], list[Any]]) -> Callable[..., Any]:
    """A party's step, compiled once for any batch size: a `tf.function` with the input
    signature ``signature`` (KerasTensors, batch dimension None; ``variables`` is JAX's)."""
    del variables
    specs = tree.map_structure(
        lambda t: tf.TensorSpec(t.shape, keras.backend.standardize_dtype(t.dtype)), signature)
    return tf.function(fn, input_signature=specs)


def vertical_train_step(model: Any, data: Any) -> dict[str, Any]:
    """One training step of a `VerticalModel` (Keras' ``train_step(data)``)."""
    return model._protocol_train_step(data)


def vertical_test_step(model: Any, data: Any) -> dict[str, Any]:
    """One evaluation step of a `VerticalModel` (Keras' ``test_step(data)``)."""
    return model._test_logs(data)


def gather_replicas(structure: Any) -> Any:
    """Under ``tf.distribute`` with several replicas, every replica's tensors gathered
    along axis 0 (the whole global batch on each); else ``structure`` unchanged."""
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        return tree.map_structure(lambda t: context.all_gather(t, axis=0), structure)
    return structure


def traced_check_errors() -> tuple[type, ...]:
    """The exceptions a failed in-graph check raises out of a compiled step."""
    return (tf.errors.InvalidArgumentError,)


def wrap_step_function(function: Callable[..., Any],
                       after: Callable[[Any], Any]) -> Callable[..., Any]:
    """Keras' step function ``function(iterator) -> outputs``, with ``after(outputs)``
    run on what every call returns."""

    def step(iterator):
        return after(function(iterator))

    return step


# == end of training steps ==
