"""The release ledger (keras_fedpriv/mechanisms/ledger.py): per-unit counts per kind of release.

The adversarial tests (test_adversarial_ledger*.py) try to make a run release more than it
records; these are the ledger's own rules.
"""

import json

import dp_accounting
import pytest

from keras_fedpriv.mechanisms import randomized_response_dp_event
from keras_fedpriv.mechanisms.ledger import (
    CLIENT,
    EXAMPLE,
    ReleaseKind,
    ReleaseLedger,
    register_protection,
)

pytestmark = [pytest.mark.jax]

LABELS = ReleaseKind("LabelDPLayer 'l'", "labels", EXAMPLE, randomized_response_dp_event(1.0, 2))
EMB = ReleaseKind("EmbeddingDPLayer 'e'", "features", EXAMPLE,
                  dp_accounting.ComposedDpEvent([randomized_response_dp_event(0.5, 2)] * 4))
UPLOAD = ReleaseKind("GaussianUpload", "client data", CLIENT, dp_accounting.GaussianDpEvent(2.0))


def test_counts_per_unit_and_for_everyone_add_up_to_the_busiest_unit():
    ledger = ReleaseLedger()
    ledger.record(LABELS, units=[1, 2, 2, 3])
    ledger.record(LABELS, units=None, count=2)  # about every example
    ledger.record_counts(LABELS, [3, 9], [4, 0])
    assert ledger.total(LABELS) == 2 + 5 and ledger.units_seen(LABELS) == 3
    assert ledger.kinds == [LABELS] and len(ledger) == 1
    ledger.record(EMB, units=[1], count=0)  # a zero count records the kind, not a release
    assert len(ledger) == 1 and ledger.total(EMB) == 0
    with pytest.raises(ValueError, match="`count` must be >= 0; got -1"):
        ledger.record(LABELS, units=[1], count=-1)
    with pytest.raises(TypeError, match="`kind` must be a ReleaseKind; got str"):
        ledger.record("labels", units=[1])


def test_a_kind_is_identified_by_its_content_not_its_object():
    same = ReleaseKind("LabelDPLayer 'l'", "labels", EXAMPLE, randomized_response_dp_event(1.0, 2))
    ledger = ReleaseLedger()
    ledger.record(LABELS, units=[1])
    ledger.record(same, units=[1])
    assert ledger.kinds == [LABELS] and ledger.total(LABELS) == 2


def test_profiles_group_units_and_drop_dominated_ones():
    ledger = ReleaseLedger()
    ledger.record(LABELS, units=[1, 2, 3])
    ledger.record(EMB, units=[1, 1, 2])
    ledger.record(EMB, units=None)  # every example once more
    kinds, profiles = ledger.unit_profiles(EXAMPLE)
    assert kinds == [LABELS, EMB]
    # unit 1: (1, 3); unit 2: (1, 2) dominated by unit 1; unit 3: (1, 1) dominated
    assert profiles == [(1, 3)]
    ledger.record(LABELS, units=[3, 3])
    assert sorted(ledger.unit_profiles(EXAMPLE)[1]) == [(1, 3), (3, 1)]
    assert ledger.unit_profiles(CLIENT) == ([], [])


def test_merge_only_and_the_state_round_trip_through_json():
    a, b = ReleaseLedger(), ReleaseLedger()
    a.record(LABELS, units=[1])
    b.record(LABELS, units=[1, 2])
    b.record_counts(EMB, [5], [3], approximate=True)
    b.record(UPLOAD, units=[0], count=4)
    merged = ReleaseLedger.merged([a, b])
    assert merged.total(LABELS) == 2 and merged.is_approximate(EMB)
    labels_only = merged.only("labels")
    assert labels_only.kinds == [LABELS] and labels_only.total(LABELS) == 2
    with pytest.raises(ValueError, match="`protects` must be one of"):
        merged.only("weights")
    back = ReleaseLedger.from_dict(json.loads(json.dumps(merged.to_dict())))
    assert [k.key for k in back.kinds] == [k.key for k in merged.kinds]
    for kind in merged.kinds:
        assert back.total(kind) == merged.total(kind)
        assert back.is_approximate(kind) == merged.is_approximate(kind)
    with pytest.raises(ValueError, match="a ledger state must be a dict"):
        ReleaseLedger.from_dict([])


def test_an_event_the_state_cannot_hold_is_refused():
    odd = ReleaseKind("x", "labels", EXAMPLE,
                      dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)))
    ledger = ReleaseLedger()
    ledger.record(odd, units=[1])
    with pytest.raises(ValueError, match="cannot save the DpEvent"):
        ledger.to_dict()


@pytest.mark.parametrize("field, value, match", [
    ("unit", "row", "`unit` must be one of"),
    ("protects", "weights", "`protects` must be one of"),
])
def test_a_kind_names_a_known_unit_and_secret(field, value, match):
    args = dict(mechanism="m", protects="labels", unit=EXAMPLE,
                event=dp_accounting.NonPrivateDpEvent())
    with pytest.raises(ValueError, match=match):
        ReleaseKind(**{**args, field: value})


def test_registering_a_protection_is_idempotent():
    class Model:
        pass

    model, protection = Model(), object()
    register_protection(model, protection)
    register_protection(model, protection)
    assert model._fedpriv_protections == [protection]


@pytest.mark.parametrize("tamper", [
    lambda k: k.update(everyone=-1),
    lambda k: k.update(everyone=1.5),
    lambda k: k.update(units={"3": -2}),
    lambda k: k.update(units={"x": 1}),
    lambda k: k["event"].update(noise_parameter=float("nan")),
    lambda k: k["event"].update(num_buckets=1),
    lambda k: k["event"].update(extra=1),
])
def test_from_dict_refuses_a_state_that_would_count_less(tamper):
    """A saved ledger is read strictly: negative or non-integer counts, bad unit ids and
    out-of-range events would make a restored ledger (a budget file, a state_dict) under-count."""
    ledger = ReleaseLedger()
    ledger.record(ReleaseKind("m", "labels", "example",
                              dp_accounting.RandomizedResponseDpEvent(0.2, 2)), units=[3])
    state = ledger.to_dict()
    tamper(state["kinds"][0])
    with pytest.raises(ValueError, match="ledger state"):
        ReleaseLedger.from_dict(state)


def test_covers_holds_when_every_record_of_the_other_is_matched_or_exceeded():
    """A restore's check: `covers` is False as soon as one unit, one kind or the anonymous
    count of the other ledger is larger."""
    small, big = ReleaseLedger(), ReleaseLedger()
    small.record(LABELS, [1, 2])
    big.record(LABELS, [1, 2, 3])
    assert big.covers(small) and not small.covers(big)
    assert ReleaseLedger().covers(ReleaseLedger()) and big.covers(ReleaseLedger())
    more = ReleaseLedger().merge(big)
    more.record(LABELS, [2])  # unit 2 twice
    assert more.covers(big) and not big.covers(more)
    other_kind = ReleaseLedger().merge(big)
    other_kind.record(UPLOAD, [0])
    assert not big.covers(other_kind)
    anonymous = ReleaseLedger().merge(big)
    anonymous.record(LABELS)  # a release about every example
    assert not big.covers(anonymous) and anonymous.covers(big)
