"""Wide&Deep for the Criteo-like workload: split between two parties, or as one Keras model.

The model the label-DP design this package follows was shown on: Wide&Deep
(Cheng et al., "Wide & Deep Learning for Recommender Systems", DLRS 2016)
over Criteo, split between a follower and a leader
(`keras_fedpriv.criteo_like`):

* the follower's bottom: an embedding of each of its categorical fields,
  concatenated, then ``Dense(bottom_units)`` (linear; or a `VAEBottom`): the
  embedding it sends;
* the leader's bottom: an embedding of each of its categorical fields and its
  dense fields, concatenated, then ``Dense(bottom_units, relu)``;
* the leader's top over both bottoms' outputs (follower's first): a **wide**
  linear part plus a **deep** MLP (``hidden_units``, ReLU), added, sigmoid.

`wide_deep_vertical` assembles the parts as a `VerticalModel` (with label DP,
EmbeddingDP or a VAE bottom passed through); `wide_deep_model` builds the
same layers as one plain `keras.Model` over the same inputs, for comparing the
protocol's cost with plain Keras. With the same ``seed`` both start from the
same weights.

Example:
    >>> data = CriteoLike(100_000, seed=0)
    >>> model = wide_deep_vertical(data, label_dp=LabelDPLayer(eps=2.0), seed=0)
    >>> model.compile("adam", "binary_crossentropy", metrics=[keras.metrics.AUC()])
    >>> model.fit(data.batches(1024), epochs=1)
    >>> plain = wide_deep_model(data, seed=0)       # the same architecture in one model
    >>> plain.compile("adam", "binary_crossentropy")
    >>> plain.fit(data.batches(1024, example_ids=False), epochs=1)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import keras
import numpy as np

from keras_fedpriv.criteo_like import FOLLOWER, LEADER
from keras_fedpriv.mechanisms.validation import (
    validate_int_sequence,
    validate_positive_int,
    validate_seed,
)

__all__ = ["FieldEmbedding", "wide_deep_model", "wide_deep_parts", "wide_deep_vertical"]


@keras.saving.register_keras_serializable(package="keras_fedpriv")
class FieldEmbedding(keras.layers.Layer):
    """Embeds the id columns of a row, keeps the columns before them: ``[x[:, :first], e]``.

    Columns ``first_column ..`` of the input hold one id per categorical field
    (integers, or floats holding integers), each in ``[0, vocabulary_size)``;
    each field has its own table of ``embedding_dim``-wide vectors (stored as
    one table, field f's ids offset by ``f * vocabulary_size``). The output is
    the first ``first_column`` columns as floats, then every field's vector.

    Args:
        num_fields: categorical fields (id columns), >= 1.
        vocabulary_size: ids per field, >= 1.
        embedding_dim: width of each field's vectors, >= 1.
        first_column: columns before the ids (kept as they are), >= 0.
        seed: seeds the table's initializer (None: Keras' global seed).
        **kwargs: `keras.layers.Layer` arguments.

    Example:
        >>> layer = FieldEmbedding(13, 10_000, 8, first_column=13)   # 13 dense, 13 ids
        >>> layer(x_leader).shape                                    # (batch, 13 + 13 * 8)
    """

    def __init__(self, num_fields: int, vocabulary_size: int, embedding_dim: int,
                 first_column: int = 0, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_fields = validate_positive_int(num_fields, "num_fields")
        self.vocabulary_size = validate_positive_int(vocabulary_size, "vocabulary_size")
        self.embedding_dim = validate_positive_int(embedding_dim, "embedding_dim")
        self.first_column = validate_positive_int(first_column, "first_column", minimum=0)
        self.seed = validate_seed(seed)

    def build(self, input_shape: Any) -> None:
        width = input_shape[-1]
        if width is not None and width != self.first_column + self.num_fields:
            raise ValueError(f"FieldEmbedding: the input has {width} columns; expected "
                             f"first_column + num_fields = {self.first_column} + "
                             f"{self.num_fields}.")
        self.table = self.add_weight(
            shape=(self.num_fields * self.vocabulary_size, self.embedding_dim), name="table",
            initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=self.seed))

    def call(self, inputs: Any) -> Any:
        ops = keras.ops
        ids = ops.cast(inputs[:, self.first_column:], "int32")
        offsets = ops.arange(self.num_fields, dtype="int32") * self.vocabulary_size
        vectors = ops.take(self.table, ids + offsets, axis=0)
        vectors = ops.reshape(vectors, (-1, self.num_fields * self.embedding_dim))
        if self.first_column == 0:
            return vectors
        kept = ops.cast(inputs[:, :self.first_column], vectors.dtype)
        return ops.concatenate([kept, vectors], axis=-1)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (input_shape[0], self.first_column + self.num_fields * self.embedding_dim)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_fields": self.num_fields,
                "vocabulary_size": self.vocabulary_size, "embedding_dim": self.embedding_dim,
                "first_column": self.first_column, "seed": self.seed}


def _layout(data):
    """(follower fields, leader dense, leader fields, vocabulary) of a `CriteoLike`-shaped spec."""
    try:
        follower = data.follower_fields
        return (follower, data.num_dense, data.num_categorical - follower, data.vocabulary_size)
    except AttributeError:
        raise TypeError(f"`data` must be a `CriteoLike` (or have its follower_fields, "
                        f"num_dense, num_categorical and vocabulary_size); got "
                        f"{type(data).__name__}.") from None


def wide_deep_parts(data: Any, *, embedding_dim: int = 8, bottom_units: int = 16,
                    hidden_units: Sequence[int] = (64, 32), vae: keras.layers.Layer | None = None,
                    seed: int = 0) -> tuple[dict[str, keras.Model], keras.Model]:
    """The follower's and the leader's bottoms and the leader's top (see the module docstring).

    Args:
        data: a `CriteoLike` (its fields and vocabulary size shape the inputs).
        embedding_dim: width of each categorical field's embedding.
        bottom_units: width of each bottom's output (what the follower sends).
        hidden_units: widths of the deep part's hidden layers.
        vae: None, or a `VAEBottom` (``latent_dim=bottom_units``) that replaces
            the follower's last ``Dense``: it then sends a sample.
        seed: seeds every initializer (a non-negative int): the same seed gives
            the same weights.

    Returns:
        ``({FOLLOWER: follower_bottom, LEADER: leader_bottom}, top)``, built
        Keras models.

    Example:
        >>> bottoms, top = wide_deep_parts(CriteoLike(seed=0), seed=0)
    """
    follower_fields, num_dense, leader_fields, vocabulary = _layout(data)
    embedding_dim = validate_positive_int(embedding_dim, "embedding_dim")
    bottom_units = validate_positive_int(bottom_units, "bottom_units")
    hidden = validate_int_sequence(hidden_units, "hidden_units", what="layer widths")
    seed = validate_seed(seed)
    if seed is None:
        raise TypeError("`seed` must be a non-negative integer (the initializers' seed); got "
                        "None.")
    seeds = iter(int(s) for s in np.random.default_rng(seed).integers(0, 2**31 - 1, size=16))

    def dense(units, activation=None, name=None):
        return keras.layers.Dense(units, activation=activation, name=name,
                                  kernel_initializer=keras.initializers.GlorotUniform(next(seeds)))

    x_f = keras.Input((follower_fields,), dtype="int32", name=FOLLOWER)
    h_f = FieldEmbedding(follower_fields, vocabulary, embedding_dim, seed=next(seeds),
                         name="follower_embeddings")(x_f)
    if vae is None:
        out_f = dense(bottom_units, name="follower_dense")(h_f)
    elif isinstance(vae, keras.layers.Layer) and getattr(vae, "latent_dim", None) is not None:
        if vae.latent_dim != bottom_units:
            raise ValueError(f"`vae`: its latent_dim ({vae.latent_dim}) must equal "
                             f"`bottom_units` ({bottom_units}), the width the top expects.")
        out_f = vae(h_f)
    else:
        raise TypeError(f"`vae` must be None or a VAEBottom layer; got {type(vae).__name__}.")
    follower = keras.Model(x_f, out_f, name="follower_bottom")

    x_l = keras.Input((num_dense + leader_fields,), dtype="float32", name=LEADER)
    h_l = FieldEmbedding(leader_fields, vocabulary, embedding_dim, first_column=num_dense,
                         seed=next(seeds), name="leader_embeddings")(x_l)
    leader = keras.Model(x_l, dense(bottom_units, "relu", name="leader_dense")(h_l),
                         name="leader_bottom")

    h = keras.Input((2 * bottom_units,), name="top_in")
    wide = dense(1, name="wide")(h)
    deep = h
    for i, width in enumerate(hidden):
        deep = dense(width, "relu", name=f"deep_{i}")(deep)
    deep = dense(1, name="deep_out")(deep)
    top = keras.Model(h, keras.layers.Activation("sigmoid", name="click")(
        keras.layers.Add(name="wide_plus_deep")([wide, deep])), name="top")
    return {FOLLOWER: follower, LEADER: leader}, top


def wide_deep_vertical(data: Any, *, label_dp: Any = None,
                       embedding_dp: keras.layers.Layer | Mapping[str, Any] | None = None,
                       vae: keras.layers.Layer | None = None, labels_privatized: bool = False,
                       **parts: Any) -> Any:
    """Wide&Deep as a `VerticalModel`: the follower sends its bottom's output to the leader.

    Inputs are `CriteoLike.parties` / `CriteoLike.batches` dicts (with
    ``"example_ids"``, which label DP needs). Not compiled.

    Args:
        data: a `CriteoLike`.
        label_dp: None or a `LabelDPLayer`, applied by the leader (see `VerticalModel`).
        embedding_dp: None or the protection of the follower's embedding (an
            `EmbeddingDPLayer`, see `VerticalModel`).
        vae: None or a `VAEBottom` as the follower's last layer (see `wide_deep_parts`).
        labels_privatized: as in `VerticalModel`.
        **parts: `wide_deep_parts` arguments (``embedding_dim``, ``bottom_units``,
            ``hidden_units``, ``seed``).

    Returns:
        A `VerticalModel` with the leader ``"leader"`` and the follower ``"follower"``.

    Example:
        >>> model = wide_deep_vertical(data, embedding_dp=EmbeddingDPLayer(eps=4.0), seed=0)
    """
    from keras_fedpriv.federated.vertical.model import VerticalModel

    bottoms, top = wide_deep_parts(data, vae=vae, **parts)
    return VerticalModel(bottoms, top, leader=LEADER, embedding_dp=embedding_dp,
                         label_dp=label_dp, labels_privatized=labels_privatized,
                         name="wide_deep_vertical")


def wide_deep_model(data: Any, *, embedding_dp: keras.layers.Layer | None = None,
                    vae: keras.layers.Layer | None = None, **parts: Any) -> keras.Model:
    """The same Wide&Deep as one plain `keras.Model` (no protocol): the baseline.

    Takes ``{"follower": ..., "leader": ...}`` (`CriteoLike.parties` /
    `CriteoLike.batches` with ``example_ids=False``). With the same ``seed``
    its weights start equal to `wide_deep_vertical`'s. Label DP has no place
    in a plain model: privatize the labels first (`keras_fedpriv.privatize_labels`).
    Not compiled.

    Args:
        data: a `CriteoLike`.
        embedding_dp: None or a layer applied to the follower's bottom output
            (e.g. an `EmbeddingDPLayer`), as `VerticalModel` applies it.
        vae: None or a `VAEBottom` (see `wide_deep_parts`).
        **parts: `wide_deep_parts` arguments.

    Returns:
        A functional `keras.Model` named ``"wide_deep"``.

    Example:
        >>> plain = wide_deep_model(CriteoLike(seed=0), seed=0)
    """
    if embedding_dp is not None and not isinstance(embedding_dp, keras.layers.Layer):
        raise TypeError(f"`embedding_dp` must be None or a Keras layer; got "
                        f"{type(embedding_dp).__name__}.")
    bottoms, top = wide_deep_parts(data, vae=vae, **parts)
    inputs = {name: keras.Input(bottom.inputs[0].shape[1:], dtype=bottom.inputs[0].dtype,
                                name=name) for name, bottom in bottoms.items()}
    sent = bottoms[FOLLOWER](inputs[FOLLOWER])
    if embedding_dp is not None:
        sent = embedding_dp(sent)
    joined = keras.layers.Concatenate(name="cut")([sent, bottoms[LEADER](inputs[LEADER])])
    return keras.Model(inputs, top(joined), name="wide_deep")
