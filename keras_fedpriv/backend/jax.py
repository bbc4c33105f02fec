"""The JAX implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import keras
import numpy as np

from keras_fedpriv.backend.private import seed_generator_class

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==

_SKIP = 256  # files hold the counter as TensorFlow's Philox state: [draws * 256, 0, 0]
_MASK32 = 0xFFFFFFFF
_INT32_MAX = 2**31 - 1


class LocalSlot(seed_generator_class()):
    """A variable that is part of a layer's state but not of its weights.

    A Keras layer tracks an attribute of type ``SeedGenerator`` as random
    state: its ``state`` variable is among ``layer.variables`` (so JAX's
    functional ``fit``, ``evaluate`` and ``predict`` carry it through ``jit``
    and write its updates back), but never among ``layer.weights``: not in
    ``get_weights``/``set_weights`` (what FL code exchanges), and not written
    by Keras' own ``save_own_variables``. The package's layers keep their
    key, random counter and release counts in such slots and decide in their
    own ``save_own_variables`` what a file holds.

    It offers the part of TensorFlow's variable API the package uses
    (``read_value``, ``value``, ``assign``, ``assign_add``, ``numpy``,
    ``shape``, ``dtype``).
    """

    def __init__(self, value: Any, dtype: str, name: str) -> None:  # no super().__init__:
        self.name = name  # a SeedGenerator's own state (a (2,) seed) is not wanted here
        self._initial_seed = None
        value = np.asarray(value)
        with keras.name_scope(name, caller=self):
            self.state = keras.Variable(value.astype(dtype), dtype=dtype, trainable=False,
                                        aggregation="none", name=name)

    def next(self, ordered: bool = True) -> Any:
        raise TypeError(f"{self.name!r} holds a layer's local state; it is no seed generator.")

    def get_config(self) -> dict[str, Any]:
        raise TypeError(f"{self.name!r} holds a layer's local state and is never serialized.")

    @property
    def value(self) -> Any:
        return self.state.value

    def read_value(self) -> Any:
        return self.state.value

    def assign(self, value: Any) -> Any:
        self.state.assign(jnp.asarray(value).astype(self.state.dtype).reshape(self.shape))
        return self.state.value

    def assign_add(self, delta: Any) -> Any:
        return self.assign(self.state.value + jnp.asarray(delta).astype(self.state.dtype))

    def numpy(self) -> np.ndarray:
        return np.asarray(self.state.numpy())

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.state.shape)

    @property
    def dtype(self) -> str:
        return self.state.dtype


def _narrow(value: Any) -> tuple[np.ndarray, str]:
    """``value`` as a numpy array of a dtype JAX keeps without x64 (int64 -> int32)."""
    value = np.asarray(value)
    if value.dtype == np.int64:
        if value.size and (value.min() < -_INT32_MAX - 1 or value.max() > _INT32_MAX):
            raise ValueError("a local variable's value does not fit in int32 (JAX without "
                             "x64); store it in 31-bit parts.")
        return value.astype(np.int32), "int32"
    if value.dtype == np.uint64:
        raise ValueError("a local variable cannot be uint64 on JAX without x64.")
    return value, value.dtype.name


def new_key_variable(owner: Any, value: np.ndarray, keep_when_saved: bool, fresh_value: Any):
    """The layer's ``rng_key``: ``[k0, k1, 1]`` as uint32 words. On JAX there is no
    checkpoint or SavedModel that restores it: the layer never saves an unseeded key,
    and a reloaded layer is built with a fresh one."""
    return LocalSlot(np.asarray(value, np.int64).astype(np.uint32), "uint32", "rng_key")


def add_fresh_key_hook(key: Any, hook: Any) -> None:
    """No checkpoint restore replaces a key on JAX: nothing to hook."""


def new_counter_variable(owner: Any):
    """The layer's ``rng_counter``: the number of calls that drew noise, as two uint32
    words ``[low, high]`` (`next_words` carries from low to high)."""
    return LocalSlot(np.zeros(2, np.uint32), "uint32", "rng_counter")


def local_variable(owner: Any, value: Any, name: str, monotone: bool = False,
                   cls: type | None = None):
    """A `LocalSlot` holding ``value`` (int64 stored as int32; ValueError if it does
    not fit). The caller assigns it to an attribute of the owning layer, which makes
    the layer track it. ``monotone`` and ``cls`` concern TensorFlow checkpoints only."""
    value, dtype = _narrow(value)
    return LocalSlot(value, dtype, name)


def local_variable_class() -> type:
    return LocalSlot


def is_local_variable(value: Any) -> bool:
    return isinstance(value, LocalSlot)


def read(variable: Any) -> Any:
    return variable.value


def to_numpy(variable: Any) -> np.ndarray:
    return variable.numpy()


def assign(variable: Any, value: Any) -> Any:
    return variable.assign(value)


def assign_add(variable: Any, delta: Any) -> Any:
    return variable.assign_add(delta)


def scatter_add(variable: Any, indices: Any, values: Any) -> Any:
    """``variable[indices] += values`` (duplicates add up)."""
    current = variable.value
    return variable.assign(current.at[jnp.asarray(indices)].add(
        jnp.asarray(values).astype(current.dtype)))


def gather(variable: Any, indices: Any) -> Any:
    return jnp.take(variable.value, jnp.asarray(indices), axis=0)


def outside_trace():
    return contextlib.nullcontext()


def key_words(key: Any) -> Any:
    """The two uint32 key words."""
    return key.value[:2]


def _next_call(counter):
    """The call index ``[low, high]`` (uint32) of this call; the counter moves on by one."""
    current = counter.value
    low = current[0] + jnp.uint32(1)
    high = current[1] + (low == 0).astype(jnp.uint32)
    counter.assign(jnp.stack([low, high]))
    return current


def _call_key(key, counter, salt):
    """A Threefry-2x32 key for this call: the layer's 64-bit secret (``salt`` XOR-ed into
    its high word) with the two words of the call index folded in."""
    call = _next_call(counter)
    words = key_words(key)
    base = jax.random.wrap_key_data(
        jnp.stack([words[0], words[1] ^ jnp.uint32(salt & _MASK32)]), impl="threefry2x32")
    return jax.random.fold_in(jax.random.fold_in(base, call[0]), call[1])


def _static_shape(shape):
    """``shape`` as a tuple of dimensions: ints, or the symbolic dimensions Keras uses
    while it infers a layer's output shape."""
    if hasattr(shape, "shape") and not isinstance(shape, (tuple, list)):  # an array of sizes
        try:
            return tuple(int(d) for d in np.asarray(shape))
        except (TypeError, jax.errors.ConcretizationTypeError):
            raise TypeError(f"On JAX the shape of a noise draw must be static (known when "
                            f"the function is traced); got a traced array {shape!r}.") from None
    return tuple(shape)


