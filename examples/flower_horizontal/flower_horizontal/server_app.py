"""The ServerApp: samples clients, checks and aggregates their SignDS uploads, runs MagRR.

Prints one line per round (replies, val_accuracy, the busiest client's eps so
far, seconds) and, at the end, the privacy report. Every setting comes from
the run config (`task.run_settings`).
"""

import time

from flower_horizontal.task import (
    DELTA,
    model_fn,
    progress_line,
    run_settings,
    server_upload_fn,
    server_validation_data,
)
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from keras_fedpriv.federated.flower import HorizontalStrategy
from keras_fedpriv.federated.flower.strategy import write_result
from keras_fedpriv.privacy import privacy_report


class ProgressStrategy(HorizontalStrategy):
    """`HorizontalStrategy` that prints a progress line after every round's aggregation."""

    def __init__(self, *args, settings, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = settings
        self.started = time.perf_counter()

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        epsilon = privacy_report(self, delta=DELTA).epsilon  # every client asked so far
        print(progress_line(server_round, self.settings, metrics, epsilon,
                            time.perf_counter() - self.started), flush=True)
        return arrays, metrics


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = run_settings(context.run_config)
    print(f"waiting for {settings.num_clients} clients; {settings.rounds} rounds of "
          f"{settings.clients_per_round} clients, {settings.local_epochs} local epochs, "
          f"upload {settings.upload}", flush=True)
    strategy = ProgressStrategy(
        model_fn(), server_upload_fn(context), settings=settings,
        clients_per_round=settings.clients_per_round, local_epochs=settings.local_epochs,
        num_clients=settings.num_clients, min_replies=settings.min_replies,
        magrr=settings.magrr(), validation_data=server_validation_data())
    strategy.start(grid, strategy.initial_arrays(), num_rounds=settings.rounds,
                   timeout=settings.round_timeout)
    result = strategy.run_result()
    if settings.result_path:
        write_result(settings.result_path, result)
    print(f"final val_accuracy {result.history['val_accuracy'][-1]:.3f} after "
          f"{settings.rounds} rounds", flush=True)
    print(privacy_report(result, delta=DELTA), flush=True)
