"""Randomness for the mechanisms: secret keys and a keyed counter-based RNG.

Why not `keras.random`: Keras casts every seed to int32
(`keras/src/backend/tensorflow/random.py::_cast_seed`), so a `SeedGenerator`
carries at most ~31 bits of secret, and `SeedGenerator(None)` seeds itself
from Python's global `random` (predictable after
`keras.utils.set_random_seed`). We want a secret of
64 bits or more drawn from OS entropy, so the randomness here is keyed by a
64-bit secret and generated with Philox-4x32-10 (Salmon et al. 2011, the
counter-based generator TensorFlow itself uses):

* `philox4x32` is a vectorized Philox in integer ops, one implementation
  per Keras backend (`keras_fedpriv.backend`): TensorFlow ops (eager, graphs,
  XLA with ``jit_compile=True``, ``tf.data``) and JAX ops in 32-bit integers
  only (``jit``, no ``jax_enable_x64``). It serves to key noise by *example
  id* (same id, same noise, in every epoch) and to derive per-call seeds.
  Both are tested bit for bit against Random123's known answers and
  TensorFlow's own Philox kernel.
* `random_words` draws uint32 words for a whole tensor: TensorFlow's
  stateless kernel with a 128-bit seed (on JAX the same words, by Philox on
  a counter).

All mechanisms consume uniform uint32 "noise words" and compare them with
integer thresholds (`probability_threshold`), so probabilities are exact to
2**-32 and no float rounding enters the privacy-critical comparisons.
"""

from __future__ import annotations

import math
import secrets
import zlib
from typing import Any, Mapping, Sequence

import numpy as np
from keras import ops

from keras_fedpriv import backend
from keras_fedpriv.mechanisms.ledger import ReleaseLedger
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed

__all__ = [
    "draw_secret",
    "philox4x32",
    "probability_threshold",
    "random_words",
    "secret_generator",
    "SeededReleases",
    "words_from_ids",
    "seed_to_key_words",
    "uniform_words",
    "words_below",
]

_MASK32 = 0xFFFFFFFF


def draw_secret() -> int:
    """A fresh non-zero 64-bit secret from OS entropy (`secrets`)."""
    while True:
        value = secrets.randbits(64)
        if value & _MASK32 and value >> 32:  # both key words non-zero
            return value


_STREAM_TAG = 0x5EED5173  # separates (seed, stream) entropy from a plain int seed


_UNIT_TAG = 0x0C11E175  # separates (seed, unit, n) entropy from (seed, stream)
_FORK_TAG = 0x0F0C4ED5  # separates a forked copy's streams from the original's


def secret_generator(seed: int | None = None, stream: int | None = None, unit: int | None = None,
                     tag: int = 0, fork: int = 0) -> np.random.Generator:
    """A numpy Generator keyed by ``seed``, or by a fresh 64-bit OS-entropy secret.

    For the mechanisms that run on the host in numpy (SignDS, Laplace,
    clip+Gaussian, MagRR's reports, auditing): never numpy's global RNG.

    Args:
        seed: None (a fresh secret from OS entropy; ``stream`` is then
            ignored) or a non-negative int < 2**64.
        stream: None, or the index n >= 0 of a release: the generator of
            the n-th release is a pure function of ``(seed, n)`` (entropy
            ``[seed, n]`` as fixed-width 32-bit words plus a tag, so no two
            pairs collide). A seeded mechanism that keeps ``n`` in its state
            continues its stream after a restore instead of replaying it
            (`SeededReleases`).
        unit: None, or an integer id >= 0 (a client): with ``stream`` n, the
            generator of that unit's n-th release, a pure function of
            ``(seed, unit, n)``. A client's releases then draw the same noise
            whether one object serves every client in one process or each
            client runs its own copy on its own machine.
        tag: with ``unit``, a 32-bit number naming the mechanism, so two
            mechanisms given the same seed never share a stream.
        fork: with ``stream``, 0 (the seed's own streams) or a 64-bit id of a
            copy of a seeded object: its streams then share nothing with the
            original's (`SeededReleases`: a copy never replays the original).

    Returns:
        A `numpy.random.Generator`.
    """
    seed = validate_seed(seed)
    if seed is None:
        return np.random.default_rng(draw_secret())
    if stream is None:
        return np.random.default_rng(seed)
    stream = validate_seed(stream, "stream")
    fork = validate_seed(fork, "fork")
    extra = [fork & _MASK32, fork >> 32, _FORK_TAG] if fork else []
    if unit is not None:
        unit = validate_seed(unit, "unit")
        return np.random.default_rng([seed & _MASK32, seed >> 32, unit & _MASK32, unit >> 32,
                                      stream & _MASK32, stream >> 32, int(tag) & _MASK32,
                                      _UNIT_TAG] + extra)
    return np.random.default_rng([seed & _MASK32, seed >> 32, stream & _MASK32, stream >> 32,
                                  _STREAM_TAG] + extra)


class SeededReleases:
    """Mixin: the n-th release of a seeded host-side mechanism uses ``secret_generator(seed, n)``.

    The host class sets ``self.seed`` and calls `_init_releases` in its
    constructor; each release calls `_release_generator`. ``num_releases``
    (n) is part of the class's ``state_dict``, so an object restored with
    ``load_state_dict`` continues the stream with new noise. An object
    rebuilt with ``from_config`` alone from a seeded config would restart at
    n = 0 and replay the original's noise (XOR-ing or subtracting two
    releases of the same data would cancel it), so it refuses to release
    until ``load_state_dict`` is called. Unseeded objects draw a fresh
    OS-entropy secret per release and never need state.

    Nothing rewinds a stream or a count:

    * a copy (``copy.copy``, ``copy.deepcopy``, ``pickle``) of a seeded
      object is a *fork*: it keeps the original's counts and ledger, and
      draws its own releases from streams keyed by a fresh random fork id,
      so the copy and the original never draw the same noise;
    * ``load_state_dict`` makes the object the continuation of the object
      whose state it loads (its counts, ledger and fork id). It refuses a
      state behind what this object has already released (any client's
      count lower than the live one), and a state without the per-client
      counts (``releases_by_unit``) for a seeded object.

    The checkpoint steps live here once for every host: `from_config`,
    `state_dict` and `load_state_dict`. A host with state of its own (a
    server estimate, evaluation counters) adds it with two hooks:
    ``_own_state()`` (its JSON-safe entries of `state_dict`) and
    ``_parse_own_state(state)`` (validate them and return the attributes to
    set, changing nothing). `load_state_dict` validates the whole state
    before it changes anything, so a refused state leaves the object as it
    was.

    Example:
        >>> class Noisy(SeededReleases):
        ...     def __init__(self, seed=None):
        ...         self.seed = seed
        ...         self._init_releases()
        ...     def get_config(self):
        ...         return {"seed": self.seed}
        ...     def release(self, x):
        ...         return x + self._release_generator().normal()
        >>> a = Noisy(seed=3); _ = a.release(0.0)
        >>> b = Noisy.from_config(a.get_config())  # refuses to release ...
        >>> b.load_state_dict(a.state_dict())       # ... until it continues a's stream
    """

    def _init_releases(self):
        self.num_releases = 0
        self.releases_by_unit = {}  # unit id -> its releases so far (unit-keyed streams)
        self._awaiting_state = False
        self._fork = 0
        self._ledger = ReleaseLedger()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Any:
        """Rebuild from ``get_config``; a seeded copy releases only after `load_state_dict`."""
        restored = cls(**config)
        restored._mark_restored_from_config()
        return restored

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs, no randomness: the host's own entries, ``num_releases``
        and ``releases_by_unit`` (the stream positions), the fork id of a copy, and the
        release ``ledger``."""
        return {**self._own_state(), **self._releases_state(), "ledger": self._ledger.to_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict`: this object continues the stream of the one that wrote it.

        Raises:
            TypeError: ``state`` is not a dict.
            ValueError: a missing or bad entry, a state behind this object's
                releases (its counts, or a ledger with fewer records than this
                object's), or no ``num_releases`` for a seeded copy rebuilt by
                `from_config`. Nothing is changed then.
        """
        if not isinstance(state, dict):
            raise TypeError(f"`state` must be a dict from {type(self).__name__}.state_dict(); "
                            f"got {type(state).__name__}.")
        own = self._parse_own_state(state)
        ledger = ReleaseLedger.from_dict(state["ledger"]) if "ledger" in state else None
        self._load_num_releases(state, ledger)  # the last checks, and the first change
        for name, value in own.items():
            setattr(self, name, value)
        if ledger is not None:
            self._ledger = ledger

    def _own_state(self) -> dict[str, Any]:
        """The host's own JSON-safe `state_dict` entries (none by default)."""
        return {}

    def _parse_own_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """Validate the host's own entries of ``state``; the attributes to set (none here)."""
        return {}

    def __setstate__(self, state):
        # copy.copy, copy.deepcopy and pickle all restore through here
        self.__dict__.update(state)
        if getattr(self, "seed", None) is not None:
            self._fork = draw_secret()

    def _mark_restored_from_config(self):
        """Called by ``from_config``: a seeded copy must get its state before releasing."""
        self._awaiting_state = self.seed is not None

    def _release_generator(self, unit=None):
        """The generator of the next release (and count it).

        Args:
            unit: None (the object's own stream), or the id of the client the
                release is about: a seeded object then draws from that
                client's own stream, ``secret_generator(seed, n_c, unit=c)``
                with ``n_c`` the client's releases so far, so the noise of a
                client's release does not depend on which other clients this
                object served before (the in-process and the per-client
                runtimes agree).
        """
        if getattr(self, "_awaiting_state", False):
            raise RuntimeError(
                f"This seeded {type(self).__name__} was rebuilt from its config without its "
                f"state: its noise stream would restart at release 0 and replay the original's "
                f"noise. Call load_state_dict(original.state_dict()) first (it carries the "
                f"release counter), or construct it with a new seed (or seed=None).")
        if self.seed is None:
            rng = secret_generator(None)
        elif unit is None:
            rng = secret_generator(self.seed, stream=self.num_releases, fork=self._fork_id())
        else:
            unit = validate_seed(unit, "client_id")
            n = self.releases_by_unit.get(unit, 0)
            # the class name in the entropy: a SignDS encoder and a MagRR given the same
            # seed draw from different streams
            tag = zlib.crc32(type(self).__name__.encode())
            rng = secret_generator(self.seed, stream=n, unit=unit, tag=tag, fork=self._fork_id())
            self.releases_by_unit[unit] = n + 1
        self.num_releases += 1
        return rng

    def _fork_id(self):
        return getattr(self, "_fork", 0)

    def _releases_state(self):
        """The JSON-safe stream positions for ``state_dict``."""
        state = {"num_releases": int(self.num_releases),
                 "releases_by_unit": {str(u): int(n) for u, n in
                                      sorted(getattr(self, "releases_by_unit", {}).items())}}
        if self._fork_id():
            state["fork"] = str(self._fork_id())  # a str: JSON readers may not keep 64-bit ints
        return state

    def _check_ledger(self, ledger):
        """Raise unless ``ledger`` (a state's, or None) holds every record of this object's."""
        if ledger is not None and not ledger.covers(self._ledger):
            raise ValueError(
                f"`state` is behind this {type(self).__name__}: its ledger holds fewer "
                f"releases than this object's own. Loading it would rewind the releases its "
                f"privacy report counts; load a state only into a new object, or one that has "
                f"released no more than the state records.")

    def _load_num_releases(self, state, ledger=None):
        """Restore ``num_releases`` from a state dict, after checking that neither it nor the
        state's ``ledger`` (a `ReleaseLedger`, or None) is behind this object.

        Without the key the counter is kept, except on a seeded copy rebuilt
        by ``from_config``, which has no position in its stream to keep.
        """
        if "num_releases" not in state:
            if getattr(self, "_awaiting_state", False):
                raise ValueError(
                    f"`state` must hold 'num_releases' for a seeded {type(self).__name__} "
                    f"rebuilt from its config: without it the copy would replay the noise of "
                    f"the original's releases; got keys {sorted(state)}.")
            if self.num_releases:
                raise ValueError(
                    f"`state` must hold 'num_releases' for a {type(self).__name__} that has "
                    f"released ({self.num_releases} so far): without it, loading cannot check "
                    f"that the state is not behind (a rewound count); got keys {sorted(state)}.")
            self._check_ledger(ledger)
            return
        num_releases = validate_positive_int(state["num_releases"], "state['num_releases']",
                                             minimum=0)
        if "releases_by_unit" not in state and self.seed is not None:
            raise ValueError(
                f"`state` must hold 'releases_by_unit' (each client's stream position) for a "
                f"seeded {type(self).__name__}: without it every client's stream would restart "
                f"at 0 and replay noise already sent; got keys {sorted(state)}.")
        by_unit = state.get("releases_by_unit", {})
        if not isinstance(by_unit, dict):
            raise ValueError(f"`state['releases_by_unit']` must be a dict of client id -> count; "
                             f"got {type(by_unit).__name__}.")
        loaded = {}
        for unit, n in by_unit.items():
            try:
                unit_id = int(unit)
            except (TypeError, ValueError):
                raise ValueError(f"`state['releases_by_unit']` keys must be client ids (integers "
                                 f">= 0); got {unit!r}.") from None
            loaded[validate_seed(unit_id, "client id")] = validate_positive_int(
                n, f"state['releases_by_unit'][{unit!r}]", minimum=0)
        behind = num_releases < self.num_releases or any(
            loaded.get(u, 0) < n for u, n in self.releases_by_unit.items())
        if behind:
            raise ValueError(
                f"`state` is behind this {type(self).__name__}: it has made "
                f"{self.num_releases} releases, the state records {num_releases} (or fewer for "
                f"some client). Loading it would rewind the release count (and, seeded, replay "
                f"noise already sent); load a state only into a new object, or one that has "
                f"released no more than the state records.")
        fork = state.get("fork", "0")
        try:
            fork = validate_seed(int(fork), "state['fork']")
        except (TypeError, ValueError):
            raise ValueError(f"`state['fork']` must be the fork id that state_dict wrote; got "
                             f"{type(fork).__name__}.") from None
        self._check_ledger(ledger)
        self.num_releases = num_releases
        self.releases_by_unit = loaded
        self._fork = fork
        self._awaiting_state = False


