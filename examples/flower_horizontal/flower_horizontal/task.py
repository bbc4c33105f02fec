"""What both sides agree on: the model, the upload scheme's settings and the data split."""

import keras

from keras_fedpriv.datasets import digits_clients
from keras_fedpriv.optimizers import SignDSEncoder

K, EPS, EPS_RR = 0.2, 10.0, 3.0  # SignDS top-k fraction and eps, MagRR's eps


def model_fn():
    """The compiled model: the global model on the server, the local one on a client."""
    keras.utils.set_random_seed(0)  # the same initial weights everywhere (a public choice)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _scheme(config):
    scheme = str(config.get("upload", "signds"))
    if scheme not in ("signds", "fedavg"):
        raise ValueError(f"'upload' must be 'signds' or 'fedavg'; got {scheme!r}.")
    return scheme


def _build(scheme):
    # SignDS with a fresh OS-entropy secret per release (no seed: nothing to leak), or FedAvg
    return SignDSEncoder(k=K, eps=EPS) if scheme == "signds" else "fedavg"


def client_upload_fn(context):
    """The client's scheme, from ITS node config (the client's operator decides, not the
    server: `flower-supernode --node-config "... upload='fedavg'"` opts in to no protection)."""
    return _build(_scheme(context.node_config))


def server_upload_fn(context):
    """The server's copy, from the run config; replies of another scheme are dropped."""
    return _build(_scheme(context.run_config))


def client_magrr_eps(context):
    """MagRR sets SignDS's server step; FedAvg needs none."""
    return EPS_RR if _scheme(context.node_config) == "signds" else None


def server_magrr_eps(context):
    return EPS_RR if _scheme(context.run_config) == "signds" else None


def client_data(partition_id, num_partitions):
    """A client's share of the digits training rows (a Dirichlet label split)."""
    clients, _ = digits_clients(num_partitions, alpha=1.0, seed=0)
    return clients[partition_id]


def server_validation_data():
    """The server's own held-out rows."""
    _, test = digits_clients(3, alpha=1.0, seed=0)
    return test
