"""Test session set-up: the backend passes, and two logical CPU devices for MirroredStrategy tests.

On TensorFlow (the default), logical devices must be configured before TensorFlow initializes
its runtime, so this runs at conftest import time, before any test module touches TF. Under
``KERAS_BACKEND=jax`` only the backend-neutral modules (marked ``jax``) are collected, and
collecting one must not import TensorFlow (a GPU machine with JAX has none).
"""

import functools
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

#: The Keras backend of this test process (``KERAS_BACKEND``; TensorFlow by default).
BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")

if BACKEND == "tensorflow":
    import tensorflow as tf  # noqa: E402

    _cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            _cpus[0],
            [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    except RuntimeError:  # runtime already initialized (e.g. by a plugin)
        pass
elif "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Two CPU devices for the data-parallel tests (keras.distribution), set before JAX
    # starts; Keras places everything else on the first device, as with one.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=2").strip()


#: The text that marks a backend-neutral test module (``pytestmark = [pytest.mark.jax]``).
JAX_MARK = "pytest.mark.jax"


@functools.cache
def _mentions_the_jax_mark(path: str) -> bool:
    """Whether the file at ``path`` has the ``jax`` mark's text (read, not imported)."""
    return JAX_MARK in pathlib.Path(path).read_text(encoding="utf-8")


#: ``KERAS_FEDPRIV_JAX_TESTS=core`` (what `make test`'s JAX pass sets, to stay within CI's
#: time): only these `jax` modules run: the backend interface (a VerticalModel step
#: included, in test_jax), the mechanisms' statistical tests, the layers, the adversarial
#: tests of their inputs, restores and ledger, and the horizontal local step.
#: The other `jax` modules test host-side code that is the same on every backend; `make
#: test-jax` and bench/gpu_check.py run them all.
JAX_CORE = {
    "test_backend", "test_jax", "test_private", "test_gpu_check",
    # the mechanisms' statistical tests
    "test_random", "test_randomized_response", "test_quantize", "test_signds", "test_magrr",
    "test_laplace", "test_gaussian",
    # the layers
    "test_label_dp", "test_label_formats", "test_input_checks", "test_embedding_dp",
    "test_vae_bottom", "test_layers", "test_secret_rng", "test_release_counter",
    "test_local_state",
    # the adversarial tests of their guarantees (inputs, restores, the ledger)
    "test_adversarial_label_inputs", "test_adversarial_restore", "test_adversarial_ledger",
    # a step of each protocol
    "test_horizontal_parties", "test_signds_optimizer",
}


def pytest_ignore_collect(collection_path: pathlib.Path, config: pytest.Config) -> bool | None:
    """Under a backend other than TensorFlow, a test module without the ``jax`` mark is not
    even imported (it may import TensorFlow); its text is read for the mark instead. With
    ``KERAS_FEDPRIV_JAX_TESTS=core``, only the modules of ``JAX_CORE``."""
    if BACKEND == "tensorflow" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    if (os.environ.get("KERAS_FEDPRIV_JAX_TESTS") == "core"
            and collection_path.stem not in JAX_CORE):
        return True
    return None if _mentions_the_jax_mark(str(collection_path)) else True


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """Under a backend other than TensorFlow, collecting (importing) a test module that
    imports TensorFlow, directly or through what it imports, is a collection error naming
    the module: a `jax` module must run where TensorFlow is not installed."""
    had_tensorflow = "tensorflow" in sys.modules
    report = yield
    if (BACKEND != "tensorflow" and isinstance(collector, pytest.Module) and not had_tensorflow
            and "tensorflow" in sys.modules and report.outcome == "passed"):
        report.outcome = "failed"
        report.longrepr = (
            f"{collector.path.name} imported TensorFlow while it was collected under "
            f"KERAS_BACKEND={BACKEND}: a module marked `jax` must not import TensorFlow, "
            "directly or through keras_fedpriv (import it inside a test marked "
            "`tensorflow_only` instead)")
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under ``KERAS_BACKEND=jax`` only modules marked ``jax`` run (backend-neutral tests),
    and in them the tests marked ``tensorflow_only`` are skipped."""
    if BACKEND == "tensorflow":
        return
    if item.get_closest_marker("jax") is None:
        pytest.skip(f"not a backend-neutral test (no `jax` mark); KERAS_BACKEND={BACKEND}")
    marker = item.get_closest_marker("tensorflow_only")
    if marker is not None:
        reason = marker.args[0] if marker.args else "needs TensorFlow"
        pytest.skip(f"TensorFlow only: {reason}")


@pytest.fixture(scope="session")
def strategy():
    """One MirroredStrategy over the two logical CPUs for the whole session.

    Two MirroredStrategy objects over the same devices in one process reuse the
    same collective group keys and abort each other's all-reduces ("Shape
    mismatch in the collective instance"), so every test module shares this one.
    """
    if BACKEND != "tensorflow":
        pytest.skip("MirroredStrategy is TensorFlow's")
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


@pytest.fixture
def in_a_run(monkeypatch):
    """Flower builds a Message only inside a run: a stand-in run id for tests that build
    Messages outside one (stand-in Grids)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0)


