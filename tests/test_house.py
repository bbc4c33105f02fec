"""House rules that a reader of the package relies on."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "keras_fedpriv"


def test_package_code_cites_no_design_file_outside_the_repository():
    """The design notes (ALGORITHMS.md, the numbered source documents) are not in the
    repository: code says what is meant or cites the paper instead."""
    pattern = re.compile(r"ALGORITHMS\.md|\bseed 00\d\b")
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{n}"
                 for path in sorted(PACKAGE.rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []
