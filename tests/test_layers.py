"""What the two protection layers share: config round trip and registration for deserialization."""

import keras
import pytest

import keras_fedpriv as kf

pytestmark = [pytest.mark.jax]


def test_get_config_round_trip():
    layer = kf.LabelDPLayer(0.7, mode="sparse", num_classes=4, per_batch=True, name="ldp")
    clone = kf.LabelDPLayer.from_config(layer.get_config())
    assert (clone.eps, clone.mode, clone.num_classes, clone.per_batch, clone.seed) == \
        (0.7, "sparse", 4, True, None)
    e = kf.EmbeddingDPLayer(3.0, seed=5, at_inference=False, ste="hardtanh")
    c = kf.EmbeddingDPLayer.from_config(e.get_config())
    assert (c.eps, c.seed, c.at_inference, c.ste) == (3.0, 5, False, "hardtanh")
    assert "rng_key" not in str(layer.get_config())


def test_layers_are_registered_for_deserialization():
    for layer in [kf.LabelDPLayer(1.0), kf.EmbeddingDPLayer(1.0)]:
        restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
        assert type(restored) is type(layer) and restored.eps == 1.0