def next_words(key: Any, counter: Any, salt: int, shape: Any) -> Any:
    """uint32 words of ``shape``, fresh at every call (the counter advances)."""
    return jax.random.bits(_call_key(key, counter, salt), _static_shape(shape), jnp.uint32)


def next_normal(key: Any, counter: Any, salt: int, shape: Any, dtype: Any) -> Any:
    """Standard normal noise of ``shape``, fresh at every call."""
    dtype = keras.backend.standardize_dtype(dtype)
    noise = jax.random.normal(_call_key(key, counter, salt), _static_shape(shape), jnp.float32)
    return noise.astype(dtype)


def noise_draws(counter: Any) -> int:
    low, high = (int(w) for w in counter.numpy())
    return low | (high << 32)


def counter_for_file(counter: Any) -> np.ndarray:
    """The counter as saved in `.keras` files: ``[draws * 256, 0, 0]`` (int64), as
    TensorFlow saves it, so files move between backends."""
    return np.array([noise_draws(counter) * _SKIP, 0, 0], np.int64)


def load_counter(counter: Any, saved: Any) -> None:
    """Take the larger of the live and the saved counter (never rewind)."""
    saved_draws = int(np.asarray(saved, np.int64).reshape(-1)[0]) // _SKIP
    draws = max(noise_draws(counter), saved_draws)
    counter.assign(np.array([draws & _MASK32, draws >> 32], np.uint32))


