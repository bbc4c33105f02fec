"""The public API carries type hints (issue 13)."""

import inspect

import pytest

from keras_fedpriv import LabelDPLayer, SignDSEncoder
from keras_fedpriv.mechanisms.ledger import ReleaseLedger
from keras_fedpriv.privacy import plan_epsilon, privacy_report

KEY_CALLABLES = [privacy_report, plan_epsilon, LabelDPLayer.__init__, ReleaseLedger.record,
                 SignDSEncoder.encode]


@pytest.mark.parametrize("func", KEY_CALLABLES, ids=lambda f: f.__qualname__)
def test_every_parameter_is_annotated(func):
    params = [p for name, p in inspect.signature(func).parameters.items() if name != "self"]
    assert params
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    assert not missing, f"{func.__qualname__}: no annotation for {missing}"
    assert inspect.signature(func).return_annotation is not inspect.Signature.empty
