"""Laplace-protected clustering evaluation of a model's outputs (MindSpore Federated's design).

During (federated) training the server wants to know whether the model's
outputs separate the data into clusters, without seeing any client's outputs
in the clear:

* client: run inference with the current model on its evaluation data and add
  i.i.d. Laplace noise of scale ``sensitivity / eps`` to every entry of every
  softmax vector (`keras_fedpriv.mechanisms.laplace.laplace`) *before* the
  vectors leave the device;
* server: label each noisy vector by its argmax and score the clustering of
  the noisy vectors (silhouette, Calinski-Harabasz, Davies-Bouldin) over the
  most recent ``cluster_client_num`` clients.

`LaplaceEvaluation` does this as a Keras callback, at the end of an epoch of
``model.fit`` or of a round of `keras_fedpriv.federated.HorizontalFL.fit`.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import keras
import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.mechanisms.ledger import (
    CLIENT,
    ReleaseKind,
    ReleaseLedger,
    non_private_event,
    register_protection,
)
from keras_fedpriv.mechanisms.events import repeat_event
from keras_fedpriv.mechanisms.laplace import (
    SAMPLERS,
    laplace,
    laplace_dp_event,
    laplace_grid,
    laplace_scale,
)
from keras_fedpriv.mechanisms.random import SeededReleases, secret_generator
from keras_fedpriv.mechanisms.validation import (
    config_with_seed,
    validate_eps,
    validate_positive_int,
    validate_real,
    validate_seed,
)

__all__ = ["MAX_EPS", "MAX_REPORT_ROWS", "MAX_SCORED_ROWS", "METRICS", "PROBABILITY_TOLERANCE",
           "TAIL_SCALES", "LaplaceEvaluation", "fixed_size_rows"]

#: The reference implementation's eps domain is (0, MAX_EPS].
MAX_EPS = 500000.0
#: Output rows must be non-negative and sum to 1 within this tolerance.
PROBABILITY_TOLERANCE = 1e-3
#: The clustering scores this callback can log, by name.
METRICS = ("silhouette", "calinski_harabasz", "davies_bouldin")
#: Default ``max_report_rows``: the most rows one client's report may hold.
MAX_REPORT_ROWS = 10_000
#: Default ``max_scored_rows``: the most rows one evaluation's scores are computed on.
MAX_SCORED_ROWS = 5_000
#: `LaplaceEvaluation.report_bound` allows this many noise scales beyond [0, 1]: an honest
#: report's entry passes it with probability at most 2 * exp(-TAIL_SCALES).
TAIL_SCALES = 700
_INFERENCE_BATCH = 1024


def _score_fn(name):
    from sklearn import metrics

    return {"silhouette": metrics.silhouette_score,
            "calinski_harabasz": metrics.calinski_harabasz_score,
            "davies_bouldin": metrics.davies_bouldin_score}[name]


def _validate_metrics(metrics):
    if isinstance(metrics, str):
        metrics = (metrics,)
    try:
        names = tuple(metrics)
    except TypeError:
        raise TypeError(f"`metrics` must be a metric name or a sequence of names from "
                        f"{METRICS}; got {metrics!r}.") from None
    if not names:
        raise ValueError(f"`metrics` must name at least one of {METRICS}; got {metrics!r}.")
    out = []
    for name in names:
        if not isinstance(name, str) or name not in METRICS:
            raise ValueError(f"`metrics` entries must be among {METRICS}; got {name!r} in "
                             f"{metrics!r}.")
        if name not in out:
            out.append(name)
    return tuple(out)


def _validate_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be True or False; got {value!r} of type "
                        f"{type(value).__name__}.")
    return bool(value)


def _as_rows(x, name):
    try:
        arr = np.asarray(x)
    except Exception as err:  # pragma: no cover - exotic inputs
        raise TypeError(f"`{name}` must be an array of model inputs; got "
                        f"{type(x).__name__}.") from err
    if arr.dtype == object or arr.ndim == 0:
        raise TypeError(f"`{name}` must be a numeric array with one example per row; got "
                        f"{type(x).__name__} with dtype {arr.dtype} and shape {arr.shape}.")
    if len(arr) == 0:
        raise ValueError(f"`{name}` has no rows; every evaluation client needs data.")
    if arr.dtype.kind == "f" and arr.dtype != np.float32:
        arr = arr.astype(np.float32)
    return arr


def _split_eval_data(eval_data, num_eval_clients, max_report_rows):
    """Per-client input arrays from ``eval_data`` (see `LaplaceEvaluation`)."""
    clients = _split(eval_data, num_eval_clients)
    for i, x in enumerate(clients or []):
        if len(x) > max_report_rows:
            raise ValueError(f"`eval_data` client {i} has {len(x)} rows, more than "
                             f"`max_report_rows`={max_report_rows} (the most a client may "
                             "report); raise `max_report_rows` or split `eval_data` among more "
                             "clients.")
    return clients


def _split(eval_data, num_eval_clients):
    if eval_data is None:
        return None
    if isinstance(eval_data, tuple):
        raise TypeError("`eval_data` must be an array x (labels are not used: the scores are "
                        "unsupervised) or a list of per-client arrays; got a tuple. Pass "
                        "x_eval, not (x_eval, y_eval).")
    if isinstance(eval_data, list):
        if not eval_data:
            raise ValueError("`eval_data` is an empty list; give at least one client's array.")
        return [_as_rows(x, f"eval_data[{i}]") for i, x in enumerate(eval_data)]
    x = _as_rows(eval_data, "eval_data")
    if len(x) < num_eval_clients:
        raise ValueError(f"`eval_data` has {len(x)} rows, fewer than `num_eval_clients`="
                         f"{num_eval_clients}; every client needs at least one row.")
    return list(np.array_split(x, num_eval_clients))


def fixed_size_rows(x: ArrayLike, rows: int) -> np.ndarray:
    """Exactly ``rows`` rows of a client's inputs ``x``, so a report's size says nothing of
    ``len(x)``: its first ``rows`` rows, or, with fewer, its rows repeated in order (row ``i``
    of the result is row ``i % len(x)``).

    Each repeated row is one of the client's own examples and is noised like the others
    (fresh noise per row): every row's release is eps-LDP whatever the clean probability
    vector, so how many rows are real is covered by the same per-row releases, which the
    client's ledger counts (``rows`` of them).

    Args:
        x: the client's inputs (at least one row).
        rows: the report's size (an integer >= 1).

    Returns:
        ``(rows, ...)`` inputs.
    """
    x = np.asarray(x)
    rows = validate_positive_int(rows, "rows")
    if len(x) == 0:
        raise ValueError("a client needs at least one row of inputs to report.")
    if len(x) >= rows:
        return x[:rows]
    return x[np.arange(rows) % len(x)]


def _evenly_spaced(n, cap):
    """Row indices ``i * n // cap`` (``i < cap``): at most ``cap`` of ``n`` rows, in order."""
    if n <= cap:
        return slice(None)
    return np.arange(cap, dtype=np.int64) * n // cap


