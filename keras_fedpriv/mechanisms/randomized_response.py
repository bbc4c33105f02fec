"""Randomized response: binary, k-ary, and k-ary with a prior (RR-with-prior).

Pure functions: no Keras state. Each takes the data, ``eps`` and either
``noise`` (uniform uint32 words, from `keras_fedpriv.mechanisms.random`) or a
``seed`` (None: a fresh secret from OS entropy; an int: reproducible). The
formulas are those of ALGORITHMS.md section 1:

* binary: flip with ``p = 1 / (1 + e^eps)``;
* k-ary over K classes: keep with ``p1 = e^eps / (K - 1 + e^eps)``, move to
  each other class with ``p2 = 1 / (K - 1 + e^eps)``;
* RR-with-prior (Ghazi et al. 2021): k-ary RR restricted to the k* classes
  with the largest prior, where k* maximizes
  ``sum_{top k} prior / (1 + (k - 1) e^-eps)``; a label outside them goes to
  a uniform class among them. Same eps guarantee, better accuracy.

Probabilities are computed with ``exp(-eps)`` so that large eps never
overflows.
"""

from __future__ import annotations

import math

import dp_accounting
from keras import ops
import tensorflow as tf

from keras_fedpriv.mechanisms.random import below, uniform_index, uniform_words
from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int

__all__ = [
    "flip_probability",
    "keep_probability",
    "other_probability",
    "binary_randomized_response",
    "kary_randomized_response",
    "rr_with_prior",
    "rr_with_prior_k",
    "randomized_response_dp_event",
]


def flip_probability(eps):
    """Flip probability of binary randomized response, ``1 / (1 + e^eps)``."""
    eps = validate_eps(eps)
    t = math.exp(-eps)
    return t / (1.0 + t)


def keep_probability(eps, num_classes):
    """Probability that k-ary RR keeps the true class, ``e^eps / (K - 1 + e^eps)``."""
    eps = validate_eps(eps)
    k = validate_positive_int(num_classes, "num_classes", minimum=2)
    return 1.0 / (1.0 + (k - 1) * math.exp(-eps))


def other_probability(eps, num_classes):
    """Probability of each particular other class, ``1 / (K - 1 + e^eps)``."""
    eps = validate_eps(eps)
    k = validate_positive_int(num_classes, "num_classes", minimum=2)
    t = math.exp(-eps)
    return t / (1.0 + (k - 1) * t)


def randomized_response_dp_event(eps, num_buckets=2):
    """The `dp_accounting` event of eps-randomized response over ``num_buckets``.

    dp_accounting parametrizes RR by the probability ``a`` of answering with a
    uniform bucket: ``P(keep) = 1 - a + a / K``. Solving
    ``P(keep) = e^eps / (K - 1 + e^eps)`` gives ``a = K / (K - 1 + e^eps)``.
    Compose it with a PLD accountant whose neighbouring relation is
    ``REPLACE_ONE`` (label DP and local DP replace one value).
    """
    eps = validate_eps(eps)
    k = validate_positive_int(num_buckets, "num_buckets", minimum=2)
    t = math.exp(-eps)
    return dp_accounting.RandomizedResponseDpEvent(
        noise_parameter=k * t / (1.0 + (k - 1) * t), num_buckets=k
    )


def _noise(noise, shape, seed, count=1):
    """Return ``count`` uint32 noise tensors of ``shape``."""
    if noise is not None:
        noise = noise if isinstance(noise, (list, tuple)) else [noise]
        if len(noise) < count:
            raise ValueError(f"`noise` must hold {count} word tensor(s); got {len(noise)}.")
        return [ops.cast(n, "uint32") for n in noise[:count]]
    words = uniform_words([count] + list(shape), seed=seed)
    return [words[i] for i in range(count)]


def binary_randomized_response(bits, eps, *, seed=None, noise=None):
    """Flip each bit with probability ``1 / (1 + e^eps)``.

    Args:
        bits: tensor of 0/1 values (any numeric dtype, any shape).
        eps: privacy parameter, finite and >= 0 (0 = fair coin).
        seed: None (fresh OS-entropy secret, eager only) or an int.
        noise: optional uint32 words of the shape of ``bits`` (overrides seed).

    Returns:
        Tensor of the shape and dtype of ``bits`` with values in {0, 1}.

    Example:
        >>> y = binary_randomized_response(np.array([0, 1, 1]), eps=1.0, seed=7)
    """
    eps = validate_eps(eps)
    bits = ops.convert_to_tensor(bits)
    (words,) = _noise(noise, ops.shape(bits), seed)
    flip = below(words, flip_probability(eps))
    out = ops.logical_xor(ops.greater(bits, 0), flip)
    return ops.cast(out, bits.dtype)


def _keep_thresholds(max_k, eps):
    """uint64 table: entry k-1 is the word threshold of P(keep) for k candidates."""
    t = math.exp(-eps)
    return ops.convert_to_tensor(
        [min(int(2.0**32 / (1.0 + (k - 1) * t)), 2**32) for k in range(1, max_k + 1)],
        dtype="uint64",
    )


