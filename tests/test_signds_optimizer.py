"""The SignDS optimizer wrapper and SignDSRounds (keras_fedpriv/optimizers/signds_optimizer.py)
under model.fit."""

import keras
import numpy as np
import pytest

from keras_fedpriv.optimizers import SignDS, SignDSEncoder, SignDSRounds
from digits_stubs import digits, digits_model

pytestmark = [pytest.mark.jax]


def test_signds_optimizer_uploads_one_message_per_round_from_model_fit():
    x, y = digits()
    opt = SignDS(keras.optimizers.SGD(0.1), SignDSEncoder(k=0.2, eps=10.0, seed=0))
    model = digits_model(optimizer=opt)
    start = [w.copy() for w in model.get_weights()]
    got = []
    hist = model.fit(x[:200], y[:200], epochs=4, batch_size=50, verbose=0,
                     callbacks=[SignDSRounds(epochs_per_round=2, on_message=got.append)])
    assert len(got) == 2 == len(opt.messages)
    d = sum(w.size for w in start)
    for m in got:
        assert m.dim == d and m.sign in (-1, 1)
        assert np.all(np.diff(m.indices) > 0) and m.indices.dtype == np.int32
    # a deployed client keeps nothing of its plain update: back to the round's start
    for a, b in zip(model.get_weights(), start):
        np.testing.assert_array_equal(a, b)
    assert hist.history["upload_bytes"][1] == got[0].nbytes
    assert "upload_bytes" not in hist.history or len(hist.history["upload_bytes"]) == 2


def test_signds_optimizer_with_server_lr_applies_its_own_message():
    x, y = digits()
    opt = SignDS("sgd", SignDSEncoder(k=0.2, eps=10.0, seed=3))
    model = digits_model(optimizer=opt)
    start = np.concatenate([w.ravel() for w in model.get_weights()])
    model.fit(x[:100], y[:100], epochs=1, verbose=0, callbacks=[SignDSRounds(server_lr=0.5)])
    m = opt.messages[0]
    step = np.concatenate([w.ravel() for w in model.get_weights()]) - start
    want = np.zeros_like(step)
    want[m.indices] = 0.5 * m.sign
    np.testing.assert_allclose(step, want, atol=1e-6)


def test_signds_optimizer_round_trips_through_keras_file(tmp_path):
    opt = SignDS(keras.optimizers.Adam(0.01), SignDSEncoder(k=0.1, eps=5.0, dim_out=7))
    model = digits_model(optimizer=opt)
    x, y = digits()
    model.fit(x[:64], y[:64], epochs=1, verbose=0)
    path = tmp_path / "m.keras"
    model.save(path)
    back = keras.models.load_model(path)
    assert isinstance(back.optimizer, SignDS)
    assert isinstance(back.optimizer.inner_optimizer, keras.optimizers.Adam)
    assert back.optimizer.encoder.output_dim(1000) == 7
    assert back.optimizer.encoder.epsilon == 5.0
    assert "seed" not in back.optimizer.get_config()["encoder"] or \
        back.optimizer.get_config()["encoder"]["seed"] is None


def test_signds_rounds_needs_a_signds_optimizer():
    x, y = digits()
    with pytest.raises(TypeError, match="SignDS"):
        digits_model().fit(x[:10], y[:10], epochs=1, verbose=0, callbacks=[SignDSRounds()])


@pytest.mark.parametrize("kwargs", [
    dict(clipnorm=1.0), dict(clipvalue=0.5), dict(global_clipnorm=1.0), dict(weight_decay=1e-4),
    dict(use_ema=True), dict(loss_scale_factor=128.0), dict(gradient_accumulation_steps=2),
    dict(learning_rate=0.1),
])
def test_signds_refuses_base_optimizer_arguments_it_would_ignore(kwargs):
    (arg, value), = kwargs.items()
    with pytest.raises(ValueError, match=f"`{arg}`.*inner optimizer"):
        SignDS(keras.optimizers.SGD(0.1), **kwargs)
    with pytest.raises(TypeError, match="momentum"):
        SignDS(keras.optimizers.SGD(0.1), momentum=0.9)
    # defaults change nothing and are accepted; on the inner optimizer the argument works
    SignDS(keras.optimizers.SGD(0.1), clipnorm=None, use_ema=False)
    inner = keras.optimizers.SGD(**{"learning_rate": 0.2, **kwargs})
    assert getattr(SignDS(inner).inner_optimizer, arg) is not None


def test_signds_scales_the_loss_with_the_inner_loss_scale_factor():
    """model.fit scales the loss with SignDS.scale_loss; the inner optimizer unscales."""
    x, y = digits()
    plain = digits_model(optimizer=SignDS(keras.optimizers.SGD(0.1)))
    scaled = digits_model(optimizer=SignDS(keras.optimizers.SGD(0.1, loss_scale_factor=64.0)))
    for m in (plain, scaled):
        m.fit(x[:64], y[:64], epochs=2, batch_size=64, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), scaled.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
