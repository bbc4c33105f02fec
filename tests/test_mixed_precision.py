"""Mixed precision: HorizontalFL local training, SignDS under a LossScaleOptimizer, layer dtypes."""

import keras
import numpy as np
import pytest

from keras_fedpriv.federated import HorizontalFL, partition
from keras_fedpriv.layers import EmbeddingDPLayer, LabelDPLayer
from keras_fedpriv.optimizers import SignDS, SignDSEncoder, SignDSRounds
from digits_stubs import digits, digits_model

pytestmark = [pytest.mark.jax]


@pytest.fixture
def policy():
    """Set a global dtype policy for one test; the previous one is restored afterwards."""
    before = keras.mixed_precision.global_policy()
    try:
        yield keras.mixed_precision.set_global_policy
    finally:
        keras.mixed_precision.set_global_policy(before)


def _accuracy(model, x, y):
    return model.evaluate(x, y, batch_size=1024, verbose=0, return_dict=True)["accuracy"]


@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_fedavg_trains_under_mixed_precision(policy, name):
    policy(name)
    x, y = digits()
    model = digits_model(lr=0.3)
    assert model.layers[0].compute_dtype == name.split("_")[1]
    if name == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    start = [w.copy() for w in model.get_weights()]
    before = _accuracy(model, x[1400:], y[1400:])
    fl = HorizontalFL(model, partition(x[:1400], y[:1400], 20, seed=0), seed=0)
    fl.fit(rounds=4, clients_per_round=5, local_epochs=3, verbose=0)
    after = _accuracy(model, x[1400:], y[1400:])
    moved = max(np.abs(a - b).max() for a, b in zip(model.get_weights(), start))
    assert moved > 0.05          # unscaled float16 steps moved the weights by ~1e-5
    assert after > 0.6 and after > before + 0.3
    assert all(w.dtype == np.float32 for w in model.get_weights())


def test_fedavg_client_update_is_float32_and_loss_scale_restarts_per_client(policy):
    policy("mixed_float16")
    x, y = digits()
    model = digits_model(lr=0.3)
    fl = HorizontalFL(model, [(x[:64], y[:64]), (x[64:128], y[64:128])], batch_size=128, seed=0)
    start = [v.numpy() for v in model.trainable_variables]
    opt = model.optimizer
    first, _ = fl.train_client(0, start, local_epochs=2)
    opt.dynamic_scale.assign(4.0)                 # as after a run of non-finite gradients
    again, _ = fl.train_client(0, start, local_epochs=2)
    assert first.dtype == np.float32
    np.testing.assert_allclose(first, again, atol=1e-6)
    assert float(opt.dynamic_scale.numpy()) == 2.0 ** 15
    assert int(opt.iterations.numpy()) == 2


def test_signds_rounds_accepts_a_loss_scale_optimizer_wrapping_signds(policy):
    policy("mixed_float16")
    x, y = digits()
    model = digits_model(optimizer=SignDS(keras.optimizers.SGD(0.1),
                                    SignDSEncoder(k=0.2, eps=10.0, seed=0)))
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    inner = model.optimizer.inner_optimizer
    assert isinstance(inner, SignDS)
    start = [w.copy() for w in model.get_weights()]
    got = []
    hist = model.fit(x[:200], y[:200], epochs=4, batch_size=50, verbose=0,
                     callbacks=[SignDSRounds(epochs_per_round=2, on_message=got.append)])
    assert len(got) == 2 == len(inner.messages)
    d = sum(w.size for w in start)
    assert all(m.dim == d and len(m.indices) > 0 for m in got)
    assert hist.history["upload_bytes"] == [float(m.nbytes) for m in got]
    assert inner.last_magnitude > 1e-3         # unscaled float16 steps would be ~1e-6
    for a, b in zip(model.get_weights(), start):  # back at the round's start
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------- layers
def test_layers_declare_their_real_output_dtype_symbolically():
    labels = keras.Input((1,), dtype="int32")
    out = LabelDPLayer(1.0, mode="sparse", num_classes=3, per_batch=True)(labels)
    assert out.dtype == "int32" and tuple(out.shape) == (None, 1)
    onehot = keras.Input((3,), dtype="float16")
    out = LabelDPLayer(1.0, mode="onehot", per_batch=True)(onehot)
    assert out.dtype == "float16" and tuple(out.shape) == (None, 3)
    emb = keras.Input((4,), dtype="float16")
    out = EmbeddingDPLayer(1.0)(emb)
    assert out.dtype == "float16" and tuple(out.shape) == (None, 4)


def test_layers_symbolic_and_real_dtypes_agree_under_mixed_float16(policy):
    policy("mixed_float16")
    emb = keras.Input((4,))
    out = EmbeddingDPLayer(1.0, seed=1)(emb)
    model = keras.Model(emb, out)
    real = model(np.full((2, 4), 0.5, np.float32), training=True)
    assert out.dtype == "float32" == keras.backend.standardize_dtype(real.dtype)

    labels = keras.Input((1,), dtype="int32")
    out = LabelDPLayer(1.0, mode="sparse", num_classes=3, per_batch=True, seed=1)(labels)
    model = keras.Model(labels, out)
    real = model(np.ones((2, 1), np.int32), training=True)
    assert out.dtype == "int32" == keras.backend.standardize_dtype(real.dtype)

    half = keras.Input((4,))
    out = EmbeddingDPLayer(1.0, seed=1)(keras.layers.Dense(4)(half))  # float16 activations
    model = keras.Model(half, out)
    real = model(np.full((2, 4), 0.5, np.float32), training=True)
    assert out.dtype == "float16" == keras.backend.standardize_dtype(real.dtype)
