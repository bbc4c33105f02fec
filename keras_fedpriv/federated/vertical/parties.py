"""The two halves of vertical FL: what a follower runs and what the leader runs.

Neither half knows how messages travel. `VerticalModel` runs the same pieces
inside one Keras ``train_step``; the loop that drives the standalone halves
is `keras_fedpriv.federated.vertical.loop` (`run_leader`,
`serve_request`), which `keras_fedpriv.federated.vertical.driver` runs in one
process and `keras_fedpriv.federated.flower.vertical` as Flower apps.

* `PartyBottom`: one party's bottom model and, for a follower, its
  protection (an `EmbeddingDPLayer`, any Keras layer, or none; a `VAEBottom`
  is a bottom whose own sampling protects). Its ``forward`` and
  ``gradients`` are the graph pieces every runtime uses.
* `VerticalFollower` (a `PartyBottom` with its own optimizer): ``embed``
  returns the wire message of a batch (`encode_embedding`: packed bits for
  an `EmbeddingDPLayer`, the float embedding otherwise) and records the
  release; ``apply_gradients`` takes the cut gradient the leader sent back
  and updates the bottom.
* `VerticalLeader`: the labels (with `LabelDPLayer` applied once per
  example), its own bottom if any, the top model, the loss and its
  optimizer. ``step`` takes the embeddings received and returns the cut
  gradient of every follower.

`split_parties` (or `VerticalModel.split_parties`) hands out the halves of a
built `VerticalModel`, sharing its layers: build one model with the same
seeds everywhere, give each party its half.

**How a follower computes its gradients.** The leader's answer comes after
the follower's forward pass, possibly in another process (Flower's
Deployment Engine starts a process per message). So ``embed`` keeps the
batch and the state of its layers from before the pass (random counters,
release counts, seed generators; see `keras_fedpriv.layers.local_state`),
and ``apply_gradients`` runs the forward pass again from that state, under a
tape: the same counters give the same noise, so the recomputed message is the
one that was sent (checked: bit for bit for packed bits, else to float
rounding), and the gradient is the one ``VerticalModel`` computes. The state
after the first pass is then restored: the second pass is neither a new
draw nor a new release.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import keras

from keras_fedpriv.federated.vertical.follower import VerticalFollower
from keras_fedpriv.federated.vertical.leader import VerticalLeader
from keras_fedpriv.federated.vertical.party import PartyBottom, SentCounter, optimizer_copy

__all__ = ["VerticalParties", "split_parties"]


@dataclasses.dataclass
class VerticalParties:
    """The halves of a vertical model: one leader and its followers.

    Attributes:
        leader: the `VerticalLeader`.
        followers: follower name -> `VerticalFollower`, sorted by name.
    """

    leader: VerticalLeader
    followers: dict[str, VerticalFollower]

    def privacy_protections(self) -> list[Any]:
        """Every half (so `privacy_report(parties)` composes what each party recorded)."""
        return [self.leader, *self.followers.values()]


def _optimizer_factory(optimizer, model, owner):
    if optimizer is None:
        base = getattr(model, "optimizer", None)
        if base is None:
            raise ValueError(f"{owner}: the model is not compiled; pass `optimizer=`.")
        return lambda: optimizer_copy(base)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return lambda: optimizer_copy(optimizer)
    if isinstance(optimizer, str):
        return lambda: keras.optimizers.get(optimizer)
    if callable(optimizer):
        return optimizer
    raise TypeError(f"{owner}: `optimizer` must be None (a copy of the model's), a Keras "
                    f"optimizer, its name, or a function returning one; got "
                    f"{type(optimizer).__name__}.")


def split_parties(model: Any, *, optimizer: Any = None, loss: Any = None,
                  metrics: Sequence[Any] | None = None,
                  class_weight: Mapping[int, float] | None = None,
                  label_free_sample_weight: bool = False) -> VerticalParties:
    """The halves of a `VerticalModel`, sharing its layers.

    Every half gets its own optimizer (a copy of the model's, with the
    same settings and fresh state) and counts what it sends without a DP
    mechanism in its own slot of the model's counter, so
    ``privacy_report(parties)`` and ``privacy_report(model)`` agree.

    Args:
        model: a built `VerticalModel` (compiled, unless ``optimizer`` and
            ``loss`` are given).
        optimizer: None (copies of the model's optimizer), a Keras optimizer
            (copied per party), its name, or a function returning a new one.
        loss: None (the model's compiled loss) or a loss for the leader.
        metrics: metrics for `VerticalLeader.evaluate`.
        class_weight: the leader's class weights (applied to randomized
            labels).
        label_free_sample_weight: see `VerticalLeader`.

    Returns:
        A `VerticalParties` (``.leader``, ``.followers``).
    """
    owner = "split_parties"
    if not getattr(model, "_is_vertical_model", False):
        raise TypeError(f"{owner}: `model` must be a VerticalModel; got {type(model).__name__}.")
    make_optimizer = _optimizer_factory(optimizer, model, owner)
    if loss is None:
        loss = getattr(model, "loss", None)
        if loss is None:
            raise ValueError(f"{owner}: the model has no compiled loss; pass `loss=`.")
    variable = model.unprotected_releases
    followers = {}
    for i, p in enumerate(model.followers):
        followers[p] = VerticalFollower(p, model.bottoms[p], model.protections.get(p),
                                        optimizer=make_optimizer(),
                                        _counter=SentCounter(variable, i))
    own = None
    if model.leader is not None:
        own = PartyBottom(model.leader, model.bottoms[model.leader], None, sends=False,
                          owner="VerticalLeader")
        own.build_spec()
    leader = VerticalLeader(model.top, {p: f.spec for p, f in followers.items()},
                            label_dp=model.label_dp, labels_privatized=model.labels_privatized,
                            loss=loss, optimizer=make_optimizer(), metrics=metrics,
                            class_weight=class_weight,
                            label_free_sample_weight=label_free_sample_weight,
                            _counter=SentCounter(variable, len(model.followers)), _own_bottom=own)
    return VerticalParties(leader, followers)
