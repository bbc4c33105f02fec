"""A synthetic Criteo-like click workload for vertical FL, generated in chunks (any size).

Criteo's display-advertising data (13 integer count features, 26 hashed
categorical features, about 25% clicks) is the workload the label-DP design
this package follows was shown on, with a Wide&Deep model split between two
parties. `CriteoLike` generates rows of the same shape from a **hidden
model** whose click probability is known for every row, so the best AUC any
model can reach (the ceiling) is computable:

* dense field j: ``log1p(floor(exp(mu_j + s_j * z)))``, z standard normal
  (log-transformed heavy-tailed counts, as one feeds Criteo's);
* categorical field f: an id in ``[0, vocabulary_size)``, Zipf-distributed
  (exponent ``zipf_exponent``) over ranks, each field's ranks mapped to ids by
  its own bijection;
* the label: 1 with probability ``sigmoid(bias + signal * (sum_j w_j t_j +
  sum_k v_k t_a(k) t_b(k) + sum_f effect_f(id_f)))`` where ``t_j`` is dense
  field j centred and scaled, the ``v_k`` terms are a few pairwise
  interactions (a deep model's job), and each (field, id) has its own effect
  (an embedding's job); ``bias`` is set so that about ``positive_rate`` of
  the rows are positive.

Every quantity is a function of (``seed``, chunk index, row within the
chunk): rows ``[c * chunk_size, (c + 1) * chunk_size)`` come from a generator
keyed by (seed, c), and the per-id effects from a hash of (seed, field, id),
so any row range is reproducible without generating the rows before it, and
memory stays one chunk whatever the number of rows (10^4 to 10^7 and more).
The rows are independent and identically distributed, so a sequential pass
is as good as a shuffled one. Rows past ``num_rows`` continue the same stream:
a test set is simply the next rows.

The vertical split (`parties`, `batches`): the **follower** holds the first
``follower_fields`` categorical fields (13 by default); the **leader** holds
the dense fields, the other categorical fields and the labels.

Example:
    >>> data = CriteoLike(100_000, seed=0)
    >>> x, y = data.parties(0, 1000)        # {"follower": int32 (1000, 13),
    ...                                     #  "leader": float32 (1000, 26), "example_ids"}, y
    >>> data.ceiling_auc()                  # the hidden model's own AUC
    >>> train = data.batches(1024)          # a keras.utils.PyDataset over rows 0 .. 99_999
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from keras_fedpriv.mechanisms.validation import (
    validate_positive_int,
    validate_real,
    validate_seed,
)

__all__ = ["FOLLOWER", "LEADER", "CriteoLike", "CriteoRows"]

FOLLOWER = "follower"
LEADER = "leader"
_NUM_INTERACTIONS = 4
_MAX_FLOAT32_ID = 2**24  # ids the leader's float32 array holds exactly
_MAX_TABLE = 2**23  # per-(field, id) effects kept in a table up to this many (64 MiB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array (a bijective 64-bit hash; arithmetic mod 2^64)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@dataclasses.dataclass(frozen=True, eq=False)
class CriteoRows:
    """Rows ``[start, stop)`` of a `CriteoLike` stream.

    Attributes:
        dense: float32 (n, num_dense), the log-transformed counts.
        categorical: int32 (n, num_categorical), the hashed ids.
        labels: float32 (n, 1), 0/1.
        probabilities: float64 (n,), the hidden model's click probability.
        example_ids: int64 (n,), the row numbers ``start .. stop - 1``.
    """

    dense: np.ndarray
    categorical: np.ndarray
    labels: np.ndarray
    probabilities: np.ndarray
    example_ids: np.ndarray


class CriteoLike:
    """A Criteo-like click data set of ``num_rows`` rows from a known hidden model.

    See the module docstring for the hidden model. Everything is determined
    by ``seed`` and the other arguments; rows are generated on demand, one
    chunk at a time (the last two chunks are cached).

    Args:
        num_rows: rows in the data set (rows ``0 .. num_rows - 1``; `rows` and
            `parties` can read past it, e.g. a test set).
        seed: a non-negative int; the whole data set is a function of it.
        vocabulary_size: ids per categorical field, in [2, 2**24] (the leader
            sends its ids as float32, exact below 2**24).
        num_dense: dense fields (>= 1).
        num_categorical: categorical fields (>= 2).
        follower_fields: how many of the categorical fields the follower
            holds (the first ones), in [1, num_categorical - 1].
        positive_rate: the share of positive labels the bias is set for, in
            (0, 1); the realized rate is within about 0.01 of it.
        signal: scales the hidden logit (0 = labels independent of the
            features; larger = a higher ceiling). The default gives a ceiling
            AUC of about 0.9.
        zipf_exponent: the categorical ids' Zipf exponent (> 0; larger = a
            few ids dominate).
        chunk_size: rows per generated chunk (>= 1); changing it changes the
            rows (they are keyed by chunk).

    Example:
        >>> data = CriteoLike(10**6, seed=0, vocabulary_size=10_000, positive_rate=0.25)
        >>> rows = data.rows(0, 5)           # CriteoRows: dense, categorical, labels, ...
        >>> data.ceiling_auc(), data.positive_rate
    """

    def __init__(self, num_rows: int = 100_000, *, seed: int = 0,
                 vocabulary_size: int = 10_000, num_dense: int = 13, num_categorical: int = 26,
                 follower_fields: int = 13, positive_rate: float = 0.25, signal: float = 1.0,
                 zipf_exponent: float = 1.1, chunk_size: int = 65_536) -> None:
        self.num_rows = validate_positive_int(num_rows, "num_rows")
        seed = validate_seed(seed)
        if seed is None:
            raise TypeError("`seed` must be a non-negative integer: the data set is a function "
                            "of it (got None).")
        self.seed = seed
        self.vocabulary_size = validate_positive_int(vocabulary_size, "vocabulary_size",
                                                     minimum=2)
        if self.vocabulary_size > _MAX_FLOAT32_ID:
            raise ValueError(f"`vocabulary_size` must be at most 2**24 = {_MAX_FLOAT32_ID} (the "
                             f"leader's ids travel as float32, exact below it); got "
                             f"{vocabulary_size!r}.")
        self.num_dense = validate_positive_int(num_dense, "num_dense")
        self.num_categorical = validate_positive_int(num_categorical, "num_categorical",
                                                     minimum=2)
        self.follower_fields = validate_positive_int(follower_fields, "follower_fields")
        if self.follower_fields >= self.num_categorical:
            raise ValueError(f"`follower_fields` must be in [1, num_categorical - 1] = [1, "
                             f"{self.num_categorical - 1}] (the leader keeps at least one "
                             f"categorical field); got {follower_fields!r}.")
        self.target_rate = validate_real(positive_rate, "positive_rate", low=0, high=1,
                                         low_open=True, high_open=True)
        self.signal = validate_real(signal, "signal", low=0)
        self.zipf_exponent = validate_real(zipf_exponent, "zipf_exponent", low=0, low_open=True)
        self.chunk_size = validate_positive_int(chunk_size, "chunk_size")
        self._cache: dict[int, tuple[np.ndarray, ...]] = {}
        self._effect_table: np.ndarray | None = None
        self._draw_parameters()

    # ----------------------------------------------------------------- the hidden model

    def _draw_parameters(self):
        rng = np.random.default_rng([self.seed, 0])
        d, c = self.num_dense, self.num_categorical
        self._mu = rng.uniform(0.0, 3.0, size=d)
        self._s = rng.uniform(0.5, 1.5, size=d)
        self._center = np.log1p(np.exp(self._mu))
        self._weights = rng.normal(0.0, 0.45, size=d)
        self._pairs = np.stack([rng.choice(d, size=2, replace=d < 2)
                                for _ in range(_NUM_INTERACTIONS)])
        self._pair_weights = rng.normal(0.0, 0.4, size=_NUM_INTERACTIONS)
        self._effect_scale = 0.45
        # Rank r of field f has id (a_f * r + b_f) mod V, a_f coprime with V: a bijection.
        v = self.vocabulary_size
        multipliers = []
        while len(multipliers) < c:
            a = int(rng.integers(1, v)) if v > 2 else 1
            if np.gcd(a, v) == 1:
                multipliers.append(a)
        self._multipliers = np.array(multipliers, dtype=np.int64)
        self._offsets = rng.integers(0, v, size=c).astype(np.int64)
        self._hash_keys = rng.integers(0, 2**63, size=c, dtype=np.int64).astype(np.uint64)
        weights = np.arange(1, v + 1, dtype=np.float64) ** -self.zipf_exponent
        self._zipf_cdf = np.cumsum(weights) / weights.sum()
        self._bias = 0.0
        logits = self._logits(*self._features(0))
        self._bias = self._solve_bias(logits)
        self.positive_rate = float(np.mean(_sigmoid(logits + self._bias)))

    def _solve_bias(self, logits):
        """The bias whose mean click probability over ``logits`` is the target rate."""
        from scipy.optimize import brentq

        return float(brentq(lambda b: np.mean(_sigmoid(logits + b)) - self.target_rate,
                            -60.0, 60.0, xtol=1e-10))

    def _effects(self, ids):
        """Each (field, id)'s effect (n, fields): `_hashed_effects`, read from a table computed
        once when the table is small (the same numbers)."""
        c, v = self.num_categorical, self.vocabulary_size
        if c * v > _MAX_TABLE:
            return self._hashed_effects(ids)
        if self._effect_table is None:
            every_id = np.broadcast_to(np.arange(v, dtype=np.int64)[:, None], (v, c))
            self._effect_table = np.ascontiguousarray(self._hashed_effects(every_id).T)
        return self._effect_table[np.arange(c), ids]

    def _hashed_effects(self, ids):
        """Each (field, id)'s effect: a normal from the hash of (seed key, field, id)."""
        from scipy.special import ndtri

        keys = self._hash_keys[None, :] ^ ids.astype(np.uint64)
        bits = _splitmix64(_splitmix64(keys) + np.arange(ids.shape[1], dtype=np.uint64))
        uniform = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
        return self._effect_scale * ndtri(uniform)

    def _features(self, chunk):
        """(dense float32, categorical int32, uniforms for the labels) of one chunk."""
        rng = np.random.default_rng([self.seed, 1, chunk])
        n = self.chunk_size
        z = rng.standard_normal((n, self.num_dense))
        counts = np.floor(np.exp(self._mu + self._s * z))
        dense = np.log1p(counts).astype(np.float32)
        ranks = np.searchsorted(self._zipf_cdf, rng.random((n, self.num_categorical)),
                                side="right")
        ranks = np.minimum(ranks, self.vocabulary_size - 1)
        ids = (ranks * self._multipliers + self._offsets) % self.vocabulary_size
        return dense, ids.astype(np.int32), rng.random(n)

    def _logits(self, dense, ids, _uniform=None):
        t = (dense.astype(np.float64) - self._center) / self._s
        linear = t @ self._weights
        pairs = (t[:, self._pairs[:, 0]] * t[:, self._pairs[:, 1]]) @ self._pair_weights
        return self.signal * (linear + 0.5 * pairs + self._effects(ids).sum(axis=1)) + self._bias

    def _chunk(self, chunk):
        """(dense, ids, labels, probabilities) of one chunk; the last two are cached."""
        if chunk not in self._cache:
            dense, ids, uniform = self._features(chunk)
            probabilities = _sigmoid(self._logits(dense, ids))
            labels = (uniform < probabilities).astype(np.float32).reshape(-1, 1)
            self._cache[chunk] = (dense, ids, labels, probabilities)
            while len(self._cache) > 2:
                del self._cache[next(iter(self._cache))]
        return self._cache[chunk]

    # ----------------------------------------------------------------- reading rows

    def _range(self, start, stop):
        start = validate_positive_int(start, "start", minimum=0)
        stop = self.num_rows if stop is None else validate_positive_int(stop, "stop", minimum=0)
        if stop <= start:
            raise ValueError(f"`stop` must be greater than `start`; got start={start}, "
                             f"stop={stop}.")
        return start, stop

    def rows(self, start: int = 0, stop: int | None = None) -> CriteoRows:
        """Rows ``[start, stop)`` (``stop=None``: ``num_rows``) as numpy arrays.

        Materializes the rows asked for: fine for test sets and small data
        (10^6 rows take about 250 MB); stream large ranges with `batches`.

        Args:
            start: first row, >= 0.
            stop: one past the last row, > start (may exceed ``num_rows``).

        Returns:
            A `CriteoRows`.

        Example:
            >>> test = CriteoLike(10**6, seed=0).rows(10**6, 10**6 + 50_000)  # the next rows
        """
        start, stop = self._range(start, stop)
        parts = []
        first, last = start // self.chunk_size, (stop - 1) // self.chunk_size
        for chunk in range(first, last + 1):
            lo = max(start - chunk * self.chunk_size, 0)
            hi = min(stop - chunk * self.chunk_size, self.chunk_size)
            parts.append([a[lo:hi] for a in self._chunk(chunk)])
        dense, ids, labels, probabilities = (np.concatenate(p) for p in zip(*parts))
        return CriteoRows(dense=dense, categorical=ids, labels=labels,
                          probabilities=probabilities,
                          example_ids=np.arange(start, stop, dtype=np.int64))

    def parties(self, start: int = 0, stop: int | None = None,
                example_ids: bool = True) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Rows ``[start, stop)`` split between the follower and the leader.

        Args:
            start: first row, >= 0.
            stop: one past the last row (None: ``num_rows``).
            example_ids: add the row numbers under ``"example_ids"`` (what
                `VerticalModel` and its label DP need; a plain Keras model
                takes ``example_ids=False``).

        Returns:
            ``(x, y)``: ``x[FOLLOWER]`` int32 (n, follower_fields), the
            follower's ids; ``x[LEADER]`` float32 (n, num_dense + the other
            fields), the dense fields then the leader's ids (exact in
            float32); ``x["example_ids"]`` int64 (n,); ``y`` float32 (n, 1).

        Example:
            >>> x, y = CriteoLike(10_000, seed=0).parties()
            >>> x["follower"].shape, x["leader"].shape   # (10000, 13), (10000, 26)
        """
        rows = self.rows(start, stop)
        k = self.follower_fields
        x = {FOLLOWER: np.ascontiguousarray(rows.categorical[:, :k]),
             LEADER: np.concatenate([rows.dense, rows.categorical[:, k:].astype(np.float32)],
                                    axis=1)}
        if example_ids:
            x["example_ids"] = rows.example_ids
        return x, rows.labels

    def batches(self, batch_size: int, start: int = 0, stop: int | None = None,
                example_ids: bool = True) -> Any:
        """A `keras.utils.PyDataset` of ``parties`` batches over rows ``[start, stop)``.

        Batch i is rows ``start + i * batch_size`` onwards (the last one
        shorter), generated when Keras asks for it: memory stays a chunk or two
        whatever the number of rows. Pass it to ``fit`` / ``evaluate`` without
        ``batch_size``.

        Args:
            batch_size: rows per batch, >= 1.
            start, stop: the row range (``stop=None``: ``num_rows``).
            example_ids: as in `parties`.

        Returns:
            A `keras.utils.PyDataset` (``len()`` = number of batches).

        Example:
            >>> model.fit(CriteoLike(10**6, seed=0).batches(1024), epochs=1)
        """
        import keras

        batch_size = validate_positive_int(batch_size, "batch_size")
        start, stop = self._range(start, stop)
        data = self

        class CriteoBatches(keras.utils.PyDataset):
            def __init__(self):
                super().__init__()

            def __len__(self):
                return -(-(stop - start) // batch_size)

            def __getitem__(self, index):
                if not 0 <= index < len(self):
                    raise IndexError(f"batch {index} of {len(self)}")
                lo = start + index * batch_size
                return data.parties(lo, min(lo + batch_size, stop), example_ids=example_ids)

        return CriteoBatches()

    def ceiling_auc(self, num_rows: int = 200_000) -> float:
        """The hidden model's own (Bayes) ROC-AUC: the best any model can reach.

        The expected AUC of scoring each row by its true click probability p,
        over rows ``0 .. num_rows - 1``: every row counts as a positive with
        weight p and as a negative with weight 1 - p (the expectation over
        the labels, so it does not depend on the labels drawn). Its sampling
        error at 200,000 rows is below 0.001.

        Args:
            num_rows: rows to average over, >= 2.

        Returns:
            The AUC, in [0.5, 1].

        Example:
            >>> CriteoLike(seed=0).ceiling_auc()   # about 0.9
        """
        from sklearn.metrics import roc_auc_score

        num_rows = validate_positive_int(num_rows, "num_rows", minimum=2)
        p = self.rows(0, num_rows).probabilities
        return float(roc_auc_score(np.r_[np.ones_like(p), np.zeros_like(p)], np.r_[p, p],
                                   sample_weight=np.r_[p, 1.0 - p]))

    def __repr__(self) -> str:
        return (f"CriteoLike(num_rows={self.num_rows}, seed={self.seed}, vocabulary_size="
                f"{self.vocabulary_size}, num_dense={self.num_dense}, num_categorical="
                f"{self.num_categorical}, follower_fields={self.follower_fields}, "
                f"positive_rate={self.positive_rate:.4f})")


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))
