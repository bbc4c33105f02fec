"""Named arrays in a Flower ArrayRecord (keras_fedpriv/federated/records.py), checked before use."""

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord  # noqa: E402

from keras_fedpriv.federated.malformed import MalformedMessage  # noqa: E402
from keras_fedpriv.federated.records import arrays_record, checked_arrays  # noqa: E402

pytestmark = pytest.mark.flower


def test_a_record_round_trips_and_is_checked_before_use():
    arrays = {"sign": np.array([1], np.int8), "indices": np.arange(5, dtype=np.int32)[::2]}
    record = arrays_record(arrays)
    got = checked_arrays(record, "upload", max_bytes=1000)
    assert set(got) == set(arrays)
    for key in arrays:
        np.testing.assert_array_equal(got[key], arrays[key])
        assert got[key].dtype == arrays[key].dtype
    with pytest.raises(MalformedMessage, match="more than the 8 bytes"):
        checked_arrays(record, "upload", max_bytes=8)
    with pytest.raises(MalformedMessage, match="'upload' must be an ArrayRecord; got ConfigRecord"):
        checked_arrays(ConfigRecord({"a": 1}), "upload", max_bytes=1000)
    assert isinstance(record, ArrayRecord)
