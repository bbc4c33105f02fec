"""What a release is about and how often: the secrets, the units and the release patterns.

The names the release ledger records (`keras_fedpriv.mechanisms.ledger`) and the registry of
mechanisms (`keras_fedpriv.mechanisms.registry`) describes, in a module of their own that
imports nothing: the ledger and every mechanism read them, and the registry, which names each
mechanism's event, sits above the mechanisms (an import circle otherwise).

Example:
    >>> from keras_fedpriv.mechanisms.units import LABELS, EXAMPLE, UNIT_PATTERNS
    >>> LABELS, UNIT_PATTERNS[EXAMPLE]
    ('labels', ('per_example', 'every_example'))
"""

from __future__ import annotations

__all__ = ["CLIENT", "CLIENT_DATA", "EVERY_EXAMPLE", "EXAMPLE", "FEATURES", "LABELS",
           "PATTERNS", "PER_CLIENT", "PER_EXAMPLE", "SECRETS", "UNITS", "UNIT_PATTERNS"]

#: The unit a release is about: one training example (named by its example id)
#: or one horizontal-FL client (named by its index).
EXAMPLE = "example"
CLIENT = "client"
UNITS = (EXAMPLE, CLIENT)

#: What a release is about: a leader's labels, a follower's features (its
#: embedding), or a horizontal-FL client's data (its update, its step size,
#: its inference outputs).
LABELS = "labels"
FEATURES = "features"
CLIENT_DATA = "client data"
SECRETS = (LABELS, FEATURES, CLIENT_DATA)

PER_EXAMPLE = "per_example"
EVERY_EXAMPLE = "every_example"
PER_CLIENT = "per_client"
#: The release patterns a plan can assume, and what ``releases`` counts under each.
PATTERNS = {
    PER_EXAMPLE: "per-example releases with example ids: `releases` is how often the busiest "
                 "example is released (epochs plus inference passes; 1 for labels randomized "
                 "once)",
    EVERY_EXAMPLE: "releases without example ids, each counted for every example: `releases` "
                   "is the number of calls (batches per epoch x epochs, plus inference batches)",
    PER_CLIENT: "per-client releases: `releases` is the rounds the busiest client takes part in",
}
#: The patterns a mechanism about each unit may be planned with (the first is the default).
UNIT_PATTERNS = {EXAMPLE: (PER_EXAMPLE, EVERY_EXAMPLE), CLIENT: (PER_CLIENT,)}
