"""What the Flower tests share: the seeded test app's model, a stand-in reply, and the
Simulation Engine's worker settings."""

import pathlib
import sys

APP = pathlib.Path(__file__).resolve().parent / "flower_app"

# The Simulation Engine's backend_config: one Ray worker process per simulation (each more one
# imports TensorFlow and the package again: about 8 CPU-s a run on 2 cores), whatever the
# machine's cores; TWO_WORKERS, for a run that must match the in-process run while a node's
# messages move between processes.
ONE_WORKER = {"init_args": {"num_cpus": 1}, "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
TWO_WORKERS = {"init_args": {"num_cpus": 2}, "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}


def load_test_app():
    """The seeded Deployment Engine test app's module (``tests/flower_app/kfp_test_app``)."""
    sys.path.insert(0, str(APP))
    try:
        from kfp_test_app import apps
    finally:
        sys.path.remove(str(APP))
    return apps


def model_fn():
    """The test app's model (the same initial weights everywhere)."""
    return load_test_app().model_fn()


class Reply:
    """A stand-in for a received Flower ``Message``: content, sender, an error reason or None."""

    def __init__(self, content, node=1, error=None):
        self.content = content

        class _Meta:
            src_node_id = node

        self.metadata = _Meta()
        self._error = error

    def has_error(self):
        return self._error not in (None, False)

    @property
    def error(self):
        class _Error:
            reason = self._error

        return _Error()
