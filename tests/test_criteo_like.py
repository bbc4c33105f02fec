"""The Criteo-like workload generator (keras_fedpriv/criteo_like.py)."""

import math

import numpy as np
import pytest

from keras_fedpriv.criteo_like import FOLLOWER, LEADER, CriteoLike, CriteoRows

pytestmark = [pytest.mark.jax]

SIGMAS = 6.5


@pytest.fixture(scope="module")
def data():
    return CriteoLike(100_000, seed=0)


@pytest.fixture(scope="module")
def rows(data):
    return data.rows(0, 100_000)


def test_fields_shapes_and_ranges(data, rows):
    assert isinstance(rows, CriteoRows)
    assert rows.dense.shape == (100_000, 13) and rows.dense.dtype == np.float32
    assert rows.categorical.shape == (100_000, 26) and rows.categorical.dtype == np.int32
    assert rows.labels.shape == (100_000, 1) and set(np.unique(rows.labels)) == {0.0, 1.0}
    assert rows.categorical.min() >= 0 and rows.categorical.max() < 10_000
    assert np.all(rows.dense >= 0) and np.all(np.isfinite(rows.dense))
    # log1p of integer counts
    np.testing.assert_allclose(np.expm1(rows.dense.astype(np.float64)),
                               np.round(np.expm1(rows.dense.astype(np.float64))), atol=1e-3,
                               rtol=1e-5)
    np.testing.assert_array_equal(rows.example_ids, np.arange(100_000))


def test_ids_are_zipf_distributed(rows):
    """The most frequent id of a field has the share of Zipf's first rank, 1 / sum r^-1.1."""
    share = 1.0 / np.sum(np.arange(1, 10_001) ** -1.1)
    counts = np.bincount(rows.categorical[:, 0], minlength=10_000)
    sd = math.sqrt(100_000 * share * (1 - share))
    assert abs(counts.max() - 100_000 * share) < SIGMAS * sd
    assert np.sort(counts)[-2] < counts.max() / 1.5  # the second rank is 2**-1.1 as frequent


def test_labels_follow_the_hidden_probabilities(data, rows):
    """The labels are Bernoulli(p) with the stated p: their sum is within 6.5 standard
    deviations of sum p (independent draws; variance sum p(1-p))."""
    p = rows.probabilities
    sd = math.sqrt(np.sum(p * (1 - p)))
    assert abs(rows.labels.sum() - p.sum()) < SIGMAS * sd
    assert abs(p.mean() - 0.25) < 0.01 and abs(data.positive_rate - 0.25) < 1e-6


def test_ceiling_is_the_auc_of_the_hidden_model(data, rows):
    from sklearn.metrics import roc_auc_score

    ceiling = data.ceiling_auc(100_000)
    assert 0.85 < ceiling < 0.95
    # the AUC of p on the drawn labels estimates it (sd about 0.0015 at 25,000 positives)
    assert abs(roc_auc_score(rows.labels[:, 0], rows.probabilities) - ceiling) < 0.012
    assert CriteoLike(1000, seed=0, signal=0.0, chunk_size=1000).ceiling_auc(1000) == 0.5


def test_any_row_range_is_reproducible_without_the_rows_before():
    small = CriteoLike(5000, seed=3, chunk_size=1000, vocabulary_size=100)
    whole = small.rows(0, 5000)
    for start, stop in ((0, 1), (999, 1001), (1500, 4321), (4000, 5000)):
        part = CriteoLike(5000, seed=3, chunk_size=1000, vocabulary_size=100).rows(start, stop)
        for name in ("dense", "categorical", "labels", "probabilities", "example_ids"):
            np.testing.assert_array_equal(getattr(part, name), getattr(whole, name)[start:stop])
    other = CriteoLike(5000, seed=4, chunk_size=1000, vocabulary_size=100).rows(0, 5000)
    assert not np.array_equal(other.categorical, whole.categorical)
    far = CriteoLike(10**7, seed=3).rows(10**7 - 3, 10**7 + 2)  # past num_rows: the same stream
    assert far.dense.shape == (5, 13)
    np.testing.assert_array_equal(far.example_ids, np.arange(10**7 - 3, 10**7 + 2))


