"""The JAX implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

import contextlib
import math
import secrets
from typing import Any, Callable

import jax
import jax.numpy as jnp
import keras
import numpy as np

from keras_fedpriv.backend.private import (
    in_stateless_scope,
    reattach_jax_state,
    seed_generator_class,
)

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==

_SKIP = 256  # files hold the counter as TensorFlow's Philox state: [draws * 256, 0, 0]
_MASK32 = 0xFFFFFFFF
_INT32_MAX = 2**31 - 1


#: This process's mask of the secret keys in JAX variables (see `LocalSlot`).
_KEY_MASK = np.frombuffer(secrets.token_bytes(12), np.uint32)


class _SlotVariable(keras.Variable):
    """The Keras variable of a `LocalSlot`: what Keras itself assigns to it never rewinds.

    Keras assigns a model's variables from outside the package's code in
    ``set_state_tree`` (what ``keras.callbacks.OrbaxCheckpoint`` restores
    with) and in its state sync after ``fit``, ``evaluate`` and ``predict``.
    Such an assignment, made on the host, follows the slot's ``rule``:

    * ``"key"``: ignored (the layer keeps its live key, as a TensorFlow
      checkpoint restore gives a fresh one: never an old key);
    * ``"counter"``: the larger of the live and the assigned call count;
    * ``"max"``: elementwise maximum, the ``keep`` positions (a lineage)
      staying as they are;
    * None: assigned as given.

    The package's own code (`LocalSlot.assign`) assigns directly, rewinds
    included (a follower recomputing its forward pass from a snapshot).
    """

    rule: str | None = None
    keep: tuple[int, ...] = ()

    def assign(self, value: Any) -> Any:
        if self.rule is None or in_stateless_scope() or isinstance(value, jax.core.Tracer):
            return super().assign(value)
        try:
            live = np.asarray(self.value)
        except (TypeError, RuntimeError):
            # Keras' JAX trainer purged the value (fit, evaluate and predict carry the state
            # themselves) or donated its buffer to a compiled step: ``value`` is that
            # state, which follows the purged one (the sync at the end of the loop)
            return super().assign(value)
        new = np.asarray(value).astype(live.dtype).reshape(live.shape)
        if self.rule == "key":
            new = live
        elif self.rule == "counter":
            new = live if _draws(live) >= _draws(new) else new
        else:
            merged = np.maximum(live, new)
            if self.keep:
                merged[list(self.keep)] = live[list(self.keep)]
            new = merged
        return super().assign(new)

    def assign_unchecked(self, value: Any) -> Any:
        return super().assign(value)


def _draws(words):
    low, high = (int(w) for w in np.asarray(words).reshape(-1))
    return low | (high << 32)


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

    Keras still lists ``state`` among the model's non-trainable variables, so
    ``model.get_state_tree()`` (and an Orbax checkpoint) holds it. Hence:

    * a secret key is stored XOR-ed with ``_KEY_MASK``, a random mask that
      lives only in this process's memory: the stored words are useless
      outside it (`value`, `numpy` and `assign` unmask and mask);
    * Keras' own assignments never rewind a counter or a count and never
      replace a key (`_SlotVariable`).

    It offers the part of TensorFlow's variable API the package uses
    (``read_value``, ``value``, ``assign``, ``assign_add``, ``numpy``,
    ``shape``, ``dtype``).
    """

    def __init__(self, value: Any, dtype: str, name: str, rule: str | None = None,
                 keep: tuple[int, ...] = (), masked: bool = False) -> None:
        self.name = name  # no super().__init__: a SeedGenerator's (2,) seed is not wanted
        self._initial_seed = None
        self._mask = _KEY_MASK[:np.size(value)].reshape(np.shape(value)) if masked else None
        value = np.asarray(value).astype(dtype)
        with keras.name_scope(name, caller=self):
            self.state = _SlotVariable(self._stored(value), dtype=dtype, trainable=False,
                                       aggregation="none", name=name)
        self.state.rule, self.state.keep = rule, tuple(keep)

    def _stored(self, value):
        return value if self._mask is None else value ^ self._mask.astype(value.dtype)

    def next(self, ordered: bool = True) -> Any:
        raise TypeError(f"{self.name!r} holds a layer's local state; it is no seed generator.")

    def get_config(self) -> dict[str, Any]:
        raise TypeError(f"{self.name!r} holds a layer's local state and is never serialized.")

    @property
    def value(self) -> Any:
        if self._mask is None:
            return self.state.value
        return self.state.value ^ jnp.asarray(self._mask, self.state.dtype)

    def read_value(self) -> Any:
        return self.value

    def assign(self, value: Any) -> Any:
        value = jnp.asarray(value).astype(self.state.dtype).reshape(self.shape)
        self.state.assign_unchecked(self._stored(value))
        return self.value

    def assign_add(self, delta: Any) -> Any:
        return self.assign(self.value + jnp.asarray(delta).astype(self.state.dtype))

    def numpy(self) -> np.ndarray:
        # the JAX array itself: keras.Variable.numpy() goes through an __array__ without
        # numpy 2's `copy` keyword (a DeprecationWarning)
        return np.array(self.value)

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
    return LocalSlot(np.asarray(value, np.int64).astype(np.uint32), "uint32", "rng_key",
                     rule="key", masked=True)


