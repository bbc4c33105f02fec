"""The one round loop of horizontal FL, beside `HorizontalServer`: `HorizontalLoop`.

Both runtimes drive it: `HorizontalFL.fit` (every client in one process) and
`keras_fedpriv.federated.flower.HorizontalStrategy` (one client per Flower
node). A round is

1. `HorizontalLoop.begin_round`: choose the round's clients, count in the
   ledger what each asked client releases (when it is asked: a client that
   answers has released, even if its reply is late or dropped), and build the
   `TrainRequest` (global weights, BatchNormalization statistics, MagRR's
   announcement);
2. the runtime carries the request to the clients and brings back one
   `TrainReply` per answer (the in-process driver calls the clients; the
   Flower driver sends messages and parses each reply with
   `keras_fedpriv.federated.horizontal.wire`);
3. `HorizontalLoop.finish_round`: drop what may not be used (error replies,
   replies from clients not asked, a second reply, malformed content, with a
   logged reason in ``rejected``), aggregate the good uploads in client-id
   order when at least ``min_replies`` arrived (MagRR's step included),
   score ``validation_data``, and log the round;
4. with a `keras_fedpriv.callbacks.LaplaceEvaluation` due this round,
   `begin_evaluate` / `finish_evaluate` (or `evaluate_in_process`) add its
   clustering scores to the same round's row.

`run_round` does 1-3 with an ``exchange`` callable. Log lines and
``rejected`` count rounds from 1 (as Keras counts epochs and Flower rounds);
the ``round`` arguments and requests are the protocol's, from 0. Every round has one row
in `history`: a figure that does not apply to a round (the step of a round
with too few replies, the Laplace scores of a round without evaluation) is
NaN there, so every key has exactly one entry per round.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from keras_fedpriv.federated.horizontal.parties import ClientResult, HorizontalServer
from keras_fedpriv.mechanisms.ledger import ReleaseKind, ReleaseLedger
from keras_fedpriv.mechanisms.validation import validate_positive_int

__all__ = ["EvaluateRequest", "EvaluateReport", "HorizontalLoop", "TrainReply", "TrainRequest"]

logger = logging.getLogger("keras_fedpriv.horizontal")

NAN = float("nan")


@dataclasses.dataclass
class TrainRequest:
    """What the server asks the round's clients (the same for every one of them).

    Attributes:
        round: the round (0-based).
        client_ids: the clients asked, sorted.
        local_epochs: epochs of local training.
        weights: the global trainable weights.
        batch_norm: the global BatchNormalization statistics (empty without
            BatchNormalization).
        magrr_cut: MagRR's announcement ``threshold * r_est``, or None.
    """

    round: int
    client_ids: list[int]
    local_epochs: int
    weights: list[np.ndarray]
    batch_norm: list[np.ndarray]
    magrr_cut: float | None = None


@dataclasses.dataclass
class TrainReply:
    """One answer to a `TrainRequest`, as the runtime received it.

    Attributes:
        sender: the client's id, or (for a sender that is no client asked)
            whatever names it, e.g. its Flower node id.
        asked: whether ``sender`` is a client asked this round.
        result: the checked `ClientResult` (its ``num_examples`` set where
            BatchNormalization statistics are averaged), or None.
        reason: why the reply cannot be used (error reply, malformed), or None.
        nbytes: the reply's size on the wire (0 in one process).
        extra: the reply carried more than the protocol releases (the
            sender's release of it is counted with the loop's ``extra_kind``).
        node: the Flower node id the reply answers for, or None (in one process).
    """

    sender: int
    asked: bool = True
    result: ClientResult | None = None
    reason: str | None = None
    nbytes: int = 0
    extra: bool = False
    node: int | None = None


@dataclasses.dataclass
class EvaluateRequest:
    """What the server asks for a Laplace evaluation of the new global model.

    Attributes:
        round: the round (0-based).
        client_ids: the clients asked (the round's clients).
        weights: the global trainable weights.
        batch_norm: the global BatchNormalization statistics.
        max_rows: the most rows a client may report.
        width: the model's output width K (the report's columns), or None.
    """

    round: int
    client_ids: list[int]
    weights: list[np.ndarray]
    batch_norm: list[np.ndarray]
    max_rows: int
    width: int | None


@dataclasses.dataclass
class EvaluateReport:
    """One answer to an `EvaluateRequest`: checked noisy rows, or why there are none.

    Attributes:
        sender: the client's id (or what names an unknown sender).
        asked: whether ``sender`` is a client asked.
        rows: the checked ``(n, K)`` float64 report, or None.
        reason: why the report cannot be used, or None.
        node: the Flower node id the report answers for, or None (in one process).
    """

    sender: int
    asked: bool = True
    rows: np.ndarray | None = None
    reason: str | None = None
    node: int | None = None


Exchange = Callable[[TrainRequest], Sequence[TrainReply]]


class HorizontalLoop:
    """Runs horizontal-FL rounds on a `HorizontalServer`, whatever carries the messages.

    Args:
        server: the server half (its model is the global model; its
            ``magrr`` steps SignDS).
        min_replies: the fewest good replies that make a round; with fewer
            the global model is left unchanged (``global_lr`` is NaN).
        ledger: where the releases counted when clients are asked go.
        asked_kinds: release kinds recorded for every client asked to train,
            when asked (the Flower server counts the upload, MagRR's bit and
            BatchNormalization statistics here; in one process the mechanisms
            record their own releases and only the statistics are counted).
        extra_kind: the release kind of content a reply carries beyond the
            protocol (recorded for its sender), or None.
        laplace: a `keras_fedpriv.callbacks.LaplaceEvaluation` or None.
        count_evaluations: record the Laplace evaluation's releases for
            every client asked to evaluate, ``max_report_rows`` each (one per
            row it may send; a server that cannot see the clients' own
            ledgers); False where the clients' mechanism records them.
        validation_data: ``(x, y)`` scored on the global model after every
            round (``val_*``), or None.
        log_magrr: add the server's MagRR values (``r_est``, ``magrr_phase``,
            ...) to every round's logs (the in-process driver leaves that to
            the MagRR callback).
        log: the `logging.Logger` of the round lines and dropped replies
            (default ``keras_fedpriv.horizontal``).
    """

    def __init__(self, server: HorizontalServer, *, min_replies: int = 1,
                 ledger: ReleaseLedger | None = None, asked_kinds: Sequence[ReleaseKind] = (),
                 extra_kind: ReleaseKind | None = None, laplace: Any = None,
                 count_evaluations: bool = False,
                 validation_data: tuple[Any, Any] | None = None,
                 log_magrr: bool = False, log: logging.Logger | None = None) -> None:
        self.server = server
        self.logger = logger if log is None else log
        self.min_replies = validate_positive_int(min_replies, "min_replies")
        self.ledger = ReleaseLedger() if ledger is None else ledger
        self.asked_kinds = list(asked_kinds)
        self.extra_kind = extra_kind
        self.laplace = laplace
        self.count_evaluations = bool(count_evaluations)
        self.validation_data = validation_data
        self.log_magrr = bool(log_magrr)
        self.rejected: list[tuple[int, int, str]] = []
        self.failed_rounds: list[int] = []  # protocol rounds with fewer than min_replies
        self.rows: dict[int, dict[str, float]] = {}
        self._request: TrainRequest | None = None
        self._started = 0.0
        self._evaluating: EvaluateRequest | None = None
        self._evaluate_started = 0.0
        self.accepted: list[int] = []  # the last round's good replies' client ids
        self.results: list[ClientResult] = []  # and their results, in that order

    @property
    def last_request(self) -> TrainRequest | None:
        """The request of the last round begun (None before the first)."""
        return self._request

    @property
    def evaluating(self) -> EvaluateRequest | None:
        """The Laplace evaluation asked and not yet finished, or None."""
        return self._evaluating

    # ----------------------------------------------------------------- rounds
    def begin_round(self, round: int, available: Sequence[int],  # noqa: A002
                    clients_per_round: int, local_epochs: int = 1,
                    ask_none_if_short: bool = False) -> TrainRequest:
        """Choose the round's clients, count their releases and build the request.

        Args:
            round: the round (0-based).
            available: the ids of the clients that can be asked.
            clients_per_round: how many to ask (fewer if fewer are available).
            local_epochs: epochs of local training.
            ask_none_if_short: with fewer clients available than
                ``min_replies``, ask no one (the round falls below the
                minimum) instead of raising.

        Returns:
            The `TrainRequest`.

        Raises:
            RuntimeError: fewer clients are available than ``min_replies``
                (asking would spend their privacy on a round that cannot count),
                without ``ask_none_if_short``.
        """
        rnd = validate_positive_int(round, "round", minimum=0)
        per_round = validate_positive_int(clients_per_round, "clients_per_round")
        local_epochs = validate_positive_int(local_epochs, "local_epochs")
        self._started = time.perf_counter()
        available = list(available)
        if len(available) < self.min_replies:
            short = (f"round {rnd + 1}: {len(available)} clients are connected, fewer than "
                     f"min_replies={self.min_replies}")
            if not ask_none_if_short:
                raise RuntimeError(f"{short}.")
            self.logger.warning("%s; no client is asked this round", short)
            available = []
        chosen = (self.server.sample(available, min(per_round, len(available)))
                  if available else [])
        for kind in self.asked_kinds:
            self.ledger.record(kind, chosen)
        self._request = TrainRequest(rnd, chosen, local_epochs, self.server.global_weights(),
                                     self.server.global_batch_norm(), self.server.magrr_cut())
        self._evaluating = None
        return self._request

    def finish_round(self, replies: Sequence[TrainReply]) -> dict[str, float]:
        """Check the round's replies, aggregate the good ones, score and log the round.

        Args:
            replies: what came back for the last `begin_round` request.

        Returns:
            The round's logs: ``replies``, ``dropped``, ``upload_bytes`` (the
            accepted uploads' payload), ``upload_bytes_per_client``,
            ``download_bytes_per_client`` (the dense float32 model),
            ``global_lr`` (NaN if the round did not count), ``val_*``, MagRR's
            values with ``log_magrr``, the Laplace keys (NaN until
            `finish_evaluate`) and ``round_time_s``.
        """
        request = self._request
        if request is None:
            raise ValueError("finish_round without begin_round.")
        rnd = request.round
        for reply in replies:  # what a reply carried beyond the protocol: released anyway
            if reply.extra and reply.asked and self.extra_kind is not None:
                self.ledger.record(self.extra_kind, [int(reply.sender)])
        good: dict[int, ClientResult] = self._keep_good(rnd, replies, "result", "reply")
        ids = sorted(good)
        results = [good[c] for c in ids]
        sizes = [r.upload.nbytes for r in results]
        logs: dict[str, float] = {
            "replies": float(len(good)), "dropped": float(len(request.client_ids) - len(good)),
            "upload_bytes": float(sum(sizes)),
            "upload_bytes_per_client": float(np.mean(sizes)) if sizes else NAN,
            "download_bytes_per_client": float(4 * self.server.dim), "global_lr": NAN}
        if len(good) >= self.min_replies:
            with_bn = all(r.batch_norm is not None for r in results)
            logs.update(self.server.step(
                [r.upload for r in results],
                magrr_reports=([r.magrr_report for r in results]
                               if self.server.magrr is not None else None),
                num_examples=[r.num_examples or 1 for r in results],
                batch_norm=[r.batch_norm for r in results] if with_bn else None,
                global_weights=request.weights, global_bn=request.batch_norm))
        else:
            self.failed_rounds.append(rnd)
            self.logger.warning("round %d: %d good replies, fewer than min_replies=%d; the global "
                                "model is unchanged (%d round(s) so far)", rnd + 1, len(good),
                                self.min_replies, len(self.failed_rounds))
        if self.validation_data is not None:
            vx, vy = self.validation_data
            scores = self.server.model.evaluate(vx, vy, batch_size=1024, verbose=0,
                                                return_dict=True)
            logs.update({f"val_{k}": float(v) for k, v in scores.items()})
        if self.log_magrr and self.server.magrr is not None:
            logs.update(self.server.magrr.log_values())
        if self.laplace is not None:
            logs.update(dict.fromkeys(self.laplace.log_keys(), NAN))
        logs["round_time_s"] = time.perf_counter() - self._started
        self.accepted = ids
        self.results = results
        self.log(rnd, logs)
        return logs

    def run_round(self, round: int, available: Sequence[int], clients_per_round: int,  # noqa: A002
                  local_epochs: int, exchange: Exchange) -> dict[str, float]:
        """One round: `begin_round`, ``exchange(request)``, `finish_round`.

        Args:
            round: the round (0-based).
            available: the ids of the clients that can be asked.
            clients_per_round: how many to ask.
            local_epochs: epochs of local training.
            exchange: carries the `TrainRequest` to its clients and returns
                their `TrainReply` objects.

        Returns:
            The round's logs (see `finish_round`).
        """
        request = self.begin_round(round, available, clients_per_round, local_epochs)
        return self.finish_round(list(exchange(request)))

    # ------------------------------------------------------------- evaluation
    def evaluation_due(self, round: int) -> bool:  # noqa: A002
        """Whether the Laplace evaluation runs after ``round`` (the last round begun)."""
        return (self.laplace is not None and self._request is not None
                and self._request.round == int(round) and self.laplace.is_due(int(round)))

    def begin_evaluate(self, round: int, width: int | None = None  # noqa: A002
                       ) -> EvaluateRequest | None:
        """The Laplace evaluation's request to the round's clients, or None if none is due.

        With ``count_evaluations`` the releases of every client asked are
        recorded now (a client that answers has released): ``max_rows``
        releases each, one per row the request lets it send (the clients
        record the rows they sent, at most that: the server's count is an
        upper bound, equal to theirs when they hold ``max_rows`` rows or more).

        Args:
            round: the round just finished.
            width: the model's output width K, if known (the report's columns).

        Returns:
            An `EvaluateRequest`, or None.
        """
        if not self.evaluation_due(round):
            return None
        laplace = self.laplace
        if laplace.num_classes is None and width is not None:
            laplace.num_classes = int(width)  # K, for the release's event
        chosen = list(self._request.client_ids)
        max_rows = int(laplace.max_report_rows)
        if self.count_evaluations:  # one release per row: the most a client may send
            self.ledger.record(laplace.release_kind(), chosen, count=max_rows)
        self._evaluate_started = time.perf_counter()
        self._evaluating = EvaluateRequest(int(round), chosen, self.server.global_weights(),
                                           self.server.global_batch_norm(), max_rows,
                                           width if width is not None else laplace.num_classes)
        return self._evaluating

    def finish_evaluate(self, round: int, reports: Sequence[EvaluateReport]  # noqa: A002
                        ) -> dict[str, float] | None:
        """Score the good reports into the round's row; None if no evaluation was asked.

        Returns:
            The Laplace keys (NaN when no report was good), or None.
        """
        asked = self._evaluating
        if asked is None or asked.round != int(round):
            return None
        self._evaluating = None
        good: dict[int, np.ndarray] = self._keep_good(asked.round, reports, "rows", "report")
        if good:
            logs = self.laplace.receive_reports([(c, good[c], None) for c in sorted(good)],
                                                self._evaluate_started)
        else:
            logs = dict.fromkeys(self.laplace.log_keys(), NAN)
        self.log(asked.round, logs)
        return logs

    def evaluate_in_process(self, round: int, client_inputs: Mapping[int, Any]  # noqa: A002
                            ) -> dict[str, float]:
        """The Laplace evaluation when the clients run in this process.

        The clients' noise is drawn and recorded by the evaluation itself
        (`LaplaceEvaluation.evaluate_round`).

        Args:
            round: the round just finished.
            client_inputs: ``{client id: its inputs}`` of the round's clients.

        Returns:
            The Laplace keys (NaN when not due).
        """
        if self.laplace is None:
            return {}
        scores = dict.fromkeys(self.laplace.log_keys(), NAN)
        scores.update(self.laplace.evaluate_round(self.server.model, int(round), client_inputs))
        self.log(int(round), scores)
        return scores

    def _keep_good(self, rnd: int, answers: Sequence[TrainReply | EvaluateReport],
                   field: str, what: str) -> dict[int, Any]:
        """Client id -> ``answer.<field>`` of the usable answers; the others are rejected.

        ``what`` names an answer in the reasons: ``"reply"`` (to train) or
        ``"report"`` (of an evaluation).
        """
        good: dict[int, Any] = {}
        for answer in answers:
            reason, value = answer.reason, getattr(answer, field)
            if reason is None and not answer.asked:
                reason = "a reply from a node that was not asked"
            elif reason is None and int(answer.sender) in good:
                reason = f"a second {what} from the same client"
            elif reason is None and value is None:
                reason = f"a {what} without {'a result' if what == 'reply' else 'rows'}"
            if reason is None:
                good[int(answer.sender)] = value
            else:
                self.reject(rnd, answer.sender, reason,
                            "reply" if what == "reply" else "evaluation", answer.asked,
                            answer.node)
        return good

    # ------------------------------------------------------------------- logs
    def reject(self, round: int, sender: int, reason: str, what: str = "reply",  # noqa: A002
               asked: bool = True, node: int | None = None) -> None:
        """Log and keep why a reply was dropped (``rejected``, rounds from 1).

        The sender is named as ``client C (node N)``, or ``node N`` for a
        sender that is no client asked (``sender`` is then its node id).
        """
        who = (f"client {sender}" + ("" if node is None else f" (node {node})") if asked
               else f"node {sender} (no client asked)")
        self.logger.warning("round %d: dropped the %s of %s: %s", round + 1, what, who, reason)
        self.rejected.append((int(round) + 1, int(sender), reason))

    def log(self, round: int, logs: Mapping[str, float]) -> None:  # noqa: A002
        """Add figures to a round's row (a later value of a key replaces an earlier one)."""
        row = self.rows.setdefault(int(round), {})
        row.update({k: float(v) for k, v in logs.items()})
        self.logger.info("round %d: %s", round + 1, {k: _rounded(v) for k, v in logs.items()})

    @property
    def history(self) -> dict[str, list[float]]:
        """Every logged figure, one entry per round (NaN where it did not apply)."""
        keys: dict[str, None] = {}
        for row in self.rows.values():
            keys.update(dict.fromkeys(row))
        rounds = sorted(self.rows)
        return {k: [self.rows[r].get(k, NAN) for r in rounds] for k in keys}


def _rounded(value: float) -> float:
    """A value rounded for a log line (NaN and infinities as they are)."""
    return value if not math.isfinite(value) else round(float(value), 4)