def seed_to_key_words(seed: int) -> np.ndarray:
    """Split a 64-bit integer into the two uint32 Philox key words (as int64)."""
    seed = int(seed)
    return np.array([seed & _MASK32, (seed >> 32) & _MASK32], dtype=np.int64)


def philox4x32(counter: Sequence[Any], key: Sequence[Any], rounds: int = 10) -> tuple[Any, ...]:
    """Philox-4x32 on broadcastable uint32 tensors.

    Args:
        counter: sequence of four uint32 tensors (c0, c1, c2, c3), broadcastable.
        key: sequence of two uint32 tensors (k0, k1).
        rounds: number of rounds (10 is the standard, and what TF uses).

    Returns:
        A tuple of four uint32 tensors, the Philox output block.
    """
    return backend.impl().philox4x32(counter, key, rounds)


def words_from_ids(key_words: Any, ids: Any, salt: int) -> tuple[Any, ...]:
    """Four uint32 noise words per example id, a pure function of (key, id, salt).

    Args:
        key_words: tensor of shape (2,), the two Philox key words (int64 on
            TensorFlow; uint32 or int32 on JAX, or 64-bit host integers).
        ids: integer tensor of example ids, any shape (int64 on TensorFlow;
            32-bit on JAX, sign-extended as an int64 cast would, or 64-bit
            host integers).
        salt: Python int < 2**32 that separates independent streams (e.g. one
            per mechanism) under the same key.

    Returns:
        Four uint32 tensors with the shape of ``ids``.
    """
    return backend.impl().words_from_ids(key_words, ids, salt)


def random_words(shape: Any, seed: Any) -> Any:
    """Uniform uint32 words of ``shape``, TensorFlow's stateless Philox stream of ``seed``.

    Both backends draw the same words for the same seed (on JAX in 32-bit
    Philox on a counter, without x64).

    Args:
        shape: output shape (list or 1-D int tensor).
        seed: two 64-bit integers (an int64 tensor of shape (2,) on
            TensorFlow; on JAX a host array, or their four uint32 words
            ``(low, high, low, high)`` as an array inside ``jit``).
    """
    return backend.impl().random_words(shape, seed)


def uniform_words(shape: Any, seed: int | None = None) -> Any:
    """Uniform uint32 noise words for one-off (eager) use of a mechanism.

    Args:
        shape: output shape.
        seed: None for a fresh secret from OS entropy, or a non-negative int
            for reproducible results.

    Raises:
        ValueError: if ``seed`` is None inside a traced function, where a
            fresh secret would be frozen into the graph as a constant and
            every call would repeat the same noise.
    """
    impl = backend.impl()
    if seed is None:
        if impl.inside_trace():
            raise ValueError(
                "A mechanism called inside a traced function (tf.function, jax.jit, "
                "model.fit, tf.data.Dataset.map) with seed=None would freeze one secret into "
                "the graph and repeat the same noise on every call. Use the Keras layers "
                "(LabelDPLayer, EmbeddingDPLayer), which keep their secret in state, "
                "or pass `noise=` words drawn from your own keyed RNG."
            )
        seed = draw_secret()
    k0, k1 = (int(w) for w in seed_to_key_words(seed))
    return random_words(shape, impl.seed_from_key(k0 | (k1 << 32)))


