"""The JAX implementation of the backend interface (see `keras_fedpriv.backend`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# Each section below is one part of the interface; keras_fedpriv/backend/tensorflow.py and
# keras_fedpriv/backend/jax.py define the same names in the same sections.

# == secret random stream and local state (layers/secret_rng.py, layers/release_counter.py) ==



# == end of secret random stream ==


# == input checks and graph helpers (layers/input_checks.py, the protection layers) ==



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


# == end of attacks ==