# Modules whose tests each start Flower processes of their own (a SuperLink and SuperNodes
# on free 127.0.0.1 ports) and share no module fixture: each test is a group of its own.
# (test_adversarial_vertical_faults and test_flower_faults_horizontal share one deployment
# between their runs: each module is one group.)
_OWN_GROUP_MODULES = {"test_flower_loopback"}
_SIMULATION = "flower-simulation"


@functools.cache
def _runs_simulation(path: str) -> bool:
    """Whether the test module at ``path`` runs Flower's Simulation Engine: it calls
    ``run_simulation(``, or a test of it is marked ``simulation_engine`` (one that runs code,
    such as a docs snippet, that calls it). A module that only names it does not."""
    text = pathlib.Path(path).read_text(encoding="utf-8")
    return "run_simulation(" in text or "pytest.mark.simulation_engine" in text


def _group(nodeid: str, root: pathlib.Path) -> str:
    """The worker group of a test under ``pytest -n N --dist loadgroup``.

    Tests of a module that runs Flower's Simulation Engine
    (``flwr.simulation.run_simulation``, which starts a Ray cluster) share one
    group: they run one after another on one worker, so two Ray clusters never
    start at once. Tests that start a Deployment Engine of their own (SuperLink
    and SuperNode processes on free ports) may run beside any other test: they
    spend most of their time waiting on Flower's polling, so a test of the
    loopback module is a group of its own. Every other test stays with its
    module, so a module-scoped fixture (a trained model, a demo run, a party
    worker process) is built once.
    """
    path = nodeid.split("::", 1)[0]  # relative to the root directory
    if pathlib.Path(path).stem in _OWN_GROUP_MODULES:
        return nodeid
    return _SIMULATION if _runs_simulation(str(root / path)) else path


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup`` with the groups of ``_group``, handed out in collection order.

    pytest-xdist 3.8 marks a test's group by rewriting a node id attribute that
    pytest 9 no longer reads, so its own ``loadgroup`` sends every test on its
    own (module fixtures run on every worker, Ray clusters start side by side).
    This scheduler groups by node id instead, and keeps the order set in
    ``pytest_collection_modifyitems`` (xdist would re-sort the groups by their
    number of tests, starting the one-test loopback groups last).
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid, config.rootpath)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


def _rank(group: str, items: list[pytest.Item]) -> int:
    """Where a group starts (lower first): the Simulation Engine group, each loopback test,
    the other groups with a slow test, then the rest."""
    if group == _SIMULATION:
        return 0
    if group == items[0].nodeid:  # a test of its own
        return 1
    return 2 if any(i.get_closest_marker("slow") for i in items) else 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the slow groups first.

    The groups are handed out in this order (see ``pytest_xdist_make_scheduler``):
    starting the longest groups first keeps one worker from starting a long
    group when the others have nothing left to do.
    """
    members: dict[str, list[pytest.Item]] = {}
    for item in items:
        members.setdefault(_group(item.nodeid, config.rootpath), []).append(item)
    rank = {g: _rank(g, m) for g, m in members.items()}
    items.sort(key=lambda i: rank[_group(i.nodeid, config.rootpath)])  # stable: order within kept
