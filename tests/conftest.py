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


@pytest.fixture(autouse=True)
def _restore_environment():
    """Put ``os.environ`` back after every test.

    Tests share worker processes (``make test`` runs them on parallel workers);
    a variable one test sets, or a library sets for it (Flower's Simulation
    Engine rewrites ``PYTHONPATH`` when it starts Ray), must not reach the
    processes the next test starts.
    """
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


def _group(item: pytest.Item) -> str:
    """The worker group of a test under ``pytest -n N --dist loadgroup``.

    Tests that start Flower (the Simulation Engine's Ray, or SuperLink and
    SuperNode processes) share one group: they run one after another on one
    worker, so a run never starts two Flower deployments of its own at once on
    a small machine. Every other test stays with its module, so a module-scoped
    fixture (a trained model, a demo run) is built once.
    """
    return "flower" if item.get_closest_marker("flower") is not None else item.module.__name__


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group tests for parallel workers, and start the slow groups first.

    Under ``--dist loadgroup`` the groups are handed out in order: putting the
    groups with slow tests at the front keeps one worker from starting a long
    group when the other has nothing left to do.
    """
    groups = {item.nodeid: _group(item) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    slow = {groups[i.nodeid] for i in items
            if i.get_closest_marker("slow") or i.get_closest_marker("flower")}
    items.sort(key=lambda i: groups[i.nodeid] not in slow)  # stable: order within kept
