"""What the Flower tests share: the seeded test app's model and a stand-in reply."""

import pathlib
import sys

APP = pathlib.Path(__file__).resolve().parent / "flower_app"


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
