"""The package logger: progress goes through logging, with verbosity control."""

import logging

import numpy as np
import pytest

import keras_fedpriv as kf


def test_verbose_progress_goes_through_the_package_logger(caplog):
    vae = kf.VAEBottom(2, hidden_units=(8,), with_decoder=True, seed=0)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    kf.logger.propagate = True  # let caplog see it
    try:
        with caplog.at_level(logging.INFO, logger="keras_fedpriv"):
            vae.pretrain(x, epochs=2, batch_size=16, verbose=1)
            vae.pretrain(x, epochs=1, batch_size=16, verbose=0)
    finally:
        kf.logger.propagate = False
    lines = sorted({r.getMessage() for r in caplog.records if r.name == "keras_fedpriv"})
    assert len(lines) == 2  # the two epochs of the verbose call, none of the quiet one
    assert lines[0].startswith("VAEBottom.pretrain epoch 1/2: loss=")


def test_set_verbosity():
    previous = kf.set_verbosity("info")
    try:
        assert kf.logger.level == logging.INFO
        assert kf.set_verbosity(logging.ERROR) == logging.INFO
    finally:
        kf.set_verbosity(previous)
    with pytest.raises(ValueError, match="level"):
        kf.set_verbosity("loud")
