"""Regression tests from an adversarial review of the release ledger.

Each test failed on the first version of the ledger (its docstring says what leaked or was
under-counted, and by how much) and passes now; the one marked xfail is a documented
limitation. They are written against the documented API (no private hooks are needed to trigger
any of them; private attributes are read only to show the evidence).
"""

import math

import keras
import numpy as np
import pytest

import keras_fedpriv as kf
from keras_fedpriv.callbacks import LaplaceEvaluation
from keras_fedpriv.mechanisms import randomized_response_dp_event
from keras_fedpriv.mechanisms.quantize import quantize_rr_dp_event
from keras_fedpriv.optimizers import SignDSEncoder
from keras_fedpriv.privacy import privacy_report
from ledger_cases import by_hand, vertical_model

pytestmark = [pytest.mark.jax]



# ------------------------------------------------------------------------- HIGH
def test_keyed_label_dp_rerandomizes_after_reload_but_ledger_counts_one_release(tmp_path):
    """LabelDPLayer keyed by example id (the default, seed=None) records ONE release per
    example "however many calls". But its key is deliberately not saved: a model reloaded from
    `.keras` (or restored from a tf.train.Checkpoint) draws a fresh key, so resuming training
    randomizes every label AGAIN, independently (here ~40% of the 128 noisy labels change).
    The release counts travel with the model (save_own_variables), so the reloaded model's
    report still says one release: eps 1.0 where two independent binary RR at eps=1 compose
    to eps 2.0 (under-count by 2x; k resumes -> k x)."""
    model, x, y = vertical_model(label_dp=kf.LabelDPLayer(eps=1.0),
                            embedding_dp=kf.EmbeddingDPLayer(eps=2.0))
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    ids = x["example_ids"]
    first = np.asarray(model.label_dp(y, example_ids=ids, training=True))

    path = str(tmp_path / "vertical.keras")
    model.save(path)
    resumed = keras.models.load_model(path)
    second = np.asarray(resumed.label_dp(y, example_ids=ids, training=True))
    resumed.fit(x, y, epochs=1, batch_size=64, verbose=0)  # trains on the new noisy labels

    # evidence of a second, independent randomization (the same coins would change none): two
    # independent releases at eps=1 differ on a label with probability 0.393, and on 10 or fewer
    # of the 128 with probability 5.7e-16 (20 or fewer: 4.8e-9)
    assert (first != second).sum() > 10
    two_releases = by_hand([(randomized_response_dp_event(1.0, 2), 2)])
    assert privacy_report(resumed, protects="labels").epsilon == pytest.approx(
        two_releases, rel=2e-3)


def test_vertical_model_reloaded_forgets_that_true_labels_were_sent():
    """A VerticalModel trained without label_dp sends cut gradients computed from the TRUE
    labels; its in-graph counter `unprotected_releases` makes the report inf. That counter is a
    plain local variable that `.keras` saving does not carry (VerticalModel has no
    save_own_variables), so the reloaded model reports a finite eps (8.0 here: only the
    follower's EmbeddingDP) for a run that released the labels with no DP at all."""
    model, x, y = vertical_model(embedding_dp=kf.EmbeddingDPLayer(eps=2.0, seed=0))
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    assert math.isinf(privacy_report(model).epsilon)

    import tempfile, os  # noqa: E401
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "vertical.keras")
        model.save(path)
        reloaded = keras.models.load_model(path)
    # the protection's own counts did survive the reload ...
    assert privacy_report(reloaded.protections["party_a"]).epsilon > 0
    # ... the "labels sent in the clear" record did not
    assert math.isinf(privacy_report(reloaded).epsilon)


# ----------------------------------------------------------------------- MEDIUM
def test_embedding_dp_accounts_every_release_at_the_last_seen_dimension():
    """EmbeddingDPLayer's ledger event is `quantize_rr_dp_event(eps, d)` with d =
    `_num_coordinates`, which `_record_shape` overwrites at every call (last call wins). A layer
    that released a 64-coordinate embedding and then a 2-coordinate one reports both as
    2-coordinate releases: eps 2.0 instead of 23.0 (PLD; 33 by basic composition) (same with
    variable-length sequence embeddings (batch, T, d) whose T changes between batches)."""
    layer = kf.EmbeddingDPLayer(eps=1.0, seed=1)
    layer(np.random.randn(4, 64).astype("float32"), training=True)
    layer(np.random.randn(4, 2).astype("float32"), training=True)
    expected = by_hand([(quantize_rr_dp_event(1.0, 64), 1), (quantize_rr_dp_event(1.0, 2), 1)])
    # Fixed by pricing every release at the largest row size seen: never below the truth.
    bound = by_hand([(quantize_rr_dp_event(1.0, 64), 2)])
    assert expected < privacy_report(layer).epsilon == pytest.approx(bound, rel=2e-3)


