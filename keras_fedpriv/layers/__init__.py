"""Keras layers: LabelDPLayer and EmbeddingDPLayer (VAEBottom comes with the vertical-FL issue)."""

from keras_fedpriv.layers.embedding_dp import EmbeddingDPLayer
from keras_fedpriv.layers.label_dp import LabelDPLayer

__all__ = ["EmbeddingDPLayer", "LabelDPLayer"]
