"""keras_fedpriv.mechanisms.units: the secrets, units and release patterns, importing nothing."""

import subprocess
import sys

import pytest

from keras_fedpriv.mechanisms import ledger, registry, units

pytestmark = [pytest.mark.jax]


def test_every_unit_has_its_patterns_and_every_pattern_is_described():
    assert set(units.UNIT_PATTERNS) == set(units.UNITS) == {"example", "client"}
    assert {p for ps in units.UNIT_PATTERNS.values() for p in ps} == set(units.PATTERNS)
    assert units.UNIT_PATTERNS[units.EXAMPLE][0] == units.PER_EXAMPLE  # the default first
    assert units.SECRETS == ("labels", "features", "client data")


def test_the_ledger_and_the_registry_use_the_same_names():
    for name in ("CLIENT", "CLIENT_DATA", "EXAMPLE", "FEATURES", "LABELS", "SECRETS", "UNITS"):
        assert getattr(ledger, name) is getattr(units, name) is getattr(registry, name), name


def test_importing_it_imports_no_other_module_of_the_package():
    code = ("import sys; import keras_fedpriv.mechanisms.units; "
            "print(sorted(m for m in sys.modules if m.startswith('keras_fedpriv.mechanisms.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "['keras_fedpriv.mechanisms.units']"
