"""The TensorFlow implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf
from keras import tree

from keras_fedpriv.backend.private import resource_variable_class

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==

_SKIP = 256  # RngReadAndSkip(delta=1) advances a Philox state by 256 (tests pin this)
_SKIP_BITS = 8  # _SKIP == 2 ** _SKIP_BITS
_PHILOX = 1  # TensorFlow's RNG algorithm id for Philox-4x32-10


class _LocalVariable(resource_variable_class()):
    """A variable built directly, bypassing `tf.distribute`'s creator: one copy
    shared by all replicas, and (not being a `keras.Variable`) no Keras weight."""


class _MonotoneVariable(_LocalVariable):
    """A local variable that a checkpoint restore can only move forward.

    `tf.train.Checkpoint.restore` / ``read`` (and every path built on it)
    assign ``max(live value, saved value)`` elementwise: restoring a file
    saved earlier never rewinds a random counter (which would replay noise
    already sent) or a release count (which would under-count).
    """

    def _restore_from_tensors(self, restored_tensors):
        restored = tf.cast(restored_tensors["VARIABLE_VALUE"], self.dtype)
        return self.assign(tf.maximum(self.read_value(), tf.reshape(restored, self.shape)))


class SecretKeyVariable(_LocalVariable):
    """Key variable whose value is left out of every TensorFlow checkpoint.

    Unless ``keep_when_saved`` (the key came from an explicit seed), it
    serializes as zeros (flag 0 = "no key") and restoring draws a fresh key
    (``fresh_value``, set by the layer).
    """

    keep_when_saved = False

    def _serialize_to_tensors(self):
        if self.keep_when_saved:
            return super()._serialize_to_tensors()
        return {"VARIABLE_VALUE": tf.zeros(self.shape, self.dtype)}

    def _restore_from_tensors(self, restored_tensors):
        if self.keep_when_saved:
            return super()._restore_from_tensors(restored_tensors)
        for hook in self.fresh_key_hooks:  # e.g. the layer's key-generation count
            hook()
        return self.assign(self.fresh_value())


class _FreshKeyAtLoad(tf.saved_model.experimental.TrackableResource):
    """Draws a fresh key for an unseeded ``rng_key`` when a SavedModel is loaded.

    Saved SavedModel resources are initialized by the loader right after the
    variables are restored (``tf.saved_model.load`` runs ``_initialize``
    eagerly; the C++ loader runs it in the model's init op), never inside a
    compiled serving function. A key restored as zeros (flag 0, "no key")
    gets two words from `_nondeterministic_key`, which is OS-entropy seeded
    there; a seeded key (flag 1) is kept.
    """

    def __init__(self, key_variable):
        super().__init__()
        self._key_variable = key_variable
        # Saved with the resource even where no endpoint captures the key.
        self._track_trackable(key_variable, name="key")

    def _create_resource(self):
        # A placeholder handle: the resource exists only for its initializer.
        return tf.raw_ops.VarHandleOp(dtype=tf.int64, shape=[], shared_name="")

    def _initialize(self):
        key = self._key_variable
        value = key.read_value()
        fresh = tf.concat([_nondeterministic_key(), tf.constant([1], tf.int64)], axis=0)
        return key.assign(tf.where(tf.equal(value[2], 0), fresh, value))


def _nondeterministic_key():
    """Two fresh key words from TF's per-kernel OS-entropy seeding (seed=seed2=0).

    Run by `_FreshKeyAtLoad` when a SavedModel is loaded (outside XLA). As a
    last resort `key_words` also uses it if the key is still unset at call
    time (a loader that skipped the init op). This op is NOT a secret source
    under XLA (XLA seeds it deterministically), which is why keys are always
    drawn on the host or at load time.
    """
    return tf.raw_ops.RandomUniformInt(
        shape=[2], minval=tf.constant(1, tf.int64), maxval=tf.constant(2**32, tf.int64),
        seed=0, seed2=0)


def new_key_variable(owner: Any, value: np.ndarray, keep_when_saved: bool, fresh_value: Any):
    """The layer's ``rng_key``: ``value`` = ``[k0, k1, 1]`` (int64).

    Left out of every TensorFlow checkpoint unless ``keep_when_saved``
    (restoring draws ``fresh_value()``), and given a fresh key when a
    SavedModel is loaded (a `_FreshKeyAtLoad` resource kept on ``owner``).
    """
    key = SecretKeyVariable(np.asarray(value, np.int64), trainable=False, name="rng_key")
    key.keep_when_saved = keep_when_saved
    key.fresh_key_hooks = []
    key.fresh_value = fresh_value
    owner._key_at_load = _FreshKeyAtLoad(key)
    return key


def add_fresh_key_hook(key: Any, hook: Any) -> None:
    """Call ``hook()`` whenever a restore gives ``key`` a fresh value."""
    key.fresh_key_hooks.append(hook)


def new_counter_variable(owner: Any):
    """The layer's ``rng_counter``: a Philox state that `next_call` advances atomically."""
    return _MonotoneVariable(np.zeros(3, np.int64), trainable=False, name="rng_counter")


def local_variable(owner: Any, value: Any, name: str, monotone: bool = False,
                   cls: type | None = None):
    """A variable that is not a Keras weight (never in ``get_weights``), shared by all
    replicas; ``monotone``: a checkpoint restore only moves it forward. ``cls``: a
    subclass of `local_variable_class` with its own restore rule."""
    cls = cls or (_MonotoneVariable if monotone else _LocalVariable)
    return cls(np.asarray(value), trainable=False, name=name)


def local_variable_class() -> type:
    """The class of `local_variable`'s variables (to subclass its restore rule)."""
    return _LocalVariable


def is_local_variable(value: Any) -> bool:
    """Whether ``value`` is one of the package's local variables (or any TF variable)."""
    return isinstance(value, tf.Variable)


def read(variable: Any) -> Any:
    """The variable's current value as a tensor (in a trace: the traced value)."""
    return variable.read_value()


def to_numpy(variable: Any) -> np.ndarray:
    """The variable's value on the host."""
    return np.asarray(variable.numpy())


def assign(variable: Any, value: Any) -> Any:
    return variable.assign(tf.cast(value, variable.dtype))


def assign_add(variable: Any, delta: Any) -> Any:
    return variable.assign_add(tf.cast(delta, variable.dtype))


def scatter_add(variable: Any, indices: Any, values: Any) -> Any:
    """``variable[indices] += values`` (duplicates add up), atomic under concurrent calls."""
    return variable.scatter_add(tf.IndexedSlices(tf.cast(values, variable.dtype), indices))


def gather(variable: Any, indices: Any) -> Any:
    return variable.sparse_read(indices)


def outside_trace():
    """A context where variables are created outside any trace (``tf.init_scope``)."""
    return tf.init_scope()


def key_words(key: Any) -> Any:
    """The two key words (int64 tensor (2,)); a fresh key if the key is unset (flag 0)."""
    value = key.read_value()
    return tf.cond(tf.equal(value[2], 0), _nondeterministic_key, lambda: value[:2])


def _next_key_counter(key, counter, salt):
    """Philox key (uint64 (1,)) and a fresh counter (uint64 (2,)) for one call.

    Key: the 64-bit secret with ``salt`` XOR-ed into its high word. Counter:
    ``[0, call index]``; the call index comes from an atomic fetch-and-add on
    the shared counter variable, so concurrent calls and replicas never get
    the same one.
    """
    # The read registers the variable as captured (a raw handle is not), so
    # model.export() tracks it; the read itself is pruned from the graph.
    counter.read_value()
    state = tf.raw_ops.RngReadAndSkip(resource=counter.handle, alg=1,
                                      delta=tf.constant(1, tf.uint64))
    words = tf.cast(key_words(key), tf.int64)
    high = tf.bitwise.bitwise_xor(words[1], tf.constant(salt, tf.int64))
    key64 = tf.bitwise.bitwise_or(words[0], tf.bitwise.left_shift(high, tf.constant(32, tf.int64)))
    # state[0] = calls * 256 (>= 0): a shift, not `// 256`. Under XLA an int64 floor
    # division here made the whole Philox kernel about 10x slower on CPU (the scalar is
    # recomputed in the generator's fused loop); a shift costs nothing there.
    call = tf.bitcast(tf.bitwise.right_shift(state[0], tf.constant(_SKIP_BITS, tf.int64)),
                      tf.uint64)
    return (tf.reshape(tf.bitcast(key64, tf.uint64), [1]),
            tf.stack([tf.constant(0, tf.uint64), call]))


def next_words(key: Any, counter: Any, salt: int, shape: Any) -> Any:
    """uint32 words of ``shape``, fresh at every call (the counter advances)."""
    k, c = _next_key_counter(key, counter, salt)
    return tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=shape, key=k, counter=c, alg=_PHILOX, dtype=tf.uint32)


def next_normal(key: Any, counter: Any, salt: int, shape: Any, dtype: Any) -> Any:
    """Standard normal noise of ``shape``, fresh at every call."""
    k, c = _next_key_counter(key, counter, salt)
    return tf.raw_ops.StatelessRandomNormalV2(
        shape=shape, key=k, counter=c, alg=_PHILOX, dtype=dtype)


def noise_draws(counter: Any) -> int:
    """How many calls drew from ``counter``."""
    return int(counter.numpy()[0]) // _SKIP


def counter_for_file(counter: Any) -> np.ndarray:
    """The counter as saved in `.keras` files: ``[draws * 256, 0, 0]`` (int64), on every
    backend (TensorFlow's Philox state), so files move between backends."""
    return np.asarray(counter.numpy(), np.int64)


def load_counter(counter: Any, saved: Any) -> None:
    """Take the larger of the live and the saved counter (never rewind)."""
    saved = np.asarray(saved, np.int64).reshape(counter.shape)
    counter.assign(np.maximum(counter.numpy(), saved))



class _ReleaseTotalsVariable(_LocalVariable):
    """``release_totals``: a checkpoint restore merges with the layer's ``merge`` rule."""

    def _restore_from_tensors(self, restored_tensors):
        restored = restored_tensors["VARIABLE_VALUE"]
        if not tf.executing_eagerly():  # a graph-mode restore: never rewind, keep the lineage
            restored = tf.cast(tf.reshape(restored, [-1]), tf.int64)
            if restored.shape[0] == self.shape[0] - 1:  # saved before lineages existed
                restored = tf.concat([restored, tf.zeros([1], tf.int64)], 0)
            keep = tf.one_hot(self.shape[0] - 1, self.shape[0], on_value=True, off_value=False)
            live = self.read_value()
            return self.assign(tf.where(keep, live, tf.maximum(live, restored)))
        return self.assign(self.merge(self.numpy(), np.asarray(restored)))


def release_totals_variable(owner: Any, value: np.ndarray, merge: Any):
    """The layer's ``release_totals`` (int64; its last slot the lineage). A checkpoint
    restore assigns ``merge(live, saved)`` (eagerly) or, in a graph, the elementwise
    maximum keeping the live lineage."""
    variable = _ReleaseTotalsVariable(np.asarray(value, np.int64), trainable=False,
                                      name="release_totals")
    variable.merge = merge
    return variable


#: The dtype of counts in traced code (JAX without x64 has no int64).
COUNT_DTYPE = "int64"


# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==


# -- shared by the protection layers --

def is_traced(x: Any) -> bool:
    """Whether ``x`` is symbolic: the layer runs inside a traced function (a
    ``tf.function``, Keras' train step), not eagerly on concrete values."""
    return not tf.executing_eagerly()


# -- embedding / VAE (layers/embedding_dp.py, layers/vae_bottom.py) --

def assert_all_finite(x: Any, message: str) -> Any:
    """``x``, checked in the graph to hold no NaN or inf (an error at run time,
    naming ``message`` only). XLA compiles the check away; the caller must also
    make the output safe where ``x`` is not finite."""
    return tf.debugging.assert_all_finite(x, message)


# -- label DP and example ids (layers/input_checks.py, layers/label_formats.py) --

