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
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_docs_cite_no_design_file_outside_the_repository():
    pattern = re.compile(r"ALGORITHMS\.md|\bseed 00\d\b")
    offenders = [f"{path.name}:{n}" for path in DOCS
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []


def test_results_pages_are_named_after_the_bench_script_that_writes_them():
    """docs/results/<name>.md is written by bench/<name>.py and says so; a guide (docs/*.md) is
    not a results page (benchmarks.md, the speed page every script adds a section to, aside)."""
    results = sorted((ROOT / "docs" / "results").glob("*.md"))
    assert results, "docs/results/ has no results page"
    for page in results:
        script = ROOT / "bench" / f"{page.stem}.py"
        assert script.exists(), f"{page.name}: no bench/{page.stem}.py"
        assert f"bench/{page.stem}.py" in page.read_text()[:600], page.name
        assert "_report.RESULTS" in script.read_text(), f"bench/{page.stem}.py writes elsewhere"
    for guide in sorted((ROOT / "docs").glob("*.md")):
        if guide.name != "benchmarks.md":
            assert "Produced by `bench/" not in guide.read_text()[:600], guide.name
    figures = {p.name for p in (ROOT / "docs" / "results").iterdir()}
    assert all(Path(f).stem in {p.stem for p in results} for f in figures), figures


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


# Where a module's tests live when they are not in tests/test_<module>.py. A new module gets a
# test module named after it; an entry here is for an existing module whose tests are shared
# with its neighbours (the suite is not split one-to-one yet).
TEST_HOMES = {
    "federated/flower/common.py": "test_flower_horizontal.py",
    "federated/flower/loopback.py": "test_flower_deployment.py",
    "federated/messages.py": "test_vertical.py",
    "federated/uploads.py": "test_horizontal_parties.py",
    "layers/input_checks.py": "test_clear_errors.py",
    "mechanisms/ledger.py": "test_adversarial_ledger.py",
    "privacy/planning.py": "test_cli.py",
}


def test_every_module_has_a_test_module():
    """tests/test_<module>.py (or test_flower_<module>.py for the Flower apps), else an entry in
    TEST_HOMES naming the existing test module that covers it."""
    tests = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    homeless, stale = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name.startswith("_"):
            continue  # __init__, __main__ and private helpers
        own = {f"test_{path.stem}.py", f"test_flower_{path.stem}.py"}
        if own & tests:
            if rel in TEST_HOMES:
                stale.append(f"{rel} has its own test module; drop its TEST_HOMES entry")
            continue
        home = TEST_HOMES.get(rel)
        if home is None:
            homeless.append(rel)
        elif home not in tests:
            stale.append(f"{rel} -> {home}")
    assert homeless == [] and stale == []
    assert set(TEST_HOMES) <= {p.relative_to(PACKAGE).as_posix()
                               for p in PACKAGE.rglob("*.py")}  # no entry for a gone module
