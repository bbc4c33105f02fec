"""The app's run in one process (`HorizontalFL`): the same model, data, upload and settings.

    cd examples/flower_horizontal && python -m flower_horizontal.one_process [--seed 0]

Seconds instead of minutes: what a Flower run of the app should reach. Seeded
(a Flower run draws fresh noise, so its numbers differ a little).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import keras
from flower_horizontal.task import (
    DELTA,
    RunSettings,
    client_data,
    model_fn,
    progress_line,
    run_settings,
    server_validation_data,
    upload_scheme,
)

from keras_fedpriv.federated import HorizontalFL
from keras_fedpriv.privacy import privacy_report


class _Progress(keras.callbacks.Callback):
    def __init__(self, fl: HorizontalFL, settings: RunSettings) -> None:
        super().__init__()
        self.fl, self.settings, self.started = fl, settings, time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        epsilon = privacy_report(self.fl, delta=DELTA).epsilon
        print(progress_line(epoch + 1, self.settings, logs or {}, epsilon,
                            time.perf_counter() - self.started), flush=True)


def run(settings: RunSettings | None = None, seed: int = 0,
        verbose: bool = False) -> tuple[HorizontalFL, Any]:
    """Run the app's protocol in one process.

    Args:
        settings: the run's settings (default: ``pyproject.toml``'s run config).
        seed: seeds the client sampling, shuffling, SignDS and MagRR.
        verbose: print the app's progress line after every round.

    Returns:
        ``(fl, history)``: the `HorizontalFL` (its ``model``, and the
        protection `privacy_report` composes) and the Keras `History`.
    """
    settings = run_settings() if settings is None else settings
    clients = [client_data(i, settings.num_clients) for i in range(settings.num_clients)]
    fl = HorizontalFL(model_fn(), clients, upload=upload_scheme(settings.upload, seed=seed),
                      seed=seed)
    magrr = settings.magrr(seed=seed)
    callbacks = [magrr] if magrr is not None else []
    if verbose:
        callbacks.append(_Progress(fl, settings))
    history = fl.fit(rounds=settings.rounds, clients_per_round=settings.clients_per_round,
                     local_epochs=settings.local_epochs,
                     validation_data=server_validation_data(), callbacks=callbacks, verbose=0)
    return fl, history


def main(argv: list[str] | None = None) -> None:
    """Command line: run once and print the progress lines and the privacy report.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    fl, _ = run(seed=parser.parse_args(argv).seed, verbose=True)
    print(privacy_report(fl, delta=DELTA))


if __name__ == "__main__":
    main()