def add_fresh_key_hook(key: Any, hook: Any) -> None:
    """No checkpoint restore replaces a key on JAX: nothing to hook."""


def new_counter_variable(owner: Any):
    """The layer's ``rng_counter``: the number of calls that drew noise, as two uint32
    words ``[low, high]`` (`next_words` carries from low to high)."""
    return LocalSlot(np.zeros(2, np.uint32), "uint32", "rng_counter", rule="counter")


def local_variable(owner: Any, value: Any, name: str, monotone: bool = False,
                   cls: type | None = None):
    """A `LocalSlot` holding ``value`` (int64 stored as int32; ValueError if it does
    not fit). The caller assigns it to an attribute of the owning layer, which makes
    the layer track it. ``monotone``: Keras' own assignments (``set_state_tree``) take
    the elementwise maximum. ``cls`` concerns TensorFlow checkpoints only."""
    value, dtype = _narrow(value)
    return LocalSlot(value, dtype, name, rule="max" if monotone else None)


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
    # Keras' own assignments: elementwise maximum, the lineage (its two parts) kept
    return LocalSlot(np.asarray(value, np.int32), "int32", "release_totals", rule="max",
                     keep=(len(value) - 2, len(value) - 1))


#: The dtype of counts in traced code (JAX without x64 has no int64).
COUNT_DTYPE = "int32"


# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==


# -- shared by the protection layers --

def is_traced(x: Any) -> bool:
    """Whether ``x`` is a JAX tracer: the layer runs inside ``jax.jit`` /
    ``jax.grad`` (Keras' train step), not eagerly on concrete values."""
    return isinstance(x, jax.core.Tracer)


# -- embedding / VAE (layers/embedding_dp.py, layers/vae_bottom.py) --

def assert_all_finite(x: Any, message: str) -> Any:
    """``x`` unchanged: a traced JAX function has no run-time assert (as under
    XLA on TensorFlow), so the caller makes its output safe where ``x`` is not
    finite and counts the event for the host (``message`` is unused)."""
    del message
    return x


# -- label DP and example ids (layers/input_checks.py, layers/label_formats.py) --

#: The integer dtype example ids are compared in inside a call: JAX without
#: ``jax_enable_x64`` has no 64-bit integers.
EXAMPLE_ID_DTYPE = "int32"


def graph_assert(condition: Any, data: list, summarize: int | None = None) -> None:
    """None: traced JAX code has no run-time assert (as under XLA on TensorFlow), so
    the caller makes its output safe where ``condition`` fails and counts the event
    for the host (`InputErrorFlagMixin.check_input_errors`)."""
    del condition, data, summarize


def run_after(deps: list) -> Any:
    """A context that changes nothing: JAX runs a traced function's operations in data
    order and has no asserts to wait for (``deps`` is empty or None entries)."""
    del deps
    return contextlib.nullcontext()


def non_dense_kind(value: Any) -> str | None:
    """What ``value`` is if it is a JAX sparse array, else None."""
    from jax.experimental import sparse

    if isinstance(value, sparse.JAXSparse):
        return f"a {type(value).__name__} sparse array (densify it with .todense())"
    return None


def signed_example_ids(ids: Any) -> Any:
    """Integer ids as `EXAMPLE_ID_DTYPE`; uint32 ids are reinterpreted (a bijection, so
    distinct ids stay distinct), narrower ones keep their value."""
    if ids.dtype == jnp.uint32:
        return jax.lax.bitcast_convert_type(ids, jnp.int32)
    return ids.astype(jnp.int32)



