"""The ClientApp the SuperNode starts for every message: a relay to the party's worker.

It imports Flower only (no TensorFlow) and hands each message to the worker
named by the node config key ``worker-socket``, which serves the real
ClientApp (`flower_horizontal.party`) with everything loaded. Without that
key it runs the real ClientApp in this process (a fresh TensorFlow per
message: slow, but it works).
"""

from keras_fedpriv.federated.flower import relay_client_app

app = relay_client_app("flower_horizontal.party:app")
