"""`MalformedMessage`: what every party raises for a received message its protocol does not promise.

One base for both protocols: horizontal FL's `MalformedUpload` (a client's
upload) is a `MalformedMessage`, and vertical FL raises `MalformedMessage`
itself (an embedding, a cut gradient, example ids). A receiver catches it,
logs the reason and never uses the message; the reason names what is wrong,
never a value.
"""

from __future__ import annotations

__all__ = ["MalformedMessage"]


class MalformedMessage(ValueError):
    """A received message that is not what the protocol promises (never used)."""
