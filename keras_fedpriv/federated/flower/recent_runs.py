"""Keep a process's per-run caches to a few recent runs.

A ClientApp caches what is slow to build (the model, its traced training
function, a party's half) per run, keyed by ``(run_id, ...)``. In a party
worker (`keras_fedpriv.federated.flower.worker`), which serves run after run
for as long as the party keeps it, such caches would grow with every run.
`RecentRuns` drops the entries of the least recently used runs beyond
``keep``; a run whose entries were dropped and that sends another message
rebuilds them from ``context.state``, as after a worker restart.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, MutableMapping

__all__ = ["DEFAULT_KEEP_RUNS", "RecentRuns"]

#: runs whose cache entries a process keeps (the most recently used ones)
DEFAULT_KEEP_RUNS = 3


class RecentRuns:
    """The runs a process served most recently, and the caches it trims to them.

    Args:
        *caches: dicts whose keys are tuples that start with the run id.
        keep: how many runs' entries to keep, >= 1.
    """

    def __init__(self, *caches: MutableMapping[tuple[Any, ...], Any],
                 keep: int = DEFAULT_KEEP_RUNS) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"`keep` must be an integer >= 1; got {keep!r}.")
        self.caches, self.keep = caches, keep
        self._order: OrderedDict[Any, None] = OrderedDict()

    @property
    def runs(self) -> list[Any]:
        """The run ids kept, least recently used first."""
        return list(self._order)

    def use(self, run_id: Any) -> list[Any]:
        """Mark ``run_id`` as the most recently used run; drop the entries of runs beyond
        ``keep``.

        Args:
            run_id: the run of the message in hand.

        Returns:
            The run ids whose entries were dropped (usually none).
        """
        self._order[run_id] = None
        self._order.move_to_end(run_id)
        dropped = []
        while len(self._order) > self.keep:
            old, _ = self._order.popitem(last=False)
            dropped.append(old)
        if dropped:
            gone = set(dropped)
            for cache in self.caches:
                for key in [k for k in cache if k[0] in gone]:
                    del cache[key]
        return dropped