@keras.saving.register_keras_serializable(package="keras_fedpriv")
class LaplaceEvaluation(SeededReleases, keras.callbacks.Callback):
    """Clustering scores of the model's outputs, released under Laplace local DP.

    At the end of every ``every_n_epochs``-th epoch (``model.fit``) or round
    (`HorizontalFL.fit`), every evaluation client runs inference with the
    current model. Its softmax rows get i.i.d. Laplace noise of scale
    ``b = sensitivity / eps`` on every entry *before they leave the client*
    (`keras_fedpriv.mechanisms.laplace.laplace`). The server labels each
    noisy vector by its argmax and computes scikit-learn's clustering scores
    over the noisy vectors of the most recent ``cluster_client_num`` clients;
    it logs ``laplace_<metric>`` for each metric, ``laplace_eval_time_s`` and,
    with ``log_clean=True``, ``clean_<metric>``: the same scores computed the
    same way on the noiseless outputs of the same clients, to show what the
    noise costs (this is a simulation aid: a real server never sees them).

    **Sensitivity: 2 by default, not the original design's 1.** The original design and the
    reference implementation add Laplace noise of scale ``1 / eps``, i.e. L1
    sensitivity 1. But two probability vectors can differ by up to 2 in L1
    norm (e.g. ``[1, 0]`` and ``[0, 1]``), so with sensitivity 1 the real
    guarantee is ``2 * eps``-LDP: the original design's eps is understated by a factor
    2. This class defaults to the correct ``sensitivity=2.0``. Pass
    ``sensitivity=1.0`` only to reproduce the original design (a warning says so). In
    every case `epsilon` and `dp_event` report the *true* guarantee for
    probability vectors, ``2 * eps / sensitivity``.

    **The original design's eps = 230260 is almost no protection.** The original design picks eps
    so that 90% of the noise draws are below 1e-5 in magnitude: the noise
    scale is ``1 / 230260 = 4.3e-6`` with the original design's sensitivity 1
    (``8.7e-6`` with sensitivity 2), far below the differences between the
    outputs of different examples. The scores are unaffected, and so is what
    the server learns about each client's outputs. Meaningful protection
    needs eps of order 1-10, where the noise (scale 0.2-2) dominates the
    probabilities; the scores then measure mostly noise (see
    docs/results/laplace_eval.md).

    **Float-safe noise.** ``sampler="discrete"`` (default) draws discrete
    Laplace noise on a power-of-two grid, which does not leak the input
    through the low bits of floating-point output (Mironov 2012);
    ``"continuous"`` is the naive float sampler, for comparison only.

    **Which clients are scored.** The server keeps a rolling buffer of the
    most recent report of each client, in the order they arrived (within an
    evaluation: the clients' order). A client that reports again replaces
    its older report (it moves to the newest end); the buffer keeps the
    newest ``cluster_client_num`` clients and the scores are computed over
    all their rows. So with ``eval_data`` split into ``num_eval_clients``
    clients, ``cluster_client_num >= num_eval_clients`` scores exactly this
    evaluation's outputs, and a smaller value the last
    ``cluster_client_num`` clients of it. With `HorizontalFL` and
    ``eval_data=None``, the buffer collects the participants of the latest
    rounds (their reports were made with the models of their rounds).
    ``cluster_client_num=None`` (default) scores the clients of the current
    evaluation only (no buffer across evaluations); the original design's configuration
    uses ``cluster_client_num=1000``. The buffer survives across ``fit``
    calls (to resume training); `reset_buffer` empties it.

    **Outputs.** The model must have one output, a 2-D array ``(n, K)`` of
    probability vectors (a softmax head): each row non-negative and summing
    to 1 within 1e-3 (rows are renormalized to sum to exactly 1 before the
    noise is added, so the L1 bound of 2 holds). Otherwise a ValueError is
    raised: the sensitivity bound only holds for probability vectors. A
    model that outputs logits needs ``from_logits=True`` (softmax is then
    applied on the client first). Multi-output models are not supported.

    **Bounded server work, and no data size.** A client asked for a report
    of ``max_rows`` rows (`client_outputs`; on Flower the server's
    ``max-rows``, and the client's own ``max_report_rows`` when the server
    names none) reports exactly ``min(max_rows, max_report_rows)`` rows: its
    first ones, or, when it holds fewer, its rows repeated in order
    (`fixed_size_rows`), each noised like the others and counted as a release
    about the client. So the report's shape does not tell the server how many
    rows the client holds; set ``max_report_rows`` near the smallest client's
    size (every row sent costs its eps). In one process (`HorizontalFL`,
    ``eval_data=None``) the server is the same process and each client
    reports its first ``max_report_rows`` rows at most, as many as it holds.
    A fixed ``eval_data`` client with more rows than ``max_report_rows`` is
    refused when the callback is built. On Flower the server sends this cap with its
    ``"evaluate"`` message and refuses a larger report from its byte size,
    before parsing it. The scores of one evaluation are computed on at most
    ``max_scored_rows`` rows: when the buffer holds more, on the evenly
    spaced rows ``i * n // max_scored_rows`` of the buffer (oldest client
    first), a deterministic subsample in which every buffered client keeps
    its share. So no client, and no number of clients, can make one
    evaluation's scoring cost more than that of ``max_scored_rows`` rows.
    A report's values are bounded too (`report_bound`: beyond it an honest
    report's noise has probability below ``2 exp(-700)``); a score that
    scikit-learn cannot compute is logged as NaN with a warning. The buffer
    holds up to ``cluster_client_num`` reports of at most ``max_report_rows``
    rows (``8 K`` bytes each) in memory.

    **Scores.** scikit-learn's ``silhouette_score`` (Euclidean, with
    ``sample_size=silhouette_sample_size``: silhouette costs O(n^2) in the
    number of scored rows, so set it below ``max_scored_rows`` to make it
    cheaper; at or above ``max_scored_rows`` it has no effect, with a
    warning), ``calinski_harabasz_score`` (higher is better) and
    ``davies_bouldin_score`` (lower is better). Each needs between 2 and
    n - 1 distinct labels; otherwise (e.g. all noisy vectors have the same
    argmax) the score is logged as 0.0 with a warning that says why.

    **Privacy.** Each evaluation releases every evaluated example's output
    vector once, under ``epsilon = 2 * eps / sensitivity``-LDP (`dp_event`).
    An example released in ``m`` evaluations has spent the composition of
    ``m`` such events (``dp_event(evaluations=m)``): that is the
    *per-example* figure. About a *client* (the unit of the ledger and of
    `keras_fedpriv.privacy.privacy_report`), one evaluation of its ``n``
    rows is ``n`` releases: changing the client's data may change all ``n``
    rows, so its data as a whole composes ``n`` eps-LDP events per
    evaluation, and the ledger records ``n`` (the rows actually noised and
    sent). `num_evaluations` counts the evaluations and `client_releases`
    how many reports each client made. The argmax labels and scores are
    post-processing.

    **Whose release it is (the ledger).** With ``eval_data=None`` each
    report is a client's own data: its rows are recorded under that
    client's id. A fixed ``eval_data`` is split into evaluation clients
    whose indices ``0..n-1`` say nothing about who owns the rows: they would
    collide with training clients' ids (`HorizontalFL`'s client ``0`` is not
    evaluation client ``0``), and a training client whose rows are in
    ``eval_data`` would go uncounted. So every report on a fixed
    ``eval_data`` is recorded as releases about *every* client, one per row
    it holds: one evaluation counts every row of ``eval_data`` (summed over
    its evaluation clients) about every client, the worst case of a client
    that owns them all, and no client's composition can miss it. This
    over-counts for clients that own fewer rows of ``eval_data`` (never
    under-counts).

    **Randomness.** ``seed=None`` (default): each client's noise comes from a
    fresh 64-bit OS-entropy secret at every evaluation, as on independent
    devices. An int ``seed`` makes the noise (and silhouette's sampling)
    reproducible; it is then saved in `get_config`, so treat it as a secret.
    The n-th client report draws its noise from ``secret_generator(seed,
    stream=n)``; `state_dict` carries n (``num_releases``) with the
    evaluation counters, so a copy restored with `load_state_dict` adds new
    noise instead of replaying it, and a seeded copy rebuilt by
    `from_config` alone refuses to report until its state is loaded.

    **When it runs.** With ``model.fit``: in ``on_epoch_end``, on
    ``eval_data`` (required: a clear error at ``on_train_begin`` otherwise).
    With `HorizontalFL.fit` (and the Flower apps): the driver calls
    `evaluate_round` after aggregation and validation, before
    ``on_epoch_end``, on ``eval_data`` if given, else on the round's
    participating clients' own training inputs. On epochs that are not evaluated every
    logged key is NaN, so ``History`` lists stay aligned with epochs.

    Args:
        eval_data: the evaluation inputs: an array ``x`` (labels are not
            used), split into ``num_eval_clients`` contiguous near-equal
            clients (`np.array_split`, fixed for the whole training; shuffle
            ``x`` first if it is sorted), or a list of per-client arrays, or
            None: only with `HorizontalFL.fit`, where each round's clients
            evaluate on their own training inputs.
        eps: per-evaluation Laplace epsilon (keyword-only, required), in the
            reference's domain ``(0, 500000]``; the noise scale is
            ``sensitivity / eps``.
        sensitivity: L1 sensitivity used to scale the noise, finite and > 0.
            Default 2.0, the true L1 diameter of probability vectors; 1.0
            reproduces the original design (and understates eps by a factor 2).
        metrics: a name or a sequence of names among ``"silhouette"``,
            ``"calinski_harabasz"``, ``"davies_bouldin"``.
        cluster_client_num: the number of most recent clients whose reports
            are scored (an integer >= 1), or None for the current
            evaluation's clients only.
        every_n_epochs: evaluate when ``(epoch + 1) % every_n_epochs == 0``.
        num_eval_clients: the number of clients an array ``eval_data`` is
            split into (ignored for a list or None).
        from_logits: apply softmax to the model's outputs first.
        log_clean: also log ``clean_<metric>`` (the noiseless scores). A
            simulation-only diagnostic: the ledger records it as a release
            without DP, so the run's report becomes ``inf``.
        sampler: ``"discrete"`` (float-safe, default) or ``"continuous"``
            (naive float sampler, for comparison only).
        silhouette_sample_size: None (all scored rows) or the number of rows
            silhouette samples (an integer >= 2), with a random state drawn
            from the callback's generator.
        max_report_rows: the most rows one client's report may hold (an
            integer >= 1); the server refuses larger reports.
        max_scored_rows: the most rows one evaluation's scores are computed
            on (an integer >= 2); a larger buffer is subsampled evenly.
        seed: None (fresh OS-entropy secrets) or an int for reproducible noise.

    Attributes:
        num_classes: K, the length of the output vectors (None before the
            first evaluation).
        num_evaluations: how many evaluations have released noisy outputs.
        client_releases: dict client id -> number of reports (evaluations it
            took part in; ids: the index in ``eval_data``'s clients, or
            `HorizontalFL`'s client id). The ledger counts rows.
        last_scores: the logged values of the last evaluation (a dict).
        last_server_view: ``(noisy_vectors, labels)``, what the server scored
            in the last evaluation (float64 ``(n, K)`` and int ``(n,)``; at
            most ``max_scored_rows`` rows).
        last_clean_view: ``(clean_vectors, labels)`` of the same rows when
            ``log_clean`` (else None).
        last_client_ids: the ids of the clients whose rows were scored, in
            buffer order (oldest first).

    Example:
        >>> model = keras.Sequential([keras.Input((64,)),
        ...                           keras.layers.Dense(10, activation="softmax")])
        >>> model.compile("adam", "sparse_categorical_crossentropy")
        >>> cb = LaplaceEvaluation(x_test, eps=10.0, log_clean=True)
        >>> history = model.fit(x, y, epochs=5, callbacks=[cb], verbose=0)
        >>> history.history["laplace_silhouette"]  # one score per epoch
        >>> cb.dp_event(evaluations=cb.num_evaluations)  # what each example spent
        >>> privacy_report(cb)  # about a client: every row of x_test, every evaluation
    """

    def __init__(self, eval_data: ArrayLike | Sequence[ArrayLike] | None = None, *, eps: float,
                 sensitivity: float = 2.0, metrics: str | Sequence[str] = METRICS,
                 cluster_client_num: int | None = None, every_n_epochs: int = 1,
                 num_eval_clients: int = 10, from_logits: bool = False, log_clean: bool = False,
                 sampler: str = "discrete", silhouette_sample_size: int | None = None,
                 seed: int | None = None, max_report_rows: int = MAX_REPORT_ROWS,
                 max_scored_rows: int = MAX_SCORED_ROWS) -> None:
        super().__init__()
        self.eps = validate_eps(eps, "eps", lower_open=True, upper=MAX_EPS)
        self.sensitivity = validate_real(sensitivity, "sensitivity", low=0, low_open=True)
        self.metrics = _validate_metrics(metrics)
        self.cluster_client_num = validate_positive_int(cluster_client_num,
                                                        "cluster_client_num", allow_none=True)
        self.every_n_epochs = validate_positive_int(every_n_epochs, "every_n_epochs")
        self.num_eval_clients = validate_positive_int(num_eval_clients, "num_eval_clients")
        self.from_logits = _validate_bool(from_logits, "from_logits")
        self.log_clean = _validate_bool(log_clean, "log_clean")
        if sampler not in SAMPLERS:
            raise ValueError(f"`sampler` must be one of {SAMPLERS}; got {sampler!r}.")
        self.sampler = sampler
        self.silhouette_sample_size = validate_positive_int(
            silhouette_sample_size, "silhouette_sample_size", minimum=2, allow_none=True)
        self.seed = validate_seed(seed)
        self.max_report_rows = validate_positive_int(max_report_rows, "max_report_rows")
        self.max_scored_rows = validate_positive_int(max_scored_rows, "max_scored_rows",
                                                     minimum=2)
        self._clients = _split_eval_data(eval_data, self.num_eval_clients, self.max_report_rows)
        if self.silhouette_sample_size is not None and \
                self.silhouette_sample_size >= self.max_scored_rows:
            warnings.warn(
                f"LaplaceEvaluation(silhouette_sample_size={self.silhouette_sample_size}) has "
                f"no effect: at most max_scored_rows={self.max_scored_rows} rows are scored, "
                "and silhouette samples only when it is below that number.", stacklevel=2)
        if self.sensitivity < 2.0:
            warnings.warn(
                f"LaplaceEvaluation(sensitivity={self.sensitivity:g}): two probability vectors "
                f"differ by up to 2 in L1 norm, so the noise scale sensitivity/eps = "
                f"{self.sensitivity / self.eps:.3g} gives {2.0 / self.sensitivity:g} * eps = "
                f"{self.epsilon:.6g}-LDP, not eps = {self.eps:g}. Use the default "
                f"sensitivity=2.0 unless you are reproducing the original design.",
                stacklevel=2)
        self._init_releases()
        if self.seed is None:
            self._server_rng = secret_generator()
        else:  # post-processing only (silhouette's sampling of noisy vectors)
            self._server_rng = np.random.default_rng(np.random.SeedSequence(self.seed).spawn(2)[1])

        self.num_classes = None
        self.num_evaluations = 0
        self.client_releases = {}
        self.last_scores = None
        self.last_server_view = None
        self.last_clean_view = None
        self.last_client_ids = None
        self._buffer = OrderedDict()  # client id -> (noisy rows, clean rows or None)
        self._evaluated_epoch = None

    # --- privacy -----------------------------------------------------------

    @property
    def noise_scale(self) -> float:
        """The Laplace scale ``b = sensitivity / eps`` added to every entry."""
        return laplace_scale(self.eps, self.sensitivity)

    def report_bound(self, num_classes: int | None = None) -> float:
        """The largest magnitude an honest report's entry may have (the server refuses more).

        A report's entry is a probability in [0, 1] plus the mechanism's
        noise: with the discrete sampler the value rounded to its grid (step
        ``gamma``) plus ``gamma`` times integer noise ``Z`` with ``P(|Z| >= z)
        <= 2 exp(-a z)`` (`laplace_grid`), with the continuous one Laplace
        noise of scale ``b``. The bound is ``1 + gamma + TAIL_SCALES *
        gamma / a`` (discrete) or ``1 + TAIL_SCALES * b`` (continuous): an
        honest entry passes it with probability at most ``2 exp(-700)``.

        Args:
            num_classes: K, the entries per row (the discrete grid depends on
                it); None: the `num_classes` seen so far (required then).

        Returns:
            The bound (a finite float > 1).
        """
        k = validate_positive_int(num_classes, "num_classes", allow_none=True)
        k = self.num_classes if k is None else k
        if k is None:
            raise ValueError("`num_classes` is unknown before the first evaluation; pass "
                             "report_bound(num_classes=K) with K the model's output length.")
        if self.sampler == "continuous":
            return 1.0 + TAIL_SCALES * self.noise_scale
        gamma, _, a = laplace_grid(self.eps, self.sensitivity, k)
        return 1.0 + gamma + TAIL_SCALES * gamma / a

    @property
    def epsilon(self) -> float:
        """The local-DP epsilon of one example's output in one evaluation.

        ``2 * eps / sensitivity``: the noise scale is ``sensitivity / eps``
        and probability vectors are at most 2 apart in L1 norm. Equal to
        ``eps`` with the default ``sensitivity=2``; ``2 * eps`` with the
        original design's ``sensitivity=1``. (With the discrete sampler and a
        sensitivity other than 2, `dp_event` is exact on the sampler's grid
        and up to about 0.1% below this value.)
        """
        return 2.0 * self.eps / self.sensitivity

    def dp_event(self, evaluations: int = 1,
                 num_classes: int | None = None) -> dp_accounting.DpEvent:
        """The per-example `dp_accounting` event of ``evaluations`` releases.

        One evaluation releases each evaluated example's K-vector once
        through the Laplace mechanism; ``evaluations`` releases are composed
        explicitly (`repeat_event`). With the default ``sensitivity=2`` this
        is ``laplace_dp_event(eps, 2.0, num_values=K, sampler=...)``. With
        another sensitivity the event describes the noise actually added
        (scale ``sensitivity / eps``) against the true L1 distance 2 of
        probability vectors: ``LaplaceDpEvent(sensitivity / (2 eps))`` for
        the continuous sampler, and for the discrete one the sampler's
        integer noise parameter with the integer sensitivity of distance 2
        on its grid (``ceil(2 / gamma) + K``), i.e. eps within about 0.1%
        (below) of `epsilon`.

        Args:
            evaluations: number of evaluations the example took part in
                (>= 1), e.g. `num_evaluations`.
            num_classes: K; needed before the first evaluation, checked
                against the model's output length after it.
        """
        evaluations = validate_positive_int(evaluations, "evaluations")
        num_classes = validate_positive_int(num_classes, "num_classes", allow_none=True)
        if num_classes is None:
            if self.num_classes is None:
                raise ValueError("`num_classes` is unknown before the first evaluation; pass "
                                 "dp_event(num_classes=K) with K the model's output length.")
            num_classes = self.num_classes
        elif self.num_classes is not None and num_classes != self.num_classes:
            raise ValueError(f"`num_classes`={num_classes} differs from the model's output "
                             f"length {self.num_classes} seen in the evaluations.")
        event = laplace_dp_event(self.eps, self.sensitivity, num_values=num_classes,
                                 sampler=self.sampler, distance=2.0)
        return repeat_event(event, evaluations)

    def release_kind(self) -> ReleaseKind:
        """The ledger's kind of one evaluated row's release about its client.

        One evaluation of a client's ``n`` rows is ``n`` releases of this
        kind about the client (each row is eps-LDP; the client's data as a
        whole composes ``n`` of them); one release is what each example
        spends per evaluation (the per-example figure). A server that asks
        clients to evaluate records ``max_report_rows`` (the most a client
        may send) for every client it asks
        (`keras_fedpriv.federated.flower.HorizontalStrategy`).

        Returns:
            A `ReleaseKind` (its event: `dp_event` of one evaluation).
        """
        return ReleaseKind("LaplaceEvaluation", "client data", CLIENT,
                           self.dp_event(),
                           "noisy softmax outputs: each evaluation releases every evaluated "
                           "example's output once; counted per row about its client (n rows: "
                           "n releases); a report asked for max-rows rows has exactly that many "
                           "(a client's rows repeated when it has fewer, each noised), so its "
                           "size tells no data size")

    def privacy_ledger(self) -> ReleaseLedger:
        """Every row released so far, per client (`ReleaseLedger`, unit: client)."""
        return self._ledger

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        register_protection(model, self)

    # --- Keras callback ----------------------------------------------------

    def begin_federated_run(self) -> None:
        """Called by a federated driver (`HorizontalFL`) before ``on_train_begin``."""
        self._federated_run = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._federated_run = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._clients is None and not getattr(self, "_federated_run", False):
            raise ValueError(
                "LaplaceEvaluation(eval_data=None) evaluates the participating clients of "
                "HorizontalFL.fit rounds on their own data; with model.fit pass the "
                "evaluation inputs: LaplaceEvaluation(x_eval, eps=...).")
        self._evaluated_epoch = None

    def is_due(self, epoch: int) -> bool:
        """Whether an evaluation runs after ``epoch`` (0-based; every ``every_n_epochs``-th).

        Args:
            epoch: the epoch or federated round (0-based).

        Returns:
            True on epochs ``every_n_epochs - 1``, ``2 * every_n_epochs - 1``, ...
        """
        return (int(epoch) + 1) % self.every_n_epochs == 0

    def evaluate_round(self, model: keras.Model, round: int,  # noqa: A002
                       client_inputs: Mapping[int, ArrayLike]) -> dict[str, float]:
        """A federated round's evaluation, if due (the driver calls it; empty dict if not).

        Args:
            model: the new global model.
            round: the round (0-based; due every ``every_n_epochs``-th).
            client_inputs: ``{client id: its inputs}`` of the round's clients;
                used when the evaluation has no ``eval_data`` of its own.

        Returns:
            The logged scores (``laplace_*``), or ``{}`` when not due.
        """
        if not self.is_due(round):
            return {}
        if self._clients is None:
            ids = [int(i) for i in client_inputs]
            # each client reports at most max_report_rows rows: its first ones (in one process
            # the server is this process; on Flower the reports have a fixed size)
            inputs = [np.asarray(client_inputs[i])[:self.max_report_rows] for i in client_inputs]
        else:
            ids = list(range(len(self._clients)))
            inputs = self._clients
        scores = self.evaluate(inputs, ids, model=model)
        self._evaluated_epoch = int(round)
        return scores

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Evaluate (unless `on_federated_round` already did) and write the logs."""
        if self._evaluated_epoch == int(epoch):
            values = self.last_scores
        elif self.is_due(epoch):
            if self._clients is None:
                raise ValueError(
                    "LaplaceEvaluation(eval_data=None) got no federated round for "
                    f"epoch {epoch}: without eval_data it only works with HorizontalFL.fit.")
            values = self.evaluate(self._clients, list(range(len(self._clients))))
        else:
            values = dict.fromkeys(self.log_keys(), float("nan"))
        if isinstance(logs, dict):
            logs.update(values)

    def log_keys(self) -> list[str]:
        """The keys this callback writes into the logs."""
        keys = [f"laplace_{m}" for m in self.metrics]
        if self.log_clean:
            keys += [f"clean_{m}" for m in self.metrics]
        return keys + ["laplace_eval_time_s"]

    # --- the protocol ------------------------------------------------------

    def client_report(self, probs: ArrayLike, client_id: int | None = None) -> np.ndarray:
        """One client's release: its probability rows plus Laplace noise (float64).

        Not recorded: `report_outputs` is the client side that records.

        Args:
            probs: ``(n, K)`` probability vectors (validated as in `evaluate`).
            client_id: the client (a seeded object draws from that client's
                own stream, so a copy on the client's machine adds the same
                noise); None: this object's own stream.
        """
        probs = self._probabilities(probs)
        return laplace(probs, self.eps, sensitivity=self.sensitivity,
                       rng=self._release_generator(client_id), sampler=self.sampler)

    def report_outputs(self, outputs: ArrayLike, client_id: int
                       ) -> tuple[np.ndarray, np.ndarray | None]:
        """The client side: noise one client's model outputs and record its releases.

        Records one release per row sent (``n`` rows: ``n`` releases about
        the client; with a fixed ``eval_data``, about every client).

        Args:
            outputs: the client's ``(n, K)`` probability rows
                (`client_outputs`).
            client_id: the client's id (an integer >= 0).

        Returns:
            ``(noisy, clean)``: the float64 rows the client sends, and its
            clean probability rows when ``log_clean`` (else None; a
            simulation-only diagnostic, recorded as not private).
        """
        noisy = self.client_report(outputs, client_id)
        clean = np.asarray(outputs) if self.log_clean else None
        cid = int(client_id)
        self.client_releases[cid] = self.client_releases.get(cid, 0) + 1
        kinds = [self.release_kind()]
        if self.log_clean:
            kinds.append(ReleaseKind(
                "LaplaceEvaluation clean_*", "client data", CLIENT, non_private_event(),
                "log_clean=True: scores of the noiseless outputs in the logs "
                "(simulation-only)"))
        # One release per row sent, about the client: its own rows are its own releases;
        # a fixed eval_data's rows may be any client's, so they count about every client
        # (over an evaluation: every row of eval_data, see the class doc).
        units = [cid] if self._clients is None else None
        for kind in kinds:
            self._ledger.record(kind, units, count=len(noisy))
        return noisy, clean

    def client_outputs(self, model: keras.Model, x: ArrayLike, max_rows: Any = None
                       ) -> np.ndarray:
        """The client's inference: the model's probability rows on ``x`` (softmax of logits
        with ``from_logits=True``), checked to be one 2-D output.

        Args:
            model: the model to run.
            x: the client's inputs.
            max_rows: None, or the report's size the server asked for (an
                integer >= 1, e.g. from its ``"evaluate"`` message; it can
                only lower what this client releases): the report then has
                exactly ``min(max_report_rows, max_rows)`` rows
                (`fixed_size_rows`: the first ones, or all of them repeated in
                order when there are fewer), so its shape says nothing of
                ``len(x)``. None: the first ``max_report_rows`` rows at most
                (a local evaluation).

        Returns:
            The ``(rows, K)`` probability rows.
        """
        if max_rows is None:
            return self._predict(model, [np.asarray(x)[:self.max_report_rows]])
        cap = min(self.max_report_rows, validate_positive_int(max_rows, "max_rows"))
        return self._predict(model, [fixed_size_rows(x, cap)])

    def receive_reports(self, reports: Sequence[tuple[int, np.ndarray, np.ndarray | None]],
                        started: float | None = None) -> dict[str, float]:
        """The server side: buffer one evaluation's reports and score the buffer.

        Args:
            reports: ``(client id, noisy rows, clean rows or None)`` per client.
            started: `time.perf_counter` at the evaluation's start (for
                ``laplace_eval_time_s``); None: now.

        Returns:
            The logs, as `evaluate`.
        """
        started = time.perf_counter() if started is None else started
        for cid, noisy, _ in reports:
            if len(noisy) > self.max_report_rows:
                raise ValueError(f"client {cid}'s report has {len(noisy)} rows, more than "
                                 f"`max_report_rows`={self.max_report_rows}.")
        self.num_evaluations += 1
        if self.cluster_client_num is None:
            self._buffer.clear()
        for cid, noisy, clean in reports:
            self._buffer.pop(cid, None)
            self._buffer[cid] = (noisy, clean)
        if self.cluster_client_num is not None:
            while len(self._buffer) > self.cluster_client_num:
                self._buffer.popitem(last=False)
        self.last_client_ids = list(self._buffer)
        noisy = np.concatenate([v[0] for v in self._buffer.values()])
        scored = _evenly_spaced(len(noisy), self.max_scored_rows)
        noisy = noisy[scored]
        labels = np.argmax(noisy, axis=1)
        self.last_server_view = (noisy, labels)
        values = {f"laplace_{m}": self._score(m, noisy, labels, "noisy") for m in self.metrics}
        self.last_clean_view = None
        if self.log_clean:
            clean = np.concatenate([v[1] for v in self._buffer.values()])[scored].astype(
                np.float64)
            clean_labels = np.argmax(clean, axis=1)
            self.last_clean_view = (clean, clean_labels)
            values.update({f"clean_{m}": self._score(m, clean, clean_labels, "clean")
                           for m in self.metrics})
        values["laplace_eval_time_s"] = time.perf_counter() - started
        self.last_scores = values
        return dict(values)

    def evaluate(self, client_inputs: Sequence[ArrayLike], client_ids: Sequence[int] | None = None,
                 model: keras.Model | None = None) -> dict[str, float]:
        """Run one evaluation: client inference + noise, server scores; return the logs.

        Args:
            client_inputs: a list of per-client input arrays.
            client_ids: their ids (default ``0..len-1``); a client already in
                the buffer is replaced by its new report.
            model: the model to evaluate (default: the callback's model).

        Returns:
            A dict ``{"laplace_<metric>": ..., ["clean_<metric>": ...,]
            "laplace_eval_time_s": ...}``.
        """
        started = time.perf_counter()
        model = self.model if model is None else model
        if model is None:
            raise ValueError("no model to evaluate: use LaplaceEvaluation as a callback of "
                             "model.fit / HorizontalFL.fit, or pass model=.")
        if client_ids is None:
            client_ids = list(range(len(client_inputs)))
        if len(client_ids) != len(client_inputs):
            raise ValueError(f"`client_ids` has {len(client_ids)} entries for "
                             f"{len(client_inputs)} clients.")
        # Clients run inference independently; simulated as one batched pass
        # (per-example outputs do not depend on the batch at inference time).
        sizes = [len(x) for x in client_inputs]
        for cid, size in zip(client_ids, sizes):
            if size > self.max_report_rows:  # refused before anything is released
                raise ValueError(f"client {cid} has {size} rows to report, more than "
                                 f"`max_report_rows`={self.max_report_rows}.")
        outputs = self._predict(model, client_inputs)
        reports = []
        for cid, rows in zip(client_ids, np.split(outputs, np.cumsum(sizes)[:-1])):
            reports.append((cid, *self.report_outputs(rows, int(cid))))
        # Everything above ran on the clients; the reports are released.
        return self.receive_reports(reports, started)

    def reset_buffer(self) -> None:
        """Forget the server's buffered reports (not the privacy counters)."""
        self._buffer.clear()

    def _predict(self, model, client_inputs):
        x = np.concatenate(client_inputs) if len(client_inputs) > 1 else client_inputs[0]
        chunks = []
        for start in range(0, len(x), _INFERENCE_BATCH):
            out = model(x[start:start + _INFERENCE_BATCH], training=False)
            if isinstance(out, (list, tuple, dict)):
                raise ValueError("LaplaceEvaluation supports single-output models only; the "
                                 f"model returned a {type(out).__name__} of outputs.")
            chunks.append(np.asarray(keras.ops.convert_to_numpy(out)))
        out = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
        if out.ndim != 2:
            raise ValueError(f"LaplaceEvaluation needs a 2-D model output (one probability "
                             f"vector per example); got shape {out.shape}.")
        if self.from_logits:
            z = out.astype(np.float64)
            z = np.exp(z - z.max(axis=1, keepdims=True))
            out = z / z.sum(axis=1, keepdims=True)
        k = out.shape[1]
        if self.num_classes is None:
            if k < 2:
                raise ValueError(f"LaplaceEvaluation needs output vectors of length >= 2; got "
                                 f"shape {out.shape}.")
            self.num_classes = k
        elif k != self.num_classes:
            raise ValueError(f"the model's output length changed from {self.num_classes} to "
                             f"{k} between evaluations.")
        return out

    def _probabilities(self, rows):
        """Check that rows are probability vectors; return them renormalized (float64)."""
        p = np.asarray(rows, dtype=np.float64)
        if p.ndim != 2:
            raise ValueError(f"expected a 2-D array of probability vectors; got shape "
                             f"{p.shape}.")
        sums = p.sum(axis=1)
        bad = (~np.all(np.isfinite(p), axis=1) | np.any(p < 0, axis=1)
               | (np.abs(sums - 1.0) > PROBABILITY_TOLERANCE))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"the model's outputs are not probability vectors (row {i}: min "
                f"{p[i].min():.4g}, sum {sums[i]:.6g}; {int(bad.sum())} of {len(p)} rows "
                f"are negative, non-finite or do not sum to 1 within "
                f"{PROBABILITY_TOLERANCE:g}). The Laplace sensitivity bound (L1 distance <= 2) "
                f"only holds for probability vectors: give the model a softmax output, or "
                f"pass from_logits=True if it outputs logits.")
        return p / sums[:, None]

    def _score(self, metric, x, labels, what):
        n = len(x)
        idx = None
        random_state = None
        if metric == "silhouette" and self.silhouette_sample_size is not None \
                and self.silhouette_sample_size < n:
            # The same indices sklearn draws from this random_state (checked below).
            random_state = int(self._server_rng.integers(0, 2**31 - 1))
            idx = np.random.RandomState(random_state).permutation(n)[
                :self.silhouette_sample_size]
        sub = labels if idx is None else labels[idx]
        n_sub, n_labels = len(sub), len(np.unique(sub))
        if not 2 <= n_labels <= n_sub - 1:
            warnings.warn(
                f"LaplaceEvaluation: {metric} of the {what} vectors is logged as 0.0: the "
                f"{n_sub} scored vectors have {n_labels} distinct argmax label(s), and the "
                f"score needs between 2 and n - 1 = {n_sub - 1}.", stacklevel=3)
            return 0.0
        kwargs = {} if idx is None else {"sample_size": self.silhouette_sample_size,
                                         "random_state": random_state}
        try:
            with np.errstate(all="ignore"):  # extreme values: judged by the result below
                score = float(_score_fn(metric)(x, labels, **kwargs))
        except Exception as error:  # noqa: BLE001 - one bad evaluation must not stop the run
            reason = f"scikit-learn raised {type(error).__name__}"
        else:
            if np.isfinite(score):
                return score
            reason = f"the score is {score}"
        warnings.warn(f"LaplaceEvaluation: {metric} of the {what} vectors is logged as NaN: "
                      f"{reason} (values too extreme to score).", stacklevel=3)
        return float("nan")

    # --- (de)serialization ---------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        """Every constructor argument but ``eval_data`` (data); ``seed`` only if given."""
        config = {
            "eps": self.eps,
            "sensitivity": self.sensitivity,
            "metrics": list(self.metrics),
            "cluster_client_num": self.cluster_client_num,
            "every_n_epochs": self.every_n_epochs,
            "num_eval_clients": self.num_eval_clients,
            "from_logits": self.from_logits,
            "log_clean": self.log_clean,
            "sampler": self.sampler,
            "silhouette_sample_size": self.silhouette_sample_size,
            "max_report_rows": self.max_report_rows,
            "max_scored_rows": self.max_scored_rows,
        }
        return config_with_seed(config, self.seed)

    # `from_config`, `state_dict` and `load_state_dict` come from `SeededReleases`: the
    # counters (evaluations, per-client releases) beside ``num_releases`` (client reports so
    # far, the position in a seeded noise stream) and the ledger, no randomness.

    def _own_state(self) -> dict[str, Any]:
        return {"num_evaluations": int(self.num_evaluations),
                "client_releases": {int(c): int(n) for c, n in self.client_releases.items()}}

    def _parse_own_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        missing = [k for k in ("num_evaluations", "client_releases") if k not in state]
        if missing:
            raise ValueError(f"`state` is missing {missing}; expected the keys of "
                             f"LaplaceEvaluation.state_dict().")
        evaluations = validate_positive_int(state["num_evaluations"],
                                            "state['num_evaluations']", minimum=0)
        # JSON turns the integer client ids into strings.
        releases = {validate_positive_int(int(c) if isinstance(c, str) and c.isdigit() else c,
                                          "client id", minimum=0):
                    validate_positive_int(n, f"state['client_releases'][{c!r}]", minimum=0)
                    for c, n in dict(state["client_releases"]).items()}
        return {"num_evaluations": evaluations, "client_releases": releases}