@pytest.mark.parametrize("num_dense,num_categorical,follower_fields", [(1, 2, 1), (3, 5, 4)])
def test_other_layouts(num_dense, num_categorical, follower_fields):
    data = CriteoLike(500, seed=0, num_dense=num_dense, num_categorical=num_categorical,
                      follower_fields=follower_fields, vocabulary_size=2, chunk_size=500)
    x, y = data.parties()
    assert x[FOLLOWER].shape == (500, follower_fields)
    assert x[LEADER].shape == (500, num_dense + num_categorical - follower_fields)
    assert set(np.unique(x[FOLLOWER])) == {0, 1} and 0 < y.mean() < 1


def test_hashed_effects_match_the_table():
    data = CriteoLike(100, seed=1, vocabulary_size=50, chunk_size=100)
    ids = data.rows(0, 100).categorical
    np.testing.assert_array_equal(data._effects(ids), data._hashed_effects(ids))


def test_parties_and_batches(data, rows):
    x, y = data.parties(10, 20)
    assert set(x) == {FOLLOWER, LEADER, "example_ids"}
    np.testing.assert_array_equal(x[FOLLOWER], rows.categorical[10:20, :13])
    assert x[FOLLOWER].dtype == np.int32 and x[LEADER].dtype == np.float32
    np.testing.assert_array_equal(x[LEADER][:, :13], rows.dense[10:20])
    np.testing.assert_array_equal(x[LEADER][:, 13:].astype(np.int32), rows.categorical[10:20, 13:])
    np.testing.assert_array_equal(y, rows.labels[10:20])
    np.testing.assert_array_equal(x["example_ids"], np.arange(10, 20))
    assert set(data.parties(0, 5, example_ids=False)[0]) == {FOLLOWER, LEADER}

    batches = data.batches(300, start=1000, stop=2000)
    assert len(batches) == 4
    xs, ys = zip(*(batches[i] for i in range(len(batches))))
    assert [len(b) for b in ys] == [300, 300, 300, 100]
    np.testing.assert_array_equal(np.concatenate(ys), rows.labels[1000:2000])
    np.testing.assert_array_equal(np.concatenate([b[FOLLOWER] for b in xs]),
                                  rows.categorical[1000:2000, :13])
    with pytest.raises(IndexError):
        batches[4]
    assert len(data.batches(1024)) == 98


def test_repr_names_the_layout(data):
    assert "follower_fields=13" in repr(data) and "positive_rate=0.2500" in repr(data)


@pytest.mark.parametrize("kwargs,err,fragment", [
    ({"num_rows": 0}, ValueError, "`num_rows`"),
    ({"seed": None}, TypeError, "`seed` must be a non-negative integer"),
    ({"seed": -1}, ValueError, "`seed`"),
    ({"vocabulary_size": 1}, ValueError, "`vocabulary_size`"),
    ({"vocabulary_size": 2**24 + 1}, ValueError, r"`vocabulary_size` must be at most 2\*\*24"),
    ({"follower_fields": 26}, ValueError, r"`follower_fields` must be in \[1, num_categorical"),
    ({"follower_fields": 0}, ValueError, "`follower_fields`"),
    ({"positive_rate": 1.0}, ValueError, "`positive_rate`"),
    ({"signal": -1.0}, ValueError, "`signal`"),
    ({"zipf_exponent": 0.0}, ValueError, "`zipf_exponent`"),
    ({"chunk_size": 2.5}, TypeError, "`chunk_size`"),
])
def test_bad_arguments(kwargs, err, fragment):
    with pytest.raises(err, match=fragment):
        CriteoLike(**{"num_rows": 100, "chunk_size": 100, **kwargs})


def test_bad_ranges(data):
    with pytest.raises(ValueError, match="`stop` must be greater than `start`"):
        data.rows(5, 5)
    with pytest.raises(ValueError, match="`start`"):
        data.parties(-1, 5)
    with pytest.raises(ValueError, match="`batch_size`"):
        data.batches(0)
    with pytest.raises(ValueError, match="`num_rows`"):
        data.ceiling_auc(1)
