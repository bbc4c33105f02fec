"""RecentRuns: a long-lived process keeps the cache entries of a few recent runs only."""

import pytest

pytest.importorskip("flwr")  # the package keras_fedpriv.federated.flower needs it

from keras_fedpriv.federated.flower.recent_runs import DEFAULT_KEEP_RUNS, RecentRuns

pytestmark = [pytest.mark.jax]


def test_the_least_recently_used_runs_beyond_keep_are_dropped_from_every_cache():
    a, b = {}, {}
    runs = RecentRuns(a, b, keep=2)
    for run in (1, 2, 1, 3):  # 1 is used again after 2: 2 is the least recent when 3 comes
        dropped = runs.use(run)
        a[(run, "model")] = b[(run, 5)] = run
    assert dropped == [2] and runs.runs == [1, 3]
    assert sorted(a) == [(1, "model"), (3, "model")] and sorted(b) == [(1, 5), (3, 5)]
    assert runs.use(3) == [] and runs.runs == [1, 3]


def test_serving_many_runs_keeps_at_most_the_bound():
    cache = {}
    runs = RecentRuns(cache)
    for run in range(50):
        runs.use(run)
        cache[(run, 0)] = cache[(run, 1)] = object()
        assert len({k[0] for k in cache}) <= DEFAULT_KEEP_RUNS
    assert sorted({k[0] for k in cache}) == list(range(50 - DEFAULT_KEEP_RUNS, 50))


@pytest.mark.parametrize("keep", [0, -1, 1.5, True, "3"])
def test_keep_must_be_a_positive_integer(keep):
    with pytest.raises(ValueError, match=r"`keep` must be an integer >= 1; got"):
        RecentRuns({}, keep=keep)
