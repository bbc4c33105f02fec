"""The client's real ClientApp: what the party worker beside each SuperNode serves.

`client_app.py` (the ClientApp the SuperNode starts per message) hands every
message to that worker, which imports this module once and keeps TensorFlow,
the model, its traced training function and the client's state loaded:

    keras-fedpriv worker --app flower_horizontal.party:app --app-dir examples/flower_horizontal \
        --socket /run/fl-party/worker.sock

Each client's node config names its partition and scheme
(``--node-config "partition-id=0 num-partitions=5 worker-socket='...'"``).
"""

from flower_horizontal.task import client_data, client_eps_rr, client_upload_fn, model_fn

from keras_fedpriv.federated.flower import horizontal_client_app


def _data(context):
    config = context.node_config
    return client_data(int(config["partition-id"]), int(config["num-partitions"]))


# seed=None: the client's shuffling and MagRR bits come from OS entropy, not from anyone's seed
app = horizontal_client_app(model_fn, _data, client_upload_fn, batch_size=32,
                           eps_rr=client_eps_rr)
