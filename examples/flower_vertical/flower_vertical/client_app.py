"""The ClientApp the SuperNode starts for every message: a relay to the follower's worker.

It imports Flower only (no TensorFlow) and hands each message to the worker
named by the node config key ``worker-socket``, which serves the follower's
real ClientApp (`flower_vertical.party`) with everything loaded. Without that
key it runs the real ClientApp in this process (a fresh TensorFlow per
message: slow, but it works).
"""

from keras_fedpriv.federated.flower import relay_client_app

app = relay_client_app("flower_vertical.party:app")
