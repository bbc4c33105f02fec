"""Horizontal FL: clients with different examples of the same features, one server.

The same parts under the same names as `keras_fedpriv.federated.vertical`:

* `parties` (`keras_fedpriv.federated.horizontal.parties`): the protocol's
  halves, `HorizontalClient` (local training and the upload) and
  `HorizontalServer` (aggregation and evaluation), with `LocalTrainer`;
* `loop` (`keras_fedpriv.federated.horizontal.loop`): `HorizontalLoop`, the
  round loop, with no I/O of its own: typed requests and replies
  (`TrainRequest`, `TrainReply`, `EvaluateRequest`, `EvaluateReport`);
* `wire` (`keras_fedpriv.federated.horizontal.wire`): every record name,
  config key, encoder and parser of the messages as Flower records (needs
  Flower);
* `driver` (`keras_fedpriv.federated.horizontal.driver`): `HorizontalFL`,
  the loop in one process.

The Flower apps (`keras_fedpriv.federated.flower`) drive the same loop over
Flower. The upload schemes (`keras_fedpriv.federated.uploads`) and the
server estimates (`MagRR`, `LaplaceEvaluation`) stay one floor down, in
`keras_fedpriv.federated`. See docs/horizontal.md.

Example:
    >>> from keras_fedpriv.federated.horizontal import HorizontalFL  # doctest: +SKIP
"""

from keras_fedpriv._lazy import lazy_exports

#: exported name -> the module that defines it (imported on first use: no TensorFlow until then)
_EXPORTS = {
    "HorizontalFL": "keras_fedpriv.federated.horizontal.driver",
    "EvaluateReport": "keras_fedpriv.federated.horizontal.loop",
    "EvaluateRequest": "keras_fedpriv.federated.horizontal.loop",
    "HorizontalLoop": "keras_fedpriv.federated.horizontal.loop",
    "TrainReply": "keras_fedpriv.federated.horizontal.loop",
    "TrainRequest": "keras_fedpriv.federated.horizontal.loop",
    "ClientResult": "keras_fedpriv.federated.horizontal.parties",
    "HorizontalClient": "keras_fedpriv.federated.horizontal.parties",
    "HorizontalServer": "keras_fedpriv.federated.horizontal.parties",
    "LocalTrainer": "keras_fedpriv.federated.horizontal.parties",
}
lazy_exports(__name__, _EXPORTS, ("driver", "loop", "parties", "wire"))

__all__ = sorted(_EXPORTS)
