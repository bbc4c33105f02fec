"""Keras layers: LabelDPLayer, EmbeddingDPLayer and VAEBottom."""

from keras_fedpriv.layers.embedding_dp import EmbeddingDPLayer
from keras_fedpriv.layers.label_dp import LabelDPLayer
from keras_fedpriv.layers.vae_bottom import VAEBottom

__all__ = ["EmbeddingDPLayer", "LabelDPLayer", "VAEBottom"]
