"""The Flower apps with a Keras model on JAX: what the in-process runs give.

`horizontal_server_app` / `horizontal_client_app` and `vertical_server_app` /
`vertical_client_app` run in this process, their messages carried by a stand-in SuperLink
(`flower_stubs.AppGrid`: the real ClientApp's handlers, a node state per node), under the
JAX pass (``KERAS_BACKEND=jax``, no TensorFlow imported). Flower's Simulation Engine is not
used here: ``flwr.simulation`` imports TensorFlow whenever it is installed, in the caller and in
every Ray worker. On TensorFlow these apps are tested in the Simulation Engine
(`tests/test_flower_horizontal.py`, `tests/test_flower_vertical.py`), so these tests are
skipped there. The party worker serves the test app's real ClientApp under JAX in
`tests/test_flower_worker.py`.
"""

import collections
import json

import keras
import numpy as np
import pytest

pytest.importorskip("flwr")

from keras_fedpriv.federated import partition  # noqa: E402
from keras_fedpriv.federated.flower.vertical import vertical_client_app  # noqa: E402
from keras_fedpriv.federated.vertical.driver import VerticalDriver  # noqa: E402
from keras_fedpriv.layers.release_counter import FRESH_IDS  # noqa: E402

import vertical_grid  # noqa: E402
from digits_stubs import digits  # noqa: E402
from flower_stubs import (  # noqa: E402
    AppGrid,
    assert_same_horizontal_run,
    assert_same_vertical_model,
    follower_arrays,
    signds_apps,
)

pytestmark = [
    pytest.mark.jax, pytest.mark.flower, pytest.mark.timeout(300),
    pytest.mark.skipif(keras.backend.backend() == "tensorflow",
                       reason="on TensorFlow the Flower apps run in Flower's Simulation Engine "
                              "(test_flower_horizontal.py, test_flower_vertical.py)"),
]


def test_horizontal_apps_on_jax_match_the_in_process_run_and_count_the_releases(in_a_run):
    x, y = digits()
    clients = partition(x[:400], y[:400], 2, seed=0)
    val = (x[1400:], y[1400:])
    out = {}
    client, server = signds_apps(clients, 200, out, rounds=2, clients_per_round=2,
                                 validation_data=val)
    with AppGrid(client, [{"partition-id": i} for i in range(2)], workers=2) as grid:
        server(grid, grid.context())
    result = out["result"]
    import jax  # the backend of this pass (skipped on TensorFlow)

    assert isinstance(result.model.trainable_variables[0].value, jax.Array)
    hist = assert_same_horizontal_run(result, clients, 200, rounds=2, clients_per_round=2,
                                      validation_data=val)
    np.testing.assert_allclose(result.history["val_loss"], hist.history["val_loss"], rtol=1e-6)
    assert result.history["replies"] == [2.0, 2.0] and result.rejected == []
    # each client's node state holds its own releases: one SignDS upload per round it
    # answered, as the server recorded them
    sent = collections.Counter()
    for ctx in grid.nodes.values():
        state = json.loads(ctx.state["keras-fedpriv"]["upload"])[0]["releases_by_unit"]
        sent.update({int(cid): n for cid, n in state.items()})
    assert sent == collections.Counter(cid for r in result.replied for cid, _ in r)
    assert sent == {0: 2, 1: 2}


def test_vertical_apps_on_jax_match_the_in_process_driver_and_count_the_releases(in_a_run):
    def follower_fn(party):
        return vertical_grid.model_fn().split_parties().followers[party]

    followers = {}
    client = vertical_client_app(follower_fn, lambda party: vertical_grid.X[party],
                                 on_finish=lambda f: followers.update({f.name: follower_arrays(f)}))
    # two stand-in worker processes: each follower is rebuilt once and then reloads its
    # state (weights, optimizer, random counters, release counts) from the node state
    with AppGrid(client, [{"party": "f1"}, {"party": "f2"}], workers=2) as grid:
        flower = vertical_grid.run_leader_on(grid, epochs=2)

    parties = vertical_grid.model_fn().split_parties()
    driver = VerticalDriver(parties, {p: vertical_grid.X[p] for p in ("f1", "f2")})
    local = driver.fit(vertical_grid.Y, example_ids=np.arange(vertical_grid.N),
                       x=vertical_grid.X["lead"], epochs=2, batch_size=8, seed=0)
    assert_same_vertical_model(flower, local, parties, followers,
                               keys=("loss", "steps", "skipped", "bytes_up", "bytes_down"))
    assert flower.rejected == [] and flower.history["steps"] == [3.0, 3.0]
    assert not np.allclose(followers["f1"][0],
                           vertical_grid.model_fn().split_parties().followers["f1"]
                           .trainable_variables[0].numpy())
    # each follower released a batch of embeddings per step, and counted each
    assert [int(followers[p][-1][FRESH_IDS]) for p in ("f1", "f2")] == [6, 6]
