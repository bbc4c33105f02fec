"""VerticalModel: a vertical (split) model whose ``fit`` runs the real protocol.

See docs/vertical.md for the user guide. In short, each party owns a bottom
model over its own features; followers send their (protected) embeddings up
to the leader, who owns the labels and the top model; the leader sends each
follower back the gradient of the loss with respect to the embedding it
received, and each party updates its own bottom from that gradient alone.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping

import keras
import numpy as np
from keras import tree

from keras_fedpriv import backend
from keras_fedpriv.backend import private
from keras_fedpriv.federated.messages import (
    EXAMPLE_IDS_KEY,
    EvaluationData,
    MessageCallback,
    PartyMessages,
    StepMessages,
    is_tf_dataset,
)
from keras_fedpriv.federated.vertical.leader import VerticalLeader, validate_label_protection
from keras_fedpriv.federated.vertical.parties import VerticalParties, split_parties
from keras_fedpriv.federated.vertical.party import (
    PartyBottom,
    SentCounter,
    copy_protection,
    counter_variable,
    derive_party_seed,
    follower_unprotected_ledger,
    label_assert_message,
    leader_loss,
    leader_unprotected_ledger,
    validate_class_weight,
    validate_party_name,
)
from keras_fedpriv.federated.vertical.step import (
    MESSAGES_KEY,
    SAMPLE_WEIGHT_REFUSAL,
    VerticalStep,
)
from keras_fedpriv.federated.vertical.wire import up_bytes
from keras_fedpriv.layers.input_checks import (
    InputErrorFlagMixin,
    find_repeat,
    host_example_ids,
    traced_check_message,
)
from keras_fedpriv.layers.label_dp import LabelDPLayer
from keras_fedpriv.layers.release_counter import ReleaseCounterMixin
from keras_fedpriv.mechanisms.ledger import ReleaseLedger

__all__ = ["VerticalModel", "derive_party_seed"]

_EXPORT_ON_JAX = ("save the model (model.save('model.keras')) and serve each party's part "
                  "with keras.Model(...) / party_embeddings on JAX.")


def _dims(value):
    """The shape of an array, tensor or `tf.TensorSpec` as a tuple, or None (unknown rank)."""
    shape = value.shape if hasattr(value, "shape") else np.shape(value)
    if hasattr(shape, "as_list"):  # a tf.TensorShape
        return None if shape.rank is None else tuple(shape.as_list())
    return tuple(shape)


def _shape_text(dims, batch=False):
    dims = list(dims)
    if batch and dims:
        dims[0] = "batch"
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _fits(given, expected):
    """Whether ``given`` (dims or None) can be a batch of ``expected`` (dims; None = any)."""
    return given is None or (len(given) == len(expected) and all(
        g is None or e is None or g == e for g, e in zip(given[1:], expected[1:])))


def _describe(value):
    """What ``value`` is, for an error message: its kind and shape, never its values."""
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    kind = ("numpy array" if isinstance(value, np.ndarray)
            else "tensor" if keras.ops.is_tensor(value) or type(value).__name__ == "TensorSpec"
            else type(value).__name__)
    dims = _dims(value) if hasattr(value, "shape") else None
    return f"a {kind} of shape {_shape_text(dims)}" if dims is not None else f"a {kind}"


@keras.saving.register_keras_serializable(package="keras_fedpriv")
class VerticalModel(keras.Model):
    """A vertical (split) model assembled from parties; ``fit`` runs the real protocol.

    Each party holds a bottom model over its own features. The **leader**
    holds the labels and the top model (and optionally a bottom model of its
    own, whose embedding never leaves it, so it is never protected). Every
    other party is a **follower**: its embedding is protected by its
    ``embedding_dp`` layer and sent up. In ``train_step``:

    1. each party runs its bottom (and protection) under its own tape;
       followers send the protected embedding ``e_p`` up;
    2. the leader runs the top on the embeddings it received, applies
       ``label_dp`` to the labels, computes the compiled loss and
       ``g_p = d loss / d e_p`` (sent down to follower p);
    3. each party computes its bottom's gradients from ``g_p`` alone
       (``tape.gradient(e_p, party_vars, output_gradients=g_p)``), plus the
       gradients of its own local losses (``add_loss`` / regularizers inside
       its bottom, e.g. a VAE bottom's KL term);
    4. one ``optimizer.apply_gradients`` on all variables. In deployment each
       party runs its own optimizer on its own variables; for per-variable
       optimizers (SGD, Adam, RMSprop, ...) that is the same computation.
       Optimizers that couple variables (global-norm clipping,
       ``global_clipnorm``) would differ.

    Inputs are a dict keyed by party name, plus optionally the reserved key
    ``"example_ids"`` (int64, shape (batch,), see `with_example_ids`).

    Steps 1-3 are the graph pieces of the party halves
    (`keras_fedpriv.federated.vertical.parties`): `split_parties` hands out
    a `VerticalFollower` per follower and the `VerticalLeader`, sharing this
    model's layers, for running each party on its own (in one process with
    `VerticalDriver`, or as Flower apps).

    **How the top receives the embeddings.** If the top is a functional
    model whose inputs are a dict, or that has several inputs, its input
    names must be exactly the party names and it receives a dict
    ``{party: embedding}``. Otherwise it receives the concatenation of all
    parties' embeddings along the last axis, in **sorted party-name order**.
    Both are checked when the model is constructed.

    Args:
        bottoms: dict party name -> built Keras model (or layer) over that
            party's features. Names are identifiers (letters, digits, ``_``,
            starting with a letter); ``"example_ids"`` is reserved.
        top: the leader's Keras model over the embeddings.
        leader: the name of the party among ``bottoms`` that holds the labels
            and the top model, or None: the leader has no bottom of its own
            and every party in ``bottoms`` is a follower.
        embedding_dp: protection of the followers' embeddings: None (sent as
            is); one layer (typically `EmbeddingDPLayer`), of which every
            follower gets its **own copy** made from the layer's config (so
            each party holds its own secret key; if the layer has an explicit
            integer ``seed``, copy p gets ``derive_party_seed(seed, p)``); or a
            dict follower -> layer or None, used as given (one layer object per
            party). Any Keras layer works as protection (e.g.
            ``keras.layers.GaussianNoise``).
        label_dp: None or a `LabelDPLayer` that the leader applies to the
            labels in each training step before the loss. Unless it was built
            with ``per_batch=True`` it needs ``"example_ids"`` in the inputs.
            Never applied at evaluation or prediction. With ``label_dp``,
            ``fit(class_weight=...)`` weights each example by its
            **randomized** label (Keras would weight by the true label before
            ``train_step``, and the weighted gradients sent to the followers
            would reveal it), and ``fit`` refuses sample weights unless
            ``label_free_sample_weight=True`` says they do not depend on the
            labels.
        labels_privatized: True if the labels given to ``fit`` were randomized
            before training (`keras_fedpriv.privatize_labels` /
            `privatize_dataset`): the cut gradients are then computed from
            randomized labels. Otherwise, without ``label_dp``, every training
            step is recorded as a release of the true labels without DP (the
            report says ``inf``). Pass the privatizing `LabelDPLayer`
            (``privatize_labels(..., layer=...)``) to `privacy_report` too, so
            its release is counted.
        **kwargs: `keras.Model` arguments (``name``, ...).

    Example:
        >>> model = VerticalModel({"party_a": bottom_a, "party_b": bottom_b}, top,
        ...                       leader="party_b", embedding_dp=EmbeddingDPLayer(eps=4.0))
        >>> model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
        >>> history = model.fit({"party_a": xa, "party_b": xb}, y, epochs=10)
        >>> history.history["bytes_up"]   # bytes sent to the leader, per epoch
    """

    _is_vertical_model = True

    def __init__(self, bottoms: Mapping[str, keras.layers.Layer], top: keras.layers.Layer,
                 leader: str | None = None,
                 embedding_dp: (keras.layers.Layer
                                | Mapping[str, keras.layers.Layer | None] | None) = None,
                 label_dp: LabelDPLayer | None = None, labels_privatized: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        parties = self._validate_bottoms(bottoms)
        if not isinstance(top, keras.layers.Layer):
            raise TypeError(f"VerticalModel: `top` must be a Keras model or layer; got "
                            f"{type(top).__name__}.")
        if any(top is b for b in bottoms.values()):
            raise ValueError("VerticalModel: `top` is also one of the `bottoms`.")
        if leader is not None and (not isinstance(leader, str) or leader not in bottoms):
            raise ValueError(f"VerticalModel: `leader` must be None (the leader has no bottom "
                             f"model) or one of the parties {parties}; got {leader!r}.")
        validate_label_protection(label_dp, labels_privatized, "VerticalModel")
        self.labels_privatized = labels_privatized
        self._parties = parties
        self._leader = leader
        self._followers = tuple(p for p in parties if p != leader)
        if not self._followers:
            raise ValueError("VerticalModel: there must be at least one follower (a party other "
                             f"than the leader {leader!r}).")
        protections = self._resolve_protections(embedding_dp)
        # Sorted dicts: a deterministic attribute layout for .keras saving.
        self.bottoms = {p: bottoms[p] for p in parties}
        self.top = top
        self.protections = {p: protections.get(p) for p in self._followers}
        self.label_dp = label_dp
        self.traffic = self._make_traffic_metrics()
        self._message_callbacks = []
        self._dispatcher = None
        self._fitting = False  # fit's validation runs through evaluate
        # What leaves a party without a DP mechanism, counted where it is sent:
        # one slot per follower (embedding calls), the last for training steps
        # whose cut gradients come from unprotected labels.
        self.unprotected_releases = counter_variable(len(self._followers) + 1)
        self._build_protocol()
        self._check_disjoint_variables()

    # --- validation ------------------------------------------------------------------

    @staticmethod
    def _validate_bottoms(bottoms):
        if not isinstance(bottoms, dict) or not bottoms:
            raise TypeError("VerticalModel: `bottoms` must be a non-empty dict party name -> "
                            f"Keras model; got {type(bottoms).__name__}.")
        for party, bottom in bottoms.items():
            validate_party_name(party, "VerticalModel", "party names in `bottoms`")
            if not isinstance(bottom, keras.layers.Layer):
                raise TypeError(f"VerticalModel: `bottoms[{party!r}]` must be a Keras model or "
                                f"layer; got {type(bottom).__name__}.")
        ids = [id(b) for b in bottoms.values()]
        if len(set(ids)) != len(ids):
            raise ValueError("VerticalModel: each party needs its own bottom model; the same "
                             "object appears for several parties in `bottoms`.")
        return tuple(sorted(bottoms))

    def _resolve_protections(self, embedding_dp):
        if embedding_dp is None:
            return {}
        if isinstance(embedding_dp, keras.layers.Layer):
            return {p: copy_protection(embedding_dp, p, "VerticalModel")
                    for p in self._followers}
        if not isinstance(embedding_dp, dict):
            raise TypeError("VerticalModel: `embedding_dp` must be None, a Keras layer or a dict "
                            f"party -> layer or None; got {type(embedding_dp).__name__}.")
        unknown = sorted(set(embedding_dp) - set(self._parties), key=str)
        if unknown:
            raise ValueError(f"VerticalModel: `embedding_dp` names unknown parties {unknown}; "
                             f"the parties are {list(self._parties)}.")
        out = {}
        for party, layer in embedding_dp.items():
            if layer is None:
                continue
            if party == self._leader:
                raise ValueError(f"VerticalModel: `embedding_dp[{party!r}]`: {party!r} is the "
                                 "leader, whose embedding never leaves it; only followers are "
                                 "protected.")
            if not isinstance(layer, keras.layers.Layer):
                raise TypeError(f"VerticalModel: `embedding_dp[{party!r}]` must be a Keras layer "
                                f"or None; got {type(layer).__name__}.")
            out[party] = layer
        ids = [id(layer) for layer in out.values()]
        if len(set(ids)) != len(ids):
            raise ValueError("VerticalModel: `embedding_dp` gives the same layer object to "
                             "several parties; they would share its secret key. Pass one layer "
                             "(each follower then gets its own copy) or one object per party.")
        return out

    def _check_disjoint_variables(self):
        owners = {}
        groups = [(p, self._party_layers(p)) for p in self._parties] + [("the top", [self.top])]
        for owner, layers in groups:
            for layer in layers:
                for v in layer.weights:
                    other = owners.setdefault(id(v), owner)
                    if other != owner:
                        raise ValueError(f"VerticalModel: variable {v.path!r} belongs to both "
                                         f"{other!r} and {owner!r}; parties cannot share "
                                         "weights in vertical FL.")

    def _party_layers(self, party):
        protection = self.protections.get(party)
        return [self.bottoms[party]] + ([protection] if protection is not None else [])

    def _make_traffic_metrics(self):
        names = ["bytes_up", "bytes_down"]
        for p in self._followers:
            names += [f"bytes_up_{p}", f"bytes_down_{p}"]
        # float64 holds every byte count exactly; JAX without x64 has no float64 (float32
        # would round above 2**24 bytes), so there the sums are int32
        dtype = "float64" if backend.is_tensorflow() else "int32"
        return {n: keras.metrics.Sum(name=n, dtype=dtype) for n in names}

    # --- building and the top's input rule --------------------------------------------

    def _build_protocol(self):
        """The parties' halves (their graph pieces) and the leader's, sharing this model's layers.

        Each party's forward pass is traced symbolically (its embedding's
        shape and dtype, checked), then the leader resolves the top's input
        rule and checks ``label_dp``'s classes against the top's outputs.
        """
        halves = {}
        for p in self._parties:
            if p == self._leader:
                halves[p] = PartyBottom(p, self.bottoms[p], None, sends=False,
                                        owner="VerticalModel")
            else:
                halves[p] = PartyBottom(p, self.bottoms[p], self.protections.get(p), sends=True,
                                        counter=SentCounter(self.unprotected_releases,
                                                         self._followers.index(p)),
                                        owner="VerticalModel")
        for half in halves.values():
            half.build_spec()
        # Plain Python objects holding this model's layers: kept out of Keras' tracking.
        object.__setattr__(self, "_halves", halves)
        self._input_specs = {p: halves[p].input_spec for p in self._parties}
        self._embedding_specs = {p: halves[p].embedding_tensor for p in self._parties}
        leader = VerticalLeader(
            self.top, {p: halves[p].spec for p in self._followers}, label_dp=self.label_dp,
            labels_privatized=self.labels_privatized,
            _counter=SentCounter(self.unprotected_releases, len(self._followers)),
            _owner="VerticalModel", _own_bottom=halves.get(self._leader), _standalone=False)
        object.__setattr__(self, "_leader_half", leader)
        # fit(class_weight=) with label_dp and message capture are the step's settings
        object.__setattr__(self, "_protocol_step",
                           VerticalStep(self, halves, leader, self._split_inputs))
        self.built = True

    def _validate_fit_labels(self, y):
        """Check array labels against ``label_dp`` eagerly, before Keras traces anything."""
        self._leader_half.validate_labels(y)

    def _combine(self, sent):
        return self._leader_half.combine(sent)

    def split_parties(self, **kwargs: Any) -> VerticalParties:
        """The halves of this model, sharing its layers (see `split_parties`).

        Args:
            **kwargs: ``optimizer``, ``loss``, ``metrics``, ``class_weight``,
                ``label_free_sample_weight`` of `split_parties`.

        Returns:
            A `VerticalParties`: ``.leader`` (`VerticalLeader`) and
            ``.followers`` (follower name -> `VerticalFollower`).
        """
        return split_parties(self, **kwargs)

    # --- the protocol ------------------------------------------------------------------

    def _split_inputs(self, inputs):
        self._check_features(inputs, "VerticalModel")  # static shapes when traced
        return {p: inputs[p] for p in self._parties}, inputs.get(EXAMPLE_IDS_KEY)

    def _dict_rule(self):
        return (f"a dict {{party name: array}} with the keys {list(self._parties)} (plus optional "
                f"{EXAMPLE_IDS_KEY!r}, see with_example_ids)")

    def _check_features(self, features, where):
        """The party dict's keys, and each party's arrays (or tensors, or `tf.TensorSpec`s)
        against that party's bottom inputs: ValueError naming the party and both shapes."""
        if not isinstance(features, dict):
            raise TypeError(f"{where}: a VerticalModel takes its inputs as {self._dict_rule()}; "
                            f"got {_describe(features)}.")
        missing = [p for p in self._parties if p not in features]
        unknown = sorted(str(k) for k in features
                         if k not in self._parties and k != EXAMPLE_IDS_KEY)
        if missing or unknown:
            raise ValueError(f"{where}: the input dict must have the keys {list(self._parties)} "
                             f"(plus optional {EXAMPLE_IDS_KEY!r}); missing {missing}, unknown "
                             f"{unknown}.")
        expected = {p: [_dims(t) for t in tree.flatten(self._input_specs[p])]
                    for p in self._parties}
        for p in self._parties:
            given = [_dims(t) for t in tree.flatten(features[p])]
            if len(given) == len(expected[p]) and all(map(_fits, given, expected[p])):
                continue
            want = ", ".join(_shape_text(d, batch=True) for d in expected[p])
            got = ", ".join("unknown" if d is None else _shape_text(d) for d in given)
            owners = [q for q in self._parties if q != p and len(given) == len(expected[q])
                      and all(map(_fits, given, expected[q]))]
            hint = (f" Party {owners[0]!r} takes that shape: are two parties' arrays swapped?"
                    if owners else "")
            raise ValueError(f"{where}: the features of party {p!r} must have shape {want} (its "
                             f"bottom model's input); got shape {got}.{hint}")

    def _check_entry(self, x, method, unique_ids=False):
        """Check ``x`` of fit / evaluate / predict where that is cheap, before Keras converts
        or traces anything: a dict of arrays, or a `tf.data.Dataset`'s element spec (other
        inputs, e.g. generators, are checked when the step is traced)."""
        where = f"VerticalModel.{method}"
        if is_tf_dataset(x):
            spec = x.element_spec
            features = spec[0] if isinstance(spec, tuple) and spec else spec
            if not isinstance(features, dict):
                raise TypeError(f"{where}: a VerticalModel takes a tf.data.Dataset whose elements "
                                f"are (features, labels[, sample_weight]) or features alone, "
                                f"with features {self._dict_rule()}; the dataset's features are "
                                f"{_describe(features)}.")
            self._check_features(features, where)
        elif isinstance(x, dict):
            self._check_features(x, where)
            if x.get(EXAMPLE_IDS_KEY) is not None:
                # before Keras converts them: on JAX (no int64) ids past 2**31 would wrap onto
                # other ids, and two examples would share their id-keyed noise
                host_example_ids(x[EXAMPLE_IDS_KEY], where)
            if unique_ids and x.get(EXAMPLE_IDS_KEY) is not None:
                ids = np.asarray(x[EXAMPLE_IDS_KEY]).reshape(-1)
                repeat = find_repeat(ids) if ids.dtype.kind in "iu" else None
                if repeat is not None:
                    raise ValueError(
                        f"{where}: invalid example_ids: `example_ids` must be unique, one id per "
                        f"example (label_dp randomizes each example once, keyed by its id); "
                        f"position {repeat[0]} repeats the id at position {repeat[1]}. "
                        f"with_example_ids(x) gives the ids 0 .. N-1.")
        elif x is not None and (hasattr(x, "shape") or isinstance(x, (list, tuple))):
            raise TypeError(f"{where}: a VerticalModel takes `x` as {self._dict_rule()}, or a "
                            f"tf.data.Dataset of such dicts; got {_describe(x)}.")

    # --- releases charged to every example ----------------------------------------------

    def _release_calls(self):
        """Per follower whose protection counts releases: (calls with ids, calls without)."""
        out = {}
        for p in self._followers:
            layer = self.protections.get(p)
            if isinstance(layer, ReleaseCounterMixin):
                calls = layer.release_calls()
                out[p] = (calls["fresh_with_ids"], calls["fresh_without_ids"])
        return out

    def _warn_if_charged_to_all(self, method, before):
        """Warn (once per call) if ``method`` released embeddings without example ids from a
        protection that counts per example id: each such call is recorded as a release of
        every example, the training rows included."""
        after = self._release_calls()
        charged = {p: after[p][1] - before[p][1] for p in before
                   if before[p][0] > 0 and after[p][1] > before[p][1]}
        if not charged:
            return
        fix = (f"model.{method}(with_example_ids(x_test, start=N), ...)" if not self._fitting
               else "fit(..., validation_data=(with_example_ids(x_val, start=N), y_val))")
        method = "fit (validation_data)" if self._fitting else method
        warnings.warn(
            f"VerticalModel.{method} ran without example ids, so each of its "
            f"{max(charged.values())} batch(es) released the embeddings of "
            f"{', '.join(repr(p) for p in charged)} with no example named: the privacy report "
            f"records each as a release of EVERY example, the training rows included. To charge "
            f"only the rows you pass, give them ids that the training data does not use, e.g. "
            f"{fix} with N the number of training rows.", UserWarning, stacklevel=3)

    def _party_forward(self, party, features, training, example_ids=None):
        """Party's side: (raw embedding, what it sends, its own losses); see `PartyBottom`."""
        return self._halves[party].forward(features, example_ids, training=training)

    # `.keras`: the counts of unprotected releases travel with the model, so a
    # reloaded model still reports that labels or embeddings left in the clear.
    def save_own_variables(self, store: Any) -> None:
        super().save_own_variables(store)
        store["unprotected_releases"] = np.asarray(self.unprotected_releases.numpy())

    def load_own_variables(self, store: Any) -> None:
        if "unprotected_releases" in store:
            saved = np.asarray(store["unprotected_releases"], np.int64).reshape(
                self.unprotected_releases.shape)  # restoring never rewinds: the larger count
            self.unprotected_releases.assign(np.maximum(self.unprotected_releases.numpy(), saved))
            store = {k: store[k] for k in store.keys() if k != "unprotected_releases"}
        super().load_own_variables(store)

    def privacy_ledger(self) -> ReleaseLedger:
        """What this model sent without a DP mechanism (`ReleaseLedger`, unit: example).

        The protections' own releases are in their ledgers (found by
        `keras_fedpriv.privacy.privacy_report` through the model's layers).
        Recorded here: embeddings of followers without a protection that
        keeps a ledger, and training steps without ``label_dp`` (the cut
        gradients sent to the followers are computed from the true labels).
        """
        ledgers = [follower_unprotected_ledger(p, self.protections.get(p),
                                               self._halves[p].unprotected_count())
                   for p in self._followers]
        ledgers.append(leader_unprotected_ledger(self._leader_half.unprotected_count()))
        return ReleaseLedger.merged(ledgers)

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        features, ids = self._split_inputs(inputs)
        sent = {p: self._party_forward(p, features[p], training, ids)[1] for p in self._parties}
        return self.top(self._combine(sent), training=training)

    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None,
                     sample_weight: Any = None, training: bool = True) -> Any:
        """The leader's loss: the compiled loss plus the top model's own losses.

        The parties' own losses (``add_loss`` and weight regularizers inside a
        bottom or protection layer) belong to those parties; ``train_step`` and
        ``test_step`` add them to the reported loss and each party
        differentiates its own.
        """
        del x, training
        return leader_loss(private.model_compile_loss(self), y, y_pred, sample_weight,
                           private.own_losses(self) + list(self.top.losses))

    def _input_flag_layers(self):
        layers = [self.label_dp] + [self.protections[p] for p in self._followers]
        return [layer for layer in layers if isinstance(layer, InputErrorFlagMixin)]

    def check_input_errors(self) -> None:
        """Raise if a protection layer met invalid inputs in a compiled (XLA) step.

        Called after every train, test and predict step by the model's step
        functions; see `LabelDPLayer.check_input_errors`.
        """
        for layer in self._input_flag_layers():
            layer.check_input_errors()

    # The steps run through the backend (`vertical_train_step`, `vertical_test_step`): on
    # TensorFlow they are the protocol's steps (`protocol_step`) as they are; on JAX the same
    # steps run stateless over the state Keras' functional trainer passes (see
    # `keras_fedpriv.backend.jax`).

    @property
    def protocol_step(self) -> VerticalStep:
        """The protocol's training and evaluation steps of this model (`VerticalStep`), which
        ``train_step`` and ``test_step`` run through the backend."""
        return self._protocol_step

    def train_step(self, *args: Any) -> Any:
        """One step of the protocol (`VerticalStep.train`); ``(data)`` on TensorFlow,
        ``(state, data)`` on JAX (Keras' functional trainer)."""
        return backend.impl().vertical_train_step(self, *args)

    def test_step(self, *args: Any) -> Any:
        """Evaluation (`VerticalStep.test`); ``(data)`` on TensorFlow, ``(state, data)`` on
        JAX."""
        return backend.impl().vertical_test_step(self, *args)

    # --- message capture ---------------------------------------------------------------

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
            verbose: str | int = "auto",
            callbacks: list[keras.callbacks.Callback] | None = None,
            label_free_sample_weight: bool = False, **kwargs: Any) -> keras.callbacks.History:
        """`keras.Model.fit`; `MessageCallback`\\ s among ``callbacks`` receive the messages.

        With ``label_dp``: ``class_weight`` is applied inside ``train_step`` to
        the randomized labels (not by Keras to the true labels), and sample
        weights (the ``sample_weight`` argument or a third element of the
        data) are refused unless ``label_free_sample_weight=True``.

        Args:
            label_free_sample_weight: set True to confirm that the sample
                weights you pass do not depend on the labels (with
                ``label_dp`` they would otherwise reveal them through the
                gradients sent to the followers). Ignored without ``label_dp``.
            x, y, batch_size, epochs, verbose, callbacks, **kwargs: as in
                `keras.Model.fit`.

        Returns:
            The `keras.callbacks.History`.
        """
        if not isinstance(label_free_sample_weight, bool):
            raise TypeError(f"VerticalModel.fit: `label_free_sample_weight` must be a bool; got "
                            f"{label_free_sample_weight!r}.")
        self._check_entry(x, "fit", unique_ids=self.label_dp is not None)
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)) and validation:
            validation = validation[0]
        self._check_entry(validation, "fit (validation_data)")
        class_weight = None
        if self.label_dp is not None:
            self._validate_fit_labels(y)
            if kwargs.get("sample_weight") is not None and not label_free_sample_weight:
                raise ValueError(SAMPLE_WEIGHT_REFUSAL)
            class_weight = kwargs.pop("class_weight", None)
            if class_weight is not None:
                class_weight = validate_class_weight(class_weight, "VerticalModel.fit")
        step = self._protocol_step
        if (class_weight, label_free_sample_weight) != \
                (step.class_weight, step.label_free_sample_weight):
            step.class_weight = class_weight
            step.label_free_sample_weight = label_free_sample_weight
            self.train_function = None  # retrace with the new weighting
        if isinstance(callbacks, keras.callbacks.CallbackList):
            listed = callbacks.callbacks
        else:
            listed = list(callbacks or [])
            callbacks = listed
        watchers = [c for c in listed if isinstance(c, MessageCallback)]
        if watchers and self.steps_per_execution != 1:
            raise ValueError(f"VerticalModel: message callbacks "
                             f"({', '.join(type(c).__name__ for c in watchers)}) need "
                             f"steps_per_execution=1 (one step's messages per call); the model "
                             f"was compiled with steps_per_execution={self.steps_per_execution}.")
        capture = bool(watchers)
        if capture != step.capture_messages:
            step.capture_messages = capture
            self.train_function = None  # retrace with / without message outputs
        dispatcher = None
        if capture:
            dispatcher = _MessageDispatcher()
            listed.insert(0, dispatcher)
            if isinstance(callbacks, keras.callbacks.CallbackList):
                dispatcher.set_model(self)
        self._message_callbacks = watchers
        self._dispatcher = dispatcher
        self._fitting = True
        try:
            return super().fit(x, y, batch_size=batch_size, epochs=epochs, verbose=verbose,
                               callbacks=callbacks, **kwargs)
        except backend.impl().traced_check_errors() as error:
            short = label_assert_message(error) or traced_check_message(error)
            if short is None:
                raise
            raise ValueError(f"VerticalModel.fit: {short}") from None
        finally:
            if dispatcher is not None and dispatcher in listed:
                listed.remove(dispatcher)
            self._message_callbacks = []
            self._dispatcher = None
            self._fitting = False

    def evaluate(self, x: Any = None, y: Any = None, *args: Any,
                 **kwargs: Any) -> Any:
        """`keras.Model.evaluate`, with the inputs checked first.

        Evaluation releases every follower's embedding again (its protection
        randomizes at inference). Pass example ids that the training data does
        not use (``with_example_ids(x_test, start=N)``, N = the number of
        training rows) so only the test rows are charged. Without ids each
        batch counts as a release of every example; if the protections have
        per-example counts (the model was trained with ids), a `UserWarning`
        says so once per call. The release is recorded either way.

        Args:
            x, y, *args, **kwargs: as in `keras.Model.evaluate`.

        Returns:
            What `keras.Model.evaluate` returns.
        """
        self._check_entry(x, "evaluate")
        before = self._release_calls()
        try:
            return super().evaluate(x, y, *args, **kwargs)
        finally:
            self._warn_if_charged_to_all("evaluate", before)

    def predict(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        """`keras.Model.predict`, with the inputs checked first.

        Example ids as in `evaluate`: without them each batch counts as a
        release of every example, with a `UserWarning` once per call when the
        protections have per-example counts.

        Args:
            x, *args, **kwargs: as in `keras.Model.predict`.

        Returns:
            What `keras.Model.predict` returns.
        """
        self._check_entry(x, "predict")
        before = self._release_calls()
        try:
            return super().predict(x, *args, **kwargs)
        finally:
            self._warn_if_charged_to_all("predict", before)

    # Keras' step functions, wrapped: after every step the protection layers' input checks
    # and, in training, the captured messages go to the message callbacks.
    # (TensorFlow: ``function(iterator) -> logs``; JAX: ``function(state, iterator) ->
    # (logs, state)``; `wrap_step_function` keeps each backend's form.)

    def _after_train_step(self, logs):
        self.check_input_errors()
        if isinstance(logs, dict) and MESSAGES_KEY in logs:
            logs = dict(logs)
            self._dispatch(logs.pop(MESSAGES_KEY))
        return logs

    def _after_reads_state(self):
        """Whether `_after_step` reads variables (the input-error flags of the layers)."""
        return bool(self._input_flag_layers())

    def _after_step(self, outputs):
        self.check_input_errors()
        return outputs

    def _wrapped_step_function(self, kind, after, force):
        """Keras' ``{kind}_function`` (``kind``: train, test or predict), made once (again
        with ``force``) and wrapped to run ``after`` on the outputs of every call."""
        attribute = f"{kind}_function"
        if getattr(self, attribute) is not None and not force:
            return getattr(self, attribute)
        getattr(super(), f"make_{attribute}")(force=True)
        setattr(self, attribute, backend.impl().wrap_step_function(
            getattr(self, attribute), after, self._after_reads_state, self))
        return getattr(self, attribute)

    def make_train_function(self, force: bool = False) -> Callable[..., Any]:
        return self._wrapped_step_function("train", self._after_train_step, force)

    def make_test_function(self, force: bool = False) -> Callable[..., Any]:
        return self._wrapped_step_function("test", self._after_step, force)

    def make_predict_function(self, force: bool = False) -> Callable[..., Any]:
        return self._wrapped_step_function("predict", self._after_step, force)

    def _dispatch(self, captured):
        if not self._message_callbacks:
            return
        arrays = tree.map_structure(lambda t: np.asarray(t), captured)
        epoch = self._dispatcher.epoch if self._dispatcher is not None else 0
        step = self._dispatcher.step if self._dispatcher is not None else 0
        parties = {}
        for p in self._followers:
            e, g = arrays["up"][p], arrays["down"][p]
            rows, coords = e.shape[0], int(np.prod(e.shape[1:]))
            up = up_bytes(rows, coords, e.dtype.itemsize, self._halves[p].spec.bits)
            parties[p] = PartyMessages(embeddings=e, gradients=g, bytes_up=int(up),
                                       bytes_down=int(rows * coords * g.dtype.itemsize))
        messages = StepMessages(
            epoch=epoch, step=step, parties=parties,
            evaluation=EvaluationData(labels=arrays["labels"],
                                      noisy_labels=arrays["noisy_labels"],
                                      example_ids=arrays.get("example_ids")))
        for callback in self._message_callbacks:
            callback.on_messages(step, messages)

    # --- per-party access and export -----------------------------------------------------

    @property
    def parties(self) -> tuple[str, ...]:
        """All party names, sorted."""
        return self._parties

    @property
    def followers(self) -> tuple[str, ...]:
        """The parties that send embeddings (all but the leader), sorted."""
        return self._followers

    @property
    def leader(self) -> str | None:
        """The leader's party name, or None (the leader has no bottom of its own)."""
        return self._leader

    @property
    def wire_format(self) -> dict[str, dict[str, Any]]:
        """Per follower: how its messages are encoded and their size per example.

        A dict follower -> dict with ``"up"`` (``"1-bit packed"`` or the
        float dtype), ``"up_bytes_per_example"``, ``"down"`` and
        ``"down_bytes_per_example"``.
        """
        return {p: {"up": "1-bit packed" if spec.bits else spec.dtype,
                    "up_bytes_per_example": spec.bytes_up_per_example,
                    "down": spec.dtype, "down_bytes_per_example": spec.bytes_down_per_example}
                for p, spec in ((p, self._halves[p].spec) for p in self._followers)}

    def _check_party(self, party):
        if party not in self._parties:
            raise ValueError(f"VerticalModel: unknown party {party!r}; the parties are "
                             f"{list(self._parties)}.")

    def party_embeddings(self, party: str, x: Any, training: bool = False) -> np.ndarray:
        """What ``party`` computes for ``x``: a follower's message (after its protection),
        or the leader's own (never sent) embedding.

        Args:
            party: a party name.
            x: that party's features, or the whole input dict (``x[party]`` is used).
            training: the protection's and bottom's training flag.

        Returns:
            A numpy array (batch, ...).
        """
        self._check_party(party)
        if isinstance(x, dict) and party in x:
            x = x[party]
        return np.asarray(self._party_forward(party, x, training=training)[1])

    def export_party(self, party: str, filepath: str, verbose: bool = False) -> None:
        """Export one party's part as a TensorFlow SavedModel (endpoint ``serve``).

        * A follower's SavedModel maps its features to exactly what it sends:
          its bottom followed by its protection (an `EmbeddingDPLayer` with
          ``at_inference=True`` keeps randomizing; its secret key is not
          stored, and the reloaded SavedModel draws a fresh key at each call).
        * The leader's SavedModel is `export_leader`'s.

        Reload with ``tf.saved_model.load(filepath).serve(features)``.
        """
        self._check_party(party)
        backend.require_tensorflow("VerticalModel.export_party (a TensorFlow SavedModel)",
                                   _EXPORT_ON_JAX)
        if party == self._leader:
            return self.export_leader(filepath, verbose=verbose)
        bottom, protection = self.bottoms[party], self.protections.get(party)
        archive = keras.export.ExportArchive()
        archive.track(bottom)
        if protection is not None:
            archive.track(protection)

        def serve(features):
            z = bottom(features, training=False)
            return z if protection is None else protection(z, training=False)

        archive.add_endpoint("serve", serve, input_signature=[self._tensor_spec(party)])
        archive.write_out(filepath, verbose=verbose)

    def export_leader(self, filepath: str, verbose: bool = False) -> None:
        """Export the leader's part as a SavedModel: its bottom (if any) + the top.

        Endpoint ``serve(inputs)``: ``inputs`` is a dict keyed by party name,
        holding the leader's own features under the leader's name and, under
        each follower's name, the message that follower sent (its
        `export_party` output). Returns the top's prediction.
        """
        backend.require_tensorflow("VerticalModel.export_leader (a TensorFlow SavedModel)",
                                   _EXPORT_ON_JAX)
        import tensorflow as tf

        archive = keras.export.ExportArchive()
        signature = {}
        for p in self._parties:
            if p == self._leader:
                archive.track(self.bottoms[p])
                signature[p] = self._tensor_spec(p)
            else:
                spec = self._embedding_specs[p]
                signature[p] = tf.TensorSpec((None,) + tuple(spec.shape[1:]), spec.dtype, name=p)
        archive.track(self.top)

        def serve(inputs):
            sent = {}
            for p in self._parties:
                if p == self._leader:
                    sent[p] = self.bottoms[p](inputs[p], training=False)
                else:
                    sent[p] = inputs[p]
            return self.top(self._combine(sent), training=False)

        archive.add_endpoint("serve", serve, input_signature=[signature])
        archive.write_out(filepath, verbose=verbose)

    def export(self, filepath: str, format: str = "tf_saved_model", verbose: bool | None = None,
               input_signature: Any = None, **kwargs: Any) -> Any:
        """`keras.Model.export` with the parties' input signature filled in.

        The whole model in one SavedModel (all parties' parts together: for
        tests and single-site serving; in deployment each party serves only
        its own part, see `export_party`). ``input_signature`` defaults to
        one dict keyed by party name with each party's feature spec.
        """
        backend.require_tensorflow("VerticalModel.export (a TensorFlow SavedModel)",
                                   _EXPORT_ON_JAX)
        if input_signature is None:
            input_signature = [{p: self._tensor_spec(p) for p in self._parties}]
        return super().export(filepath, format=format, verbose=verbose,
                              input_signature=input_signature, **kwargs)

    def _tensor_spec(self, party):
        """``party``'s feature spec (batch dimension None), named after the party.

        A party with several feature tensors gets ``{party}_0``, ``{party}_1``,
        ... in the flattened order of its inputs.
        """
        import tensorflow as tf

        flat = tree.flatten(self._input_specs[party])
        names = [party] if len(flat) == 1 else [f"{party}_{i}" for i in range(len(flat))]
        specs = [tf.TensorSpec((None,) + tuple(t.shape[1:]), t.dtype, name=name)
                 for t, name in zip(flat, names)]
        return tree.pack_sequence_as(self._input_specs[party], specs)

    # --- serialization -------------------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        ser = keras.saving.serialize_keras_object
        return {
            "name": self.name,
            "trainable": self.trainable,
            "bottoms": {p: ser(b) for p, b in self.bottoms.items()},
            "top": ser(self.top),
            "leader": self._leader,
            "embedding_dp": {p: (None if layer is None else ser(layer))
                             for p, layer in self.protections.items()},
            "label_dp": None if self.label_dp is None else ser(self.label_dp),
            "labels_privatized": self.labels_privatized,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any],
                    custom_objects: Mapping[str, Any] | None = None) -> VerticalModel:
        config = dict(config)
        de = keras.saving.deserialize_keras_object

        def load(item):
            return None if item is None else de(item, custom_objects=custom_objects)

        config["bottoms"] = {p: load(b) for p, b in config["bottoms"].items()}
        config["top"] = load(config["top"])
        if isinstance(config.get("embedding_dp"), dict):
            config["embedding_dp"] = {p: load(x) for p, x in config["embedding_dp"].items()}
        else:
            config["embedding_dp"] = load(config.get("embedding_dp"))
        config["label_dp"] = load(config.get("label_dp"))
        return cls(**config)



class _MessageDispatcher(keras.callbacks.Callback):
    """Tracks the epoch and step for `VerticalModel._dispatch` (inserted by ``fit``)."""

    def __init__(self):
        super().__init__()
        self.epoch = 0
        self.step = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = int(epoch)
        self.step = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.step = int(batch)
