"""Horizontal FL on the wire: every record name, config key, encoder and parser in one place.

Both Flower halves use this module: the server (`HorizontalStrategy`) builds
``"query"``, ``"train"`` and ``"evaluate"`` messages and parses the replies;
the client (`horizontal_client_app`) reads the requests and builds the replies.

What crosses the wire each round (Flower ``Message`` contents):

* server -> client ``"train"``: ``"weights"`` (the global trainable weights),
  ``"batch-norm"`` (the global BatchNormalization statistics, if any) and
  ``"config"`` (``round``, ``local-epochs``, MagRR's ``magrr-cut``);
* client -> server: ``"upload"`` (exactly the upload scheme's ``to_wire``
  arrays) and ``"config"`` (``client-id``; ``magrr-report`` with MagRR;
  ``num-examples`` with ``"batch-norm"`` when statistics are averaged);
* ``"evaluate"``: ``"weights"``, ``"batch-norm"``, ``"config"`` (``max-rows``)
  and back ``"report"`` (one float64 array ``"report"``) and ``"config"``;
* ``"query"``: an empty ``"config"`` and back ``"config"`` (``client-id``).

Parsers check records before anything in them is deserialized (record
types, keys, array kinds and sizes) and raise `MalformedUpload` (a
`MalformedMessage`) naming what is wrong.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

try:
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError("keras_fedpriv.federated.horizontal.wire needs Flower (the `flower` extra: "
                      "pip install -e \".[flower]\").") from err

from keras_fedpriv.federated.records import arrays_record, checked_arrays
from keras_fedpriv.federated.horizontal.loop import EvaluateRequest, TrainRequest
from keras_fedpriv.federated.horizontal.parties import ClientResult, HorizontalServer
from keras_fedpriv.federated.laplace_eval import MAX_REPORT_ROWS
from keras_fedpriv.federated.uploads import MalformedUpload

__all__ = [
    "BATCH_NORM", "CLIENT_ID", "CONFIG", "EVALUATE", "LOCAL_EPOCHS", "MAGRR_CUT",
    "MAGRR_REPORT", "MAX_ROWS", "NUM_EXAMPLES", "QUERY", "REPORT", "ROUND", "TRAIN", "UPLOAD",
    "WEIGHTS", "TrainOrder", "evaluate_content", "extra_content", "parse_client_id",
    "parse_report", "parse_train_reply", "query_content", "query_reply_content", "read_train",
    "report_content",
    "train_content", "train_reply_content",
]

# message types
QUERY, TRAIN, EVALUATE = "query", "train", "evaluate"
# record names
WEIGHTS, BATCH_NORM, CONFIG, UPLOAD, REPORT = "weights", "batch-norm", "config", "upload", "report"
# config keys
ROUND, LOCAL_EPOCHS, MAGRR_CUT, MAX_ROWS = "round", "local-epochs", "magrr-cut", "max-rows"
CLIENT_ID, MAGRR_REPORT, NUM_EXAMPLES = "client-id", "magrr-report", "num-examples"
# what the server sets in a train config (a user's train_config cannot override them)
_SERVER_KEYS = (ROUND, LOCAL_EPOCHS, MAGRR_CUT)


# --------------------------------------------------------------- server -> client
def query_content() -> RecordDict:
    """The ``"query"`` message's content (the client answers with its id)."""
    return RecordDict({CONFIG: ConfigRecord({})})


def train_content(request: TrainRequest, settings: Mapping[str, Any] | None = None
                  ) -> RecordDict:
    """A ``"train"`` message's content.

    Args:
        request: the round's `TrainRequest`.
        settings: further config entries (a user's ``train_config``); the
            protocol's own keys replace any of the same name.

    Returns:
        A `RecordDict`.
    """
    config = {k: v for k, v in (settings or {}).items() if k not in _SERVER_KEYS}
    config.update({ROUND: int(request.round), LOCAL_EPOCHS: int(request.local_epochs)})
    if request.magrr_cut is not None:
        config[MAGRR_CUT] = float(request.magrr_cut)
    content = RecordDict({WEIGHTS: ArrayRecord(numpy_ndarrays=list(request.weights)),
                          CONFIG: ConfigRecord(config)})
    if request.batch_norm:
        content[BATCH_NORM] = ArrayRecord(numpy_ndarrays=list(request.batch_norm))
    return content


def evaluate_content(request: EvaluateRequest) -> RecordDict:
    """An ``"evaluate"`` message's content (at most ``max_rows`` rows are asked for)."""
    content = RecordDict({WEIGHTS: ArrayRecord(numpy_ndarrays=list(request.weights)),
                          CONFIG: ConfigRecord({MAX_ROWS: int(request.max_rows)})})
    if request.batch_norm:
        content[BATCH_NORM] = ArrayRecord(numpy_ndarrays=list(request.batch_norm))
    return content