def _rr_on_ranks(rank_y, k, max_k, keep_words, other_words, eps):
    """k-ary RR on ranks 0..k-1, where k may vary per row (k <= max_k).

    ``rank_y`` is the true class's rank within the candidate set, or -1 when
    it is outside the set (then the output is uniform over the set).
    Returns the output rank (int32).
    """
    k = ops.cast(k, "int32")
    rank_y = ops.cast(rank_y, "int32")
    threshold = ops.take(_keep_thresholds(max_k, eps), k - 1)
    # tf.less, not ops.less: Keras' dtype promotion turns uint64 into uint32
    # and wraps a threshold of 2**32 to 0 (found by the eps=40 frequency test).
    keep = tf.less(tf.cast(keep_words, tf.uint64), threshold)
    inside = ops.greater_equal(rank_y, 0)
    # Inside and not kept: uniform over the k - 1 other ranks. Outside the
    # set: uniform over all k ranks.
    other = uniform_index(other_words, ops.maximum(k - 1, 1))
    other = other + ops.cast(ops.greater_equal(other, rank_y), "int32")
    uniform_all = uniform_index(other_words, k)
    return ops.where(inside, ops.where(keep, rank_y, other), uniform_all)


def kary_randomized_response(class_ids, num_classes, eps, *, seed=None, noise=None):
    """k-ary randomized response on integer class ids.

    Keeps the class with ``e^eps / (K - 1 + e^eps)`` and moves to each other
    class with ``1 / (K - 1 + e^eps)``.

    Args:
        class_ids: integer tensor with values in [0, num_classes).
        num_classes: K >= 2.
        eps: privacy parameter, finite and >= 0 (0 = uniform class).
        seed: None (fresh OS-entropy secret, eager only) or an int.
        noise: optional pair of uint32 word tensors shaped like ``class_ids``.

    Returns:
        int32 tensor of the shape of ``class_ids``.
    """
    eps = validate_eps(eps)
    k = validate_positive_int(num_classes, "num_classes", minimum=2)
    class_ids = ops.cast(ops.convert_to_tensor(class_ids), "int32")
    w_keep, w_other = _noise(noise, ops.shape(class_ids), seed, count=2)
    return _rr_on_ranks(class_ids, ops.full(ops.shape(class_ids), k, "int32"), k, w_keep, w_other, eps)


def _static_num_classes(prior):
    num_classes = prior.shape[-1]
    if num_classes is None or num_classes < 2:
        raise ValueError(f"`prior` must have a static last dimension K >= 2 (one probability per "
                         f"class); got shape {tuple(prior.shape)}.")
    return int(num_classes)


def rr_with_prior_k(prior, eps):
    """The per-example size k* of the RR-with-prior candidate set.

    ``k* = argmax_k sum_{top k} prior / (1 + (k - 1) e^-eps)``, ties to the
    smallest k.

    Args:
        prior: float tensor (N, K), rows of class probabilities.
        eps: privacy parameter.

    Returns:
        int32 tensor (N,) with values in [1, K].
    """
    eps = validate_eps(eps)
    prior = ops.cast(ops.convert_to_tensor(prior), "float32")
    num_classes = _static_num_classes(prior)
    top = ops.flip(ops.sort(prior, axis=-1), axis=-1)  # descending
    mass = ops.cumsum(top, axis=-1)
    t = math.exp(-eps)
    weights = ops.convert_to_tensor([1.0 / (1.0 + (k - 1) * t) for k in range(1, num_classes + 1)],
                                    dtype="float32")
    score = mass * weights
    return ops.cast(ops.argmax(score, axis=-1), "int32") + 1


def rr_with_prior(class_ids, prior, eps, *, seed=None, noise=None):
    """Randomized response with a prior (RRWithPrior, Ghazi et al. 2021).

    For each example, take the k* classes with the largest prior (see
    `rr_with_prior_k`) and run k*-ary randomized response within them; a true
    class outside them is replaced by a uniform class among them. For every
    prior the mechanism is eps-label-DP, provided the prior of an example does
    not depend on that example's label (e.g. it comes from a model trained on
    other data).

    Args:
        class_ids: integer tensor (N,) with values in [0, K).
        prior: float tensor (N, K), per-example class probabilities.
        eps: privacy parameter, finite and >= 0.
        seed: None (fresh OS-entropy secret, eager only) or an int.
        noise: optional pair of uint32 word tensors of shape (N,).

    Returns:
        int32 tensor (N,).
    """
    eps = validate_eps(eps)
    class_ids = ops.cast(ops.convert_to_tensor(class_ids), "int32")
    prior = ops.convert_to_tensor(prior)
    k_star = rr_with_prior_k(prior, eps)
    # order[i, r] = class of rank r (descending prior, ties by class index).
    order = ops.cast(ops.argsort(-ops.cast(prior, "float32"), axis=-1), "int32")
    ranks = ops.cast(ops.argsort(order, axis=-1), "int32")
    rank_y = ops.take_along_axis(ranks, ops.expand_dims(class_ids, -1), axis=-1)[..., 0]
    rank_y = ops.where(ops.less(rank_y, k_star), rank_y, -1)
    w_keep, w_other = _noise(noise, ops.shape(class_ids), seed, count=2)
    out_rank = _rr_on_ranks(rank_y, k_star, _static_num_classes(prior), w_keep, w_other, eps)
    return ops.take_along_axis(order, ops.expand_dims(out_rank, -1), axis=-1)[..., 0]
