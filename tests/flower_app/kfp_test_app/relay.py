"""The ClientApp the test app's pyproject.toml names: it relays each message to the party's
worker (node config ``worker-socket``), or runs ``apps.client`` in its own process without one."""

from keras_fedpriv.federated.flower.worker import relay_client_app

client = relay_client_app("kfp_test_app.apps:client")
