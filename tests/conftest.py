"""Test session set-up: two logical CPU devices for MirroredStrategy tests.

Logical devices must be configured before TensorFlow initializes its runtime,
so this runs at conftest import time, before any test module touches TF.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
except RuntimeError:  # runtime already initialized (e.g. by a plugin)
    pass


@pytest.fixture(scope="session")
def strategy():
    """One MirroredStrategy over the two logical CPUs for the whole session.

    Two MirroredStrategy objects over the same devices in one process reuse the
    same collective group keys and abort each other's all-reduces ("Shape
    mismatch in the collective instance"), so every test module shares this one.
    """
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs the two logical CPUs configured in conftest.py")
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
