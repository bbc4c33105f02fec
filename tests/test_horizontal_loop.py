"""`HorizontalLoop`: the one round loop both horizontal-FL runtimes drive."""

import math

import keras
import numpy as np
import pytest

from keras_fedpriv.federated.horizontal.loop import HorizontalLoop, TrainReply
from keras_fedpriv.federated.horizontal.parties import ClientResult, HorizontalServer
from keras_fedpriv.federated.uploads import as_upload
from keras_fedpriv.mechanisms.ledger import CLIENT, ReleaseKind, non_private_event

pytestmark = [pytest.mark.jax]


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    return model


ASKED = ReleaseKind("asked", "client data", CLIENT, non_private_event(), "test")
EXTRA = ReleaseKind("extra", "client data", CLIENT, non_private_event(), "test")


def _loop(**kw):
    server = HorizontalServer(_model(), as_upload("fedavg"), seed=0)
    return HorizontalLoop(server, asked_kinds=[ASKED], extra_kind=EXTRA, **kw)


def _result(loop, value):
    step = np.full(loop.server.dim, value, np.float32)
    return ClientResult(loop.server.upload.client_message(step, 4), 0.0, None, None, 4)


def test_a_round_aggregates_the_good_replies_and_drops_the_rest_with_a_reason():
    loop = _loop()
    before = np.concatenate([w.ravel() for w in loop.server.global_weights()])

    def exchange(request):
        a, b, c = request.client_ids
        return [TrainReply(a, result=_result(loop, 1.0)),
                TrainReply(a, result=_result(loop, 9.0)),            # a second reply
                TrainReply(b, reason="error reply: boom"),
                TrainReply(77, asked=False, result=_result(loop, 9.0)),  # not asked
                TrainReply(c, result=_result(loop, 3.0), extra=True)]

    logs = loop.run_round(0, range(5), 3, 1, exchange)
    after = np.concatenate([w.ravel() for w in loop.server.global_weights()])
    np.testing.assert_allclose(after - before, 2.0, atol=1e-6)  # FedAvg of 1 and 3
    assert logs["replies"] == 2.0 and logs["dropped"] == 1.0 and logs["global_lr"] == 1.0
    reasons = sorted(r for _, _, r in loop.rejected)
    assert reasons == ["a reply from a node that was not asked",
                       "a second reply from the same client", "error reply: boom"]
    chosen = loop.last_request.client_ids
    assert loop.accepted == [chosen[0], chosen[2]]
    assert loop.ledger.units_seen(ASKED) == 3 and loop.ledger.total(EXTRA) == 1


def test_too_few_replies_leave_the_model_and_log_nan_for_the_step():
    loop = _loop(min_replies=2)
    before = loop.server.global_weights()
    logs = loop.run_round(0, range(4), 2, 1, lambda r: [TrainReply(r.client_ids[0],
                                                                   result=_result(loop, 1.0))])
    assert math.isnan(logs["global_lr"]) and logs["replies"] == 1.0
    for a, b in zip(before, loop.server.global_weights()):
        np.testing.assert_array_equal(a, b)
    loop.run_round(1, range(4), 2, 1, lambda r: [TrainReply(c, result=_result(loop, 1.0))
                                                 for c in r.client_ids])
    history = loop.history
    assert {len(v) for v in history.values()} == {2}
    assert math.isnan(history["global_lr"][0]) and history["global_lr"][1] == 1.0
    with pytest.raises(RuntimeError, match="fewer than min_replies=2"):
        loop.begin_round(2, [0], 2)
    with pytest.raises(ValueError, match="without begin_round"):
        _loop().finish_round([])


def test_asked_clients_are_counted_when_asked_even_if_no_reply_comes():
    loop = _loop()
    loop.run_round(0, range(6), 4, 1, lambda request: [])
    assert loop.ledger.units_seen(ASKED) == 4 and loop.history["replies"] == [0.0]
    assert math.isnan(loop.history["upload_bytes_per_client"][0])


def test_a_figure_logged_in_a_later_round_only_is_nan_in_the_earlier_ones():
    loop = _loop()
    for rnd in range(3):
        loop.run_round(rnd, range(3), 1, 1, lambda r: [TrainReply(r.client_ids[0],
                                                                  result=_result(loop, 0.5))])
    loop.log(2, {"late": 1.0})
    assert np.isnan(loop.history["late"][:2]).all()
    assert loop.history["late"][2] == 1.0 and len(loop.history["late"]) == 3
    assert loop.begin_evaluate(2) is None and not loop.evaluation_due(2)


def test_the_server_counts_every_row_a_client_asked_to_evaluate_may_send():
    """A Laplace evaluation of n rows is n releases about the client: the server records, when
    it asks, the rows the request asks each client to send; a client records the rows it
    sent: exactly that many, whatever it holds (fewer rows are repeated, each noised)."""
    from keras_fedpriv.callbacks import LaplaceEvaluation

    server_side = LaplaceEvaluation(eps=2.0, seed=0, max_report_rows=7)
    loop = _loop(laplace=server_side, count_evaluations=True)
    loop.begin_round(0, range(5), 3, 1)
    request = loop.begin_evaluate(0, width=2)
    assert request.max_rows == 7
    kind = server_side.release_kind()
    assert loop.ledger.units_seen(kind) == 3 and loop.ledger.total(kind) == 7
    model = _model()
    x = np.random.default_rng(0).normal(size=(9, 3)).astype("float32")
    for rows, want in ((x, 7), (x[:4], 7)):  # 9 rows, capped at 7; 4 rows, repeated to 7
        client_side = LaplaceEvaluation(eps=2.0, seed=0, from_logits=True, max_report_rows=7)
        outputs = client_side.client_outputs(model, rows, max_rows=request.max_rows)
        client_side.report_outputs(outputs, request.client_ids[0])
        ledger = client_side.privacy_ledger()
        (mine,) = ledger.kinds
        assert mine.key == kind.key and ledger.total(mine) == want <= loop.ledger.total(kind)
