"""Leader-driven vertical FL over the party halves, in one process (`VerticalDriver`).

The loop is `keras_fedpriv.federated.vertical.loop.run_leader`, the
one every runtime drives (the Flower apps of
`keras_fedpriv.federated.flower.vertical` too); its pieces are re-exported
here. `VerticalDriver` carries the requests to the followers in this
process: every message goes through the same encoding and checks as across
processes.

Given the same seeds, data and ``batches_per_message`` both runtimes
compute the same model.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

import numpy as np

from keras_fedpriv.federated.vertical.parties import VerticalParties
from keras_fedpriv.federated.vertical.loop import (
    MAX_BATCHES_PER_MESSAGE,
    FeatureTable,
    FollowerRequest,
    VerticalRunResult,
    epoch_order,
    failure_reason,
    run_leader,
    serve_request,
    validate_batches_per_message,
)

__all__ = ["FeatureTable", "FollowerRequest", "VerticalDriver", "VerticalRunResult",
           "epoch_order", "failure_reason", "run_leader", "serve_request"]

logger = logging.getLogger("keras_fedpriv.vertical")


class VerticalDriver:
    """Runs the halves of vertical FL in one process, leader-driven (`run_leader`).

    Every message goes through the same encoding and checks as across
    processes: followers answer with wire arrays, the leader decodes and
    checks them, cut gradients go back encoded.

    Args:
        parties: a `VerticalParties` (e.g. ``model.split_parties()``).
        follower_data: follower name -> its features: an array (rows are
            example ids ``0 .. n-1``), or ``(example_ids, x)``, or a
            `FeatureTable`. Include the rows of validation examples.
        max_batches_per_message: the most batches a follower serves in one
            message (what a follower's operator allows; see `serve_request`).

    Example:
        >>> parties = model.split_parties()
        >>> driver = VerticalDriver(parties, {"party_a": (ids, xa)})
        >>> result = driver.fit(y, example_ids=ids, x=xb, epochs=5, batch_size=64, seed=0)
        >>> result.history["loss"]
    """

    def __init__(self, parties: VerticalParties, follower_data: Mapping[str, Any], *,
                 max_batches_per_message: int = MAX_BATCHES_PER_MESSAGE) -> None:
        self.max_batches_per_message = validate_batches_per_message(
            max_batches_per_message, "max_batches_per_message")
        if not isinstance(parties, VerticalParties):
            raise TypeError(f"VerticalDriver: `parties` must be a VerticalParties (e.g. "
                            f"model.split_parties()); got {type(parties).__name__}.")
        self.parties = parties
        if not isinstance(follower_data, Mapping):
            raise TypeError("VerticalDriver: `follower_data` must be a dict follower name -> "
                            f"features; got {type(follower_data).__name__}.")
        names = set(parties.followers)
        if set(follower_data) != names:
            raise ValueError(f"VerticalDriver: `follower_data` must have exactly the followers "
                             f"{sorted(names)}; got {sorted(follower_data)}.")
        self.tables = {}
        for p, data in follower_data.items():
            if isinstance(data, FeatureTable):
                self.tables[p] = data
            elif isinstance(data, tuple) and len(data) == 2:
                self.tables[p] = FeatureTable(data[1], data[0])
            else:
                self.tables[p] = FeatureTable(data)

    def exchange(self, requests: Mapping[str, FollowerRequest]) -> dict[str, Any]:
        """Serve every request in this process; a failure becomes a reason (`failure_reason`)."""
        replies = {}
        for p in sorted(requests):
            try:
                replies[p] = serve_request(self.parties.followers[p], requests[p], self.tables[p],
                                           self.max_batches_per_message)
            except Exception as error:  # what a follower process would answer
                logger.debug("follower %r failed to serve a request", p, exc_info=True)
                replies[p] = f"error reply: {failure_reason(error)}"
        return replies

    def fit(self, y: Any, *, example_ids: Any = None, x: Any = None, epochs: int = 1,
            batch_size: int = 32, batches_per_message: int = 1, seed: int | None = None,
            shuffle: bool = True,
            validation_data: tuple[Any, Any, Any] | None = None,
            validation_batch_size: int = 256) -> VerticalRunResult:
        """Train the halves (see `run_leader` for the arguments).

        Args:
            y: the training labels (held by the leader).
            example_ids: their ids (default ``0 .. len(y) - 1``).
            x: the leader's own features, or None.
            epochs, batch_size, batches_per_message, seed, shuffle,
                validation_data, validation_batch_size: as in `run_leader`.

        Returns:
            A `VerticalRunResult` (with ``epoch_time_s`` in the history).
        """
        validate_batches_per_message(batches_per_message, maximum=self.max_batches_per_message)
        if example_ids is None:
            example_ids = np.arange(len(np.asarray(y)), dtype=np.int64)
        started = [time.perf_counter()]
        times: list[float] = []

        def clock(epoch, logs):
            now = time.perf_counter()
            times.append(now - started[0])
            started[0] = now

        result = run_leader(self.parties.leader, self.exchange, example_ids, y, x,
                            epochs=epochs, batch_size=batch_size,
                            batches_per_message=batches_per_message, seed=seed, shuffle=shuffle,
                            validation_data=validation_data,
                            validation_batch_size=validation_batch_size, on_epoch_end=clock)
        result.history["epoch_time_s"] = times
        return result

    def privacy_protections(self) -> list[Any]:
        """Every half (so `privacy_report(driver)` composes what each party recorded)."""
        return self.parties.privacy_protections()
