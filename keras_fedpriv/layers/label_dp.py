"""LabelDPLayer: randomized response on the leader's labels."""

from __future__ import annotations

from typing import Any

import dp_accounting
import keras
import numpy as np
from keras import ops
from numpy.typing import ArrayLike

from keras_fedpriv import backend
from keras_fedpriv.layers import input_checks, label_formats
from keras_fedpriv.layers import release_counter as rc
from keras_fedpriv.layers.secret_rng import SecretRandomMixin
from keras_fedpriv.mechanisms.events import pure_epsilon, repeat_event
from keras_fedpriv.mechanisms.ledger import EXAMPLE, LABELS, ReleaseKind, ReleaseLedger
from keras_fedpriv.mechanisms.randomized_response import (
    kary_randomized_response,
    randomized_response_dp_event,
    rr_with_prior,
    rr_with_prior_dp_event,
)
from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int


@keras.saving.register_keras_serializable(package="keras_fedpriv")
class LabelDPLayer(rc.ReleaseCounterMixin, SecretRandomMixin, input_checks.InputErrorFlagMixin,
                   keras.layers.Layer):
    """Label differential privacy by randomized response, once per example.

    Binary labels flip with ``p = 1 / (1 + e^eps)``; one-hot or sparse labels
    over K classes keep their class with ``e^eps / (K - 1 + e^eps)`` and move
    to each other class with ``1 / (K - 1 + e^eps)``. With a ``prior`` (per
    example class probabilities that do not depend on that example's label),
    RR-with-prior (Ghazi et al. 2021) is used: same eps, better accuracy.

    **Once per example.** Label DP protects a label released once. If the
    same label were re-randomized every epoch, an observer could average the
    flips away and the guarantee would be ``epochs * eps``. So the layer
    needs ``example_ids``: the noise is a pure function of (secret key,
    example id), and an example gets the same noisy label in every epoch.
    Easiest of all is to privatize the labels once before training with
    `keras_fedpriv.privatize_labels` (arrays) or
    `keras_fedpriv.privatize_dataset` (`tf.data`).

    ``per_batch=True`` instead draws fresh noise at every call. That composes
    over epochs: E epochs of per-batch re-randomization are ``E * eps``
    (basic composition; `dp_event(num_epochs=E)` gives dp_accounting the
    exact composition). Use it only when you account for that.

    **With a prior, every call is a new release.** The candidate set of
    RR-with-prior depends on the prior; two calls for the same example under
    the same coins but different priors could rule labels out with
    certainty. So calls with a ``prior`` draw fresh noise and each counts as
    a release of its examples (privatize once with `privatize_labels` to
    spend eps once), and `dp_event(num_epochs=E)` plans E releases.

    **Releases are recorded where they happen** (`privacy_ledger`): a call
    keyed by example id releases each example once, however often it is
    repeated; a fresh-noise call (``per_batch=True`` without ids, or a
    prior) is a release of each of its examples, counted per example id
    when ids are given and for every example otherwise.

    **Example ids.** Within a call there must be exactly one id per label and
    no id twice (repeated ids would share their noise: knowing one label of
    the pair would reveal the other); the layer checks both. Across calls
    and epochs it is the user's duty that an id always names the same
    example and that two different examples never share an id (e.g. row
    numbers of a fixed data set, assigned before shuffling). Any integer
    dtype; negative ids are allowed (ids are compared as 64-bit integers on
    TensorFlow, so int32 -1 and int64 -1 are the same id; as 32-bit integers
    on JAX, which refuses eager ids that do not fit: JAX without
    ``jax_enable_x64`` truncates 64-bit ids that reach a traced step, so keep
    them below 2**31 there).

    **Invalid inputs.** Eagerly: a ValueError naming the argument and the
    first offending position (and no other data: Keras' "Arguments received"
    dump is suppressed). In a traced TensorFlow graph: a `tf.debugging.Assert`
    with the same message. Under XLA (``jit_compile=True``) asserts are
    compiled away, and traced JAX code (every ``fit`` on JAX) cannot raise,
    so there a batch with an invalid label or invalid ids gets pure noise
    instead (uniform classes that do not depend on its labels) and the layer
    counts the event; `check_input_errors()` raises it on the host
    (`VerticalModel` calls it after every step; call it yourself after a
    compiled step of a plain model).

    At ``training=False`` (inference, evaluation) labels pass unchanged and
    nothing is released.

    Args:
        eps: privacy parameter, a finite real >= 0 (0 = labels are pure noise).
        mode: ``"auto"``, ``"binary"``, ``"onehot"`` or ``"sparse"`` (see
            `keras_fedpriv.layers.label_formats`).
        num_classes: number of classes; required for ``"sparse"``.
        seed: None (default): a 64-bit secret from OS entropy that is never
            saved. An int makes the noise reproducible and is saved in the
            config, so treat it as a secret.
        per_batch: re-randomize at every call (composes over epochs).
        id_capacity: how many example ids the per-example release counts tell
            apart: ids ``0 .. id_capacity - 1`` are counted exactly, in 4 bytes
            each (default 2**20: 4 MiB; 10**8 ids: 400 MB; at most 2**28).
            Other ids fold onto shared slots, and the report then counts every
            example as often as the busiest slot (an upper bound, said so).

    Call arguments:
        labels: labels in the layer's format (bool labels are read as 0/1).
            Output has the same format, shape and dtype.
        example_ids: integer tensor (N,) of unique example ids (required
            unless ``per_batch=True``).
        prior: optional (N, K) class probabilities, one row per label
            (binary: (N,) P(label=1)): finite, in [0, 1], each row summing to
            1 within 0.01; checked like the labels (errors name the row,
            never a value of the prior).
        training: randomize only when True.

    Returns:
        The randomized labels (training) or ``labels`` unchanged.

    Example:
        >>> layer = LabelDPLayer(eps=1.0)
        >>> y = np.array([0, 1, 1, 0], "float32")
        >>> noisy = layer(y, example_ids=np.arange(4), training=True)
    """

    _rng_salt = 0x4C414245  # "LABE"
    # Two slots (the counter is checkpointed; its shape is kept): labels and prior share one.
    _input_error_reasons = ("invalid labels or prior",
                            "invalid example_ids (wrong count or repeated)")

    def __init__(self, eps: float, mode: str = "auto", num_classes: int | None = None,
                 seed: int | None = None, per_batch: bool = False,
                 id_capacity: int = rc.ID_CAPACITY, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.eps = validate_eps(eps)
        if mode not in label_formats.MODES:
            raise ValueError(f"`mode` must be one of {label_formats.MODES}; got {mode!r}.")
        self.mode = mode
        self.num_classes = validate_positive_int(num_classes, "num_classes", minimum=2,
                                                 allow_none=True)
        if mode == "sparse" and self.num_classes is None:
            raise ValueError("LabelDPLayer(mode='sparse') needs `num_classes` (an integer >= 2).")
        if not isinstance(per_batch, bool):
            raise TypeError(f"`per_batch` must be a bool; got {per_batch!r}.")
        self.per_batch = per_batch
        self._init_rng(seed)
        self._init_release_counter(id_capacity)
        self._init_input_errors()
        self._convert_input_args = False  # keep the labels' own dtype
        self._allow_non_tensor_positional_args = True
        self._resolved = None

    @property
    def epsilon(self) -> float:
        """Pure eps of one release of one example's label, as realized by the integer thresholds."""
        return pure_epsilon(self.dp_event())

    def build(self, input_shape: Any = None) -> None:
        if input_shape is not None:
            self._resolved = label_formats.resolve_mode(self.mode, tuple(input_shape),
                                                        self.num_classes)
        self.built = True

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def compute_output_spec(self, labels: keras.KerasTensor, *args: Any,
                            **kwargs: Any) -> keras.KerasTensor:
        """Symbolic output: the labels' shape and dtype (the layer keeps both).

        Args:
            labels: the symbolic labels; the other call arguments do not
                change the output's shape or dtype.

        Returns:
            A `keras.KerasTensor` of the labels' shape and dtype.
        """
        return keras.KerasTensor(labels.shape, dtype=labels.dtype)

    def __call__(self, labels: ArrayLike, *args: Any, **kwargs: Any) -> Any:
        """Check the prior's kind and build from the labels' shape before Keras does.

        Keras builds a layer from the shape of the first tensor among the call's
        arguments: with NumPy labels, that of ``example_ids`` or ``prior``, which
        would blame the labels for the prior's shape.

        Args:
            labels, *args, **kwargs: the arguments of `call`.

        Returns:
            What `call` returns.
        """
        prior = kwargs.get("prior", args[1] if len(args) > 1 else None)
        if prior is not None:
            label_formats.refuse_non_dense_prior(prior)
        if not self.built and not isinstance(labels, keras.KerasTensor):
            try:
                shape = tuple(labels.shape) if hasattr(labels, "shape") else np.shape(labels)
            except ValueError:  # not an array: `call` says why
                shape = None
            if shape is not None:
                self.build(shape)
        return super().__call__(labels, *args, **kwargs)

    @input_checks.private_errors
    def call(self, labels: ArrayLike, example_ids: ArrayLike | None = None,
             prior: ArrayLike | None = None, training: bool | None = None) -> Any:
        if not training:
            return labels
        labels = ops.convert_to_tensor(labels)
        out_dtype = keras.backend.standardize_dtype(labels.dtype)
        if out_dtype == "bool":  # a bool one-hot (or binary) matrix: read as 0/1
            labels = ops.cast(labels, "int32")
        mode, k = label_formats.resolve_mode(self.mode, tuple(labels.shape), self.num_classes)
        self._resolved = (mode, k)
        # Eagerly every check raises; in a trace (tf.function, XLA, jax.jit) the checks
        # give flags and TensorFlow graph asserts, and `_guard` makes the output safe where
        # no assert runs (XLA, JAX).
        eager = not any(backend.impl().is_traced(x) for x in (labels, example_ids, prior)
                        if x is not None)
        labels_ok = ids_ok = prior_ok = None
        asserts = []
        if eager:
            label_formats.validate_eager(labels, mode, k)
        else:
            row_ok, _ = label_formats.rows_ok(labels, mode, k)
            labels_ok = ops.all(row_ok)
            asserts.append(label_formats.graph_assert(labels, mode, k, row_ok=row_ok))
        class_ids = label_formats.to_class_ids(labels, mode)
        n = ops.shape(class_ids)[0]  # an int where static, else a scalar tensor
        ids = None
        if example_ids is not None:
            ids, ids_ok, id_asserts = input_checks.check_example_ids(example_ids, n, eager)
            asserts += id_asserts
        if prior is not None:  # checked before anything is drawn or counted
            prior, prior_ok, prior_asserts = label_formats.check_prior(prior, mode, k, n, eager)
            asserts += prior_asserts
        with backend.impl().run_after(asserts):  # nothing is drawn or counted for a failed check
            noisy, words = self._randomize(class_ids, ids, prior, k, n)
            if not eager:
                noisy = self._guard(noisy, words, k, labels_ok, ids_ok, prior_ok)
            out = label_formats.from_class_ids(noisy, labels, mode, k)
        return ops.cast(out, "bool") if out_dtype == "bool" else out

    def _randomize(self, class_ids, ids, prior, k, n):
        """Randomized class ids and the two noise words per label they came from; counts
        the release."""
        if prior is not None or self.per_batch:
            # Fresh noise: a new release of every example in the call.
            both = self._next_words((2, n))
            words = (both[0], both[1])
            if ids is not None:
                self._count_release(rc.FRESH_IDS, n, ids)
            else:
                self._count_release(rc.FRESH_ANON, n)
        elif ids is not None:
            # Keyed by (secret, example id): the same noise in every call.
            words = self._words_for_ids(ids)[:2]
            self._count_release(rc.ONCE, n)
            self._count_key_generation(n)
        else:
            raise ValueError(
                "LabelDPLayer randomizes each example once, so it needs `example_ids` (unique "
                "integer ids, one per label). Alternatives: privatize the labels once before "
                "training with keras_fedpriv.privatize_labels / privatize_dataset, or construct "
                "the layer with per_batch=True (fresh noise at every call, which composes over "
                "epochs: E epochs cost E * eps).")
        if prior is not None:
            self._count_release(rc.PRIOR, n)
            return rr_with_prior(class_ids, prior, self.eps, noise=list(words)), words
        return kary_randomized_response(class_ids, k, self.eps, noise=list(words)), words

    def _guard(self, noisy, words, k, labels_ok, ids_ok, prior_ok):
        """Traced path: where no assert runs (XLA, JAX), never release a batch
        with invalid labels, ids or prior; output label-independent noise and
        count the event for `check_input_errors`."""
        if ids_ok is None:
            ids_ok = ops.convert_to_tensor(True)
        if prior_ok is not None:
            labels_ok = ops.logical_and(labels_ok, prior_ok)
        ok = ops.logical_and(labels_ok, ids_ok)
        uniform = ops.cast(ops.mod(words[1], ops.cast(k, "uint32")), noisy.dtype)
        self._count_input_errors([ops.logical_not(labels_ok), ops.logical_not(ids_ok)])
        return ops.where(ok, noisy, uniform)

    def _num_classes(self):
        return self._resolved[1] if self._resolved else (self.num_classes or 2)

    def dp_event(self, num_epochs: int = 1, prior: bool = False) -> dp_accounting.DpEvent:
        """The dp_accounting event of one example's label over ``num_epochs`` epochs, as planned.

        Keyed by example id (the default): one release (RR over the K
        classes), whatever ``num_epochs``. Fresh noise (``per_batch=True``,
        or calls with a ``prior``): one release per epoch, ``num_epochs`` in
        all, as the ledger counts them. With a prior each release is binary
        RR at the realized eps (it dominates every eps-DP mechanism). This is
        a plan; for what the layer actually released use `privacy_ledger`
        (or `keras_fedpriv.privacy.privacy_report`).

        Args:
            num_epochs: how many epochs (calls per example) the plan covers.
            prior: plan for calls with a ``prior`` before the first one; a
                layer that has been called with a prior always plans for it.

        Returns:
            The `dp_accounting.DpEvent` of one example's label over the run.
        """
        num_epochs = validate_positive_int(num_epochs, "num_epochs")
        if not isinstance(prior, bool):
            raise TypeError(f"dp_event: `prior` must be a bool (True: plan for calls with a "
                            f"prior); got a {type(prior).__name__}.")  # never the values
        with_prior = prior or bool(self._release_totals()[rc.PRIOR])
        k = self._num_classes()
        event = (rr_with_prior_dp_event(self.eps, k) if with_prior
                 else randomized_response_dp_event(self.eps, k))
        return repeat_event(event, num_epochs) if self.per_batch or with_prior else event

    def privacy_ledger(self) -> ReleaseLedger:
        """What this layer has released so far, as a `ReleaseLedger` (unit: example).

        * calls keyed by example id: one release per example, however many
          calls (the same noisy label each time);
        * fresh-noise calls (``per_batch=True`` without ids, or with a
          prior): one release per call of each example in it, counted per
          example id (without ids: for every example).
        """
        totals = self._release_totals()
        ledger = ReleaseLedger()
        name = f"LabelDPLayer {self.name!r}"
        k = self._num_classes()
        if totals[rc.ONCE]:
            # One release per key: a seeded key is the same after a reload; an
            # unseeded layer that was reloaded or restored has a fresh key, and its
            # keyed noise is a new, independent release of every label.
            keys = 1 if self.seed is not None else max(int(totals[rc.KEY_GENERATIONS]), 1)
            ledger.record(ReleaseKind(name, LABELS, EXAMPLE,
                                      randomized_response_dp_event(self.eps, k),
                                      "keyed by example id: one release per example and secret "
                                      "key, any number of calls (a reloaded unseeded layer has "
                                      "a new key)"), units=None, count=keys)
        fresh = ReleaseKind(name, LABELS, EXAMPLE,
                            rr_with_prior_dp_event(self.eps, k) if totals[rc.PRIOR]
                            else randomized_response_dp_event(self.eps, k),
                            "fresh noise at every call (per_batch or prior): each call releases "
                            "its examples again" + ("; a prior was used, so binary RR at eps "
                                                    "(dominates every eps-DP mechanism)"
                                                    if totals[rc.PRIOR] else ""))
        self._record_fresh_releases(ledger, fresh, totals)
        return ledger

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"eps": self.eps, "mode": self.mode, "num_classes": self.num_classes,
                       "seed": self.seed, "per_batch": self.per_batch,
                       "id_capacity": self.id_capacity})
        return config
