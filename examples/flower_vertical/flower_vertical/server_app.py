"""The ServerApp: the leader, which holds the labels and drives the run."""

import logging

import keras
from flower_vertical.task import leader_data, leader_validation, model_fn

from keras_fedpriv.federated.flower_vertical import vertical_server_app
from keras_fedpriv.privacy import privacy_report

logging.getLogger("keras_fedpriv.vertical").setLevel(logging.INFO)


def _leader():
    return model_fn().split_parties(metrics=[keras.metrics.AUC(name="auc")]).leader


def _report(result):
    history = result.history
    print(f"loss per epoch {[round(v, 4) for v in history['loss']]}")
    print(f"val_auc per epoch {[round(v, 4) for v in history['val_auc']]}")
    print(f"skipped batches {history['skipped']}, refused replies {len(result.rejected)}")
    # the leader's own releases: its labels, once per example (LabelDP)
    print(privacy_report(result.leader, delta=1e-5))


app = vertical_server_app(_leader, leader_data, validation_fn=leader_validation,
                          epochs=3, batch_size=128, on_finish=_report)