def probability_threshold(p: float) -> int:
    """Integer threshold T with P(word < T) = T / 2**32 >= p for uniform uint32 words.

    The threshold is rounded UP (``ceil(p * 2**32)``), the safe direction for
    the probability of a flip or a move: the realized probability
    ``T / 2**32`` exceeds ``p`` by less than 2**-32 and is never 0 for
    ``p > 0`` (rounding down would turn a flip probability below 2**-32 into
    "never flip", i.e. no privacy at all).

    Args:
        p: probability in [0, 1).

    Returns:
        An int in [0, 2**32 - 1].

    Raises:
        ValueError: if ``p`` is outside [0, 1), or so close to 1 that the
            rounded threshold would be 2**32 (an event that always happens).
    """
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"probability must be in [0, 1); got {p!r}")
    threshold = math.ceil(p * 2.0**32)  # exact: p * 2**32 only shifts the exponent
    if threshold > _MASK32:
        raise ValueError(f"probability {p!r} is within 2**-32 of 1: rounded up to a multiple "
                         f"of 2**-32 it would be 1 (always); use a probability <= 1 - 2**-32.")
    return threshold


def words_below(words: Any, threshold: Any) -> Any:
    """Boolean tensor ``words < threshold`` on uint32 words: an event of probability
    ``threshold / 2**32``.

    Args:
        words: uniform uint32 noise words (any integer dtype holding them).
        threshold: an int in [0, 2**32), or a uint32 tensor broadcastable
            to ``words``.
    """
    return ops.less(ops.cast(words, "uint32"), ops.convert_to_tensor(threshold, "uint32"))


def below(words: Any, p: float) -> Any:
    """Boolean tensor: ``words < probability_threshold(p)``, an event of probability ``>= p``.

    The realized probability is ``probability_threshold(p) / 2**32`` (``p``
    rounded up to a multiple of 2**-32).
    """
    return words_below(words, probability_threshold(p))


def uniform_index(words: Any, n: Any) -> Any:
    """Map uniform uint32 words to integers in [0, n) by multiply-shift.

    ``floor(word * n / 2**32)``: index j gets ``floor(2**32 / n)`` or
    ``ceil(2**32 / n)`` words, so the indices are uniform only up to a
    relative error below ``n / 2**32`` (exactly uniform when n is a power of
    two). Randomized response does not use it for the move to another class,
    which must be exactly uniform (see `randomized_response`).
    """
    high, _ = backend.impl().mulhilo32(ops.cast(words, "uint32"), ops.cast(n, "uint32"))
    return ops.cast(high, "int32")
