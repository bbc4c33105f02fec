"""Issue 18, case 8: a node that lies about which follower it is (vertical FL on Flower).

The vertical leader asks every connected node which party it is. A rogue node that claims a
follower's name must never receive that follower's example ids or cut gradients: two nodes
claiming one follower stop the run before anything is sent (unless the follower is pinned to its
node id, when only that node is it), and a malformed introduction is refused with a logged
reason instead of crashing the ServerApp. A stand-in Grid plays the SuperLink; the real
followers behind it are `VerticalFollower` objects serving the leader's messages.
"""

import logging

import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, RecordDict  # noqa: E402

from vertical_grid import F1, F2, N, in_a_run, model_fn  # noqa: E402, F401
from vertical_grid import FakeGrid as _Grid  # noqa: E402
from vertical_grid import hello as _hello  # noqa: E402
from vertical_grid import run_leader_on as _run  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.timeout(300)]

ROGUE = 5  # a node id smaller than the followers', so it answers first


def _capture(caplog):
    return caplog.at_level(logging.WARNING, logger="keras_fedpriv.flower")


def test_case8_two_nodes_claiming_one_follower_stop_the_run_before_anything_is_sent(in_a_run,
                                                                                     caplog):
    """Case 8: the rogue answered first and became f1; now nobody is f1 and nothing is sent."""
    grid = _Grid()
    grid.others[ROGUE] = _hello("f1", grid.spec(F1))
    with _capture(caplog), pytest.raises(RuntimeError, match=r"nodes \[5, 10\] all claim to be "
                                                            r"follower 'f1'.*party-node\.f1"):
        _run(grid)
    assert {kind for _, kind in grid.sent} == {"query"}  # no ids, no gradients to anyone
    assert "nodes [5, 10] all claim to be follower 'f1'" in caplog.text


def _served_by_the_real_followers(grid, result):
    # a message per batch, and one that carries the last batch's gradient
    assert grid.messages_to(F1).count("train") == N // 8 + 1
    assert grid.messages_to(F2).count("train") == N // 8 + 1
    assert grid.messages_to(F1)[-1] == "query.finish"
    assert result.rejected == [] and result.history["skipped"] == [0.0]


def test_case8_a_pinned_follower_is_only_its_node(in_a_run, caplog):
    """Case 8: with f1 pinned, the rogue claiming f1 is ignored: it gets the query (asked for
    the unpinned f2) and nothing else, and the run uses the real f1. The unpinned f2 is trusted
    on first claim, and the log says so."""
    grid = _Grid()
    grid.others[ROGUE] = _hello("f1", grid.spec(F1))
    with _capture(caplog):
        result = _run(grid, party_nodes={"f1": F1})
    assert grid.messages_to(ROGUE) == ["query"]
    _served_by_the_real_followers(grid, result)
    assert "node 5 claims follower 'f1', which is pinned to node 10; ignored" in caplog.text
    assert "follower 'f2' is not pinned to a node id: the node that claims it is trusted on " \
        "first claim" in caplog.text
    assert "follower 'f1' is not pinned" not in caplog.text


class _LateF1(_Grid):
    """The real f1 (node 10) connects only after the leader has looked ``late`` times; the rogue
    and f2 are connected from the start."""

    def __init__(self, late):
        super().__init__()
        self.late, self.looks = late, 0
        self.others[ROGUE] = _hello("f1", self.spec(F1))

    def get_node_ids(self):
        self.looks += 1
        nodes = super().get_node_ids()
        return nodes if self.looks > self.late else [n for n in nodes if n != F1]


def test_case8_the_leader_waits_for_a_pinned_followers_own_node(in_a_run, caplog):
    """Review: the leader took the first len(followers) connected nodes ([5, 11]) while the
    real f1 was late, and stopped; now it waits for the pinned node and asks only the pinned
    nodes (every follower is pinned, f2 by the run config's decimal string): the rogue gets
    nothing at all."""
    grid = _LateF1(late=2)
    with _capture(caplog):
        result = _run(grid, run_config={"party-node.f2": str(F2)}, party_nodes={"f1": F1})
    assert grid.looks > 2
    assert grid.messages_to(ROGUE) == []
    _served_by_the_real_followers(grid, result)
    assert "is not pinned" not in caplog.text


def test_case8_a_pinned_node_that_never_connects_is_named(in_a_run):
    """Review: the error said 'the reasons are logged' when nothing was logged about f1."""
    grid = _LateF1(late=10**9)
    with pytest.raises(TimeoutError, match=r"^pinned node 10 \(follower 'f1'\) is not "
                                           r"connected \(connected: \[5, 11\]\) after 1 s"):
        _run(grid, party_nodes={"f1": F1}, connect_timeout=1)
    assert grid.sent == []


