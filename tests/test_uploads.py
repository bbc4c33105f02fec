"""What a horizontal-FL client uploads and how the server aggregates it
(keras_fedpriv/federated/uploads.py): the wire format and what is refused."""

import numpy as np
import pytest

from keras_fedpriv.federated.uploads import (
    FedAvgUpload,
    GaussianUpload,
    MalformedUpload,
    SignDSUpload,
)
from keras_fedpriv.federated.uploads import as_upload
from keras_fedpriv.optimizers import SignDSEncoder

pytestmark = [pytest.mark.jax]


def _signds():
    return SignDSUpload(SignDSEncoder(k=0.2, eps=10.0, seed=0))


def _assert_refused(scheme, tamper, match):
    delta = np.random.default_rng(1).normal(size=500).astype(np.float32)
    arrays = scheme.to_wire(scheme.client_message(delta, 10))
    with pytest.raises(MalformedUpload, match=match):
        scheme.from_wire(tamper(arrays), 500)


def test_each_scheme_rebuilds_its_own_upload_from_the_wire():
    rng = np.random.default_rng(0)
    delta = rng.normal(size=500).astype(np.float32)
    for scheme in (FedAvgUpload(), _signds(), GaussianUpload(1.0, 1.0, seed=0)):
        sent = scheme.client_message(delta, 37, client_id=4)
        got = scheme.from_wire(scheme.to_wire(sent), 500)
        np.testing.assert_array_equal(scheme.aggregate([got], 1.0),
                                      scheme.aggregate([sent], 1.0))
    assert set(_signds().to_wire(_signds().client_message(delta, 37))) == {"sign", "indices"}
    assert set(GaussianUpload(seed=0).to_wire(GaussianUpload(seed=0).client_message(
        delta, 37))) == {"update"}  # no data size on the wire


@pytest.mark.parametrize("tamper, match", [
    (lambda a: {**a, "extra": np.zeros(1)}, "exactly the arrays"),
    (lambda a: {"sign": a["sign"]}, "exactly the arrays"),
    (lambda a: {**a, "indices": a["indices"][:-1]}, "shape"),
    (lambda a: {**a, "indices": a["indices"][::-1].copy()}, "sorted"),
    (lambda a: {**a, "indices": np.concatenate([a["indices"][:1], a["indices"][:-1]])},
     "sorted and unique"),
    (lambda a: {**a, "indices": np.where(np.arange(len(a["indices"])) == len(a["indices"]) - 1,
                                         500, a["indices"]).astype(np.int32)}, r"\[0, 500\)"),
    (lambda a: {**a, "indices": a["indices"].astype(np.int64)}, "int32"),
    (lambda a: {**a, "indices": a["indices"].astype(np.float32)}, "dtype"),
    (lambda a: {**a, "sign": np.array([2], np.int8)}, r"\+1 or -1"),
    (lambda a: {**a, "sign": np.array([1, 1], np.int8)}, "shape"),
])
def test_signds_server_refuses_a_malformed_upload(tamper, match):
    _assert_refused(_signds(), tamper, match)


@pytest.mark.parametrize("tamper, match", [
    (lambda a: {**a, "update": a["update"][:-1]}, "shape"),
    (lambda a: {**a, "update": a["update"].astype(np.float64)}, "float32"),
    (lambda a: {**a, "update": np.where(np.arange(500) == 7, np.inf, a["update"]).astype(
        np.float32)}, "NaN or infinity"),
    (lambda a: {**a, "num_examples": np.array([0])}, ">= 1"),
    (lambda a: {**a, "num_examples": np.array([2.5])}, "dtype"),
    (lambda a: {**a, "update": "not an array"}, "dtype"),
])
def test_fedavg_server_refuses_a_malformed_upload(tamper, match):
    _assert_refused(FedAvgUpload(), tamper, match)


def test_malformed_upload_reasons_do_not_echo_the_values():
    scheme = FedAvgUpload()
    secret = np.full(500, 0.123456789, np.float32)
    arrays = scheme.to_wire(scheme.client_message(secret, 10))
    arrays["update"] = arrays["update"][:-1]
    with pytest.raises(MalformedUpload) as err:
        scheme.from_wire(arrays, 500)
    assert "0.1234" not in str(err.value)


def test_upload_objects_report_their_events():
    assert FedAvgUpload().dp_event() is None
    assert GaussianUpload(1.0, 1.0, seed=0).dp_event().noise_multiplier == 0.5
    assert SignDSUpload(SignDSEncoder(eps=3.0, seed=0)).dp_event() is not None


def test_fedavg_aggregates_the_size_weighted_mean_times_the_server_step():
    scheme = FedAvgUpload()
    a = scheme.client_message(np.array([1.0, 0.0], np.float32), 1)
    b = scheme.client_message(np.array([0.0, 4.0], np.float32), 3)
    np.testing.assert_allclose(scheme.aggregate([a, b], 0.5), [0.125, 1.5])


def test_the_upload_argument_is_normalized_or_refused_by_name():
    assert isinstance(as_upload("fedavg"), FedAvgUpload)
    assert isinstance(as_upload("signds"), SignDSUpload)
    encoder = SignDSEncoder(eps=1.0, seed=0)
    assert as_upload(encoder).encoder is encoder
    gaussian = GaussianUpload(seed=0)
    assert as_upload(gaussian) is gaussian
    with pytest.raises(ValueError, match="`upload` must be 'fedavg', 'signds'.*got 'sgd'"):
        as_upload("sgd")
    with pytest.raises(TypeError, match="`upload` must be.*got 3"):
        as_upload(3)


def test_a_seeded_gaussian_upload_from_its_config_waits_for_its_state():
    """GaussianUpload shares SeededReleases' from_config: a seeded copy rebuilt from its config
    refuses to release until it continues the original's stream (no replayed noise)."""
    delta = np.zeros(50, np.float32)
    original = GaussianUpload(0.5, 2.0, seed=5)
    first = original.client_message(delta, 1).message
    assert original.get_config() == {"clip_norm": 0.5, "noise_multiplier": 2.0, "seed": 5}
    assert "seed" not in GaussianUpload().get_config()
    copy = GaussianUpload.from_config(original.get_config())
    with pytest.raises(RuntimeError, match="load_state_dict"):
        copy.client_message(delta, 1)
    copy.load_state_dict(original.state_dict())
    assert not np.any(copy.client_message(delta, 1).message == first)
