"""Vertical FL as Flower apps: the same as `keras_fedpriv.federated.flower.vertical`.

Kept so that ``from keras_fedpriv.federated.flower_vertical import
vertical_client_app, vertical_server_app`` goes on working; new code imports
`keras_fedpriv.federated.flower.vertical`.
"""

from __future__ import annotations

from keras_fedpriv.federated.flower.vertical import (
    vertical_client_app,
    vertical_server_app,
)

__all__ = ["vertical_client_app", "vertical_server_app"]
