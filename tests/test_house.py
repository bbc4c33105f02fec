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


#: Phrases that call the original design "the seed", which reads as the random seed (`seed=`).
DESIGN_SEED = re.compile(
    r"\b(?:beyond|follows?|reproduc\w*|as in|in|unlike|than|as) the seed\b(?!\s*=)"
    r"|\bthe seed's\s+(?!own\b|key\b|stream)"
    r"|\bthe seed (?:claims|picks|chose|uses|says|reports|and its reference|design|paper)\b"
    r"|\bseed (?:design|paper|project)\b|\bseed 0\d\d\b",
    re.IGNORECASE)


def test_the_design_phrase_pattern_tells_the_design_from_the_random_seed():
    design = ["beyond the seed", "as the seed claims", "the seed's figure", "The seed's 230260",
              "to reproduce the\n  seed;", "reproducing the seed.", "as in the seed and",
              "whose name follows the seed)", "The seed picks eps", "Seed 003's example",
              "the seed and its reference implementation"]
    random_seed = ["the seed=0 run", "over the seeds of a run", "a seeded layer",
                   "re-derives its key from the seed", "treat the seed (and files) as a secret",
                   "0 (the seed's own streams)", "`seed` only if given", "seed 0: the test",
                   "each seed's sampler", "the seed is then saved"]
    assert [p for p in design if not DESIGN_SEED.search(re.sub(r"\s+", " ", p))] == []
    assert [p for p in random_seed if DESIGN_SEED.search(p)] == []


def test_nothing_calls_the_original_design_the_seed():
    """Docs, package code and bench scripts say "the original design", "the reference
    implementation" or cite the paper: "the seed" reads as the `seed=` argument."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]
    offenders = []
    for path in files:
        text = path.read_text()
        flat = re.sub(r"\s+", " ", text)  # a phrase may be wrapped over two lines
        for match in DESIGN_SEED.finditer(flat):
            context = flat[max(match.start() - 20, 0):match.end() + 20]
            offenders.append(f"{path.relative_to(ROOT)}: ...{context}...")
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
    strays = {p.name for p in (ROOT / "docs" / "results").iterdir()
              if p.stem not in {page.stem for page in results}}
    assert strays == set()  # a figure or JSON belongs to the results page of its name


def test_test_modules_named_in_the_docs_exist():
    named = {(path.name, m) for path in DOCS + sorted(PACKAGE.rglob("*.py"))
             for m in re.findall(r"tests/(test_\w+\.py)", path.read_text())}
    assert sorted((where, m) for where, m in named if not (ROOT / "tests" / m).exists()) == []


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


# Test modules that are about the package as a whole, not one module (adversarial tests are
# test_adversarial_*.py). Every other test module is named after the module it tests.
CROSS_CUTTING = {
    "test_api_docs.py": "the API reference builds from the docstrings",
    "test_architecture.py": "the floors and imports of docs/architecture.md",
    "test_bench.py": "every bench/ script's --quick mode",
    "test_gpu_check.py": "bench/gpu_check.py (the JAX tests and benchmarks on a GPU), on the CPU",
    "test_bench_hfl_signds.py": "bench/hfl_signds.py's DP-FedAvg eps against dp-accounting",
    "test_clear_errors.py": "a new user's common mistakes, on every path",
    "test_cli.py": "the command line (keras_fedpriv/__main__.py)",
    "test_docs_horizontal.py": "the horizontal guide's examples run",
    "test_examples.py": "the examples' defaults learn (examples/, in one process)",
    "test_export.py": "save, load and export of every object",
    "test_flower_faults_horizontal.py": "a horizontal client killed and restarted on loopback",
    "test_flower_jax.py": "the horizontal and vertical Flower apps with a JAX model",
    "test_house.py": "these rules",
    "test_horizontal_faults.py": "horizontal FL's faults: lost and rejoining nodes, failed "
                                 "rounds, client data, report sizes",
    "test_integration.py": "the layers inside Keras: tf.data, XLA, MirroredStrategy, fit",
    "test_mixed_precision.py": "mixed_float16 / bfloat16 end to end",
    "test_readme.py": "the README's examples run",
    "test_typing.py": "type hints on the public API",
}


def _module_stems():
    paths = [p for p in PACKAGE.rglob("*.py") if not p.name.startswith("_")]
    packages = [p for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").exists()]
    return ({p.stem for p in paths} | {f"{p.parent.name}_{p.stem}" for p in paths}
            | {p.name for p in packages})


#: module names that several modules share, each tested by a module named after it alone
SHARED_STEM_TESTS = {
    "mechanisms/signds.py": "test_signds.py",
    "optimizers/signds.py": "test_signds_optimizer.py",
}


def _test_names(path, shared):
    """The names a module's test module may have: tests/test_<package>_<module>.py, and
    tests/test_<module>.py (test_flower_<module>.py for the Flower apps) unless another module
    has the same name (``loop``, ``wire``, ``driver`` of both protocols)."""
    names = {f"test_{path.parent.name}_{path.stem}.py"}
    if path.stem not in shared:
        names |= {f"test_{path.stem}.py", f"test_flower_{path.stem}.py"}
    own = SHARED_STEM_TESTS.get(path.relative_to(PACKAGE).as_posix())
    return names | {own} if own else names


def test_every_module_has_its_own_test_module():
    """tests/test_<module>.py (test_flower_<module>.py for the Flower apps) for every module."""
    tests = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    modules = [p for p in sorted(PACKAGE.rglob("*.py"))
               if not p.name.startswith("_")]  # __init__, __main__ and private helpers
    seen, shared = set(), set()
    for path in modules:
        (shared if path.stem in seen else seen).add(path.stem)
    homeless = [path.relative_to(PACKAGE).as_posix() for path in modules
                if not _test_names(path, shared) & tests]
    assert homeless == []


def test_every_test_module_names_what_it_tests():
    stems = _module_stems()
    strays = [p.name for p in sorted((ROOT / "tests").glob("test_*.py"))
              if p.name not in CROSS_CUTTING and not p.name.startswith("test_adversarial_")
              and p.stem[5:] not in stems and p.stem[len("test_flower_"):] not in stems]
    assert strays == []
    assert set(CROSS_CUTTING) <= {p.name for p in (ROOT / "tests").glob("test_*.py")}