# == end of input checks ==


# == Philox and mechanisms (mechanisms/) ==

_MASK32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # Philox-4x32 round multipliers
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # Philox-4x32 key increments (Weyl sequence)
# TensorFlow's StatelessRandomGetKeyCounter scrambles a seed with one Philox block under this key
_SEED_SCRAMBLE_KEY = (0x3EC8F720, 0x02461E29)


def _on_host(x):
    return isinstance(x, (int, np.integer, np.ndarray, list, tuple))


def _u32(x):
    """``x`` as uint32 words: host integers (up to 64 bits) modulo 2**32, signed 32-bit
    device integers bit-cast."""
    if _on_host(x):
        x = np.asarray(x)
        x = x.astype(np.uint64 if x.dtype == np.uint64 else np.int64)
        return jnp.asarray((x & _MASK32).astype(np.uint32))
    x = jnp.asarray(x)
    if x.dtype == jnp.uint32:
        return x
    if x.dtype == jnp.int32:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    return x.astype(jnp.uint32)


def mulhilo32(a, b):
    """``(hi, lo)``: the high and low 32 bits of the product of uint32 arrays.

    JAX has no uint64 without ``jax_enable_x64``: the product is built from
    16-bit limbs, each partial product exact in uint32.
    """
    a, b = _u32(a), _u32(b)
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = b & 0xFFFF, b >> 16
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    middle = (ll >> 16) + (lh & 0xFFFF) + (hl & 0xFFFF)  # < 3 * 2**16: no overflow
    hi = hh + (lh >> 16) + (hl >> 16) + (middle >> 16)
    lo = (middle << 16) | (ll & 0xFFFF)
    return hi, lo


