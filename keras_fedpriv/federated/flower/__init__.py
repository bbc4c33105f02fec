"""Run keras-fedpriv's protocols on Flower (``pip install "keras-fedpriv[flower]"``).

Flower (`flwr`) carries the messages between processes and machines; the
parties' code is the same as in one process (`HorizontalClient`,
`HorizontalServer` in `keras_fedpriv.federated.horizontal_parties`). Builders
return ready Flower apps that run on both of Flower's engines, the Simulation
Engine (`flwr.simulation.run_simulation`, ``flwr run`` on a local federation)
and the Deployment Engine (a ``flower-superlink`` and ``flower-supernode``
processes):

* `horizontal_client_app` / `horizontal_server_app`: horizontal FL with
  FedAvg, SignDS (+ MagRR) or the Gaussian upload.
* `HorizontalStrategy`: the server half as a Flower ``Strategy``, for a
  user's own ``ServerApp`` (``strategy.start(grid, ...)``).

See ``docs/flower.md``.
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "keras_fedpriv.federated.flower needs Flower: pip install \"keras-fedpriv[flower]\" "
        "(flwr[simulation]>=1.41,<1.42).") from err

from keras_fedpriv.federated.flower.horizontal import (  # noqa: E402
    FlowerRunResult,
    horizontal_client_app,
    horizontal_server_app,
    message_nbytes,
)
from keras_fedpriv.federated.flower.strategy import HorizontalStrategy  # noqa: E402

__all__ = ["FlowerRunResult", "HorizontalStrategy", "horizontal_client_app", "horizontal_server_app", "message_nbytes"]
