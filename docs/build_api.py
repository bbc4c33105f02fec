"""Build the API reference (a static HTML site) from the docstrings, with pdoc.

Usage: ``python docs/build_api.py [OUTPUT_DIR]`` (default ``build/api``), or ``make api``.
Every public module of the package is documented, including those that a package's
``__all__`` does not re-export (pdoc follows ``__all__`` otherwise). The module page template
(``docs/api_templates/module.html.jinja2``, pdoc's default extended) documents a re-exported
name once, on the page of the module that defines it, and links it from the re-exporting
package's page; every package page links all public modules below it, so the root page
links every module and stays small. Exits non-zero if a module cannot be imported or
documented, so the test suite keeps the build from breaking.
"""

from __future__ import annotations

import pkgutil
import sys
import warnings
from pathlib import Path

#: pdoc's module page with re-exported names as links and every submodule listed
TEMPLATES = Path(__file__).resolve().parent / "api_templates"
#: what our template overrides or calls in pdoc's default module template (pdoc 16)
PDOC_HOOKS = ("{% block nav_submodules %}", "{% block module_contents %}",
              "{% defaultmacro is_public(doc) %}")


def public_modules(package="keras_fedpriv"):
    """Names of the package and of every submodule whose name has no leading underscore."""
    root = __import__(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def build(output_dir="build/api"):
    """Write the site to ``output_dir``; return the list of documented modules."""
    import pdoc
    import pdoc.render

    modules = public_modules()
    # pdoc also adds the submodules a package lists itself; naming them again is harmless.
    warnings.filterwarnings("ignore", message="The module specification .* has already been")
    pdoc.render.configure(docformat="google", footer_text="keras-fedpriv API reference",
                          search=True, show_source=True, template_directory=TEMPLATES)
    check_pdoc_template(Path(pdoc.__file__).parent / "templates" / "default" / "module.html.jinja2",
                        pdoc.__version__)
    pdoc.pdoc(*modules, output_directory=Path(output_dir))
    check_root_links(Path(output_dir), modules)
    return modules


def check_pdoc_template(default, version):
    """Exit if pdoc's default module page no longer has what our template extends.

    Jinja ignores a block that the parent template lacks, so a renamed block in a
    new pdoc would silently drop the module list or the re-export links.
    """
    text = default.read_text() if default.exists() else ""
    missing = [hook for hook in PDOC_HOOKS if hook not in text]
    if missing:
        sys.exit(f"pdoc {version}'s default module template lacks {missing}, which "
                 f"{TEMPLATES / 'module.html.jinja2'} extends: adapt it or install pdoc 16.")


def check_root_links(site, modules):
    """Exit unless the root page links the page of every other public module."""
    root = (site / f"{modules[0]}.html").read_text()
    unlinked = [m for m in modules[1:] if f'href="{m.replace(".", "/")}.html' not in root]
    if unlinked:
        sys.exit(f"the API reference's root page does not link {unlinked}: check "
                 f"{TEMPLATES / 'module.html.jinja2'} against this pdoc version.")


if __name__ == "__main__":
    from keras_fedpriv.logs import quiet_tensorflow

    quiet_tensorflow()  # before pdoc imports the package's modules (and TensorFlow)
    out = sys.argv[1] if len(sys.argv) > 1 else "build/api"
    try:
        import pdoc
    except ImportError:
        sys.exit("the API reference needs pdoc: pip install 'pdoc>=16,<17' (or run `make api`)")
    if pdoc.__version__.split(".")[0] != "16":
        sys.exit(f"the API reference needs pdoc 16 (its templates are written for it); found "
                 f"pdoc {pdoc.__version__}: pip install 'pdoc>=16,<17' (or run `make api`)")
    documented = build(out)
    sizes = {name: (Path(out) / name).stat().st_size / 1e6
             for name in ("keras_fedpriv.html", "search.js")}
    print(f"API reference for {len(documented)} modules written to {out}/index.html (root page "
          f"{sizes['keras_fedpriv.html']:.2f} MB, search index {sizes['search.js']:.1f} MB)")
