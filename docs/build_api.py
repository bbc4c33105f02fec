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

import os
import pkgutil
import sys
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

#: pdoc's module page with re-exported names as links and every submodule listed
TEMPLATES = Path(__file__).resolve().parent / "api_templates"


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
    pdoc.pdoc(*modules, output_directory=Path(output_dir))
    return modules


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "build/api"
    documented = build(out)
    sizes = {name: (Path(out) / name).stat().st_size / 1e6
             for name in ("keras_fedpriv.html", "search.js")}
    print(f"API reference for {len(documented)} modules written to {out}/index.html (root page "
          f"{sizes['keras_fedpriv.html']:.2f} MB, search index {sizes['search.js']:.1f} MB)")
