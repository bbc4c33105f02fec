"""Secret-keyed randomness for the layers.

Every randomized layer owns two variables. Neither is a Keras weight, so
``model.get_weights()`` / ``set_weights()`` (the usual way FL code exchanges
weights) never carry them, and both are single variables shared by all
replicas (created directly, not through `tf.distribute`'s variable creator):

* ``rng_key`` (`SecretKeyVariable`): ``[k0, k1, 1]``, two uint32 Philox key
  words (64 bits) from OS entropy or from the user's explicit ``seed=``, and
  a "set" flag. Without ``seed=`` the key is **never saved**: `.keras`
  files and `.weights.h5` omit it, and TensorFlow checkpoints
  (`tf.train.Checkpoint`, `model.export()` SavedModels) store zeros because
  the variable itself overrides its serialization, which every saving path
  goes through. A reloaded Keras layer draws a fresh key. A SavedModel
  draws one at load time: each layer carries a `_FreshKeyAtLoad` resource
  whose initializer, which `tf.saved_model.load` (and TF Serving's init op)
  runs once after restoring the variables and outside any XLA cluster, sets
  a key from TensorFlow's OS-entropy kernel seeding. So every load (every
  serving process) has its own key, compiled serving functions included,
  and neither `keras.utils.set_random_seed` nor a checkpoint replays the
  noise.
* ``rng_counter``: a Philox state advanced atomically by `RngReadAndSkip`
  at every draw, so concurrent calls (a parallel `tf.data` map, replicas)
  never get the same counter, hence never the same noise.

Noise is either keyed by example id (same id -> same noise in every epoch) or
by call: TensorFlow's stateless Philox kernel (the V2 ops, which take key and
counter directly) runs with the 64-bit key (the layer's salt XOR-ed into its
high word) and the 128-bit counter ``[0, call index]``: element blocks count
up in the low word, so distinct calls never share a stream. (The V1
``tf.random.stateless_*`` ops with a seed computed in the graph cost ~10 ms
per call under XLA on CPU; the V2 ops cost nothing measurable.)
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from keras_fedpriv.mechanisms.random import (
    draw_secret,
    seed_to_key_words,
    words_from_ids,
)
from keras_fedpriv.mechanisms.validation import validate_seed

_COUNTER = "rng_counter"
_SKIP = 256  # RngReadAndSkip(delta=1) advances a Philox state by 256 (tests pin this)
_PHILOX = 1  # TensorFlow's RNG algorithm id for Philox-4x32-10


def _key_value(seed):
    """``[k0, k1, 1]`` for ``seed`` (None: a fresh OS-entropy secret)."""
    words = seed_to_key_words(draw_secret() if seed is None else seed)
    return np.array([words[0], words[1], 1], dtype=np.int64)


class _LocalVariable(resource_variable_ops.ResourceVariable):
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
    serializes as zeros (flag 0 = "no key") and restoring draws a fresh key.
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
        return self.assign(_key_value(None))


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
    last resort `_key_words` also uses it if the key is still unset at call
    time (a loader that skipped the init op). This op is NOT a secret source
    under XLA (XLA seeds it deterministically), which is why keys are always
    drawn on the host or at load time.
    """
    return tf.raw_ops.RandomUniformInt(
        shape=[2], minval=tf.constant(1, tf.int64), maxval=tf.constant(2**32, tf.int64),
        seed=0, seed2=0)


class SecretRandomMixin:
    """Mixin for Keras layers that need secret, replay-proof randomness.

    Subclasses set the class attribute ``_rng_salt`` (separates streams) and
    call ``self._init_rng(seed)`` in ``__init__``.
    """

    _rng_salt = 0

    def _init_rng(self, seed):
        self.seed = validate_seed(seed)
        self.rng_key = SecretKeyVariable(_key_value(self.seed), trainable=False, name="rng_key")
        self.rng_key.keep_when_saved = self.seed is not None
        self.rng_key.fresh_key_hooks = []
        self._key_at_load = _FreshKeyAtLoad(self.rng_key)
        self.rng_counter = _MonotoneVariable(np.zeros(3, np.int64), trainable=False,
                                             name=_COUNTER)

    def _key_words(self):
        key = self.rng_key.read_value()
        return tf.cond(tf.equal(key[2], 0), _nondeterministic_key, lambda: key[:2])

    def _next_key_counter(self):
        """Philox key (uint64 (1,)) and a fresh counter (uint64 (2,)) for one call.

        Key: the 64-bit secret with ``_rng_salt`` XOR-ed into its high word.
        Counter: ``[0, call index]``; the call index comes from an atomic
        fetch-and-add on the shared counter variable, so concurrent calls and
        replicas never get the same one.
        """
        # The read registers the variable as captured (a raw handle is not), so
        # model.export() tracks it; the read itself is pruned from the graph.
        self.rng_counter.read_value()
        state = tf.raw_ops.RngReadAndSkip(resource=self.rng_counter.handle, alg=1,
                                          delta=tf.constant(1, tf.uint64))
        key = tf.cast(self._key_words(), tf.int64)
        high = tf.bitwise.bitwise_xor(key[1], tf.constant(self._rng_salt, tf.int64))
        key64 = tf.bitwise.bitwise_or(key[0], tf.bitwise.left_shift(high, tf.constant(32, tf.int64)))
        call = tf.bitcast(state[0] // _SKIP, tf.uint64)
        return (tf.reshape(tf.bitcast(key64, tf.uint64), [1]),
                tf.stack([tf.constant(0, tf.uint64), call]))

    def _next_words(self, shape):
        """uint32 words of ``shape``, fresh at every call."""
        key, counter = self._next_key_counter()
        return tf.raw_ops.StatelessRandomUniformFullIntV2(
            shape=shape, key=key, counter=counter, alg=_PHILOX, dtype=tf.uint32)

    def _next_normal(self, shape, dtype):
        """Standard normal noise of ``shape``, fresh at every call."""
        key, counter = self._next_key_counter()
        return tf.raw_ops.StatelessRandomNormalV2(
            shape=shape, key=key, counter=counter, alg=_PHILOX, dtype=dtype)

    @property
    def noise_draws(self):
        """How many per-call noise draws the layer has made (id-keyed draws do not count)."""
        return int(self.rng_counter.numpy()[0]) // _SKIP

    def _words_for_ids(self, ids):
        """Four uint32 words per example id, the same in every call and epoch."""
        return words_from_ids(self._key_words(), ids, self._rng_salt)

    # `.keras` / `.weights.h5`: only the counter. An explicit seed's key is
    # re-derived from the config; a secret key is never written. Loading never
    # rewinds the counter (a live layer keeps its key, so a rewound counter
    # would repeat noise it already sent): it takes the larger of the two.
    def save_own_variables(self, store):
        store[_COUNTER] = np.asarray(self.rng_counter.numpy())

    def load_own_variables(self, store):
        if _COUNTER in store:
            saved = np.asarray(store[_COUNTER], np.int64).reshape(self.rng_counter.shape)
            self.rng_counter.assign(np.maximum(self.rng_counter.numpy(), saved))