def test_case8_an_unpinned_follower_is_trusted_on_first_claim(in_a_run, caplog):
    """What pins are for (documented): with nothing pinned and the real f1 absent, the rogue
    is the only node claiming f1 and becomes it; the log warned that f1 was unpinned."""
    grid = _LateF1(late=10**9)
    with _capture(caplog), pytest.raises(RuntimeError, match="epoch 1 trained no step"):
        _run(grid)  # the rogue answers nothing useful: the run stops, naming it
    assert "train" in grid.messages_to(ROGUE)
    assert "follower 'f1' is not pinned to a node id" in caplog.text


def test_case8_a_pin_to_a_node_that_claims_another_party_stops_the_run(in_a_run):
    grid = _Grid()
    with pytest.raises(RuntimeError, match=r"\['f1'\] did not introduce themselves \('f1': "
                                           r"pinned node 11 introduced itself as 'f2'\)"):
        _run(grid, party_nodes={"f1": F2, "f2": F2})
    assert {kind for _, kind in grid.sent} == {"query"}


@pytest.mark.parametrize("pins, run_config, match", [
    ({"f3": 10}, {}, "'f3', which is not a follower"),
    ({"f1": 0}, {}, "node id"),
    ({"f1": True}, {}, "node id"),
    ({"f1": "ten"}, {}, "node id"),
    ({"f1": 10}, {"party-node.f1": 11}, "already pinned to node 10"),
    # review: the value as given; a digit that is not ASCII; beyond Flower's uint64 node ids
    ({}, {"party-node.f1": "0"}, r"'party-node.f1' must be a Flower node id .*; got '0'\.$"),
    ({}, {"party-node.f1": "\u00b2"}, r"'party-node.f1' must be a Flower node id .*; got '\u00b2'"),
    ({}, {"party-node.f1": str(2**64)}, rf"node id .*; got '{2**64}'\.$"),
    ({"f1": 2**64}, {}, rf"node id .*; got {2**64}\.$"),
])
def test_bad_pins_are_refused_by_name(in_a_run, pins, run_config, match):
    grid = _Grid()
    with pytest.raises(ValueError, match=match):
        _run(grid, run_config=run_config, party_nodes=pins)
    assert grid.sent == []


def test_case8_a_malformed_introduction_is_refused_with_a_logged_reason(in_a_run, caplog):
    """Case 8: a query reply without a 'config' record crashed the ServerApp with a KeyError."""
    grid = _Grid()
    grid.others.update({
        1: RecordDict({}),                                               # no 'config'
        2: RecordDict({"config": ConfigRecord({"party": "f1"})}),         # no spec
        3: _hello("f1", "{not json"),                                    # a spec that is not one
        4: RecordDict({"config": ArrayRecord()}),                         # not a ConfigRecord
        6: "boom\nsecret trace",                                          # an error reply
    })
    with _capture(caplog):
        result = _run(grid)
    assert result.history["skipped"] == [0.0]
    for node in (1, 2, 3, 4, 6):
        assert grid.messages_to(node) == ["query"]
    assert "node 1: its introduction was refused: the reply has no 'config' record" in \
        caplog.text
    assert "node 2: its introduction was refused: 'config' must hold the strings" in caplog.text
    assert "node 3: its introduction was refused: its embedding spec does not parse" in \
        caplog.text
    assert "node 4: its introduction was refused: 'config' is a ArrayRecord" in caplog.text
    assert "secret trace" not in caplog.text


def test_case8_a_follower_whose_only_introduction_is_malformed_is_missing_not_a_crash(in_a_run):
    grid = _Grid()
    grid.followers.pop(F2)
    grid.others[F2] = RecordDict({})
    with pytest.raises(RuntimeError, match=r"the followers \['f2'\] did not introduce"):
        _run(grid)
    assert {kind for _, kind in grid.sent} == {"query"}


def test_an_empty_pin_pins_nothing_and_the_declared_override_reaches_the_leader(in_a_run):
    """Review: Flower refuses a --run-config key the app's pyproject does not declare, and a
    declared placeholder "" was refused as a node id. The example declares party-node.<party> =
    "" for every follower: an unpinned run works, the documented override pins."""
    from pathlib import Path

    from flwr.common.config import get_fused_config_from_dir, parse_config_args

    from keras_fedpriv.federated.flower.vertical_strategy import _pins

    leader = model_fn().split_parties().leader
    assert _pins({"f1": ""}, {"party-node.f2": " "}, leader) == {}
    app = Path(__file__).parents[1] / "examples" / "flower_vertical"
    declared = get_fused_config_from_dir(app, {})
    assert {k: v for k, v in declared.items() if k.startswith("party-node.")} == {
        "party-node.f1": "", "party-node.f2": ""}
    # the run config Flower builds for `flwr run . --run-config "party-node.f1='10'"`
    run = get_fused_config_from_dir(app, parse_config_args([f"party-node.f1='{F1}'"]))
    assert _pins(None, declared, leader) == {}
    assert _pins(None, run, leader) == {"f1": F1}
    assert _pins(None, {"party-node.f1": f" {2**64 - 1} "}, leader) == {"f1": 2**64 - 1}
    grid = _Grid()
    result = _run(grid, run_config={"party-node.f1": "", "party-node.f2": ""})
    _served_by_the_real_followers(grid, result)
