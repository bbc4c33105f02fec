"""Vertical (split) federated learning: `VerticalModel` and its message callbacks.

See docs/vertical.md.
"""

from keras_fedpriv.federated.messages import (
    EXAMPLE_IDS_KEY,
    EvaluationData,
    MessageCallback,
    MessageRecorder,
    PartyMessages,
    StepMessages,
    with_example_ids,
)
from keras_fedpriv.federated.vertical import VerticalModel, derive_party_seed

__all__ = ["EXAMPLE_IDS_KEY", "EvaluationData", "MessageCallback", "MessageRecorder",
           "PartyMessages", "StepMessages", "VerticalModel", "derive_party_seed",
           "with_example_ids"]
