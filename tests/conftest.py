"""Test session set-up: two logical CPU devices for MirroredStrategy tests.

Logical devices must be configured before TensorFlow initializes its runtime,
so this runs at conftest import time, before any test module touches TF.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
except RuntimeError:  # runtime already initialized (e.g. by a plugin)
    pass
