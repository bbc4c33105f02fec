"""What the Flower tests share: the seeded test app's model and a stand-in reply."""

import pathlib
import sys

APP = pathlib.Path(__file__).resolve().parent / "flower_app"


def model_fn():
    """The seeded Deployment Engine test app's model (the same initial weights everywhere)."""
    sys.path.insert(0, str(APP))
    try:
        from kfp_test_app.apps import model_fn as build
    finally:
        sys.path.remove(str(APP))
    return build()


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
