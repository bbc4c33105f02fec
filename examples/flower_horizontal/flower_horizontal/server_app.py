"""The ServerApp: samples clients, checks and aggregates their SignDS uploads, runs MagRR."""

import logging

from flower_horizontal.task import (
    model_fn,
    server_magrr_eps,
    server_upload_fn,
    server_validation_data,
)

from keras_fedpriv.callbacks import MagRR
from keras_fedpriv.federated.flower import horizontal_server_app
from keras_fedpriv.privacy import privacy_report

logging.getLogger("keras_fedpriv.flower").setLevel(logging.INFO)


def _report(result):
    print(f"final val_accuracy {result.history['val_accuracy'][-1]:.3f}")
    print(privacy_report(result, delta=1e-5))


def _magrr(context):
    eps_rr = server_magrr_eps(context)
    # r_init: a first guess of the step size near this model's (MagRR grows it 5x a round)
    return None if eps_rr is None else MagRR(eps_rr=eps_rr, r_init=1e-2)


app = horizontal_server_app(model_fn, server_upload_fn, num_clients=3, min_replies=2, magrr=_magrr,
                            validation_data=server_validation_data(), on_finish=_report)
