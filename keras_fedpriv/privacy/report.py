"""Privacy reports: collect the DpEvents of every mechanism used; compose them with dp-accounting.

`privacy_report(obj, ...)` accepts a Keras model (the `LabelDPLayer` and
`EmbeddingDPLayer` layers inside it, a `VerticalModel` included), a Keras
`History`, a `HorizontalFL` simulation (its upload scheme: SignDS or Gaussian,
counted per client over the rounds it took part in), the callbacks of a run
(`MagRR`, `LaplaceEvaluation`), or a list of these. It returns a
`PrivacyReport`: one row per mechanism (what it protects, eps of one release,
number of releases, the composition of that row) and the composition of all
rows, at the given delta, with the PLD accountant (default, tight) or the RDP
accountant.

Counting releases:

* `LabelDPLayer`: one release per example when labels are randomized once
  (the default); one per epoch with ``per_batch=True``.
* `EmbeddingDPLayer`: every forward pass is a release; the report counts the
  training epochs (inference passes come on top: pass ``extra_releases``).
* `HorizontalFL`: a client releases once per round it takes part in (SignDS's
  index set, or the Gaussian-noised update; MagRR's bit on top). The report
  takes the client that took part most often (the worst case).
* `LaplaceEvaluation`: every evaluation releases each evaluated example's
  output once.

Neighbouring relations: the randomized-response events (label DP, quantize+RR,
SignDS, MagRR) are for replacing one value by another; the Gaussian and
Laplace events of this package already carry the replacement sensitivity (2C,
2 for probability vectors) in their parameters. The PLDs are built for exactly
those pairs and composed directly (`dp_accounting.pld.privacy_loss_distribution`),
which is what a single `PLDAccountant` would do if it accepted both kinds.
With ``accountant="rdp"``, pure eps-DP events enter as eps^2/2-zCDP (Bun and
Steinke 2016, Prop. 1.4) and Gaussian events as themselves.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import dp_accounting
import keras
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from keras_fedpriv.mechanisms.validation import validate_eps, validate_positive_int
from keras_fedpriv.text_table import text_table

__all__ = ["EpsilonLogger", "PrivacyReport", "Release", "compose_epsilon", "privacy_report",
           "pure_epsilon"]

_VDI = 1e-4
NeighborRel = dp_accounting.NeighboringRelation


# ------------------------------------------------------------------ events
def _flatten(event, count=1, out=None):
    """Counter of base events with their multiplicities."""
    out = collections.Counter() if out is None else out
    if isinstance(event, dp_accounting.ComposedDpEvent):
        for e in event.events:
            _flatten(e, count, out)
    elif isinstance(event, dp_accounting.SelfComposedDpEvent):
        _flatten(event.event, count * event.count, out)
    elif isinstance(event, dp_accounting.NoOpDpEvent):
        pass
    else:
        out[event] += count
    return out


def pure_epsilon(event):
    """eps of a pure-DP base event (RR, Laplace, discrete Laplace); None otherwise."""
    if isinstance(event, dp_accounting.RandomizedResponseDpEvent):
        a, k = event.noise_parameter, event.num_buckets
        if a == 0:
            return math.inf
        return math.log((1 - a + a / k) / (a / k))
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return math.inf if event.noise_multiplier == 0 else 1.0 / event.noise_multiplier
    if isinstance(event, dp_accounting.dp_event.DiscreteLaplaceDpEvent):
        return event.noise_parameter * event.sensitivity
    return None


def _base_pld(event):
    if isinstance(event, dp_accounting.RandomizedResponseDpEvent):
        return pld_lib.from_randomized_response(event.noise_parameter, event.num_buckets,
                                                value_discretization_interval=_VDI,
                                                neighboring_relation=NeighborRel.REPLACE_ONE)
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return pld_lib.from_gaussian_mechanism(event.noise_multiplier,
                                               value_discretization_interval=_VDI)
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return pld_lib.from_laplace_mechanism(event.noise_multiplier,
                                              value_discretization_interval=_VDI)
    if isinstance(event, dp_accounting.dp_event.DiscreteLaplaceDpEvent):
        return pld_lib.from_discrete_laplace_mechanism(event.noise_parameter, event.sensitivity,
                                                       value_discretization_interval=_VDI)
    raise ValueError(f"privacy_report: cannot account for {event!r} (supported: randomized "
                     "response, Gaussian, Laplace, discrete Laplace and their compositions).")


def _non_private(counter):
    return any(isinstance(e, dp_accounting.NonPrivateDpEvent) or pure_epsilon(e) == math.inf
               for e in counter)


def compose_epsilon(events_with_counts, delta, accountant="pld"):
    """eps at ``delta`` of the composition of ``[(event, count), ...]``.

    Returns ``inf`` if any event is not private (e.g. quantization only).
    """
    counter = collections.Counter()
    for event, count in events_with_counts:
        _flatten(event, count, counter)
    counter = collections.Counter({e: c for e, c in counter.items() if c > 0})
    if not counter:
        return 0.0
    if _non_private(counter):
        return math.inf
    if accountant == "pld":
        total = None
        for event, count in counter.items():
            pld = _base_pld(event).self_compose(count) if count > 1 else _base_pld(event)
            total = pld if total is None else total.compose(pld)
        return float(total.get_epsilon_for_delta(delta))
    if accountant == "rdp":
        acc = dp_accounting.rdp.RdpAccountant()
        for event, count in counter.items():
            eps = pure_epsilon(event)
            if eps is not None:
                event = dp_accounting.ZCDpEvent(rho=eps * eps / 2.0)
            elif not isinstance(event, dp_accounting.GaussianDpEvent):
                raise ValueError(f"privacy_report: the RDP accountant cannot take {event!r}.")
            acc.compose(event, int(count))
        return float(acc.get_epsilon(delta))
    raise ValueError(f"`accountant` must be 'pld' or 'rdp'; got {accountant!r}.")


# ------------------------------------------------------------------ report
@dataclasses.dataclass
class Release:
    """One row of a report: a mechanism, what it protects, and how often it released.

    Attributes:
        mechanism: a name, e.g. ``"LabelDPLayer 'label_dp'"``.
        protects: what the noise protects.
        event: the `dp_accounting` event of one release.
        count: number of releases (per example / per client).
        note: how ``count`` was obtained.
    """

    mechanism: str
    protects: str
    event: object
    count: int
    note: str = ""


@dataclasses.dataclass
class PrivacyReport:
    """What every mechanism guarantees, alone and composed.

    Attributes:
        releases: the rows (`Release`).
        delta: the delta of every composed eps.
        accountant: ``"pld"`` or ``"rdp"``.
    """

    releases: list
    delta: float
    accountant: str = "pld"

    def per_release_epsilon(self, row):
        """eps of one release of ``row`` (at ``delta`` for Gaussian events)."""
        return compose_epsilon([(row.event, 1)], self.delta, self.accountant)

    def row_epsilon(self, row):
        """eps of all ``row.count`` releases of ``row``, composed."""
        return compose_epsilon([(row.event, row.count)], self.delta, self.accountant)

    @property
    def epsilon(self):
        """eps of everything in the report composed (one person in every row)."""
        return compose_epsilon([(r.event, r.count) for r in self.releases], self.delta,
                               self.accountant)

    def rows(self):
        """The table as a list of dicts."""
        return [dict(mechanism=r.mechanism, protects=r.protects,
                     eps_per_release=self.per_release_epsilon(r), releases=r.count,
                     eps_composed=self.row_epsilon(r), note=r.note) for r in self.releases]

    def __str__(self):
        header = ("mechanism", "protects", "eps / release", "releases",
                  f"composed eps (delta={self.delta:g})")
        cells = [(r["mechanism"], r["protects"], _fmt(r["eps_per_release"]), str(r["releases"]),
                  _fmt(r["eps_composed"])) for r in self.rows()]
        cells.append(("all of the above", "", "", "", _fmt(self.epsilon)))
        notes = [f"- {r.mechanism}: {r.note}" for r in self.releases if r.note]
        return "\n".join([text_table(header, cells),
                          f"Accountant: {self.accountant.upper()} (dp-accounting)."] + notes)


def _fmt(eps):
    return "inf (not private)" if math.isinf(eps) else f"{eps:.3g}"


# ------------------------------------------------------------- collection
def _from_model(model, epochs, extra_releases):
    from keras_fedpriv.layers.embedding_dp import EmbeddingDPLayer
    from keras_fedpriv.layers.label_dp import LabelDPLayer

    rows = []
    # _flatten_layers visits every (nested) layer once, even if it is shared
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, LabelDPLayer):
            if layer.per_batch:
                rows.append(Release(f"LabelDPLayer {layer.name!r}", "labels",
                                    layer.dp_event(1), epochs,
                                    "per_batch=True: a new release every epoch"))
            else:
                rows.append(Release(f"LabelDPLayer {layer.name!r}", "labels", layer.dp_event(1),
                                    1, "randomized once per example: one release, any epochs"))
        elif isinstance(layer, EmbeddingDPLayer):
            if layer.eps is None:
                event = dp_accounting.NonPrivateDpEvent()
            elif layer.built:
                event = layer.dp_event()
            else:
                continue  # never called: nothing released
            rows.append(Release(f"EmbeddingDPLayer {layer.name!r}", "a follower's embedding",
                                event, epochs + extra_releases,
                                f"every forward pass is a release: {epochs} training epoch(s)"
                                + (f" + {extra_releases} other pass(es)" if extra_releases
                                   else "")))
    return rows


def _from_callbacks(callbacks, participation):
    from keras_fedpriv.callbacks.magrr import MagRR

    rows = []
    for cb in callbacks:
        if isinstance(cb, MagRR):
            count = participation if participation is not None else cb.num_releases
            rows.append(Release("MagRR", "a client's step size (1 bit per round)",
                                cb.dp_event(1), int(count),
                                "one randomized-response bit per round a client takes part in"))
        elif hasattr(cb, "dp_event") and hasattr(cb, "num_evaluations"):
            if cb.num_evaluations == 0:
                continue
            rows.append(Release(type(cb).__name__, "inference results (softmax outputs)",
                                cb.dp_event(), int(cb.num_evaluations),
                                "each evaluated example's output, once per evaluation"))
    return rows


def _from_horizontal(fl):
    from keras_fedpriv.federated.uploads import GaussianUpload, SignDSUpload

    most = int(fl.participation.max()) if len(fl.participation) else 0
    upload = fl.upload
    if most == 0:
        return [], 0
    note = (f"the client that took part most often ({most} of "
            f"{int(fl.participation.sum())} client-rounds)")
    if isinstance(upload, SignDSUpload):
        return [Release("SignDS upload", "a client's update (index set; sign is a fair coin)",
                        upload.dp_event(), most, note)], most
    if isinstance(upload, GaussianUpload):
        return [Release("Gaussian upload", "a client's update (clipped + noise)",
                        upload.dp_event(), most, note)], most
    return [Release(f"{upload.name} upload", "nothing", dp_accounting.NonPrivateDpEvent(), most,
                    "plain updates are not private")], most


def privacy_report(obj, epochs=None, delta=1e-5, accountant="pld", callbacks=(),
                   extra_releases=0):
    """Collect and compose the DpEvents of a model, a run or a simulation.

    Args:
        obj: a Keras model (its privacy layers, recursively; `VerticalModel`
            included), a Keras `History` (its model and number of epochs), a
            `HorizontalFL` (its upload scheme per client), or a list/tuple of
            these.
        epochs: training epochs, for the layers whose releases repeat per
            epoch. Default: the number of epochs in the model's `History`
            (``len(model.history.epoch)``), else 1.
        delta: the delta of the composed (eps, delta).
        accountant: ``"pld"`` (default; tight) or ``"rdp"``.
        callbacks: the run's callbacks (`MagRR`, `LaplaceEvaluation`) to
            include.
        extra_releases: forward passes of an `EmbeddingDPLayer` besides the
            training epochs (e.g. validation or inference passes).

    Returns:
        A `PrivacyReport`; ``print(report)`` shows the table.

    Example:
        >>> history = model.fit(x, y, epochs=5)
        >>> print(privacy_report(history, delta=1e-5))
    """
    delta = validate_eps(delta, "delta", upper=1.0)
    if accountant not in ("pld", "rdp"):
        raise ValueError(f"`accountant` must be 'pld' or 'rdp'; got {accountant!r}.")
    extra_releases = validate_positive_int(extra_releases, "extra_releases", minimum=0)
    if epochs is not None:
        epochs = validate_positive_int(epochs, "epochs")
    objs = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    callbacks = list(callbacks) + [o for o in objs if isinstance(o, keras.callbacks.Callback)
                                   and not isinstance(o, keras.callbacks.History)]
    objs = [o for o in objs if o not in callbacks]
    rows, participation = [], None
    for item in objs:
        item_rows, most = _collect(item, epochs, extra_releases)
        rows += item_rows
        if most is not None:
            participation = most if participation is None else max(participation, most)
    rows += _from_callbacks(callbacks, participation)
    return PrivacyReport(rows, delta, accountant)


def _collect(item, epochs, extra_releases):
    """(rows, most participations or None) of one object."""
    from keras_fedpriv.federated.horizontal import HorizontalFL

    if isinstance(item, HorizontalFL):
        return _from_horizontal(item)
    if isinstance(item, keras.callbacks.History):
        n = epochs if epochs is not None else max(len(item.epoch), 1)
        return _from_model(item.model, n, extra_releases), None
    if isinstance(item, keras.Model):
        n = epochs
        if n is None:
            history = getattr(item, "history", None)
            n = max(len(getattr(history, "epoch", []) or []), 1)
        return _from_model(item, n, extra_releases), None
    raise TypeError(f"privacy_report: cannot collect privacy events from "
                    f"{type(item).__name__}; pass a Keras model, a History, a HorizontalFL, "
                    f"callbacks, or a list of these.")


class EpsilonLogger(keras.callbacks.Callback):
    """Log the composed eps of the run so far into the training history every epoch / round.

    Adds ``epsilon`` (all mechanisms composed, at ``delta``) to the logs. With
    ``model.fit`` it reports the model's privacy layers after ``epoch + 1``
    epochs; with `HorizontalFL.fit` it reports the upload scheme and the
    other callbacks of the run (pass them as ``callbacks``; MagRR and
    LaplaceEvaluation are counted as they go).

    Args:
        delta: the delta of the reported (eps, delta).
        accountant: ``"pld"`` or ``"rdp"``.
        callbacks: other callbacks of the run whose releases count.
    """

    def __init__(self, delta=1e-5, accountant="pld", callbacks=()):
        super().__init__()
        self.delta = validate_eps(delta, "delta", upper=1.0)
        if accountant not in ("pld", "rdp"):
            raise ValueError(f"`accountant` must be 'pld' or 'rdp'; got {accountant!r}.")
        self.accountant = accountant
        self.callbacks = list(callbacks)
        self._fl = None
        self.last_report = None

    def on_federated_round(self, fl, round_index, client_ids, logs):
        self._fl = fl

    def on_epoch_end(self, epoch, logs=None):
        target = self._fl if self._fl is not None else self.model
        self.last_report = privacy_report(target, epochs=epoch + 1, delta=self.delta,
                                          accountant=self.accountant, callbacks=self.callbacks)
        if logs is not None:
            logs["epsilon"] = self.last_report.epsilon
