"""The API reference builds (docs/build_api.py, `make api`): a broken docstring or import fails CI.

The reference must also be usable: every public module has a page, linked from the root page
(where index.html leads) and from its parent package's page, and the root page stays small
(re-exported names are documented once, where they are defined, and linked elsewhere).
"""

import posixpath
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
from build_api import check_pdoc_template, check_root_links, public_modules  # noqa: E402

MB = 1024 * 1024


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "api"
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "build_api.py"), str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def _page(module):
    return module.replace(".", "/") + ".html"


def _links(site, page):
    """The pages ``page`` links to (site-relative paths, fragments dropped)."""
    html = (site / page).read_text()
    hrefs = re.findall(r'href="([^"#:]+)(?:#[^"]*)?"', html)
    return {posixpath.normpath(posixpath.join(posixpath.dirname(page), h)) for h in hrefs}


def _root_page(site):
    """The page index.html leads to (pdoc redirects there when there is one root module)."""
    html = (site / "index.html").read_text()
    redirect = re.search(r'http-equiv="refresh" content="0; url=\./([^"]+)"', html)
    return redirect.group(1) if redirect else "index.html"


@pytest.mark.slow
def test_api_reference_builds_every_public_module(site):
    assert (site / "index.html").exists()
    for page in ("keras_fedpriv/layers/label_dp.html", "keras_fedpriv/mechanisms/ledger.html",
                 "keras_fedpriv/privacy/report.html", "keras_fedpriv/privacy/planning.html",
                 "keras_fedpriv/federated/vertical.html", "keras_fedpriv/tuning.html"):
        assert (site / page).exists(), page
    ledger = (site / "keras_fedpriv/mechanisms/ledger.html").read_text()
    assert "ReleaseLedger" in ledger and "privacy_ledger" in ledger


@pytest.mark.slow
def test_every_public_module_is_linked_from_the_root_and_its_parent(site):
    modules = public_modules()
    assert {"keras_fedpriv.tuning", "keras_fedpriv.federated.flower",
            "keras_fedpriv.federated.horizontal.loop",
            "keras_fedpriv.federated.vertical.parties"} <= set(modules)
    root = _root_page(site)
    assert root == _page("keras_fedpriv")
    from_root = _links(site, root)
    missing_page = [m for m in modules if not (site / _page(m)).exists()]
    unlinked = [m for m in modules if m != "keras_fedpriv" and _page(m) not in from_root]
    assert not missing_page and not unlinked, (missing_page, unlinked)
    orphans = [m for m in modules if "." in m
               and _page(m) not in _links(site, _page(m.rsplit(".", 1)[0]))]
    assert not orphans


@pytest.mark.slow
def test_reexports_are_documented_once_and_the_root_page_is_small(site):
    root = site / _root_page(site)
    assert root.stat().st_size < 1 * MB
    html = root.read_text()
    # the package's lazy exports are links to the defining module, not inlined copies
    assert "Exported names" in html
    assert "keras_fedpriv/layers/label_dp.html#LabelDPLayer" in html
    assert 'id="LabelDPLayer"' not in html
    defining = (site / "keras_fedpriv/layers/label_dp.html").read_text()
    assert 'id="LabelDPLayer"' in defining
    # the search index indexes each object once (it was 9.3 MB with every re-export copied)
    assert (site / "search.js").stat().st_size < 7 * MB


def test_a_pdoc_whose_default_template_changed_fails_the_build_by_name(tmp_path):
    """Jinja ignores an overridden block that the parent lacks: without this check a new pdoc
    could drop the module list silently. The installed pdoc's template has every hook."""
    import pdoc

    default = Path(pdoc.__file__).parent / "templates" / "default" / "module.html.jinja2"
    check_pdoc_template(default, pdoc.__version__)
    renamed = tmp_path / "module.html.jinja2"
    renamed.write_text(default.read_text().replace("block nav_submodules", "block submodules"))
    with pytest.raises(SystemExit, match=r"pdoc 99\.0.*nav_submodules"):
        check_pdoc_template(renamed, "99.0")


def test_a_root_page_missing_a_module_link_fails_the_build(tmp_path):
    (tmp_path / "pkg.html").write_text('<a href="pkg/a.html">a</a>')
    check_root_links(tmp_path, ["pkg", "pkg.a"])
    with pytest.raises(SystemExit, match=r"does not link \['pkg.b'\]"):
        check_root_links(tmp_path, ["pkg", "pkg.a", "pkg.b"])


def test_make_api_documents_this_checkout_with_pdoc_16_and_never_upgrades_pip():
    """`make api` in a user's venv: no pip upgrade, no test extras; this checkout is always
    installed (editable, without dependencies: another installed version of the package is
    replaced), and pdoc installed unless its major version is 16 (a dry run lists the
    commands)."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("no make")
    # --no-print-directory: under `make test` (MAKELEVEL set) make prints "Entering directory"
    out = subprocess.run(["make", "-n", "--no-print-directory", "api"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    commands = out.stdout.replace("\\\n", "").splitlines()
    assert not any("--upgrade" in c or "[test" in c or "[bench" in c for c in commands)
    always = [c for c in commands if "pip install" in c and "||" not in c]
    assert len(always) == 1 and "--no-deps" in always[0] and always[0].endswith("-e .")
    (pdoc,) = [c for c in commands if "pdoc>=16,<17" in c]
    assert "pdoc.__version__" in pdoc and "'16'" in pdoc and "||" in pdoc
    assert commands[-1].endswith("docs/build_api.py build/api")
