"""Vertical (split) FL: parties with different features of the same examples; one has the labels.

The same parts under the same names as `keras_fedpriv.federated.horizontal`:

* `parties` (`keras_fedpriv.federated.vertical.parties`): the protocol's
  halves, `VerticalLeader` (labels, top model, loss) and `VerticalFollower`
  (a bottom model and its protection), handed out by `split_parties`; their
  shared pieces in `keras_fedpriv.federated.vertical.party`, each half in
  `leader` and `follower`;
* `loop` (`keras_fedpriv.federated.vertical.loop`): `run_leader`, the
  leader's round loop, with no I/O of its own: typed requests
  (`FollowerRequest`) that an exchange function carries, and
  `serve_request`, a follower's side of one;
* `wire` (`keras_fedpriv.federated.vertical.wire`): what crosses the wire
  (`EmbeddingSpec`, the embedding and gradient codecs, several batches in one
  message) and how a reply is checked and decoded, with its byte limits;
* `driver` (`keras_fedpriv.federated.vertical.driver`): `VerticalDriver`, the
  loop in one process.

`VerticalModel` (`keras_fedpriv.federated.vertical.model`) runs the same
pieces inside one Keras ``train_step`` (its steps: `VerticalStep`, in
`keras_fedpriv.federated.vertical.step`); the Flower apps
(`keras_fedpriv.federated.flower.vertical`) run the loop over Flower. See
docs/vertical.md.

Example:
    >>> from keras_fedpriv.federated.vertical import VerticalModel  # doctest: +SKIP
"""

from keras_fedpriv._lazy import lazy_exports

#: exported name -> the module that defines it (imported on first use: no TensorFlow until then)
_EXPORTS = {
    "VerticalDriver": "keras_fedpriv.federated.vertical.driver",
    "VerticalFollower": "keras_fedpriv.federated.vertical.follower",
    "VerticalLeader": "keras_fedpriv.federated.vertical.leader",
    "FeatureTable": "keras_fedpriv.federated.vertical.loop",
    "FollowerRequest": "keras_fedpriv.federated.vertical.loop",
    "VerticalRunResult": "keras_fedpriv.federated.vertical.loop",
    "run_leader": "keras_fedpriv.federated.vertical.loop",
    "serve_request": "keras_fedpriv.federated.vertical.loop",
    "VerticalModel": "keras_fedpriv.federated.vertical.model",
    "VerticalParties": "keras_fedpriv.federated.vertical.parties",
    "split_parties": "keras_fedpriv.federated.vertical.parties",
    "PartyBottom": "keras_fedpriv.federated.vertical.party",
    "derive_party_seed": "keras_fedpriv.federated.vertical.party",
    "EmbeddingSpec": "keras_fedpriv.federated.vertical.wire",
}
lazy_exports(__name__, _EXPORTS, ("driver", "follower", "leader", "loop", "model", "parties",
                                  "party", "step", "wire"))

__all__ = sorted(_EXPORTS)
