"""Secret-keyed randomness for the layers.

What follows describes the TensorFlow backend; on JAX
(`keras_fedpriv.backend.jax`) the key and counter are Keras variables held in
``SeedGenerator``-like slots, which JAX's functional ``fit`` carries through
``jit`` but which are never among the layer's weights; a `.keras` or
`.weights.h5` file holds the counter only (in TensorFlow's layout, so files
move between backends), there are no TensorFlow checkpoints or SavedModels to
restore a key from, and per-call noise is JAX's Threefry keyed by the secret
and the call index. Every guarantee below that names no TensorFlow-only path
holds on both.

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

from keras_fedpriv.backend import impl
from keras_fedpriv.mechanisms.random import (
    draw_secret,
    seed_to_key_words,
    words_from_ids,
)
from keras_fedpriv.mechanisms.validation import validate_seed

_COUNTER = "rng_counter"


def _key_value(seed):
    """``[k0, k1, 1]`` for ``seed`` (None: a fresh OS-entropy secret)."""
    words = seed_to_key_words(draw_secret() if seed is None else seed)
    return np.array([words[0], words[1], 1], dtype=np.int64)


def local_variable(owner, value, name, monotone=False):
    """A variable of ``owner`` that is no Keras weight (see `keras_fedpriv.backend`).

    Assign the result to an attribute of ``owner`` (a Keras layer): on JAX
    that is what makes the layer carry it through ``fit``. ``monotone``: a
    TensorFlow checkpoint restore only moves it forward.
    """
    return impl().local_variable(owner, value, name, monotone=monotone)


class SecretRandomMixin:
    """Mixin for Keras layers that need secret, replay-proof randomness.

    Subclasses set the class attribute ``_rng_salt`` (separates streams) and
    call ``self._init_rng(seed)`` in ``__init__``.
    """

    _rng_salt = 0

    def _init_rng(self, seed):
        self.seed = validate_seed(seed)
        backend = impl()
        self.rng_key = backend.new_key_variable(self, _key_value(self.seed),
                                                keep_when_saved=self.seed is not None,
                                                fresh_value=lambda: _key_value(None))
        self.rng_counter = backend.new_counter_variable(self)

    def _key_words(self):
        return impl().key_words(self.rng_key)

    def _next_words(self, shape):
        """uint32 words of ``shape``, fresh at every call."""
        return impl().next_words(self.rng_key, self.rng_counter, self._rng_salt, shape)

    def _next_normal(self, shape, dtype):
        """Standard normal noise of ``shape``, fresh at every call."""
        return impl().next_normal(self.rng_key, self.rng_counter, self._rng_salt, shape, dtype)

    @property
    def noise_draws(self):
        """How many per-call noise draws the layer has made (id-keyed draws do not count)."""
        return impl().noise_draws(self.rng_counter)

    def _words_for_ids(self, ids):
        """Four uint32 words per example id, the same in every call and epoch."""
        return words_from_ids(self._key_words(), ids, self._rng_salt)

    # `.keras` / `.weights.h5`: only the counter. An explicit seed's key is
    # re-derived from the config; a secret key is never written. Loading never
    # rewinds the counter (a live layer keeps its key, so a rewound counter
    # would repeat noise it already sent): it takes the larger of the two.
    def save_own_variables(self, store):
        store[_COUNTER] = impl().counter_for_file(self.rng_counter)

    def load_own_variables(self, store):
        if _COUNTER in store:
            impl().load_counter(self.rng_counter, store[_COUNTER])
