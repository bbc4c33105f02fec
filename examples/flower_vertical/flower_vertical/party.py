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
from keras_fedpriv.logs import set_verbosity

# the follower's log shows, per message, what it used of its randomness (its random counter
# going on, never back, over a restart too) and any request it refused
set_verbosity("info")


def _follower(party, context):
    followers = model_fn(context=context).split_parties().followers
    if party not in followers:  # the run config's dataset has other followers
        raise ValueError(f"node config `party` must be one of {', '.join(sorted(followers))} "
                         f"for this run's dataset; got {party!r}.")
    return followers[party]


# a follower's own cap on what it releases about each example, over every run, can be set by
# its operator: --node-config "... max-epsilon=40 privacy-budget-path='/var/lib/fl/f1.json'";
# with --node-config "... state-dir='/var/lib/fl-f1'" (a folder of mode 700) the follower keeps
# its state there and rejoins a run after a restart (docs/flower.md)
app = vertical_client_app(_follower, follower_features, parties=list(FOLLOWERS))
