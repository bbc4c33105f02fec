"""The two halves of horizontal FL: what a client runs and what the server runs.

Neither half knows how messages travel. `HorizontalFL` drives them in one
process; `keras_fedpriv.federated.flower` drives the same objects as Flower
apps, one client per SuperNode. Given the same seeds and data both give the
same global model, because nothing a half computes depends on the runtime:

* a client shuffles its data for round ``t`` with a generator keyed by
  ``(seed, client id, t)``;
* a seeded upload scheme and MagRR draw a client's n-th release from that
  client's own stream (``secret_generator(seed, n, unit=client)``);
* the server samples a round's clients from the sorted list of client ids
  with its own generator, and aggregates the uploads in client-id order.

`LocalTrainer` is the compiled local training of a compiled Keras model;
`HorizontalClient` is one client (its data, the trainer, the upload scheme's
client side, MagRR's client side); `HorizontalServer` is the server (client
sampling, the check of every received upload, aggregation, BatchNormalization
statistics, MagRR's step estimate).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import keras
import numpy as np
from numpy.typing import ArrayLike

from keras_fedpriv import backend
from keras_fedpriv.backend.private import flatten_layers
from keras_fedpriv.federated.uploads import ClientUpload, MalformedUpload
from keras_fedpriv.layers.input_checks import traced_check_message
from keras_fedpriv.mechanisms.validation import validate_positive_int, validate_seed
from keras_fedpriv.optimizers.signds import flatten_update, unflatten_update

__all__ = ["ClientDataError", "ClientResult", "HorizontalClient", "HorizontalServer",
           "LocalTrainer", "batch_norm_statistics", "check_client_data", "shuffle_order"]


_SHUFFLE_TAG = 0x5A0FF1E5


def batch_norm_statistics(model: keras.Model) -> list[Any]:
    """The moving mean and variance of every BatchNormalization layer, in layer order."""
    out = []
    for layer in flatten_layers(model, include_self=False):
        if isinstance(layer, keras.layers.BatchNormalization):
            out += [layer.moving_mean, layer.moving_variance]
    return out


class ClientDataError(ValueError):
    """A client's data does not fit the model: names the client and the rule, never a value."""


def _shape_text(dims: Sequence[Any]) -> str:
    """``(batch, 64)``: a shape with its batch dimension named."""
    return "(" + ", ".join(["batch"] + [str(d) for d in dims]) + ("," if not dims else "") + ")"


def _loss_name(model: keras.Model) -> str:
    """The compiled loss's name in lower case ("" if it has none)."""
    loss = getattr(model, "loss", None)
    if isinstance(loss, str):
        return loss.lower()
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
    return str(name).lower()


def _model_tensors(model: keras.Model, which: str) -> list[Any]:
    """The model's symbolic ``inputs`` or ``outputs`` (empty where it has none: subclassed)."""
    try:
        return list(getattr(model, which, None) or [])
    except (AttributeError, ValueError):  # an unbuilt or subclassed model
        return []


def _first_bad(ok: np.ndarray) -> tuple[int, int]:
    """``(number of False entries, first False row)`` of a boolean array over rows."""
    bad = np.flatnonzero(~ok.reshape(len(ok), -1).all(axis=1))
    return int(bad.size), int(bad[0]) if bad.size else -1


def _check_labels(model: keras.Model, y: np.ndarray, who: str) -> None:
    """Labels against the model's outputs, for the crossentropy losses (others: finite only)."""
    if y.dtype.kind not in "biuf":
        raise ClientDataError(f"{who}: labels must be numbers (bool, int or float); got dtype "
                              f"{y.dtype}.")
    outputs = _model_tensors(model, "outputs")
    width = int(outputs[0].shape[-1]) if outputs and outputs[0].shape[-1] is not None else None
    loss = _loss_name(model)
    if y.dtype.kind == "f":
        count, row = _first_bad(np.isfinite(y))
        if count:
            raise ClientDataError(f"{who}: labels must be finite; {count} of {len(y)} rows are "
                                  f"not (the first is row {row}).")
    if width is None:
        return
    if "sparse_categorical" in loss or "sparsecategorical" in loss:
        if y.ndim > 2 or (y.ndim == 2 and y.shape[1] != 1):
            raise ClientDataError(f"{who}: labels must have shape (batch,) or (batch, 1) (class "
                                  f"ids, for loss {loss}); got {_shape_text(y.shape[1:])}.")
        flat = y.reshape(-1)
        with np.errstate(invalid="ignore"):
            ok = (flat == np.round(flat)) & (flat >= 0) & (flat < width)
        count, row = _first_bad(ok)
        if count:
            raise ClientDataError(f"{who}: labels must be integer class ids in [0, {width}) "
                                  f"(the model has {width} outputs, loss {loss}); {count} of "
                                  f"{len(flat)} labels are not (the first is row {row}).")
    elif "categorical" in loss and (y.ndim != 2 or y.shape[1] != width):
        raise ClientDataError(f"{who}: labels must have shape (batch, {width}) (one column per "
                              f"model output, loss {loss}); got {_shape_text(y.shape[1:])}.")