#: The integer dtype example ids are compared in inside a call: 64-bit on TensorFlow.
EXAMPLE_ID_DTYPE = "int64"


def graph_assert(condition: Any, data: list, summarize: int | None = None) -> Any:
    """A `tf.debugging.Assert` op: when the graph runs and ``condition`` is False
    it raises ``InvalidArgumentError`` with ``data`` (XLA compiles it away, so the
    caller also makes its output safe and counts the event)."""
    return tf.debugging.Assert(condition, data, summarize=summarize)


def run_after(deps: list) -> Any:
    """A context whose operations run only after ``deps`` (the graph's asserts), so a
    failed assert stops the draws and counts of the call (`tf.control_dependencies`: in a
    ``tf.function`` an assert and a variable update are otherwise unordered)."""
    return tf.control_dependencies([d for d in deps if d is not None])


def non_dense_kind(value: Any) -> str | None:
    """What ``value`` is if it is one of TensorFlow's non-dense tensors, else None."""
    if isinstance(value, tf.RaggedTensor):
        return "a tf.RaggedTensor (rows of different lengths)"
    if isinstance(value, tf.SparseTensor):
        return "a tf.SparseTensor (densify it with tf.sparse.to_dense)"
    return None


def signed_example_ids(ids: Any) -> Any:
    """Integer ids as `EXAMPLE_ID_DTYPE`; uint64 ids are reinterpreted (a bijection, so
    distinct ids stay distinct), narrower ones keep their value."""
    if ids.dtype == tf.uint64:
        ids = tf.bitcast(ids, tf.int64)
    return tf.cast(ids, tf.int64)



# == end of input checks ==


# == Philox and mechanisms (mechanisms/) ==

_MASK32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # Philox-4x32 round multipliers
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # Philox-4x32 key increments (Weyl sequence)


def _u32(x):
    return tf.cast(x, tf.uint32)


def mulhilo32(a, b):
    """``(hi, lo)``: the high and low 32 bits of the 64-bit product of uint32 tensors."""
    product = tf.cast(a, tf.uint64) * tf.cast(b, tf.uint64)
    hi = tf.cast(tf.bitwise.right_shift(product, tf.constant(32, tf.uint64)), tf.uint32)
    lo = tf.cast(tf.bitwise.bitwise_and(product, tf.constant(_MASK32, tf.uint64)), tf.uint32)
    return hi, lo


def philox4x32(counter, key, rounds=10):
    """Philox-4x32 on broadcastable uint32 tensors (see `keras_fedpriv.mechanisms.random`).

    Plain TensorFlow integer ops: eager, graphs, XLA and ``tf.data``. Equal
    bit for bit to TensorFlow's own Philox kernel.
    """
    c0, c1, c2, c3 = (_u32(c) for c in counter)
    k0, k1 = (_u32(k) for k in key)
    m0, m1 = (tf.constant(m, tf.uint32) for m in _PHILOX_M)
    w0, w1 = (tf.constant(w, tf.uint32) for w in _PHILOX_W)
    for _ in range(rounds):
        hi0, lo0 = mulhilo32(m0, c0)
        hi1, lo1 = mulhilo32(m1, c2)
        c0, c1, c2, c3 = (
            tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi1, c1), k0),
            lo1,
            tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi0, c3), k1),
            lo0,
        )
        k0 = k0 + w0
        k1 = k1 + w1
    return c0, c1, c2, c3


