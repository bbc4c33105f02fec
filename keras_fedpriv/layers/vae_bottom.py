"""VAEBottom: a follower's bottom model as the encoder of a VAE.

After "Exploiting Internal Randomness for Privacy in Vertical Federated Learning", ESORICS 2024.

The embedding a follower sends up is a reparameterized posterior sample
``z = mu(x) + sigma(x) * n``, ``n ~ N(0, I)``, with ``sigma = exp(0.5 *
logvar)``, at training and at inference: the internal randomness is the
protection. `keras_fedpriv.privacy.deldp` estimates its dELDP epsilon.

Called with ``example_ids`` (as a vertical follower's bottom does), each call
is recorded per example id in the layer's release ledger, with the same
counters as `EmbeddingDPLayer` (`keras_fedpriv.layers.release_counter`): a
release without a DP guarantee (the sample's randomness is not a DP
mechanism), counted once per example per pass, not once per batch. A call
without ids is recorded as a release of every example.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Sequence

import keras
import numpy as np
from keras import ops
from numpy.typing import ArrayLike

from keras_fedpriv.layers import input_checks
from keras_fedpriv.layers import release_counter as rc
from keras_fedpriv.layers.secret_rng import SecretRandomMixin
from keras_fedpriv.logs import logger, verbose_scope
from keras_fedpriv.mechanisms.ledger import (
    EXAMPLE,
    FEATURES,
    ReleaseKind,
    ReleaseLedger,
    non_private_event,
)
from keras_fedpriv.mechanisms.validation import (
    validate_eps,
    validate_int_sequence,
    validate_positive_int,
)

__all__ = ["VAEBottom", "kl_to_standard_normal", "vae_release_scope"]

_SCOPE = threading.local()  # `vae_release_scope` in this thread: (released, recorders)


@contextlib.contextmanager
def vae_release_scope(released: bool) -> Iterator[list[Any]]:
    """Within it (this thread), whether a `VAEBottom`'s call is a release it records.

    For a caller that knows whether the output leaves: a vertical party
    whose embedding is not sent as computed (the leader's, or one that a DP
    layer protects, which records the release itself) calls its bottom
    model with ``released=False``, so a VAEBottom inside records nothing.
    Outside any scope every call is recorded.

    Args:
        released: whether the calls made within are releases.

    Yields:
        A list, filled with each VAEBottom that recorded a call within the
        scope (in a traced step, at tracing: once per traced function).
    """
    before = getattr(_SCOPE, "state", None)
    recorders: list[Any] = []
    _SCOPE.state = (bool(released), recorders)
    try:
        yield recorders
    finally:
        _SCOPE.state = before


def kl_to_standard_normal(mu: Any, logvar: Any) -> Any:
    """KL(N(mu, diag(exp(logvar))) || N(0, I)) per example (summed over the last axis).

    ``-0.5 * sum(1 + logvar - mu^2 - exp(logvar))``, computed in float32 (or
    the inputs' dtype if wider).
    """
    wide = keras.backend.standardize_dtype(mu.dtype) == "float64"
    dtype = "float64" if wide else "float32"
    mu = ops.cast(mu, dtype)
    logvar = ops.cast(logvar, dtype)
    return -0.5 * ops.sum(1.0 + logvar - ops.square(mu) - ops.exp(logvar), axis=-1)


@keras.saving.register_keras_serializable(package="keras_fedpriv")
class VAEBottom(rc.ReleaseCounterMixin, SecretRandomMixin, keras.layers.Layer):
    """A follower's bottom model that sends a VAE posterior sample.

    After "Exploiting Internal Randomness for Privacy in Vertical Federated Learning", ESORICS 2024.

    Encoder: ``Dense(u, relu)`` for each ``u`` in ``hidden_units``, then two
    linear heads, ``mu = Dense(latent_dim)`` and ``logvar = Dense(latent_dim)``.
    The output is the reparameterized sample::

        z = mu + exp(0.5 * logvar) * n,   n ~ N(0, I)

    drawn at **every** call, in training and at inference alike (the internal
    randomness is what protects the features; there is no switch to turn it
    off). The noise comes from the layer's secret, replay-proof key (64 bits
    from OS entropy unless ``seed=`` is given; see docs/privacy.md "Secrets").

    Each call adds the KL term to N(0, I) with `add_loss`:
    ``beta * mean over the batch of sum over latent dims of
    -0.5 * (1 + logvar - mu^2 - exp(logvar))`` (nothing is added when
    ``beta == 0``). In a model it joins the training loss automatically.

    With ``with_decoder=True`` the layer also owns a decoder (``Dense(u, relu)``
    for ``u`` in reversed ``hidden_units``, then a linear ``Dense(input_dim)``)
    so that `pretrain` can fit encoder + decoder on the party's own features
    (reconstruction MSE + beta * KL) before vertical training. The decoder is
    never used in `call` and nothing it computes is sent.

    Called with ``example_ids`` (integers, one per row: a vertical follower
    whose bottom model is this layer passes them), every call is recorded as
    a release of each row's example, counted per example id
    (`privacy_ledger`; ``release_calls()``), like `EmbeddingDPLayer`'s: a run
    of E epochs counts E releases per example, not one per batch. The release
    has no DP guarantee (the internal randomness is not a DP mechanism), so a
    privacy report says "not private" for the features, as it would for an
    unprotected embedding. A call without ids (inside a larger bottom model,
    or a plain Keras model) is recorded as a release of every example, once
    per call. A vertical party whose message is not this layer's output as
    computed (the leader, or a follower with a DP layer in `embedding_dp`)
    calls it within `vae_release_scope` ``(False)``: nothing is recorded.

    `encode` gives ``(mu, logvar)`` without sampling and `sigma` the standard
    deviation ``exp(0.5 * logvar)``; `keras_fedpriv.privacy.deldp` uses them to
    estimate the dELDP epsilon of the released sample (an empirical estimate,
    not a DP guarantee).

    Args:
        latent_dim: size of the embedding sent up, a positive int.
        hidden_units: tuple/list of positive ints, the widths of the encoder's
            hidden ``relu`` layers; ``()`` makes mu and logvar linear in x.
        beta: weight of the KL term, a finite real >= 0.
        with_decoder: whether to build a decoder for `pretrain` (a bool).
        seed: None (default): a 64-bit secret from OS entropy that is never
            saved. An int makes the noise reproducible (and is saved).
        id_capacity: how many example ids the per-example release counts tell
            apart: ids ``0 .. id_capacity - 1`` are counted exactly, in 4 bytes
            each (default 2**20: 4 MiB; 10**8 ids: 400 MB; at most 2**28).
            Other ids fold onto shared slots, and the report then counts every
            example as often as the busiest slot (an upper bound, said so).
        **kwargs: standard `keras.layers.Layer` arguments (``name``, ``dtype``).

    Returns (call):
        A tensor of shape ``input_shape[:-1] + (latent_dim,)``: one fresh
        sample of the posterior per row.

    Example:
        >>> bottom = VAEBottom(latent_dim=8, hidden_units=(32,), beta=0.5, with_decoder=True)
        >>> x = np.random.randn(256, 10).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int64")
        >>> history = bottom.pretrain(x, epochs=5, verbose=0)
        >>> z = bottom(x)                        # a sample, also at inference
        >>> mu, logvar = bottom.encode(x)        # no sampling
        >>> report = keras_fedpriv.privacy.deldp(bottom, x, y)
    """

    _rng_salt = 0x56414542  # "VAEB"

    def __init__(self, latent_dim: int, hidden_units: Sequence[int] = (64,), beta: float = 1.0,
                 with_decoder: bool = False, seed: int | None = None,
                 id_capacity: int = rc.ID_CAPACITY, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.latent_dim = validate_positive_int(latent_dim, "latent_dim")
        self.hidden_units = validate_int_sequence(hidden_units, "hidden_units",
                                                  allow_scalar=False, what="layer widths")
        self.beta = validate_eps(beta, "beta")
        if not isinstance(with_decoder, (bool, np.bool_)):
            raise TypeError(f"`with_decoder` must be a bool (True or False); got "
                            f"{with_decoder!r} of type {type(with_decoder).__name__}.")
        self.with_decoder = bool(with_decoder)
        self._init_rng(seed)
        self._init_release_counter(id_capacity)
        policy = self.dtype_policy
        self.hidden_layers = [keras.layers.Dense(u, activation="relu", dtype=policy,
                                                 name=f"hidden_{i}")
                              for i, u in enumerate(self.hidden_units)]
        self.z_mean = keras.layers.Dense(self.latent_dim, dtype=policy, name="z_mean")
        self.z_log_var = keras.layers.Dense(self.latent_dim, dtype=policy, name="z_log_var")
        if self.with_decoder:
            self.decoder_layers = [
                keras.layers.Dense(u, activation="relu", dtype=policy, name=f"decoder_hidden_{i}")
                for i, u in enumerate(reversed(self.hidden_units))]
        else:
            self.decoder_layers = []
        self.decoder_output = None  # Dense(input_dim), created in build()
        self.input_dim = None

    # --- building ---------------------------------------------------------------------

    def build(self, input_shape: Any) -> None:
        input_shape = tuple(input_shape)
        if len(input_shape) < 2 or input_shape[-1] is None:
            raise ValueError(f"VAEBottom: inputs must have shape (batch, ..., features) with a "
                             f"known number of features; got {input_shape}.")
        self.input_dim = int(input_shape[-1])
        shape = input_shape
        for layer in self.hidden_layers:
            layer.build(shape)
            shape = shape[:-1] + (layer.units,)
        self.z_mean.build(shape)
        self.z_log_var.build(shape)
        if self.with_decoder:
            self.decoder_output = keras.layers.Dense(self.input_dim, dtype=self.dtype_policy,
                                                     name="decoder_output")
            shape = input_shape[:-1] + (self.latent_dim,)
            for layer in self.decoder_layers:
                layer.build(shape)
                shape = shape[:-1] + (layer.units,)
            self.decoder_output.build(shape)
        self.built = True

    def compute_output_shape(self, input_shape: Any) -> tuple[int | None, ...]:
        return tuple(input_shape)[:-1] + (self.latent_dim,)

    def _ensure_built(self, x):
        if not self.built:
            self.build(x.shape)

    # --- the encoder ------------------------------------------------------------------

    def _encode(self, x):
        h = x
        for layer in self.hidden_layers:
            h = layer(h)
        return self.z_mean(h), self.z_log_var(h)

    def encode(self, x: ArrayLike) -> tuple[Any, Any]:
        """The posterior's parameters, without sampling.

        Args:
            x: features, shape ``(batch, ..., input_dim)``.

        Returns:
            ``(mu, logvar)``, two tensors of shape ``(batch, ..., latent_dim)``;
            the standard deviation is ``sigma = exp(0.5 * logvar)`` (`sigma`).
        """
        x = ops.convert_to_tensor(x, dtype=self.compute_dtype)
        self._ensure_built(x)
        return self._encode(x)

    def sigma(self, x: ArrayLike) -> Any:
        """The posterior's standard deviation ``exp(0.5 * logvar(x))``."""
        _, logvar = self.encode(x)
        return ops.exp(0.5 * logvar)

    def _sample(self, mu, logvar):
        noise = self._next_normal(ops.shape(mu), keras.backend.standardize_dtype(mu.dtype))
        return mu + ops.exp(0.5 * logvar) * noise

    def _kl(self, mu, logvar):
        """beta * mean over the batch of the per-example KL (a scalar)."""
        return self.beta * ops.mean(kl_to_standard_normal(mu, logvar))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Concrete ids are checked before Keras converts the call's arrays: on JAX it would
        # turn 64-bit ids into int32, wrapping distinct ids onto the same one unflagged.
        ids = kwargs.get("example_ids", args[2] if len(args) > 2 else None)
        if ids is not None:
            input_checks.host_example_ids(ids, "VAEBottom")
        return super().__call__(*args, **kwargs)

    def call(self, inputs: Any, training: bool | None = None,
             example_ids: ArrayLike | None = None) -> Any:
        # `training` is accepted for Keras' sake and deliberately ignored: the
        # sample is drawn at inference too.
        mu, logvar = self._encode(inputs)
        if self.beta > 0:
            self.add_loss(self._kl(mu, logvar))
        self._record_call(ops.shape(mu)[0], example_ids)
        return self._sample(mu, logvar)

    def _record_call(self, rows, example_ids):
        """Count the call as a release: per example id, or of every example without ids."""
        released, recorders = getattr(_SCOPE, "state", None) or (True, None)
        if not released:
            return
        self._count_fresh_release(rows, example_ids, "VAEBottom")
        if recorders is not None:
            recorders.append(self)

    def privacy_ledger(self) -> ReleaseLedger:
        """The recorded calls, as releases without DP (unit: example).

        Returns:
            A `ReleaseLedger`: one kind, ``non_private_event()``, counted per
            example id (a call without ids, or whose ids do not name every
            row, counts for every example).
        """
        ledger = ReleaseLedger()
        kind = ReleaseKind(f"VAEBottom {self.name!r}", FEATURES, EXAMPLE, non_private_event(),
                           "the follower's embedding, a sample of the VAE's posterior: its "
                           "internal randomness is no DP guarantee (deldp gives an empirical "
                           "estimate); counted per example id (a call without ids: every example)")
        self._record_fresh_releases(ledger, kind, self._release_totals())
        return ledger

    # --- the decoder and pretraining --------------------------------------------------

    def decode(self, z: ArrayLike) -> Any:
        """Reconstruct features from latent codes (needs ``with_decoder=True``)."""
        self._require_decoder("decode")
        return self._decode(ops.convert_to_tensor(z, dtype=self.compute_dtype))

    def _decode(self, h):
        for layer in self.decoder_layers:
            h = layer(h)
        return self.decoder_output(h)

    def _require_decoder(self, what):
        if not self.with_decoder:
            raise ValueError(f"VAEBottom.{what}: this layer has no decoder; create it with "
                             f"`with_decoder=True` to pretrain it as an autoencoder.")
        if not self.built:
            raise ValueError(f"VAEBottom.{what}: the layer is not built yet; call it on data "
                             f"(or `pretrain`) first.")

    def pretrain(self, x: ArrayLike, epochs: int = 10, batch_size: int = 32,
                 optimizer: str | keras.optimizers.Optimizer = "adam", verbose: int = 1,
                 shuffle: bool = True) -> dict[str, list[float]]:
        """Train encoder + decoder on the party's own features (a VAE).

        Minimizes ``mean reconstruction MSE + beta * KL`` with the
        reparameterized sample from the layer's secret RNG. Only the party's
        features are needed (no labels, nothing leaves the party).

        Args:
            x: features, an array of shape ``(N, ..., input_dim)``.
            epochs: number of passes over x (positive int).
            batch_size: mini-batch size (positive int).
            optimizer: a Keras optimizer instance or identifier (``"adam"``).
            verbose: 0 silent, 1 one line per epoch.
            shuffle: reshuffle the rows at each epoch.

        Returns:
            A dict of per-epoch means: ``{"loss": [...], "reconstruction": [...],
            "kl": [...]}`` (``kl`` already multiplied by beta).

        Raises:
            ValueError: if the layer was built without a decoder.
        """
        if not self.with_decoder:
            raise ValueError("VAEBottom.pretrain: this layer has no decoder; create it with "
                             "`with_decoder=True` to pretrain it as an autoencoder.")
        epochs = validate_positive_int(epochs, "epochs")
        batch_size = validate_positive_int(batch_size, "batch_size")
        x = np.asarray(x, dtype=self.compute_dtype)
        if x.ndim < 2 or len(x) == 0:
            raise ValueError(f"VAEBottom.pretrain: `x` must have shape (N, ..., features) with "
                             f"N >= 1; got shape {x.shape}.")
        self._ensure_built(x[:1])
        if x.shape[-1] != self.input_dim:
            raise ValueError(f"VAEBottom.pretrain: `x` has {x.shape[-1]} features, the layer was "
                             f"built for {self.input_dim}.")
        autoencoder = _Autoencoder(self)
        autoencoder.compile(optimizer=keras.optimizers.get(optimizer),
                            loss={"reconstruction": "mse", "kl": _mean_of_prediction},
                            loss_weights={"reconstruction": 1.0, "kl": self.beta})
        log = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: self._log_pretrain_epoch(epoch, epochs, logs,
                                                                      verbose))
        fitted = autoencoder.fit(x, {"reconstruction": x, "kl": np.zeros(len(x), "float32")},
                                 epochs=epochs, batch_size=batch_size, shuffle=shuffle, verbose=0,
                                 callbacks=[log]).history
        return {"loss": [float(v) for v in fitted["loss"]],
                "reconstruction": [float(v) for v in fitted["reconstruction_loss"]],
                "kl": [self.beta * float(v) for v in fitted["kl_loss"]]}

    def _log_pretrain_epoch(self, epoch, epochs, logs, verbose):
        if verbose:
            with verbose_scope(verbose):
                logger.info("VAEBottom.pretrain epoch %d/%d: loss=%.4f reconstruction=%.4f "
                            "kl=%.4f", epoch + 1, epochs, logs["loss"],
                            logs["reconstruction_loss"], self.beta * logs["kl_loss"])

    # --- serialization ----------------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"latent_dim": self.latent_dim, "hidden_units": list(self.hidden_units),
                       "beta": self.beta, "with_decoder": self.with_decoder, "seed": self.seed,
                       "id_capacity": self.id_capacity})
        return config


def _mean_of_prediction(y_true, y_pred):
    """The "loss" of the autoencoder's KL output: the per-example KL itself."""
    del y_true
    return y_pred


class _Autoencoder(keras.Model):
    """A `VAEBottom`'s encoder, sample and decoder as one model, for `VAEBottom.pretrain`.

    Outputs ``{"reconstruction": decoder(sample), "kl": per-example KL}``; its
    ``fit`` (any backend, XLA or not) trains the VAE's own weights. Nothing it
    computes leaves the party, so it records no release.
    """

    def __init__(self, vae: VAEBottom) -> None:
        super().__init__(dtype=vae.dtype_policy, name=f"{vae.name}_pretraining")
        self.vae = vae
        self.built = True

    def call(self, x: Any) -> dict[str, Any]:
        mu, logvar = self.vae._encode(x)
        return {"reconstruction": self.vae._decode(self.vae._sample(mu, logvar)),
                "kl": kl_to_standard_normal(mu, logvar)}

    def compute_output_spec(self, x: Any) -> dict[str, keras.KerasTensor]:
        batch = x.shape[:-1]
        return {"reconstruction": keras.KerasTensor(x.shape, dtype=self.compute_dtype),
                "kl": keras.KerasTensor(batch, dtype="float32")}
