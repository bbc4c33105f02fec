"""Secret-keyed randomness for the layers (ALGORITHMS.md section 0).

Every randomized layer owns two variables:

* ``rng_key``: two uint32 Philox key words (64 bits) from OS entropy, or from
  the user's explicit ``seed=``. Without ``seed=`` the key is **never
  saved**: `.keras` files, `.weights.h5`, `tf.train.Checkpoint` and
  `model.export()` SavedModels hold zeros in its place, and a reloaded layer
  draws a fresh key (a Keras layer on the host from `secrets`; a bare
  SavedModel, where no Python runs, from TensorFlow's nondeterministic kernel
  seeding at each call). So neither `keras.utils.set_random_seed` nor a
  checkpoint lets anyone replay the noise.
* ``rng_counter``: how many noise draws the layer has made; it makes
  consecutive calls independent and is harmless without the key.

Noise is either keyed by example id (same id -> same noise in every epoch) or
by (counter, replica id), so replicas under `tf.distribute` never share noise.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from keras_fedpriv.mechanisms.random import (
    derive_seed,
    draw_secret,
    random_words,
    seed_to_key_words,
    words_from_ids,
)
from keras_fedpriv.mechanisms.validation import validate_seed

_KEY = "rng_key"
_COUNTER = "rng_counter"


class SecretKeyVariable(keras.Variable):
    """A `keras.Variable` whose value is left out of every checkpoint.

    When ``keep_when_saved`` is False, TensorFlow checkpoints (used by
    `tf.train.Checkpoint` and by SavedModel export) store zeros instead of
    the value, and restoring draws a fresh secret instead of reading it.
    """

    keep_when_saved = False

    def _serialize_to_tensors(self):
        if self.keep_when_saved:
            return super()._serialize_to_tensors()
        return {"VARIABLE_VALUE": tf.zeros_like(self.value)}

    def _restore_from_tensors(self, restored_tensors):
        if self.keep_when_saved:
            return super()._restore_from_tensors(restored_tensors)
        return self.value.assign(seed_to_key_words(draw_secret()))


def _nondeterministic_key():
    """Two fresh key words from TF's per-kernel OS-entropy seeding (seed=seed2=0).

    Only reached in a reloaded SavedModel, whose saved key is zeros. This op
    is NOT a secret source under XLA (XLA seeds it deterministically), which
    is why Keras layers always carry a host-drawn key and never take this
    branch in training.
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
        explicit = self.seed is not None
        key = seed_to_key_words(self.seed if explicit else draw_secret())
        self.rng_key = SecretKeyVariable(
            initializer=lambda shape=None, dtype=None: tf.constant(key, tf.int64),
            shape=(2,), dtype="int64", trainable=False,
            aggregation="only_first_replica", name=_KEY)
        self.rng_key.keep_when_saved = explicit
        self.rng_counter = keras.Variable(
            initializer=lambda shape=None, dtype=None: tf.constant(0, tf.int64),
            shape=(), dtype="int64", trainable=False,
            aggregation="only_first_replica", name=_COUNTER)

    def _key_words(self):
        key = tf.convert_to_tensor(self.rng_key.value)
        unset = tf.reduce_all(tf.equal(key, 0))
        return tf.cond(unset, _nondeterministic_key, lambda: key)

    def _next_words(self, shape):
        """uint32 words of ``shape``, fresh at every call (counter and replica keyed)."""
        counter = tf.convert_to_tensor(self.rng_counter.value)
        self.rng_counter.assign_add(tf.constant(1, tf.int64))
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group if context is not None else 0
        seed = derive_seed(self._key_words(), counter, replica, self._rng_salt)
        return random_words(shape, seed)

    def _words_for_ids(self, ids):
        """Four uint32 words per example id, the same in every call and epoch."""
        return words_from_ids(self._key_words(), ids, self._rng_salt)

    # `.keras` / `.weights.h5`: the key is stored only when it was given.
    def save_own_variables(self, store):
        store[_COUNTER] = np.asarray(self.rng_counter.numpy())
        if self.seed is not None:
            store[_KEY] = np.asarray(self.rng_key.numpy())

    def load_own_variables(self, store):
        if _COUNTER in store:
            self.rng_counter.assign(np.asarray(store[_COUNTER]))
        if self.seed is not None and _KEY in store:
            self.rng_key.assign(np.asarray(store[_KEY]))
        # Without an explicit seed the key drawn at construction is kept:
        # a reloaded layer has a fresh secret.