def _split64(x):
    x = tf.cast(x, tf.int64)
    lo = tf.bitwise.bitwise_and(x, tf.constant(_MASK32, tf.int64))
    hi = tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, tf.constant(32, tf.int64)),
                                tf.constant(_MASK32, tf.int64))
    return _u32(lo), _u32(hi)


def words_from_ids(key_words, ids, salt):
    """Philox of ``(id low, id high, 0, salt)`` under ``key_words`` (int64, shape (2,))."""
    lo, hi = _split64(ids)
    key_words = tf.cast(key_words, tf.int64)
    zeros = tf.zeros_like(lo)
    return philox4x32((lo, hi, zeros, zeros + _u32(salt)), (key_words[0], key_words[1]))


def random_words(shape, seed):
    """Uniform uint32 words of ``shape`` from TensorFlow's stateless Philox kernel.

    ``seed``: two 64-bit integers (an int64 tensor or array of shape (2,)).
    """
    return tf.random.stateless_uniform(shape, seed=seed, minval=None, maxval=None, dtype=tf.uint32)


def seed_from_key(key):
    """The ``seed`` of `random_words` for a 64-bit key: ``[key, 0]`` as int64."""
    key64 = np.array([key], np.uint64).view(np.int64)[0]
    return tf.constant([key64, 0], tf.int64)


def inside_trace():
    """Whether the caller runs inside a traced function (``tf.function``, ``model.fit``,
    ``tf.data``), where a value drawn in Python would be frozen into the graph."""
    return tf.inside_function()


# == end of Philox ==


# == training steps (federated/: VerticalModel, LocalTrainer) ==

# -- horizontal: local training --

