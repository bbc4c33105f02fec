"""Shared helpers of the ledger tests: eps composed by hand with dp-accounting, a small vertical model."""

import dp_accounting
import keras
import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from keras_fedpriv.federated import VerticalModel, with_example_ids

DELTA = 1e-5
REL = dp_accounting.NeighboringRelation.REPLACE_ONE


def pld_of(event):
    if isinstance(event, dp_accounting.RandomizedResponseDpEvent):
        return pld_lib.from_randomized_response(event.noise_parameter, event.num_buckets,
                                                value_discretization_interval=1e-4,
                                                neighboring_relation=REL)
    if isinstance(event, dp_accounting.dp_event.DiscreteLaplaceDpEvent):
        return pld_lib.from_discrete_laplace_mechanism(event.noise_parameter, event.sensitivity,
                                                       value_discretization_interval=1e-4)
    assert isinstance(event, dp_accounting.GaussianDpEvent), event
    return pld_lib.from_gaussian_mechanism(event.noise_multiplier,
                                           value_discretization_interval=1e-4)



def by_hand(events_with_counts, delta=DELTA):
    """eps of ``[(event, count)]`` with dp-accounting's PLDs, composed explicitly."""
    total = None
    for event, count in events_with_counts:
        if isinstance(event, dp_accounting.ComposedDpEvent):
            parts = [(e, count) for e in event.events]
            sub = [pld_of(e).self_compose(c) for e, c in parts]
        else:
            sub = [pld_of(event).self_compose(count)]
        for pld in sub:
            total = pld if total is None else total.compose(pld)
    return float(total.get_epsilon_for_delta(delta))



def vertical_model(label_dp=None, embedding_dp=None, n=128, leader="party_b"):
    rng = np.random.default_rng(0)
    xa = rng.normal(size=(n, 6)).astype("float32")
    xb = rng.normal(size=(n, 4)).astype("float32")
    y = (xa[:, 0] + xb[:, 0] > 0.5).astype("float32")
    bottom = lambda k: keras.Sequential([keras.Input((k,)), keras.layers.Dense(8)])  # noqa: E731
    top = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1, activation="sigmoid")])
    model = VerticalModel({"party_a": bottom(6), "party_b": bottom(4)}, top, leader=leader,
                          label_dp=label_dp, embedding_dp=embedding_dp)
    model.compile("adam", "binary_crossentropy")
    return model, with_example_ids({"party_a": xa, "party_b": xb}), y