class TrainOrder:
    """A ``"train"`` or ``"evaluate"`` message as the client reads it.

    Attributes:
        weights: the global trainable weights.
        batch_norm: the global BatchNormalization statistics (maybe empty).
        config: the message's config record (``round``, ``local-epochs``,
            ``magrr-cut``, ``max-rows``; `read_train` checks them).
    """

    def __init__(self, content: RecordDict) -> None:
        self.weights = content[WEIGHTS].to_numpy_ndarrays()
        self.batch_norm = (content[BATCH_NORM].to_numpy_ndarrays() if BATCH_NORM in content
                           else [])
        self.config = content[CONFIG] if CONFIG in content else {}

    @property
    def round(self) -> int:
        """The protocol's round (0-based)."""
        return self.config[ROUND]

    @property
    def local_epochs(self) -> int:
        """The local epochs asked for."""
        return self.config[LOCAL_EPOCHS]

    @property
    def magrr_cut(self) -> float | None:
        """MagRR's announcement, or None."""
        return self.config[MAGRR_CUT] if MAGRR_CUT in self.config else None

    @property
    def max_rows(self) -> int | None:
        """The most rows an evaluation may report, or None."""
        return self.config.get(MAX_ROWS)


def read_train(message: Message) -> TrainOrder:
    """What a ``"train"`` or ``"evaluate"`` message asks (the client checks the values).

    Returns:
        A `TrainOrder`.
    """
    return TrainOrder(message.content)


# --------------------------------------------------------------- client -> server
def query_reply_content(client_id: int) -> RecordDict:
    """The answer to ``"query"``: the client's id."""
    return RecordDict({CONFIG: ConfigRecord({CLIENT_ID: int(client_id)})})


def train_reply_content(client_id: int, upload: Mapping[str, np.ndarray],
                        magrr_report: int | None = None,
                        batch_norm: Sequence[np.ndarray] | None = None,
                        num_examples: int | None = None) -> RecordDict:
    """A ``"train"`` reply's content: exactly what the protocol releases.

    Args:
        client_id: the client's id.
        upload: the upload scheme's ``to_wire`` arrays.
        magrr_report: MagRR's randomized bit, or None.
        batch_norm: BatchNormalization statistics sent in the clear
            (``batch_norm="average"``), or None.
        num_examples: the data size sent with them.

    Returns:
        A `RecordDict`.
    """
    content = RecordDict({UPLOAD: arrays_record(dict(upload))})
    meta: dict[str, Any] = {CLIENT_ID: int(client_id)}
    if magrr_report is not None:
        meta[MAGRR_REPORT] = int(magrr_report)
    if batch_norm is not None:
        content[BATCH_NORM] = ArrayRecord(numpy_ndarrays=list(batch_norm))
        meta[NUM_EXAMPLES] = int(num_examples)
    content[CONFIG] = ConfigRecord(meta)
    return content


def report_content(client_id: int, noisy: np.ndarray) -> RecordDict:
    """An ``"evaluate"`` reply's content: the noisy rows."""
    return RecordDict({REPORT: arrays_record({REPORT: noisy}),
                       CONFIG: ConfigRecord({CLIENT_ID: int(client_id)})})


# --------------------------------------------------------------------- parsers
def parse_client_id(reply: Message) -> int | None:
    """The client id a ``"query"`` reply claims, or None if it claims no valid one."""
    try:
        cid = reply.content[CONFIG][CLIENT_ID]
    except Exception:  # noqa: BLE001 - a malformed answer is no answer
        return None
    if isinstance(cid, bool) or not isinstance(cid, int) or cid < 0:
        return None
    return cid


def _expected(server: HorizontalServer, with_magrr: bool, batch_norm: str
              ) -> tuple[set[str], set[str]]:
    """The records and config keys a good train reply holds."""
    with_bn = bool(server.bn_variables) and batch_norm == "average"
    records = {UPLOAD, CONFIG} | ({BATCH_NORM} if with_bn else set())
    meta = {CLIENT_ID} | ({MAGRR_REPORT} if with_magrr else set()) | \
        ({NUM_EXAMPLES} if with_bn else set())
    return records, meta


def extra_content(reply: Message, server: HorizontalServer, with_magrr: bool,
                  batch_norm: str) -> bool:
    """Whether a train reply carries content the protocol does not release (count it if so)."""
    records, meta_keys = _expected(server, with_magrr, batch_norm)
    try:
        content = reply.content
        meta = content[CONFIG] if CONFIG in content else {}
        return bool(set(content.keys()) - records) or bool(set(meta.keys()) - meta_keys)
    except Exception:  # noqa: BLE001 - unreadable: count it
        return True


