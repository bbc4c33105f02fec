"""The ClientApp: one follower per SuperNode (`--node-config "party='f1'"` or a partition id)."""

from flower_vertical.task import FOLLOWERS, follower_features, model_fn

from keras_fedpriv.federated.flower_vertical import vertical_client_app


def _follower(party):
    return model_fn().split_parties().followers[party]


# a follower's own cap on what it releases about each example, over every run, can be set by
# its operator: --node-config "... max-epsilon=40 privacy-budget-path='/var/lib/fl/f1.json'"
app = vertical_client_app(_follower, follower_features, parties=list(FOLLOWERS))
