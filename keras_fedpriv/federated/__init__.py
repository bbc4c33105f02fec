"""Federated learning assembly.

The two protocols are laid out the same way, each a package with the same
parts under the same names: ``parties`` (the protocol's halves), ``loop``
(the round loop, no I/O of its own), ``wire`` (what crosses the wire) and
``driver`` (the loop in one process); the Flower apps of
`keras_fedpriv.federated.flower` are thin adapters over the same loops.

Vertical (split) FL, `keras_fedpriv.federated.vertical`: `VerticalModel` and
its message callbacks; the party halves `VerticalFollower` / `VerticalLeader`
(`split_parties`), the leader's loop `run_leader` (K batches per message), and
its in-process driver `VerticalDriver` (docs/vertical.md).
Horizontal FL, `keras_fedpriv.federated.horizontal`: `HorizontalFL`, client
partitioning and the upload schemes (docs/horizontal.md); the protocol's
halves `HorizontalClient` and `HorizontalServer`, and the one round loop
`HorizontalLoop` that `HorizontalFL` and the Flower apps drive
(docs/flower.md). Shared by both, one floor down: the protocols' server
estimates with a client side each, `MagRR` (SignDS's step size) and
`LaplaceEvaluation` (clustering scores of noisy outputs), which are also
Keras callbacks (`keras_fedpriv.callbacks`).
"""

from keras_fedpriv._lazy import lazy_exports

#: exported name -> the module that defines it (imported on first use: no TensorFlow until then)
_EXPORTS = {
    "HorizontalFL": "keras_fedpriv.federated.horizontal.driver",
    "LaplaceEvaluation": "keras_fedpriv.federated.laplace_eval",
    "MagRR": "keras_fedpriv.federated.magrr",
    "HorizontalClient": "keras_fedpriv.federated.horizontal.parties",
    "HorizontalServer": "keras_fedpriv.federated.horizontal.parties",
    "LocalTrainer": "keras_fedpriv.federated.horizontal.parties",
    "EvaluateReport": "keras_fedpriv.federated.horizontal.loop",
    "EvaluateRequest": "keras_fedpriv.federated.horizontal.loop",
    "HorizontalLoop": "keras_fedpriv.federated.horizontal.loop",
    "TrainReply": "keras_fedpriv.federated.horizontal.loop",
    "TrainRequest": "keras_fedpriv.federated.horizontal.loop",
    "MalformedMessage": "keras_fedpriv.federated.malformed",
    "EXAMPLE_IDS_KEY": "keras_fedpriv.federated.messages",
    "EvaluationData": "keras_fedpriv.federated.messages",
    "MessageCallback": "keras_fedpriv.federated.messages",
    "MessageRecorder": "keras_fedpriv.federated.messages",
    "PartyMessages": "keras_fedpriv.federated.messages",
    "StepMessages": "keras_fedpriv.federated.messages",
    "with_example_ids": "keras_fedpriv.federated.messages",
    "partition": "keras_fedpriv.federated.partition",
    "partition_indices": "keras_fedpriv.federated.partition",
    "ClientUpload": "keras_fedpriv.federated.uploads",
    "FedAvgUpload": "keras_fedpriv.federated.uploads",
    "GaussianUpload": "keras_fedpriv.federated.uploads",
    "MalformedUpload": "keras_fedpriv.federated.uploads",
    "SignDSUpload": "keras_fedpriv.federated.uploads",
    "VerticalModel": "keras_fedpriv.federated.vertical.model",
    "derive_party_seed": "keras_fedpriv.federated.vertical.party",
    "VerticalDriver": "keras_fedpriv.federated.vertical.driver",
    "VerticalRunResult": "keras_fedpriv.federated.vertical.driver",
    "VerticalFollower": "keras_fedpriv.federated.vertical.follower",
    "VerticalLeader": "keras_fedpriv.federated.vertical.leader",
    "VerticalParties": "keras_fedpriv.federated.vertical.parties",
    "split_parties": "keras_fedpriv.federated.vertical.parties",
    "FeatureTable": "keras_fedpriv.federated.vertical.loop",
    "FollowerRequest": "keras_fedpriv.federated.vertical.loop",
    "run_leader": "keras_fedpriv.federated.vertical.loop",
}
lazy_exports(__name__, _EXPORTS, ())

__all__ = sorted(_EXPORTS)
