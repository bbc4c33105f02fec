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


ROOT = PACKAGE.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_cite_no_design_file_outside_the_repository():
    pattern = re.compile(r"ALGORITHMS\.md|\bseed 00\d\b")
    offenders = [f"{path.name}:{n}" for path in DOCS
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []


def _anchor(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_relative_links_in_the_docs_resolve():
    """Every relative link of README.md and docs/*.md names an existing file (and heading)."""
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # an absolute URL
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.name} -> {target}")
            elif anchor and linked.suffix == ".md":
                headings = {_anchor(h) for h in re.findall(r"^#+ (.*)$", linked.read_text(), re.M)}
                if anchor not in headings:
                    broken.append(f"{path.name} -> {target}")
    assert broken == []