def local_training(model: Any, batch_size: int, x_spec: Any, y_spec: Any,
                   bn_variables: Any) -> Any:
    """A client's whole local training as one traced function of a compiled Keras model.

    The returned ``train(global_weights, x, y, order, bn_start)`` sets the
    trainable weights to ``global_weights`` and the BatchNormalization
    statistics ``bn_variables`` to ``bn_start``, resets the optimizer to the
    state it had when this was built, runs the mini-batches of ``batch_size`` rows of
    ``order`` (``len(order) // len(x)`` epochs, the last batch of each epoch
    short) and returns ``(deltas, mean loss, bn_end)``: the per-variable
    float32 updates, the mean of the steps' losses and the final statistics.
    The model keeps the trained state.

    Here: one ``tf.function`` with a dynamic batch dimension, traced once for
    every client and round (``x_spec``, ``y_spec``: ``(shape, dtype)`` of one
    example's features and label).
    """
    opt = model.optimizer
    tv = list(model.trainable_variables)
    if not opt.built:
        opt.build(tv)
    opt_vars = list(opt.variables)
    opt_init = [np.array(v.numpy()) for v in opt_vars]
    bs = batch_size
    bn = list(bn_variables)
    signature = [
        [tf.TensorSpec(v.shape, v.dtype) for v in tv],
        tf.TensorSpec((None,) + tuple(x_spec[0]), tf.as_dtype(x_spec[1])),
        tf.TensorSpec((None,) + tuple(y_spec[0]), tf.as_dtype(y_spec[1])),
        tf.TensorSpec((None,), tf.int32),
        [tf.TensorSpec(v.shape, v.dtype) for v in bn],
    ]

    @tf.function(input_signature=signature)
    def local_train(global_weights, x, y, order, bn_start):
        for v, w in zip(tv, global_weights):
            v.assign(w)
        for v, w in zip(bn, bn_start):
            v.assign(w)
        for v, init in zip(opt_vars, opt_init):
            v.assign(tf.constant(init, dtype=v.dtype))
        n = tf.shape(x)[0]
        batches_per_epoch = (n + bs - 1) // bs
        steps = (tf.shape(order)[0] // n) * batches_per_epoch
        total = tf.constant(0.0, tf.float32)
        for step in tf.range(steps):
            epoch = step // batches_per_epoch
            b = step % batches_per_epoch
            start = epoch * n + b * bs
            stop = epoch * n + tf.minimum((b + 1) * bs, n)
            idx = order[start:stop]
            xb = tf.gather(x, idx)
            yb = tf.gather(y, idx)
            with tf.GradientTape() as tape:
                y_pred = model(xb, training=True)
                loss = model.compute_loss(x=xb, y=yb, y_pred=y_pred, training=True)
                # as Keras' train_step: a LossScaleOptimizer (mixed_float16) or a
                # loss_scale_factor scales the loss here and unscales in apply()
                scaled = opt.scale_loss(loss)
            grads = tape.gradient(scaled, tv)
            opt.apply(grads, tv)
            total += tf.cast(loss, tf.float32)
        deltas = [tf.cast(v, tf.float32) - tf.cast(w, tf.float32)
                  for v, w in zip(tv, global_weights)]
        bn_end = [tf.identity(v) for v in bn]
        return deltas, total / tf.cast(tf.maximum(steps, 1), tf.float32), bn_end

    def train(global_weights, x, y, order, bn_start):
        deltas, loss, bn_end = local_train(list(global_weights), x, y, order, list(bn_start))
        return [d.numpy() for d in deltas], float(loss), [np.array(b) for b in bn_end]

    return train




# -- vertical --
# VerticalModel's steps and the parties' gradients (keras_fedpriv/federated/vertical/: step.py
# and the party halves): a tape per party.


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


def party_function(fn: Callable[..., Any], signature: list[Any],
                   variables: Callable[[], list[Any]]) -> Callable[..., Any]:
    """A party's step, compiled once for any batch size: a `tf.function` with the input
    signature ``signature`` (KerasTensors, batch dimension None; ``variables`` is JAX's)."""
    del variables
    specs = tree.map_structure(
        lambda t: tf.TensorSpec(t.shape, keras.backend.standardize_dtype(t.dtype)), signature)
    return tf.function(fn, input_signature=specs)


def vertical_train_step(model: Any, data: Any) -> dict[str, Any]:
    """One training step of a `VerticalModel` (Keras' ``train_step(data)``): its
    `VerticalStep.train`."""
    return model.protocol_step.train(data)


def vertical_test_step(model: Any, data: Any) -> dict[str, Any]:
    """One evaluation step of a `VerticalModel` (Keras' ``test_step(data)``): its
    `VerticalStep.test`."""
    return model.protocol_step.test(data)


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


def wrap_step_function(function: Callable[..., Any], after: Callable[[Any], Any],
                       reads_state: Callable[[], bool], model: Any) -> Callable[..., Any]:
    """Keras' step function ``function(iterator) -> outputs``, with ``after(outputs)``
    run on what every call returns (the model's variables hold their values: JAX's
    ``reads_state`` and ``model`` are not needed)."""
    del reads_state, model

    def step(iterator):
        return after(function(iterator))

    return step


# == end of training steps ==


# == attacks (attacks/gradient_inversion.py) ==


def value_and_grad(fn):
    """``fn``'s value and its gradients with respect to all its (tensor) arguments, as a
    function of the same arguments; differentiable again (nested tapes)."""
    def value_and_grads(*args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            value = fn(*args)
        return value, tape.gradient(value, args, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return value_and_grads


def compiled(fn):
    """``fn`` as a TensorFlow graph function (``tf.function``)."""
    return tf.function(fn)


def optimizer_step(optimizer, variables, grads_and_aux):
    """A compiled step ``step(*args) -> aux``: ``grads, aux = grads_and_aux(values, *args)``
    at the current values of the Keras variables ``variables``, then one ``optimizer``
    step on them (``optimizer.apply``, in a ``tf.function``)."""
    optimizer.build(variables)

    @tf.function
    def step(*args):
        grads, aux = grads_and_aux([tf.convert_to_tensor(v) for v in variables], *args)
        optimizer.apply(grads, variables)
        return aux

    return step


# == end of attacks ==