def parse_train_reply(reply: Message, server: HorizontalServer, with_magrr: bool,
                      batch_norm: str) -> ClientResult:
    """One train reply's upload, MagRR bit and BN statistics, checked.

    Args:
        reply: the client's reply.
        server: the server half (checks the upload and the statistics).
        with_magrr: the run has MagRR (the reply must hold the bit).
        batch_norm: ``"average"`` or ``"local"``.

    Returns:
        A `ClientResult` (``loss`` NaN: it stays on the client).

    Raises:
        MalformedUpload: anything not exactly as the protocol sends it.
    """
    content = reply.content
    records, meta_keys = _expected(server, with_magrr, batch_norm)
    if set(content.keys()) != records:
        raise MalformedUpload(f"the reply must hold exactly the records {sorted(records)}; got "
                              f"{sorted(map(str, content.keys()))}.")
    meta = content[CONFIG]
    if not isinstance(meta, ConfigRecord):
        raise MalformedUpload(f"{CONFIG!r} must be a ConfigRecord.")
    if set(meta.keys()) != meta_keys:
        raise MalformedUpload(f"{CONFIG!r} must hold exactly {sorted(meta_keys)}; got "
                              f"{sorted(map(str, meta.keys()))}.")
    # a generous bound: twice a dense float64 update plus headers
    arrays = checked_arrays(content[UPLOAD], UPLOAD, 16 * server.dim + 4096)
    result = ClientResult(server.receive(arrays), math.nan, None, None, 1)
    if with_magrr:
        bit = meta[MAGRR_REPORT]
        if isinstance(bit, bool) or not isinstance(bit, int) or bit not in (0, 1):
            raise MalformedUpload(f"{MAGRR_REPORT!r} must be 0 or 1.")
        result.magrr_report = bit
    if BATCH_NORM in records:
        bn_size = sum(int(np.prod(v.shape)) for v in server.bn_variables)
        stats = checked_arrays(content[BATCH_NORM], BATCH_NORM, 16 * bn_size + 4096)
        result.batch_norm = server.check_batch_norm(list(stats.values()))
        n = meta[NUM_EXAMPLES]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise MalformedUpload(f"{NUM_EXAMPLES!r} must be an integer >= 1.")
        result.num_examples = n
    return result


def parse_report(reply: Message, width: int | None, max_rows: int = MAX_REPORT_ROWS,
                 bound: float = math.inf) -> np.ndarray:
    """A client's LaplaceEvaluation report, checked (`MalformedUpload` if not as promised).

    Its size is checked before anything is deserialized: no more bytes than a
    float64 ``(max_rows, width)`` array (the rows the server asked for). Its
    values must be finite and at most ``bound`` in magnitude
    (`LaplaceEvaluation.report_bound`: an honest report exceeds it with
    probability about ``exp(-700)``), so no report can overflow the scores.

    Args:
        reply: the client's reply.
        width: the model's output width K.
        max_rows: the rows asked for.
        bound: the largest magnitude an honest report reaches.

    Returns:
        The ``(n, K)`` float64 rows.
    """
    if set(reply.content.keys()) != {REPORT, CONFIG}:
        raise MalformedUpload(f"the reply must hold exactly {REPORT!r} and {CONFIG!r}.")
    if width is None:  # pragma: no cover - the strategy knows K before it asks
        raise MalformedUpload("the server does not know the model's output width.")
    rows = checked_arrays(reply.content[REPORT], REPORT, 8 * max_rows * width + 4096)
    if set(rows) != {REPORT}:
        raise MalformedUpload(f"{REPORT!r} must hold exactly the array {REPORT!r}.")
    noisy = rows[REPORT]
    if noisy.dtype != np.float64 or noisy.ndim != 2 or len(noisy) == 0 or \
            noisy.shape[1] != width:
        raise MalformedUpload(f"the report must be a non-empty float64 array of shape "
                              f"(n, {width}); got {noisy.dtype} {noisy.shape}.")
    if len(noisy) > max_rows:
        raise MalformedUpload(f"the report holds {len(noisy)} rows, more than the {max_rows} "
                              "asked for.")
    if not np.isfinite(noisy).all():
        raise MalformedUpload("the report holds NaN or infinity.")
    if np.abs(noisy).max() > bound:
        raise MalformedUpload(f"the report holds values beyond +-{bound:.6g}, which the "
                              "mechanism's noise does not reach.")
    return noisy
