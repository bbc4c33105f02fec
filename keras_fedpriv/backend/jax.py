"""The JAX implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import keras
import numpy as np

from keras_fedpriv.backend import private

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
# VerticalModel's steps (keras_fedpriv/federated/vertical.py): Keras' JAX trainer passes
# and takes back the state (trainable, non-trainable, optimizer, metrics variables); each
# party's gradients come from the vjp of its own forward pass with its cut gradient.


def counter_variable(initial: Any, name: str) -> Any:
    """An int32 counter (no Keras weight) that a layer carries through ``fit`` as state.

    Held the way Keras holds a ``SeedGenerator``'s state: a layer that keeps
    it as an attribute lists its variable among ``non_trainable_variables``
    (so JAX's functional ``fit`` passes it through ``jit``), never among its
    ``weights`` (so no weights file stores it). It has ``shape``, ``dtype``,
    ``value``, ``numpy()``, ``assign`` and ``assign_add``.
    """
    base = private.seed_generator_class()

    class _Counter(base):  # only the state: no seed, never drawn from
        def __init__(self):
            self.name = name
            self._initial_seed = None
            self.state = keras.Variable(np.asarray(initial).astype(np.int32), trainable=False,
                                        dtype="int32", name=name)

        shape = property(lambda self: self.state.shape)
        dtype = property(lambda self: self.state.dtype)
        value = property(lambda self: self.state.value)

        def numpy(self):
            return np.asarray(self.state.numpy())

        def assign(self, value):
            return self.state.assign(value)

        def assign_add(self, value):
            return self.state.assign_add(value)

        def next(self, ordered=True):
            raise TypeError(f"{name} is a counter, not a seed generator.")

    return _Counter()


# The variables of the step being run and the scope holding their current values: `vjp`
# maps every one of them in its own scope (a `keras.StatelessScope` does not read through to
# an enclosing one).
_STEPS: list[tuple[list[Any], Any]] = []


def _in_step(variables, values, fn):
    """``(fn(), new values)``: ``fn`` run in a `keras.StatelessScope` mapping ``variables`` to
    ``values``, with `vjp` able to see them."""
    with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
        _STEPS.append((variables, scope))
        try:
            out = fn()
        finally:
            _STEPS.pop()
    return out, [scope.get_current_value(v) for v in variables]


def vjp(fn: Callable[[Any], tuple[list[Any], Any]], variables: list[Any],
        inputs: Any = None) -> tuple[list[Any], Any, Callable[[list[Any]], Any]]:
    """``fn(inputs)`` with what its gradients need: ``(outputs, aux, pullback)``.

    ``fn`` returns ``(outputs, aux)``: a list of tensors (or None) and anything
    else. ``pullback(cotangents)`` (one per output; None: ones) returns
    ``(gradients of variables, gradients of inputs)`` (zeros where an output
    does not depend on one). Here ``fn`` runs as a function of the values of
    ``variables`` (and of ``inputs``) under `jax.vjp`, inside the step that
    `stateful_call` or a `VerticalModel` step opened: the other variables'
    updates (random counters, release counts) go back into that step.
    """
    if not _STEPS:
        raise RuntimeError("keras_fedpriv.backend.jax.vjp runs inside stateful_call or a "
                           "VerticalModel step.")
    step_variables, outer = _STEPS[-1]
    ids = {id(v) for v in variables}
    others = [v for v in step_variables if id(v) not in ids]

    def forward(weights, inputs):
        mapping = list(zip(variables, weights)) + [
            (v, outer.get_current_value(v)) for v in others]
        with keras.StatelessScope(state_mapping=mapping) as scope:
            outputs, aux = fn(inputs)
        return outputs, (aux, [scope.get_current_value(v) for v in others])

    weights = [outer.get_current_value(v) for v in variables]
    outputs, pull, (aux, updates) = jax.vjp(forward, weights, inputs, has_aux=True)
    for v, value in zip(others, updates):
        outer.add_update((v, value))

    def pullback(cotangents):
        seeds = [None if o is None else jnp.ones_like(o) if c is None
                 else jnp.asarray(c, o.dtype) for o, c in zip(outputs, cotangents)]
        return pull(seeds)

    return outputs, aux, pullback


def stateful_call(variables: list[Any], fn: Callable[[], Any]) -> Any:
    """``fn()``, which reads and updates ``variables``: run in a step over their current
    values (so `vjp` works inside), the new values assigned after."""
    variables = list(variables)
    out, values = _in_step(variables, [v.value for v in variables], fn)
    for v, value in zip(variables, values):
        v.assign(value)
    return out


def party_function(fn: Callable[..., Any], signature: list[Any],
                   variables: Callable[[], list[Any]]) -> Callable[..., Any]:
    """A party's step: ``fn(*args)`` run by `stateful_call` over ``variables()`` (every
    variable it reads or updates; ``signature`` is TensorFlow's)."""
    del signature

    def call(*args):
        return stateful_call(variables(), lambda: fn(*args))

    return call


def _functional_step(model, groups, state, fn):
    """Keras' functional step: ``fn()`` over the state ``groups`` (lists of the model's
    variables) hold; ``(its result, the new state)``."""
    variables = [v for group in groups for v in group]
    out, values = _in_step(variables, [x for part in state for x in part], fn)
    new, start = [], 0
    for group in groups:
        new.append(values[start:start + len(group)])
        start += len(group)
    return out, tuple(new)


def vertical_train_step(model: Any, state: Any, data: Any) -> tuple[dict[str, Any], Any]:
    """One training step of a `VerticalModel` (Keras' JAX ``train_step(state, data)``):
    the protocol step, stateless over the model's variables."""
    groups = [model.trainable_variables, model.non_trainable_variables,
              model.optimizer.variables, model.metrics_variables]
    return _functional_step(model, groups, state, lambda: model._protocol_train_step(data))


def vertical_test_step(model: Any, state: Any, data: Any) -> tuple[dict[str, Any], Any]:
    """One evaluation step of a `VerticalModel` (Keras' JAX ``test_step(state, data)``)."""
    groups = [model.trainable_variables, model.non_trainable_variables,
              model.metrics_variables]
    return _functional_step(model, groups, state, lambda: model._test_logs(data))


def gather_replicas(structure: Any) -> Any:
    """The captured messages of a step (one device: unchanged)."""
    return structure


def traced_check_errors() -> tuple[type, ...]:
    """The exceptions a failed in-graph check raises out of a compiled step (none on JAX:
    the protection layers flag invalid inputs, and ``check_input_errors`` raises)."""
    return ()


def wrap_step_function(function: Callable[..., Any],
                       after: Callable[[Any], Any]) -> Callable[..., Any]:
    """Keras' JAX step function ``function(state, iterator) -> (outputs, state)``, with
    ``after(outputs)`` run on the outputs of every call."""

    def step(state, iterator):
        outputs, state = function(state, iterator)
        return after(outputs), state

    return step


# == end of training steps ==
