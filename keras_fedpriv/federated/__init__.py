"""Federated learning assembly.

Vertical (split) FL: `VerticalModel` and its message callbacks; the party halves
`VerticalFollower` / `VerticalLeader` (`split_parties`) and their in-process
driver `VerticalDriver` (docs/vertical.md).
Horizontal FL: `HorizontalFL`, client partitioning and the upload schemes
(docs/horizontal.md); the protocol's halves `HorizontalClient` and
`HorizontalServer`, which `HorizontalFL` and the Flower apps of
`keras_fedpriv.federated.flower` drive (docs/flower.md); the protocols' server
estimates with a client side each, `MagRR` (SignDS's step size) and
`LaplaceEvaluation` (clustering scores of noisy outputs), which are also
Keras callbacks (`keras_fedpriv.callbacks`).
"""

from keras_fedpriv.federated.horizontal import HorizontalFL
from keras_fedpriv.federated.laplace_eval import LaplaceEvaluation
from keras_fedpriv.federated.magrr import MagRR
from keras_fedpriv.federated.horizontal_parties import (
    HorizontalClient,
    HorizontalServer,
    LocalTrainer,
)
from keras_fedpriv.federated.malformed import MalformedMessage
from keras_fedpriv.federated.messages import (
    EXAMPLE_IDS_KEY,
    EvaluationData,
    MessageCallback,
    MessageRecorder,
    PartyMessages,
    StepMessages,
    with_example_ids,
)
from keras_fedpriv.federated.partition import partition, partition_indices
from keras_fedpriv.federated.uploads import (
    ClientUpload,
    FedAvgUpload,
    GaussianUpload,
    MalformedUpload,
    SignDSUpload,
)
from keras_fedpriv.federated.vertical import VerticalModel, derive_party_seed
from keras_fedpriv.federated.vertical_driver import VerticalDriver, VerticalRunResult
from keras_fedpriv.federated.vertical_parties import (
    VerticalFollower,
    VerticalLeader,
    VerticalParties,
    split_parties,
)

__all__ = ["EXAMPLE_IDS_KEY", "ClientUpload", "EvaluationData", "FedAvgUpload",
           "GaussianUpload", "HorizontalClient", "HorizontalFL", "HorizontalServer",
           "LaplaceEvaluation", "LocalTrainer", "MagRR", "MalformedMessage", "MalformedUpload", "MessageCallback", "MessageRecorder",
           "PartyMessages", "SignDSUpload", "StepMessages", "VerticalDriver",
           "VerticalFollower", "VerticalLeader", "VerticalModel", "VerticalParties",
           "VerticalRunResult", "derive_party_seed", "partition", "partition_indices",
           "split_parties", "with_example_ids"]
