"""The ServerApp: the leader, which holds the labels and drives the run."""

import keras
from flower_vertical.task import (
    BATCH_SIZE,
    BATCHES_PER_MESSAGE,
    EPOCHS,
    leader_data,
    leader_validation,
    model_fn,
)

from keras_fedpriv.federated.flower.vertical import vertical_server_app
from keras_fedpriv.privacy import privacy_report


def _leader(context):
    return model_fn(context=context).split_parties(
        metrics=[keras.metrics.AUC(name="auc")]).leader


def _progress(epoch, logs):
    # one line per epoch, printed by the leader's process (no val_auc: no held-out rows)
    val = f", val_auc {logs['val_auc']:.4f}" if "val_auc" in logs else ""
    print(f"epoch {epoch + 1}: loss {logs['loss']:.4f}{val}, "
          f"{logs['epoch_time_s']:.1f} s, {int(logs['steps'])} steps "
          f"({int(logs['skipped'])} skipped)", flush=True)


def _report(result):
    history = result.history
    for key in ("loss", "val_auc"):
        if key in history:
            print(f"{key} per epoch {[round(v, 4) for v in history[key]]}")
    print(f"skipped batches {history['skipped']}, refused replies {len(result.rejected)}")
    # the leader's own releases: its labels, once per example (LabelDP)
    print(privacy_report(result.leader, delta=1e-5))


# the run config (pyproject.toml, or `flwr run --run-config`) overrides these per run
app = vertical_server_app(_leader, leader_data, validation_fn=leader_validation,
                          epochs=EPOCHS, batch_size=BATCH_SIZE,
                          batches_per_message=BATCHES_PER_MESSAGE, on_finish=_report,
                          on_epoch_end=_progress)
