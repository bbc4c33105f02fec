"""Client and server apps with fixed seeds, so a Deployment Engine run can be compared."""

import keras

from keras_fedpriv.datasets import digits_clients
from keras_fedpriv.federated.flower import horizontal_client_app, horizontal_server_app
from keras_fedpriv.optimizers import SignDSEncoder

SEED, SIGNDS_SEED, NUM_CLIENTS = 3, 5, 3


def model_fn():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def data():
    return digits_clients(NUM_CLIENTS, seed=0)


def _scheme(name):
    return SignDSEncoder(k=0.2, eps=10.0, seed=SIGNDS_SEED) if name == "signds" else "fedavg"


def client_upload_fn(context):  # the client's own choice: its node config
    return _scheme(context.node_config.get("upload", "fedavg"))


def server_upload_fn(context):
    return _scheme(context.run_config.get("upload", "fedavg"))


client = horizontal_client_app(
    model_fn, lambda context: data()[0][int(context.node_config["partition-id"])],
    client_upload_fn, seed=SEED)
# waits for `clients-per-round` clients (run config), so one host may run fewer SuperNodes
server = horizontal_server_app(model_fn, server_upload_fn, seed=SEED,
                               validation_data=data()[1])