def test_laplace_evaluation_restored_from_state_dict_reports_no_releases():
    """LaplaceEvaluation.state_dict() carries `client_releases` (client 0: 3 releases), and
    `load_state_dict` restores them into the object, but the ledger that privacy_report reads is
    not restored: a resumed run (HorizontalFL(initial_round=...) with a callback rebuilt via
    from_config + load_state_dict) reports eps 0 for the 3 noisy evaluations of client 0 that
    happened before the checkpoint (6.0 at eps=2). The same holds for MagRR, SignDSEncoder and GaussianUpload,
    whose state_dict carries `num_releases` but not their ledger."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    rng = np.random.default_rng(0)
    clients = [rng.normal(size=(6, 4)).astype("float32") for _ in range(2)]
    original = LaplaceEvaluation(eps=2.0, from_logits=True, seed=0)
    for _ in range(3):
        original.evaluate(clients, [0, 1], model=model)
    before = privacy_report(original).epsilon
    assert before > 0

    restored = LaplaceEvaluation.from_config(original.get_config())
    restored.load_state_dict(original.state_dict())
    assert restored.client_releases == {0: 3, 1: 3}  # the object knows ...
    assert privacy_report(restored).epsilon == pytest.approx(before, rel=2e-3)  # ... the report not


def test_signds_encoder_restored_from_state_dict_forgets_its_releases():
    """SignDSEncoder (seeded, as required to resume its stream): after 4 messages,
    from_config + load_state_dict(state_dict()) knows num_releases == 4 but its ledger is empty,
    so a resumed client's report counts only the messages after the resume (eps 10 instead of
    the 50 that 5 messages at eps=10 cost)."""
    enc = SignDSEncoder(k=0.2, eps=10.0, seed=3)
    delta = np.random.default_rng(0).normal(size=200).astype("float32")
    for _ in range(4):
        enc.encode(delta)
    restored = SignDSEncoder.from_config(enc.get_config())
    restored.load_state_dict(enc.state_dict())
    assert restored.num_releases == 4
    restored.encode(delta)
    five = SignDSEncoder(k=0.2, eps=10.0)
    for _ in range(5):
        five.encode(delta)
    assert privacy_report(restored).epsilon == pytest.approx(privacy_report(five).epsilon,
                                                             rel=2e-3)


# -------------------------------------------------------------------------- LOW
@pytest.mark.xfail(strict=True, reason="known limitation, documented in docs/privacy.md: a "
                   "protection that no path reaches from the objects passed is not in the report")
def test_protection_called_inside_a_lambda_is_not_reachable_from_the_model():
    """A protection used through a keras Lambda (or any closure Keras does not track) releases
    (the layer's own counter shows one anonymous release = every example) but no path from the
    model leads to it, so privacy_report(model) reports eps 0.0 for a run that released the
    embedding. Nothing warns; the report cannot tell "no release" from "release it cannot see"."""
    inner = kf.EmbeddingDPLayer(eps=1.0, seed=2)
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Lambda(lambda t: inner(t, training=True))(inp))
    model.predict(np.random.randn(8, 4).astype("float32"), verbose=0)
    assert inner.release_totals.numpy()[1] == 1  # one call without ids
    assert privacy_report(model).epsilon == pytest.approx(privacy_report(inner).epsilon)


def test_signds_message_carries_the_clients_data_size_in_the_clear():
    """SignDSEncoder.encode(update, num_examples=n) puts n (a function of the client's data: its
    number of examples) into the uploaded SignDSMessage, which `aggregate` uses as weights. The
    unit is the client (replace one client's data by any other), so n is released without DP,
    yet the ledger records only the SignDS index selection: eps 10 instead of inf."""
    enc = SignDSEncoder(k=0.2, eps=10.0)
    delta = np.random.default_rng(0).normal(size=200).astype("float32")
    message = enc.encode(delta, num_examples=137, client_id=0)
    assert message.num_examples == 137  # on the wire
    assert math.isinf(privacy_report(enc).epsilon)