def release_totals_variable(owner: Any, value: np.ndarray, merge: Any):
    """The layer's ``release_totals`` in the int32 layout (see release_counter)."""
    return LocalSlot(np.asarray(value, np.int32), "int32", "release_totals")


#: The dtype of counts in traced code (JAX without x64 has no int64).
COUNT_DTYPE = "int32"


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


# The variables of the step being run and the scope holding their current values: `vjp`
# maps every one of them in its own scope (a `keras.StatelessScope` does not read through to
# an enclosing one).
_STEPS: list[tuple[list[Any], Any]] = []


def _in_step(variables, values, fn):
    """``(fn(), new values)``: ``fn`` run in a `keras.StatelessScope` mapping ``variables`` to
    ``values``, with `vjp` able to see them."""
    with keras.StatelessScope(state_mapping=list(zip(variables, values)),
                              collect_losses=True) as scope:
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
    `party_function` or a `VerticalModel` step opened: the other variables'
    updates (random counters, release counts) go back into that step.
    """
    if not _STEPS:
        raise RuntimeError("keras_fedpriv.backend.jax.vjp runs inside party_function or a "
                           "VerticalModel step.")
    step_variables, outer = _STEPS[-1]
    ids = {id(v) for v in variables}
    others = [v for v in step_variables if id(v) not in ids]

    def forward(weights, inputs):
        mapping = list(zip(variables, weights)) + [
            (v, outer.get_current_value(v)) for v in others]
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            outputs, aux = fn(inputs)  # add_loss inside: in this scope (read by `.losses`)
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


def party_function(fn: Callable[..., Any], signature: list[Any],
                   variables: Callable[[], list[Any]]) -> Callable[..., Any]:
    """A party's step, compiled: ``fn(*args)`` as a `jax.jit` function of the values of
    ``variables()`` (every variable it reads or updates) and of ``args``, the new values
    assigned after each call (``signature`` is TensorFlow's; JAX traces once per shape)."""
    del signature
    compiled: dict[tuple[int, ...], Any] = {}

    def call(*args):
        state = list(variables())
        key = tuple(map(id, state))
        if key not in compiled:
            compiled[key] = jax.jit(
                lambda values, args: _in_step(state, values, lambda: fn(*args)))
        out, values = compiled[key]([v.value for v in state], args)
        for v, value in zip(state, values):
            v.assign(value)
        return out

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


def wrap_step_function(function: Callable[..., Any], after: Callable[[Any], Any],
                       reads_state: Callable[[], bool], model: Any) -> Callable[..., Any]:
    """Keras' JAX step function ``function(state, iterator) -> (outputs, state)``, with
    ``after(outputs)`` run on the outputs of every call.

    During JAX's ``fit``/``evaluate``/``predict`` the model's variables do not hold their
    values (the state does). When ``reads_state()``, ``after`` runs in a
    `keras.StatelessScope` that maps the model's trainable and non-trainable variables to
    the new state: what it reads (e.g. a layer's input-error flags) is the value after the
    step.
    """
    variables = []

    def step(state, iterator):
        outputs, state = function(state, iterator)
        if not reads_state():
            return after(outputs), state
        if not variables:  # fixed once the step function exists
            variables.extend(list(model.trainable_variables) + list(model.non_trainable_variables))
        values = list(state[0]) + list(state[1])
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            outputs = after(outputs)
        return outputs, state

    return step


# == end of training steps ==
