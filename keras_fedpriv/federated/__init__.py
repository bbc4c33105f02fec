"""Federated learning assembly.

Vertical (split) FL: `VerticalModel` and its message callbacks; the party halves
`VerticalFollower` / `VerticalLeader` (`split_parties`), the leader's loop
`run_leader` (K batches per message), and its in-process driver
`VerticalDriver` (docs/vertical.md).
Horizontal FL: `HorizontalFL`, client partitioning and the upload schemes
(docs/horizontal.md); the protocol's halves `HorizontalClient` and
`HorizontalServer`, and the one round loop `HorizontalLoop` that
`HorizontalFL` and the Flower apps of `keras_fedpriv.federated.flower` drive
(docs/flower.md); the protocols' server
estimates with a client side each, `MagRR` (SignDS's step size) and
`LaplaceEvaluation` (clustering scores of noisy outputs), which are also
Keras callbacks (`keras_fedpriv.callbacks`).
"""

from keras_fedpriv._lazy import lazy_exports

#: exported name -> the module that defines it (imported on first use: no TensorFlow until then)
_EXPORTS = {
    "HorizontalFL": "keras_fedpriv.federated.horizontal",
    "LaplaceEvaluation": "keras_fedpriv.federated.laplace_eval",
    "MagRR": "keras_fedpriv.federated.magrr",
    "HorizontalClient": "keras_fedpriv.federated.horizontal_parties",
    "HorizontalServer": "keras_fedpriv.federated.horizontal_parties",
    "LocalTrainer": "keras_fedpriv.federated.horizontal_parties",
    "EvaluateReport": "keras_fedpriv.federated.horizontal_loop",
    "EvaluateRequest": "keras_fedpriv.federated.horizontal_loop",
    "HorizontalLoop": "keras_fedpriv.federated.horizontal_loop",
    "TrainReply": "keras_fedpriv.federated.horizontal_loop",
    "TrainRequest": "keras_fedpriv.federated.horizontal_loop",
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
    "VerticalModel": "keras_fedpriv.federated.vertical",
    "derive_party_seed": "keras_fedpriv.federated.vertical",
    "VerticalDriver": "keras_fedpriv.federated.vertical_driver",
    "VerticalRunResult": "keras_fedpriv.federated.vertical_driver",
    "VerticalFollower": "keras_fedpriv.federated.vertical_parties",
    "VerticalLeader": "keras_fedpriv.federated.vertical_parties",
    "VerticalParties": "keras_fedpriv.federated.vertical_parties",
    "split_parties": "keras_fedpriv.federated.vertical_parties",
    "FeatureTable": "keras_fedpriv.federated.vertical_parties.loop",
    "FollowerRequest": "keras_fedpriv.federated.vertical_parties.loop",
    "run_leader": "keras_fedpriv.federated.vertical_parties.loop",
}
lazy_exports(__name__, _EXPORTS, ())

__all__ = sorted(_EXPORTS)
