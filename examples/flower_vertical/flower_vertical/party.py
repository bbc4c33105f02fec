"""A follower's real ClientApp: what the party worker beside each SuperNode serves.

`client_app.py` (the ClientApp the SuperNode starts per message) hands every
message to that worker, which imports this module once and keeps TensorFlow,
the follower's bottom model, its traced functions and its state loaded:

    keras-fedpriv worker --app flower_vertical.party:app --app-dir examples/flower_vertical \
        --socket /run/fl-f1/worker.sock

Each follower's node config names its party (``--node-config "party='f1' worker-socket='...'"``).
"""

from flower_vertical.task import FOLLOWERS, follower_features, model_fn

from keras_fedpriv.federated.flower.vertical import vertical_client_app


def _follower(party):
    return model_fn().split_parties().followers[party]


# a follower's own cap on what it releases about each example, over every run, can be set by
# its operator: --node-config "... max-epsilon=40 privacy-budget-path='/var/lib/fl/f1.json'"
app = vertical_client_app(_follower, follower_features, parties=list(FOLLOWERS))