def philox4x32(counter, key, rounds=10):
    """Philox-4x32 on broadcastable uint32 arrays, in 32-bit integer ops (jit, no x64).

    Equal bit for bit to the TensorFlow implementation and to TensorFlow's kernel.
    """
    c0, c1, c2, c3 = (_u32(c) for c in counter)
    k0, k1 = (_u32(k) for k in key)
    m0, m1 = (jnp.uint32(m) for m in _PHILOX_M)
    w0, w1 = (jnp.uint32(w) for w in _PHILOX_W)
    for _ in range(rounds):
        hi0, lo0 = mulhilo32(m0, c0)
        hi1, lo1 = mulhilo32(m1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = k0 + w0, k1 + w1
    return c0, c1, c2, c3


def _split_ids(ids):
    """``(low, high)`` uint32 words of integer ids: 64-bit host ids exactly, 32-bit device
    ids sign-extended (as TensorFlow's int64 cast does)."""
    if _on_host(ids):
        ids = np.asarray(ids).astype(np.int64)
        return _u32(ids), _u32(ids >> 32)
    ids = jnp.asarray(ids)
    if jnp.issubdtype(ids.dtype, jnp.signedinteger):
        return _u32(ids.astype(jnp.int32)), _u32((ids >> (8 * ids.dtype.itemsize - 1))
                                                 .astype(jnp.int32))
    return _u32(ids), jnp.zeros(ids.shape, jnp.uint32)


def words_from_ids(key_words, ids, salt):
    """Philox of ``(id low, id high, 0, salt)`` under ``key_words`` (shape (2,), uint32 or
    int32 on the device, or 64-bit integers on the host)."""
    lo, hi = _split_ids(ids)
    key_words = _u32(key_words)
    zeros = jnp.zeros_like(lo)
    return philox4x32((lo, hi, zeros, zeros + jnp.uint32(salt)), (key_words[0], key_words[1]))


def random_words(shape, seed):
    """Uniform uint32 words of ``shape``, the same words as TensorFlow's
    ``stateless_uniform(shape, seed, dtype=uint32)``.

    ``seed``: two 64-bit integers on the host (shape (2,)), or their four
    uint32 words ``(low 0, high 0, low 1, high 1)`` as an array (in ``jit``).
    As TensorFlow does, the seed is scrambled by one Philox block into a key
    and the high counter words; word ``4 i + j`` is word ``j`` of Philox at
    counter ``(i, 0, ...)``.
    """
    if _on_host(seed) and np.shape(seed) == (2,):
        seed = np.asarray(seed).astype(np.int64)
        seed = np.stack([seed, seed >> 32], axis=-1).reshape(-1)  # low 0, high 0, low 1, high 1
    seed = _u32(seed)
    if seed.shape != (4,):
        raise ValueError(f"`seed` must be two 64-bit integers or four uint32 words; got shape "
                         f"{tuple(seed.shape)}.")
    mix = philox4x32(tuple(seed[i] for i in range(4)), _SEED_SCRAMBLE_KEY)
    shape = tuple(int(d) for d in shape)
    size = math.prod(shape)
    blocks = -(-size // 4)
    index = jnp.arange(blocks, dtype=jnp.uint32)
    zeros = jnp.zeros_like(index)
    out = philox4x32((index, zeros, zeros + mix[2], zeros + mix[3]), (mix[0], mix[1]))
    return jnp.stack(out, axis=-1).reshape(-1)[:size].reshape(shape)


def seed_from_key(key):
    """The ``seed`` of `random_words` for a 64-bit key: ``[key, 0]`` as four uint32 words."""
    return np.array([key & _MASK32, (key >> 32) & _MASK32, 0, 0], np.uint32)


def inside_trace():
    """Whether the caller runs inside a JAX trace (``jit``, Keras' compiled ``fit``), where
    a value drawn in Python would be frozen into the compiled function."""
    return isinstance(jnp.zeros(()), jax.core.Tracer)


# == end of Philox ==


# == training steps (federated/: VerticalModel, LocalTrainer) ==

# -- horizontal: local training --

def local_training(model: Any, batch_size: int, x_spec: Any, y_spec: Any,
                   bn_variables: Any) -> Any:
    """A client's whole local training with a compiled Keras model (the contract:
    `keras_fedpriv.backend.tensorflow.local_training`).

    Here: one ``jax.jit``-compiled, stateless training step (Keras'
    ``StatelessScope`` around the forward pass and the loss,
    ``jax.value_and_grad``, ``optimizer.stateless_apply``) run over the
    mini-batches from the host; the model's whole state (weights,
    BatchNormalization statistics, random-generator states, optimizer) is
    carried through the steps and written back at the end (after an error too:
    random states and release counters never go back). A step is compiled
    once per batch shape: the full batch and each distinct short last batch.
    """
    del x_spec, y_spec  # every batch shape is compiled on first use
    opt = model.optimizer
    tv_refs = list(model.trainable_variables)
    if not opt.built:
        opt.build(tv_refs)
    ntv_refs = list(model.non_trainable_variables)
    opt_refs = list(opt.variables)
    opt_init = [np.array(v.numpy()) for v in opt_refs]
    bn_at = [next(i for i, r in enumerate(ntv_refs) if r is v) for v in bn_variables]

    def loss_and_state(tv, ntv, ov, xb, yb):
        mapping = list(zip(tv_refs, tv)) + list(zip(ntv_refs, ntv)) + list(zip(opt_refs, ov))
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            y_pred = model(xb, training=True)
            loss = model.compute_loss(x=xb, y=yb, y_pred=y_pred, training=True)
            # as Keras' train_step: a LossScaleOptimizer or a loss_scale_factor
            # scales the loss here and unscales in stateless_apply()
            scaled = opt.scale_loss(loss)
        return scaled, (loss, [scope.get_current_value(v) for v in ntv_refs])

    @jax.jit
    def step(state, xb, yb):
        tv, ntv, ov = state
        (_, (loss, ntv)), grads = jax.value_and_grad(loss_and_state, has_aux=True)(
            tv, ntv, ov, xb, yb)
        tv, ov = opt.stateless_apply(ov, grads, tv)
        return (tv, ntv, ov), loss.astype("float32")

    def train(global_weights, x, y, order, bn_start):
        ntv = [v.value for v in ntv_refs]
        for i, w in zip(bn_at, bn_start):
            ntv[i] = np.asarray(w, ntv_refs[i].dtype)
        state = ([np.asarray(w, v.dtype) for v, w in zip(tv_refs, global_weights)], ntv,
                 [np.asarray(o, v.dtype) for v, o in zip(opt_refs, opt_init)])
        n = len(x)
        starts = [(e * n + b, e * n + min(b + batch_size, n))
                  for e in range(len(order) // n) for b in range(0, n, batch_size)]
        losses = []
        try:
            for start, stop in starts:
                idx = order[start:stop]
                state, loss = step(state, x[idx], y[idx])
                losses.append(loss)
        finally:  # even after an error: random states and counters never go back
            for refs, values in zip((tv_refs, ntv_refs, opt_refs), state):
                for v, value in zip(refs, values):
                    v.assign(value)
        deltas = [np.asarray(v, np.float32) - np.asarray(w, np.float32)
                  for v, w in zip(state[0], global_weights)]
        total = float(np.sum(np.asarray(jax.device_get(losses), np.float32)))
        return deltas, total / max(len(starts), 1), [np.array(state[1][i]) for i in bn_at]

    return train




# -- vertical --
# VerticalModel's steps (keras_fedpriv/federated/vertical/step.py): Keras' JAX trainer passes
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
    assigned after each call (``signature`` is TensorFlow's; JAX traces once per shape).

    The values' buffers are donated to the step (updated in place, as in Keras' own
    trainer): a large state (a per-example count table) costs no copy per call."""
    del signature
    compiled: dict[tuple[int, ...], Any] = {}

    def call(*args):
        state = list({id(v): v for v in variables()}.values())  # a buffer is donated once
        key = tuple(map(id, state))
        if key not in compiled:
            compiled[key] = jax.jit(
                lambda values, args: _in_step(state, values, lambda: fn(*args)),
                donate_argnums=0)
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
    return _functional_step(model, groups, state, lambda: model.protocol_step.train(data))


def vertical_test_step(model: Any, state: Any, data: Any) -> tuple[dict[str, Any], Any]:
    """One evaluation step of a `VerticalModel` (Keras' JAX ``test_step(state, data)``)."""
    groups = [model.trainable_variables, model.non_trainable_variables,
              model.metrics_variables]
    return _functional_step(model, groups, state, lambda: model.protocol_step.test(data))


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

    A step that raises gives the model its variables' values back (Keras would leave them
    empty): the state before it when the step itself raised (a refusal while tracing), the
    state after it when ``after`` raised (the step ran: its releases stay counted).
    """
    variables = []

    def step(state, iterator):
        try:
            outputs, new_state = function(state, iterator)
        except BaseException:
            reattach_jax_state(model, state)
            raise
        return checked(outputs, new_state), new_state

    def checked(outputs, state):
        if not reads_state():
            scope = contextlib.nullcontext()
        else:
            if not variables:  # fixed once the step function exists
                variables.extend(list(model.trainable_variables)
                                 + list(model.non_trainable_variables))
            values = list(state[0]) + list(state[1])
            scope = keras.StatelessScope(state_mapping=list(zip(variables, values)))
        try:
            with scope:
                return after(outputs)
        except BaseException:
            reattach_jax_state(model, state)
            for variable in variables if reads_state() else ():
                variable.assign(scope.get_current_value(variable))  # what `after` wrote
            raise

    return step


# == end of training steps ==


# == attacks (attacks/gradient_inversion.py) ==


def value_and_grad(fn):
    """``fn``'s value and its gradients with respect to all its (array) arguments, as a
    function of the same arguments; differentiable again."""
    def value_and_grads(*args):
        return jax.value_and_grad(fn, argnums=tuple(range(len(args))))(*args)
    return value_and_grads


def compiled(fn):
    """``fn`` compiled with ``jax.jit``."""
    return jax.jit(fn)


def optimizer_step(optimizer, variables, grads_and_aux):
    """A compiled step ``step(*args) -> aux``: ``grads, aux = grads_and_aux(values, *args)``
    at the current values of the Keras variables ``variables``, then one ``optimizer``
    step on them (``optimizer.stateless_apply`` under ``jax.jit``; the new values are
    written back into the variables and the optimizer's own)."""
    optimizer.build(variables)

    @jax.jit
    def pure(values, optimizer_values, *args):
        grads, aux = grads_and_aux(values, *args)
        values, optimizer_values = optimizer.stateless_apply(optimizer_values, grads, values)
        return values, optimizer_values, aux

    def step(*args):
        values, optimizer_values, aux = pure([v.value for v in variables],
                                             [v.value for v in optimizer.variables], *args)
        for variable, value in zip(list(variables) + list(optimizer.variables),
                                   list(values) + list(optimizer_values)):
            variable.assign(value)
        return aux

    return step


# == end of attacks ==
