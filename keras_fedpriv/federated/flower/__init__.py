"""Run keras-fedpriv's protocols on Flower (``pip install -e ".[flower]"`` in the clone's root).

Flower (`flwr`) carries the messages between processes and machines; the
parties' code and the round loops are the same as in one process
(`keras_fedpriv.federated.horizontal`, `keras_fedpriv.federated.vertical`):
these modules only carry the loops' requests and replies as Flower messages. Builders
return ready Flower apps that run on both of Flower's engines, the Simulation
Engine (``flwr run`` on Flower's ``local`` connection, or the deprecated
`flwr.simulation.run_simulation` from Python)
and the Deployment Engine (a ``flower-superlink`` and ``flower-supernode``
processes):

* `horizontal_client_app` / `horizontal_server_app`: horizontal FL with
  FedAvg, SignDS (+ MagRR) or the Gaussian upload.
* `HorizontalStrategy`: the server half as a Flower ``Strategy``, for a
  user's own ``ServerApp`` (``strategy.start(grid, ...)``).
* `vertical_client_app` / `vertical_server_app`: vertical FL, the leader
  as the ``ServerApp`` and each follower a ``ClientApp``
  (`keras_fedpriv.federated.flower.vertical`).
* `VerticalStrategy`: the vertical leader as one class, the mirror of
  `HorizontalStrategy`, for a user's own ``ServerApp``
  (``strategy.start(grid, data, run_config=...)``).
* `relay_client_app` and `serve_worker`: a party's long-lived worker
  process, which keeps TensorFlow and the models loaded across messages, and
  the thin ClientApp that hands each message to it
  (`keras_fedpriv.federated.flower.worker`).

Names are imported on first use: the relay ClientApp's process imports
Flower and the standard library only. See ``docs/flower.md``.
"""

from __future__ import annotations

#: How to install Flower beside keras-fedpriv (the package is not on the package index).
INSTALL_HINT = ("pip install -e \".[flower]\" in the root of your keras-fedpriv clone, or "
                "pip install \"flwr[simulation]>=1.41,<1.42\" into the environment where "
                "keras-fedpriv is installed.")

try:
    import flwr  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError("keras_fedpriv.federated.flower needs Flower: " + INSTALL_HINT) from err

from keras_fedpriv._lazy import lazy_exports  # noqa: E402

#: exported name -> the module that defines it (imported on first use)
_EXPORTS = {
    "FlowerRunResult": "keras_fedpriv.federated.flower.horizontal",
    "horizontal_client_app": "keras_fedpriv.federated.flower.horizontal",
    "horizontal_server_app": "keras_fedpriv.federated.flower.horizontal",
    "message_nbytes": "keras_fedpriv.federated.flower.horizontal",
    "HorizontalStrategy": "keras_fedpriv.federated.flower.strategy",
    "central_dp": "keras_fedpriv.federated.flower.central_dp",
    "relay_client_app": "keras_fedpriv.federated.flower.worker",
    "serve_worker": "keras_fedpriv.federated.flower.worker",
    "vertical_client_app": "keras_fedpriv.federated.flower.vertical",
    "vertical_server_app": "keras_fedpriv.federated.flower.vertical",
    "VerticalStrategy": "keras_fedpriv.federated.flower.vertical_strategy",
}
lazy_exports(__name__, _EXPORTS, ())

__all__ = sorted(_EXPORTS)
