"""Horizontal federated learning in one process: `HorizontalFL`.

Clients hold different examples with the same features. Every round the server
samples clients; each trains the current global model locally for a few
epochs, uploads its update through an upload scheme (`FedAvgUpload`,
`SignDSUpload`, `GaussianUpload`, see `keras_fedpriv.federated.uploads`); the
server aggregates and evaluates. Rounds are Keras epochs to callbacks:
``on_epoch_begin`` / ``on_epoch_end`` fire once per round, ``History`` gets one
row per round, ``EarlyStopping`` and ``ModelCheckpoint`` work as usual, and a
`keras_fedpriv.callbacks.MagRR` callback sets the server's step for SignDS.

Speed: a naive simulation calls ``model.fit`` once per client and pays Keras'
start-up (data adapter, iterator, callbacks) every time. Here one compiled
function does a client's whole local training (set the global weights, reset
the optimizer, E epochs of mini-batches, return the update) and is reused for
every client and round: on TensorFlow one ``tf.function`` with a dynamic batch
dimension, on JAX one ``jax.jit`` step per batch shape (`LocalTrainer`). See
``bench/hfl_throughput.py`` for the measured speed-up.
"""

from __future__ import annotations

import inspect
import time
import warnings
from typing import Any, Sequence

import keras
import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv.federated.horizontal.parties import (
    HorizontalClient,
    HorizontalServer,
    LocalTrainer,
    batch_norm_statistics,
    check_client_data,
)
from keras_fedpriv.federated.horizontal.loop import HorizontalLoop, TrainReply, TrainRequest
from keras_fedpriv.federated.laplace_eval import LaplaceEvaluation
from keras_fedpriv.federated.magrr import MagRR
from keras_fedpriv.federated.uploads import SignDSUpload, as_upload
from keras_fedpriv.mechanisms.ledger import (
    CLIENT,
    ReleaseKind,
    ReleaseLedger,
    holds_protections,
    is_protection,
    non_private_event,
    register_protection,
)
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed

__all__ = ["HorizontalFL"]


def _is_scalar(value):
    """Whether a log value is one real number (what a progress bar can show)."""
    return not isinstance(value, (bool, np.bool_)) and np.ndim(value) == 0 and \
        np.issubdtype(np.asarray(value).dtype, np.number)


