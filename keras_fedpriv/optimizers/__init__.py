"""Federated client/server update encodings.

SignDS: `SignDSEncoder` turns a client's flattened
update into a `SignDSMessage` (a fair-coin sign and a few sorted int32
indices chosen by an eps-LDP exponential mechanism); the server side
`decode`s and `aggregate`s the messages into a dense step.
`flatten_update` / `unflatten_update` convert between per-variable arrays and
the flat vector. `SignDS` wraps any Keras optimizer so that a client's round
update leaves as a SignDS message (`SignDSRounds` runs the rounds in
``model.fit``).
"""

from keras_fedpriv.optimizers.signds import (
    SignDSEncoder,
    SignDSMessage,
    aggregate,
    decode,
    flatten_update,
    unflatten_update,
)
from keras_fedpriv.optimizers.signds_optimizer import SignDS, SignDSRounds

__all__ = [
    "SignDS",
    "SignDSEncoder",
    "SignDSRounds",
    "SignDSMessage",
    "aggregate",
    "decode",
    "flatten_update",
    "unflatten_update",
]
