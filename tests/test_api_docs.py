"""The API reference builds (docs/build_api.py, `make api`): a broken docstring or import fails CI."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_api_reference_builds_every_public_module(tmp_path):
    out = tmp_path / "api"
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "build_api.py"), str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (out / "index.html").exists()
    for page in ("keras_fedpriv/layers/label_dp.html", "keras_fedpriv/mechanisms/ledger.html",
                 "keras_fedpriv/privacy/report.html", "keras_fedpriv/privacy/planning.html",
                 "keras_fedpriv/federated/vertical.html", "keras_fedpriv/tuning.html"):
        assert (out / page).exists(), page
    ledger = (out / "keras_fedpriv/mechanisms/ledger.html").read_text()
    assert "ReleaseLedger" in ledger and "privacy_ledger" in ledger
