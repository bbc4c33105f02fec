"""What the Flower apps share (keras_fedpriv/federated/flower/common.py): sizes, error lines, waits."""

import types

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Message, Metadata, RecordDict  # noqa: E402

from keras_fedpriv.federated.flower import common  # noqa: E402
from keras_fedpriv.federated.records import arrays_record  # noqa: E402

pytestmark = pytest.mark.flower


def _message(arrays):
    metadata = Metadata(run_id=1, message_id="", src_node_id=0, dst_node_id=1,
                        reply_to_message_id="", group_id="1", created_at=0.0, ttl=60.0,
                        message_type="train")
    return Message(RecordDict({"upload": arrays_record(arrays)}), metadata=metadata)


def test_message_size_grows_with_the_arrays_it_carries():
    small = common.message_nbytes(_message({"x": np.zeros(10, np.float32)}))
    big = common.message_nbytes(_message({"x": np.zeros(1010, np.float32)}))
    assert 40 <= small < big and big - small == pytest.approx(4000, abs=16)


def test_an_error_reply_is_reduced_to_its_own_first_line():
    wrapped = ("Exception ClientAppException occurred. Message: \x1b[1mValueError: bad shape\x1b[0m"
               "\nTraceback (most recent call last):\n  File secret.py")
    assert common.first_line(wrapped) == "ValueError: bad shape"
    assert common.first_line("one\ntwo") == "one"
    assert common.first_line("") == ""
    assert len(common.first_line("x" * 1000)) == 200


def test_the_context_is_passed_only_to_functions_that_take_it():
    context = object()
    assert common.call_with_context(lambda a: a, 1, context=context) == 1
    assert common.call_with_context(lambda a, context: (a, context), 1, context=context) == (1, context)


def test_waiting_for_nodes_times_out_with_the_count():
    grid = types.SimpleNamespace(get_node_ids=lambda: [3, 1])
    assert common.wait_for_nodes(grid, 2, timeout=1.0) == [1, 3]
    with pytest.raises(TimeoutError, match="only 2 of the 3 followers needed connected"):
        common.wait_for_nodes(grid, 3, timeout=0.0, what="followers")


def test_the_budget_takes_the_smaller_cap_and_the_operators_path(tmp_path):
    context = types.SimpleNamespace(node_config={})
    assert common.party_budget(context, None, 1e-5, None) is None
    budget = common.party_budget(context, 3.0, 1e-5, str(tmp_path / "code.json"))
    assert budget.max_epsilon == 3.0 and budget.path == str(tmp_path / "code.json")
    context.node_config = {"max-epsilon": 2.0, "privacy-budget-path": str(tmp_path / "op.json")}
    budget = common.party_budget(context, 3.0, 1e-5, str(tmp_path / "code.json"), per_record=True)
    assert budget.max_epsilon == 2.0 and budget.path == str(tmp_path / "op.json")
    context.node_config = {"max-epsilon": 5.0}
    assert common.party_budget(context, None, 1e-5, lambda c: str(tmp_path / "fn.json")).path == \
        str(tmp_path / "fn.json")


def test_a_renamed_argument_names_its_new_name_and_an_unknown_one_is_refused():
    with pytest.raises(TypeError, match="takes `eps_rr` now; `magrr_eps` was renamed"):
        common.check_renamed({"magrr_eps": 3.0}, "horizontal_client_app")
    with pytest.raises(TypeError, match="unexpected keyword argument 'epochs'"):
        common.check_renamed({"epochs": 3}, "horizontal_client_app")
    assert common.check_renamed({}, "horizontal_client_app") is None