def check_client_data(model: keras.Model, x: ArrayLike, y: ArrayLike, who: str) -> None:
    """Check one client's data against the model before anything is traced or trained.

    Features: numbers, finite, each example of the model's input shape.
    Labels: numbers, finite; with a sparse categorical crossentropy, integer
    class ids in ``[0, outputs)``; with a categorical one, one column per
    output. Messages name ``who`` and what is wrong (shapes, dtypes, counts,
    the first bad row), never a value of the data.

    Args:
        model: the built Keras model the client trains.
        x, y: the client's features and labels (numpy arrays).
        who: names the client in the message (``"client 2"``).

    Raises:
        ClientDataError: (a ValueError) the data cannot train the model.
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind not in "biuf":
        raise ClientDataError(f"{who}: features must be numbers (bool, int or float); got dtype "
                              f"{x.dtype}.")
    inputs = _model_tensors(model, "inputs")
    if len(inputs) == 1:
        want = tuple(inputs[0].shape[1:])
        got = tuple(x.shape[1:])
        if len(got) != len(want) or any(w is not None and g != w for g, w in zip(got, want)):
            raise ClientDataError(f"{who}: features must have shape {_shape_text(want)} (the "
                                  f"model's input); got {_shape_text(got)}.")
    if x.dtype.kind == "f":
        count, row = _first_bad(np.isfinite(x))
        if count:
            raise ClientDataError(f"{who}: features must be finite; {count} of {len(x)} rows "
                                  f"hold NaN or infinity (the first is row {row}).")
    _check_labels(model, y, who)


def shuffle_order(seed: int | None, client_id: int, round: int, num_examples: int,  # noqa: A002
                  local_epochs: int) -> np.ndarray:
    """The order a client visits its examples in one round: one permutation per local epoch.

    Keyed by ``(seed, client_id, round)`` so the order does not depend on
    which other clients trained before (None: fresh OS entropy).

    Returns:
        int32 array of length ``num_examples * local_epochs``.
    """
    for value, name in ((client_id, "client_id"), (round, "round")):
        validate_positive_int(value, name, minimum=0)
    # the tag keeps this stream apart from default_rng(seed), the server's sampling
    rng = np.random.default_rng(None if seed is None else
                                [int(seed), int(client_id), int(round), _SHUFFLE_TAG])
    return np.concatenate([rng.permutation(num_examples)
                           for _ in range(local_epochs)]).astype(np.int32)


class LocalTrainer:
    """A client's local training as one compiled function of a compiled Keras model.

    Set the global weights and BatchNormalization statistics, reset the
    optimizer, run the mini-batches of ``order`` and return the update. The
    function is compiled once and reused for every client and round, so no
    Keras start-up is paid per client: on TensorFlow one ``tf.function`` with
    a dynamic batch dimension, on JAX one ``jax.jit`` training step per batch
    shape (see ``local_training`` in `keras_fedpriv.backend`).

    Args:
        model: a compiled, built `keras.Model` (its optimizer trains, reset
            to its initial state for every call; its loss scores).
        batch_size: local mini-batch size.
        x_spec, y_spec: ``(shape, dtype)`` of one example's features and
            label (the batch dimension excluded).
    """

    def __init__(self, model: keras.Model, batch_size: int, x_spec: tuple[tuple[int, ...], Any],
                 y_spec: tuple[tuple[int, ...], Any]) -> None:
        self.model = model
        self.batch_size = validate_positive_int(batch_size, "batch_size")
        self.bn_variables = batch_norm_statistics(model)
        self._fn = backend.impl().local_training(model, self.batch_size, x_spec, y_spec,
                                                 self.bn_variables)

    def train(self, global_weights: Sequence[ArrayLike], x: np.ndarray, y: np.ndarray,
              order: np.ndarray, bn_start: Sequence[ArrayLike]
              ) -> tuple[np.ndarray, float, list[np.ndarray]]:
        """Train from ``global_weights`` over ``order``; the model keeps the trained weights.

        Returns:
            ``(update, loss, bn_end)``: the flat float32 update, the mean
            local training loss and the final BatchNormalization statistics.
        """
        try:
            deltas, loss, bn_end = self._fn(list(global_weights), x, y, order, list(bn_start))
        except backend.impl().traced_check_errors() as error:  # a graph check (TensorFlow, no XLA)
            short = traced_check_message(error)
            if short is None:
                raise
            raise ValueError(f"LocalTrainer.train: {short}") from None
        # A protection layer in the model that met invalid inputs in the compiled step made
        # its output safe and counted the event: raise it here, before anything is encoded.
        for layer in flatten_layers(self.model, include_self=False):
            if hasattr(layer, "check_input_errors"):
                layer.check_input_errors()
        return flatten_update(deltas)[0], loss, bn_end


@dataclasses.dataclass
class ClientResult:
    """What one client produced in one round.

    Attributes:
        upload: the `ClientUpload` (its ``message`` is what is sent).
        loss: the client's mean local training loss (kept on the client).
        batch_norm: the client's BatchNormalization statistics after
            training (sent in the clear only with ``batch_norm="average"``).
        magrr_report: MagRR's randomized bit, or None without MagRR.
        num_examples: the client's data size (weights its BatchNormalization
            statistics), or None where it was not sent.
    """

    upload: ClientUpload
    loss: float
    batch_norm: list[np.ndarray] | None
    magrr_report: int | None = None
    num_examples: int | None = None


class HorizontalClient:
    """The client half: local training, the upload's encoding, MagRR's report.

    Args:
        trainer: a `LocalTrainer` (one per process; clients in one process
            share it).
        data: the client's ``(x, y)`` arrays.
        upload: the upload scheme (its ``client_message`` encodes and records
            the release).
        client_id: the client's id (an integer >= 0; the unit its releases
            are recorded and keyed under).
        seed: None or an int: the shuffling of the client's data (see
            `shuffle_order`).
        batch_norm: ``"average"`` (start each round from the global
            statistics) or ``"local"`` (keep the client's own, FedBN).
        magrr: the client side of a `keras_fedpriv.callbacks.MagRR` (a copy
            with the run's ``eps_rr`` and the client's seed), or None.
        laplace: the client side of a
            `keras_fedpriv.callbacks.LaplaceEvaluation` (its copy with the
            client's eps and seed; ``log_clean`` off), or None: the client
            answers no evaluation.
    """

    def __init__(self, trainer: LocalTrainer, data: tuple[np.ndarray, np.ndarray], upload: Any,
                 client_id: int, seed: int | None = None, batch_norm: str = "average",
                 magrr: Any = None, laplace: Any = None) -> None:
        self.trainer = trainer
        self.x, self.y = data
        self.upload = upload
        self.client_id = validate_positive_int(client_id, "client_id", minimum=0)
        self.seed = validate_seed(seed)
        if batch_norm not in ("average", "local"):
            raise ValueError(f"`batch_norm` must be 'average' or 'local'; got {batch_norm!r}.")
        self.batch_norm = batch_norm
        self.magrr = magrr
        if laplace is not None and getattr(laplace, "log_clean", False):
            raise ValueError("`laplace` (a client's LaplaceEvaluation) must have "
                             "log_clean=False: the clean outputs would have to leave the client; "
                             "got log_clean=True.")
        self.laplace = laplace
        self._own_bn = None  # batch_norm='local': this client's statistics

    @property
    def own_batch_norm(self) -> list[np.ndarray] | None:
        """The client's own BatchNormalization statistics (``batch_norm="local"``), or None.

        None until the client has trained once. Set it to restore what a
        previous process of the same client kept (e.g. from Flower's node
        state); with ``batch_norm="average"`` it is never used.
        """
        return None if self._own_bn is None else list(self._own_bn)

    @own_batch_norm.setter
    def own_batch_norm(self, stats: Sequence[ArrayLike] | None) -> None:
        self._own_bn = None if stats is None else [np.asarray(a) for a in stats]

    def privacy_protections(self) -> list[Any]:
        """What records this client's releases: its upload scheme, MagRR and Laplace copies."""
        return [p for p in (self.upload, self.magrr, self.laplace) if p is not None]

    @property
    def num_examples(self) -> int:
        """The client's number of training examples."""
        return len(self.x)

    def train(self, global_weights: Sequence[ArrayLike], round: int,  # noqa: A002
              local_epochs: int = 1, global_bn: Sequence[ArrayLike] = ()
              ) -> tuple[np.ndarray, float, list[np.ndarray]]:
        """Local training only (nothing encoded, uploaded or recorded).

        Returns:
            ``(update, loss, bn_end)`` as `LocalTrainer.train`; with
            ``batch_norm="local"`` the client keeps ``bn_end`` for its next
            round.
        """
        order = shuffle_order(self.seed, self.client_id, round, self.num_examples, local_epochs)
        bn_start = list(global_bn)
        if self.batch_norm == "local" and self._own_bn is not None:
            bn_start = self._own_bn
        delta, loss, bn_end = self.trainer.train(global_weights, self.x, self.y, order, bn_start)
        if self.batch_norm == "local":
            self._own_bn = bn_end
        return delta, loss, bn_end

    def fit(self, global_weights: Sequence[ArrayLike], round: int,  # noqa: A002
            local_epochs: int = 1, global_bn: Sequence[ArrayLike] = (),
            magrr_cut: float | None = None, record: Any = None) -> ClientResult:
        """Train one round from the global model and encode the upload.

        Args:
            global_weights: the global model's trainable weights.
            round: the round index (keys the shuffling).
            local_epochs: epochs of local training.
            global_bn: the global BatchNormalization statistics.
            magrr_cut: the server's MagRR announcement (``threshold * r_est``);
                needed when the client has ``magrr``.
            record: None (the upload scheme records the release itself), or
                a callable ``record(update, num_examples) -> ClientUpload``
                that encodes and records instead (`HorizontalFL` uses it for
                schemes that keep no ledger).

        Returns:
            A `ClientResult`.
        """
        delta, loss, bn_end = self.train(global_weights, round, local_epochs, global_bn)
        if record is not None:
            upload = record(delta, self.num_examples)
        else:
            upload = self.upload.client_message(delta, self.num_examples,
                                                client_id=self.client_id)
        report = None
        if self.magrr is not None:
            if upload.magnitude is None:
                raise ValueError("MagRR needs an upload scheme that reports the client's step "
                                 "size (SignDS).")
            if magrr_cut is None:
                raise ValueError("`magrr_cut` (the server's MagRR announcement) is needed when "
                                 "the client runs MagRR.")
            report = int(self.magrr.client_reports([upload.magnitude], [self.client_id],
                                                   cut=magrr_cut)[0])
        return ClientResult(upload, loss, bn_end, report, self.num_examples)


class HorizontalServer:
    """The server half: sampling, checking, aggregating, stepping the global model.

    Args:
        model: the global `keras.Model` (its trainable weights are updated;
            its BatchNormalization statistics follow ``batch_norm``).
        upload: the upload scheme (its ``aggregate``, and its ``from_wire``
            for uploads received from another process).
        seed: None or an int: the client sampling.
        batch_norm: ``"average"`` or ``"local"`` (see `HorizontalFL`).
        magrr: a `keras_fedpriv.callbacks.MagRR` (its server side sets the
            step of SignDS every round), or None.
    """

    def __init__(self, model: keras.Model, upload: Any, seed: int | None = None,
                 batch_norm: str = "average", magrr: Any = None) -> None:
        self.model = model
        self.upload = upload
        self.batch_norm = batch_norm
        self.magrr = magrr
        self._rng = np.random.default_rng(validate_seed(seed))
        self.trainable = list(model.trainable_variables)
        self.bn_variables = batch_norm_statistics(model)
        self.dim = int(sum(int(np.prod(v.shape)) for v in self.trainable))

    def sample(self, client_ids: Sequence[int], count: int) -> list[int]:
        """``count`` of ``client_ids`` uniformly without replacement, sorted.

        The ids are sorted first, so the draw depends on the set of ids, not
        on the order they were listed in.
        """
        ids = sorted(int(c) for c in client_ids)
        count = validate_positive_int(count, "clients_per_round")
        if count > len(ids):
            raise ValueError(f"`clients_per_round`={count} is more than the {len(ids)} clients.")
        chosen = self._rng.choice(len(ids), count, replace=False)
        return sorted(ids[i] for i in chosen)

    def global_weights(self) -> list[np.ndarray]:
        """The global model's trainable weights as numpy arrays."""
        return [v.numpy() for v in self.trainable]

    def global_batch_norm(self) -> list[np.ndarray]:
        """The global BatchNormalization statistics as numpy arrays."""
        return [v.numpy() for v in self.bn_variables]

    def magrr_cut(self) -> float | None:
        """What the server announces to the round's clients for MagRR (None without it)."""
        return None if self.magrr is None else self.magrr.cut

    def receive(self, arrays: Mapping[str, Any]) -> ClientUpload:
        """An upload received from another process, checked (see the scheme's ``from_wire``).

        Raises:
            MalformedUpload: the arrays are not what the scheme promises.
        """
        from_wire = getattr(self.upload, "from_wire", None)
        if from_wire is None:
            raise TypeError(f"The upload scheme {type(self.upload).__name__} has no from_wire: "
                            "it cannot be received from another process.")
        return from_wire(arrays, self.dim)

    def check_batch_norm(self, stats: Sequence[Any]) -> list[np.ndarray]:
        """Received BatchNormalization statistics, checked against the model's.

        Raises:
            MalformedUpload: wrong number, shape or dtype, or a non-finite or
                negative variance.
        """
        stats = list(stats)
        if len(stats) != len(self.bn_variables):
            raise MalformedUpload(f"expected {len(self.bn_variables)} BatchNormalization "
                                  f"arrays; got {len(stats)}.")
        out = []
        for i, (v, a) in enumerate(zip(self.bn_variables, stats)):
            a = np.asarray(a)
            dtype = np.dtype(keras.backend.standardize_dtype(v.dtype))
            if a.shape != tuple(v.shape) or a.dtype != dtype or not np.isfinite(a).all():
                raise MalformedUpload(f"BatchNormalization array {i} must be finite {dtype} of "
                                      f"shape {tuple(v.shape)}; got {a.dtype} {a.shape}.")
            if i % 2 == 1 and np.any(a < 0):
                raise MalformedUpload(f"BatchNormalization array {i} is a variance and must be "
                                      f">= 0.")
            out.append(a)
        return out

    def step(self, uploads: Sequence[ClientUpload], magrr_reports: Sequence[int] | None = None,
             num_examples: Sequence[int] | None = None,
             batch_norm: Sequence[Sequence[np.ndarray]] | None = None,
             global_weights: Sequence[np.ndarray] | None = None,
             global_bn: Sequence[np.ndarray] | None = None) -> dict[str, float]:
        """Aggregate one round's uploads (in client-id order) into the global model.

        Args:
            uploads: the round's accepted uploads.
            magrr_reports: MagRR's bits of the same clients (with ``magrr``).
            num_examples: the clients' data sizes, to weight their
                BatchNormalization statistics (``batch_norm="average"``).
            batch_norm: the clients' BatchNormalization statistics.
            global_weights: the global weights the round started from; None:
                the model's current weights (right when no client trained
                this model object in between, as on Flower's server).
            global_bn: likewise, the global BatchNormalization statistics the
                round started from (``batch_norm="local"`` restores them).

        Returns:
            ``{"global_lr": ...}``: the step size used.
        """
        lr = None
        if self.magrr is not None:
            lr = self.magrr.server_update(np.asarray(list(magrr_reports or []), np.int32),
                                          num_clients=len(uploads))
        step = self.upload.aggregate(list(uploads), global_lr=lr)
        start = self.global_weights() if global_weights is None else list(global_weights)
        flat, shapes = flatten_update(start)
        for v, w in zip(self.trainable, unflatten_update(flat + step, shapes)):
            v.assign(w)
        if self.bn_variables and self.batch_norm == "average" and batch_norm:
            sizes = np.asarray(list(num_examples), np.float64)
            weights = sizes / sizes.sum()
            for i, v in enumerate(self.bn_variables):
                value = sum(w * np.asarray(stats[i], np.float64)
                            for w, stats in zip(weights, batch_norm))
                v.assign(np.asarray(value).astype(v.dtype))
        elif self.bn_variables and global_bn is not None:  # 'local': the global model's own
            for v, value in zip(self.bn_variables, global_bn):
                v.assign(np.asarray(value).astype(v.dtype))
        return {"global_lr": float(lr if lr is not None else
                                   getattr(self.upload, "global_lr", 1.0))}
