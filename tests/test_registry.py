"""The registry of mechanisms (keras_fedpriv/mechanisms/registry.py): one table of their facts."""

import math
import subprocess
import sys
from pathlib import Path

import dp_accounting
import pytest

from keras_fedpriv.mechanisms import ledger, registry
from keras_fedpriv.mechanisms.registry import MECHANISMS, PATTERNS, mechanism, names

pytestmark = [pytest.mark.jax]

REPO = Path(__file__).resolve().parent.parent


def test_every_mechanism_states_its_secret_unit_and_patterns():
    for m in MECHANISMS.values():
        assert m.secret in registry.SECRETS and m.unit in registry.UNITS
        assert m.parameter in ("eps", "noise_multiplier")
        assert m.default_pattern == m.patterns[0] and set(m.patterns) <= set(PATTERNS)
        assert m.limit > 0 and m.weight > 0
    assert (mechanism("label_dp").secret, mechanism("embedding_dp").secret) == (
        registry.LABELS, registry.FEATURES)
    assert {mechanism(n).secret for n in ("signds", "magrr", "gaussian", "laplace_eval")} == {
        registry.CLIENT_DATA}
    assert mechanism("label_dp").patterns == (registry.PER_EXAMPLE, registry.EVERY_EXAMPLE)
    assert mechanism("magrr").patterns == (registry.PER_CLIENT,)


def test_the_ledger_names_the_registry_s_secrets_and_units():
    assert (ledger.LABELS, ledger.FEATURES, ledger.CLIENT_DATA, ledger.EXAMPLE, ledger.CLIENT) == (
        registry.LABELS, registry.FEATURES, registry.CLIENT_DATA, registry.EXAMPLE,
        registry.CLIENT)


def test_events_are_the_mechanisms_own():
    from keras_fedpriv.mechanisms.gaussian import gaussian_dp_event
    from keras_fedpriv.mechanisms.laplace import laplace_dp_event
    from keras_fedpriv.mechanisms.quantize import quantize_rr_dp_event
    from keras_fedpriv.mechanisms.randomized_response import randomized_response_dp_event
    from keras_fedpriv.mechanisms.signds import signds_dp_event

    assert mechanism("label_dp").event(1.5, num_classes=7) == randomized_response_dp_event(1.5, 7)
    assert mechanism("magrr").event(1.5, num_classes=7) == randomized_response_dp_event(1.5, 2)
    assert mechanism("embedding_dp").event(2.0, num_coordinates=4) == quantize_rr_dp_event(2.0, 4)
    assert mechanism("signds").event(3.0) == signds_dp_event(3.0)
    assert mechanism("gaussian").event(1.2) == gaussian_dp_event(1.2)
    assert mechanism("laplace_eval").event(0.5, num_classes=3) == laplace_dp_event(
        0.5, 2.0, num_values=3, distance=2.0)
    assert isinstance(mechanism("gaussian").event(1.2), dp_accounting.GaussianDpEvent)


def test_largest_settings_and_names():
    assert mechanism("signds").max_scale == 100.0
    assert mechanism("gaussian").max_scale == pytest.approx(20.0)  # noise multiplier >= 0.05
    assert names(alone=True, parameter="eps") == ("label_dp", "embedding_dp", "signds", "magrr")
    assert names(alone=True) == ("label_dp", "embedding_dp", "signds", "magrr", "gaussian")
    assert names(alone=False) == ("laplace_eval",)
    assert names(takes="num_coordinates") == ("embedding_dp",)
    assert names(alone=True, takes="num_classes") == ("label_dp",)
    assert [m.name for m in MECHANISMS.values() if m.upload] == ["signds", "gaussian"]


def test_signals_and_the_too_small_check():
    assert mechanism("magrr").signal(2.0) == pytest.approx(math.tanh(1.0))
    assert mechanism("embedding_dp").signal(2.0) == pytest.approx(math.tanh(0.5))
    assert mechanism("label_dp").signal(1.0, num_classes=2) == pytest.approx(math.tanh(0.5))
    assert "signds at a per-release eps of 0.35" in mechanism("signds").too_small_to_learn(0.35)
    assert mechanism("signds").too_small_to_learn(8.0) is None
    assert mechanism("magrr").too_small_to_learn(1e-3) is None  # no threshold measured
    with pytest.raises(ValueError, match="for a signal; got 'gaussian'"):
        mechanism("gaussian").signal(1.0)
    with pytest.raises(ValueError, match="`k` must be a fraction"):
        mechanism("signds").signal(1.0, k=1.5)


def test_unknown_names_are_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"`mechanism` must be one of \('label_dp',.*'dp_sgd'"):
        mechanism("dp_sgd")
    with pytest.raises(ValueError, match="must be one of \\('signds',\\); got 'magrr'"):
        mechanism("magrr", ("signds",))


def test_the_registry_imports_neither_keras_nor_dp_accounting():
    code = ("import sys; from keras_fedpriv.mechanisms import registry; "
            "registry.names(); print(sorted(m for m in ('keras', 'tensorflow', 'jax', "
            "'dp_accounting', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