class HorizontalFL:
    """Simulate horizontal FL with a compiled Keras model.

    Args:
        model: a compiled `keras.Model` (its optimizer is each client's local
            optimizer, reset to its initial state for every client; its loss
            and metrics are used for local training and evaluation). The
            model's weights are the global model.
        clients: a list of ``(x, y)`` array pairs, one per client (see
            `keras_fedpriv.federated.partition`). Single-array ``x`` and ``y``.
        upload: ``"fedavg"``, ``"signds"``, a `SignDSEncoder`, or an upload
            object (`FedAvgUpload`, `SignDSUpload`, `GaussianUpload`).
        batch_size: local mini-batch size.
        seed: None or an int; drives client sampling and local shuffling
            (not the privacy mechanisms, which have their own secrets).
        log_client_loss: also log ``sim_client_loss``, the mean of the
            round's clients' exact local training losses. A SIMULATION-ONLY
            diagnostic: no upload scheme releases it (with one client per
            round it is that client's own loss), so it is off by default;
            when on, the ledger records it as a release without DP.
        batch_norm: what happens to the moving statistics (``moving_mean``,
            ``moving_variance``) of the model's BatchNormalization layers.
            ``"average"``: each sampled client starts from the global
            model's statistics and the server sets the global statistics to
            their client-size-weighted mean, as FedAvg does with the weights.
            ``"local"`` (FedBN): every client keeps its own statistics from
            one of its rounds to the next (starting from the global model's
            the first time it is sampled) and the global model keeps its own,
            untouched by the clients. BN's affine weights (gamma, beta) are
            trainable and federated in both modes. None (default) means
            ``"average"``, with a warning if the model has
            BatchNormalization. The statistics are never uploaded through
            the upload scheme: in ``"average"`` mode they reach the server
            in the clear (the ledger records them as a release without DP).

    Privacy: every upload is recorded by the upload scheme with the client's
    id, and the callbacks that release (MagRR, LaplaceEvaluation) record
    theirs; `keras_fedpriv.privacy.privacy_report` of this object, of the
    model or of the History gives the busiest client's composed eps.

    Trainable weights are federated through the upload scheme;
    BatchNormalization statistics follow ``batch_norm``. Other non-trainable
    state (random-seed states) stays as the last client left it.

    Mixed precision: under ``mixed_float16`` Keras wraps the optimizer in a
    `keras.optimizers.LossScaleOptimizer`; local steps scale the loss with it
    (its ``apply`` unscales the gradients), its loss scale restarts for every
    client like the other optimizer state, and updates are float32.
    ``mixed_bfloat16`` needs no loss scaling.

    Example:
        >>> from keras_fedpriv.federated import HorizontalFL, partition
        >>> from keras_fedpriv.optimizers import SignDSEncoder
        >>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
        >>> model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(
        ...     from_logits=True), metrics=["accuracy"])
        >>> fl = HorizontalFL(model, partition(x, y, 100, alpha=0.5, seed=0),
        ...                   upload=SignDSEncoder(k=0.2, eps=10))
        >>> history = fl.fit(rounds=20, clients_per_round=10, validation_data=(xt, yt))
    """

    def __init__(self, model: keras.Model, clients: Sequence[tuple[ArrayLike, ArrayLike]],
                 upload: Any = "fedavg", batch_size: int = 32, seed: int | None = None,
                 log_client_loss: bool = False, batch_norm: str | None = None) -> None:
        if not isinstance(model, keras.Model):
            raise TypeError(f"`model` must be a keras.Model; got {type(model).__name__}.")
        if not getattr(model, "compiled", False) or model.optimizer is None:
            raise ValueError("`model` must be compiled (model.compile(optimizer, loss, "
                             "metrics)) before HorizontalFL: its optimizer trains each client "
                             "and its loss and metrics score the rounds.")
        if not isinstance(clients, (list, tuple)) or not clients:
            raise ValueError(f"`clients` must be a non-empty list of (x, y) pairs; "
                             f"got {type(clients).__name__}.")
        self.model = model
        self.upload = as_upload(upload)
        self.batch_size = validate_positive_int(batch_size, "batch_size")
        self.clients = [self._check_client(i, c) for i, c in enumerate(clients)]
        self.num_clients = len(self.clients)
        self.participation = np.zeros(self.num_clients, np.int64)
        self.log_client_loss = bool(log_client_loss)
        self._callbacks_seen = []
        # Uploads of a scheme that keeps no ledger of its own: recorded here, not private.
        self._ledger = ReleaseLedger()
        self._upload_keeps_ledger = is_protection(self.upload) or holds_protections(self.upload)
        try:
            self._upload_takes_id = "client_id" in inspect.signature(
                self.upload.client_message).parameters
        except (TypeError, ValueError):  # pragma: no cover - exotic callables
            self._upload_takes_id = False
        register_protection(model, self)
        x0 = self.clients[0][0]
        if not model.built:
            model(x0[:1])
        self._check_clients_data()
        self._bn_vars = batch_norm_statistics(model)
        if batch_norm is None:
            if self._bn_vars:
                warnings.warn(
                    "HorizontalFL: the model has BatchNormalization layers and `batch_norm` "
                    "was not set; their moving statistics are averaged over each round's "
                    "clients (batch_norm='average'). Pass batch_norm='average' or "
                    "batch_norm='local' (FedBN: statistics stay on each client) to choose "
                    "and silence this warning.", UserWarning, stacklevel=2)
            batch_norm = "average"
        if batch_norm not in ("average", "local"):
            raise ValueError(f"`batch_norm` must be 'average', 'local' or None; got "
                             f"{batch_norm!r}.")
        self.batch_norm = batch_norm
        self._seed = validate_seed(seed)
        self._server = None
        self._client_parties = None
        self._validation_data = None

    @staticmethod
    def _check_client(i, client):
        if not isinstance(client, (list, tuple)) or len(client) != 2:
            raise ValueError(f"`clients[{i}]` must be an (x, y) pair; got {type(client).__name__}.")
        x, y = (np.asarray(a) for a in client)
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"`clients[{i}]` must have the same non-zero number of rows in x "
                             f"and y; got {len(x)} and {len(y)}.")
        if x.dtype.kind == "f":
            x = x.astype(np.float32, copy=False)  # no copy of data already float32
        if y.dtype.kind == "f":
            y = y.astype(np.float32, copy=False)
        return x, y

    def _check_clients_data(self):
        """Every client's data against the model, before anything is traced: a
        `ClientDataError` naming the client and what is wrong, never a value."""
        for i, (x, y) in enumerate(self.clients):
            check_client_data(self.model, x, y, f"client {i}")

    # ----------------------------------------------------------------- clients
    def _parties(self):
        """The server half and one client half per client (built on first use)."""
        if self._server is None:
            x0, y0 = self.clients[0]
            trainer = LocalTrainer(self.model, self.batch_size, (x0.shape[1:], x0.dtype),
                                   (y0.shape[1:], y0.dtype))
            self._client_parties = [
                HorizontalClient(trainer, data, self.upload, i, seed=self._seed,
                                 batch_norm=self.batch_norm)
                for i, data in enumerate(self.clients)]
            self._server = HorizontalServer(self.model, self.upload, seed=self._seed,
                                            batch_norm=self.batch_norm)
        return self._server, self._client_parties

    def train_client(self, client: int, global_weights: Sequence[ArrayLike],
                     local_epochs: int = 1, round: int = 0  # noqa: A002
                     ) -> tuple[np.ndarray, float]:
        """Train one client from ``global_weights``; return (flat update, mean loss).

        Nothing is uploaded or recorded. The model's trainable weights are
        left at the client's trained values; `fit` resets them to the global
        model afterwards. BatchNormalization statistics start from the
        model's current ones (``batch_norm="average"``) or from the client's
        own (``"local"``, which keeps the client's new statistics for its
        next round).

        Args:
            client: the client's index in ``clients``.
            global_weights: the global model's trainable weights (arrays, in
                ``model.trainable_variables`` order).
            local_epochs: epochs of local training.
            round: the round index that keys the client's shuffling.

        Returns:
            ``(update, loss)``: the flat float32 update and the client's mean
            local training loss.
        """
        _, parties = self._parties()
        delta, loss, _ = parties[client].train(global_weights, round, local_epochs,
                                               [v.numpy() for v in self._bn_vars])
        return delta, loss

    # ------------------------------------------------------------------- fit
    def fit(self, rounds: int, clients_per_round: int = 10, local_epochs: int = 1,
            validation_data: tuple[ArrayLike, ArrayLike] | None = None,
            callbacks: Sequence[keras.callbacks.Callback] | None = None, verbose: int = 1,
            initial_round: int = 0) -> keras.callbacks.History:
        """Run federated rounds; return the Keras `History` (one entry per round).

        Args:
            rounds: number of rounds (Keras "epochs" to the callbacks).
            clients_per_round: clients sampled uniformly without replacement
                each round.
            local_epochs: E, epochs of local training per client and round.
            validation_data: ``(x, y)`` evaluated on the global model after
                every round; logs ``val_<metric>``.
            callbacks: Keras callbacks. A `keras_fedpriv.callbacks.MagRR`
                among them sets SignDS's global learning rate every round. A
                `keras_fedpriv.callbacks.LaplaceEvaluation` makes the round's
                clients evaluate the new global model (this driver runs it).
                Any callback with a method ``on_federated_round(fl, round,
                client_ids, logs)`` gets it called after aggregation and
                evaluation, before ``on_epoch_end``, with this object and the
                ids of the round's clients; ``on_federated_train_begin(fl)``,
                if a callback has it, is called before ``on_train_begin``.
            verbose: 0 silent, 1 a progress bar over rounds.
            initial_round: round to start at (to resume).

        Logged per round (one entry per round for every key; rounds run by
        `keras_fedpriv.federated.HorizontalLoop`, the loop the Flower
        strategy runs too): ``replies`` and ``dropped`` (every client
        answers in one process: ``clients_per_round`` and 0),
        ``upload_bytes_per_client``, ``upload_bytes`` (sum over the round's
        clients), ``download_bytes_per_client`` (the dense float32 model),
        ``global_lr`` (the server's step; with MagRR, its ``lr_global``),
        ``round_time_s`` and the validation metrics (computed by the server
        on its own data); with MagRR also ``r_est``, ``magrr_phase`` and
        ``magrr_debiased_ones`` (in the progress bar too); other callbacks
        add their own.
        The clients' local losses are not logged: no upload releases them
        (see ``log_client_loss``).
        """
        rounds = validate_positive_int(rounds, "rounds")
        clients_per_round = validate_positive_int(clients_per_round, "clients_per_round")
        if clients_per_round > self.num_clients:
            raise ValueError(f"`clients_per_round`={clients_per_round} is more than the "
                             f"{self.num_clients} clients.")
        local_epochs = validate_positive_int(local_epochs, "local_epochs")
        initial_round = validate_positive_int(initial_round, "initial_round", minimum=0)
        callbacks = list(callbacks or [])
        for i, callback in enumerate(callbacks):
            if any(callback is c for c in callbacks[:i]):
                raise ValueError(f"`callbacks` lists the same {type(callback).__name__} twice "
                                 f"(positions {[j for j, c in enumerate(callbacks) if c is callback]}"
                                 f"); pass each callback once (RunPlan.callbacks(cbs) already "
                                 f"returns cbs followed by the plan's checks).")
        magrr = self._find_magrr(callbacks)
        self._validation_data = validation_data
        for callback in callbacks:
            if is_protection(callback) and not any(
                    callback is c for c in self._callbacks_seen):
                self._callbacks_seen.append(callback)
        model = self.model
        cb = keras.callbacks.CallbackList(callbacks, add_history=True, add_progbar=False,
                                          model=model, verbose=0, epochs=rounds, steps=1)
        progbar = keras.utils.Progbar(rounds, unit_name="round") if verbose else None
        model.stop_training = False
        server, _ = self._parties()
        server.magrr = magrr  # the clients' bits: one call per round (`_exchange`)
        laplaces = [c for c in callbacks if isinstance(c, LaplaceEvaluation)]
        for laplace in laplaces:
            laplace.begin_federated_run()
        loop = self._loop(server, laplaces[0] if laplaces else None)
        for callback in callbacks:
            hook = getattr(callback, "on_federated_train_begin", None)
            if hook is not None:
                hook(self)
        cb.on_train_begin()
        logs = {}
        everyone = range(self.num_clients)
        for rnd in range(initial_round, rounds):
            started = time.perf_counter()
            cb.on_epoch_begin(rnd)
            logs = loop.run_round(rnd, everyone, clients_per_round, local_epochs, self._exchange)
            chosen = np.asarray(loop.accepted, np.int64)
            self.participation[chosen] += 1
            if self.log_client_loss:  # simulation-only: never released by the protocol
                logs["sim_client_loss"] = float(np.mean([r.loss for r in loop.results]))
                self._ledger.record(ReleaseKind(
                    "HorizontalFL sim_client_loss", "client data", CLIENT, non_private_event(),
                    "log_client_loss=True: the clients' exact losses in the History "
                    "(simulation-only)"), [int(c) for c in chosen])
            for laplace in laplaces:  # the round's clients evaluate the new global model
                inputs = {int(c): self.clients[int(c)][0] for c in chosen}
                logs.update(loop.evaluate_in_process(rnd, inputs) if laplace is loop.laplace
                            else laplace.evaluate_round(model, rnd, inputs))
            for callback in callbacks:
                hook = getattr(callback, "on_federated_round", None)
                if hook is not None:
                    hook(self, rnd, chosen, logs)
            if magrr is not None:  # Keras hands callbacks a copy: the progress bar shows these
                logs.update(magrr.log_values())
            logs.pop("round_time_s", None)
            logs["round_time_s"] = time.perf_counter() - started
            cb.on_epoch_end(rnd, logs)
            if progbar is not None:
                values = [(k, float(v)) for k, v in logs.items() if _is_scalar(v)]
                # every value is this round's: shown as it is, not averaged over rounds
                progbar.stateful_metrics.update(k for k, _ in values)
                progbar.update(rnd + 1, values=values)
            if model.stop_training:
                break
        cb.on_train_end(logs)
        return model.history

    def _loop(self, server, laplace):
        """The round loop of this run: the BN statistics counted when the clients are asked."""
        kinds = []
        if self._bn_vars and self.batch_norm == "average":
            kinds.append(ReleaseKind(
                "HorizontalFL BatchNormalization statistics", "client data", CLIENT,
                non_private_event(), "batch_norm='average': each client's moving mean and "
                "variance reach the server in the clear"))
        return HorizontalLoop(server, ledger=self._ledger, asked_kinds=kinds, laplace=laplace,
                              validation_data=self._validation_data)

    def _exchange(self, request: TrainRequest) -> list[TrainReply]:
        """Carry a round's request to the clients in this process (they share the model).

        With MagRR the round's clients report their bits in one vectorized
        `MagRR.client_reports` call, each from its own stream (the same bits
        and ledger as one call per client).
        """
        server, parties = self._parties()
        ids = request.client_ids
        results = [parties[c].fit(request.weights, request.round, request.local_epochs,
                                  request.batch_norm, record=self._recorder(c)) for c in ids]
        if server.magrr is not None:
            bits = server.magrr.client_reports([r.upload.magnitude for r in results], ids,
                                               cut=request.magrr_cut)
            for result, bit in zip(results, bits):
                result.magrr_report = int(bit)
        return [TrainReply(c, result=r) for c, r in zip(ids, results)]

    def _recorder(self, client):
        """None when the scheme records its own releases, else an encoder that records here."""
        if self._upload_keeps_ledger and self._upload_takes_id:
            return None

        def record(delta, num_examples):
            if self._upload_keeps_ledger:
                # an override without client_id: its scheme records the release for every client
                return self.upload.client_message(delta, num_examples)
            self._ledger.record(ReleaseKind(
                f"{type(self.upload).__name__} upload", "client data", CLIENT,
                non_private_event(), "an upload scheme without a privacy ledger: counted as not "
                "private"), [client])
            return self.upload.client_message(delta, num_examples)

        return record

    def privacy_protections(self) -> list[Any]:
        """The upload scheme and the releasing callbacks of every `fit` so far."""
        return [self.upload] + list(self._callbacks_seen)

    def privacy_ledger(self) -> ReleaseLedger:
        """Releases this object records itself, per client, all counted as not private.

        Uploads of a scheme that keeps no ledger of its own, ``sim_client_loss``
        (``log_client_loss=True``) and BatchNormalization statistics
        (``batch_norm="average"`` on a model with BatchNormalization).

        Returns:
            A `ReleaseLedger`.
        """
        return self._ledger

    def _find_magrr(self, callbacks):
        found = [c for c in callbacks if isinstance(c, MagRR)]
        if not found:
            return None
        if len(found) > 1:
            raise ValueError("at most one MagRR callback per HorizontalFL.fit; got "
                             f"{len(found)}.")
        if not isinstance(self.upload, SignDSUpload):
            raise ValueError("MagRR estimates the step size of SignDS updates; it needs "
                             f"upload=SignDSEncoder(...) or 'signds', not {self.upload.name!r}.")
        return found[0]

    def __repr__(self) -> str:
        return (f"HorizontalFL({self.num_clients} clients, upload={self.upload.describe()}, "
                f"batch_size={self.batch_size})")

