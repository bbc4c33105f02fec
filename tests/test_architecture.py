"""The package's shape (docs/architecture.md): floors, no circle, no private name across modules.

In the manner of import-linter's layer contracts, read from the source with `ast` (nothing is
imported; docs/architecture.py reads the graph and places each module on its floor by its
dotted path). The known breaches below are listed one by one, each with why it is there: the
lists only shrink. A new breach fails; a listed one that is gone fails too, asking for its
line to be deleted.
"""

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import architecture  # noqa: E402

pytestmark = [pytest.mark.jax]

PACKAGE = architecture.PACKAGE

#: Imports that point up a floor today, each to be removed (issue 28): importer -> imported.
KNOWN_UPWARD = set()

#: Import circles today (each sorted), to be untangled (issue 28).
KNOWN_CIRCLES = []

#: ``_``-prefixed names that one package module imports from another today (importer,
#: defining module, name): each should become public within the package or move to where it
#: is used (issue 28). The list only shrinks.
KNOWN_PRIVATE_IMPORTS = set()


#: ``_``-prefixed methods that a module calls on another module's objects today (caller,
#: defining module, method), found by name: a method ``_m`` of a class of the package, called
#: as ``obj._m`` (not ``self._m``, ``cls._m`` or ``super()._m``) outside the module that
#: defines it. Each should become public or move to where it is used. The list only shrinks.
KNOWN_PRIVATE_METHODS = set()


@pytest.fixture(scope="module")
def graph():
    return architecture.import_graph()


def _compare(found, known, what):
    new = sorted(set(map(tuple, found)) - set(map(tuple, known)))
    gone = sorted(set(map(tuple, known)) - set(map(tuple, found)))
    assert new == [], f"new {what}: {new} (docs/architecture.md says where each module belongs)"
    assert gone == [], f"{what} fixed, delete their lines from tests/test_architecture.py: {gone}"


def test_every_module_sits_on_a_floor(graph):
    floors = {architecture.floor_of(module) for module in graph}
    assert floors == set(architecture.FLOOR_NAMES)  # each floor holds a module, none is extra
    assert architecture.floor_of(PACKAGE) == "face"
    # a new subpackage falls on the floor of the package that holds it, without an edit here
    assert architecture.floor_of(f"{PACKAGE}.federated.vertical.loop") == "protocols"
    assert architecture.floor_of(f"{PACKAGE}.federated.flower.vertical_server") == "runtimes"
    assert architecture.floor_of(f"{PACKAGE}.mechanisms.registry") == "mechanisms"


def test_the_graph_reads_every_kind_of_import(tmp_path):
    """Top-level and function-level imports, relative ones and the lazy exports' strings; a
    logger's name is no import."""
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text(f'import {PACKAGE}.c as c\nEXPORTS = {{"f": '
                                         f'"{PACKAGE}.sub.b"}}\n')
    (package / "sub" / "__init__.py").write_text("from . import a\n")
    (package / "sub" / "a.py").write_text(
        f"import logging\nfrom {PACKAGE}.sub.b import f\nlogger = logging.getLogger("
        f"'{PACKAGE}')\ndef g():\n    from {PACKAGE} import c\n    return c, f\n")
    (package / "sub" / "b.py").write_text("from .a import logger\nf = 1\n")
    (package / "c.py").write_text("C = 'keras_fedpriv.sub'\n")  # a message, not an import
    graph = architecture.import_graph(package)
    assert graph == {PACKAGE: {f"{PACKAGE}.c", f"{PACKAGE}.sub.b"},
                     f"{PACKAGE}.sub": {f"{PACKAGE}.sub.a"},
                     f"{PACKAGE}.sub.a": {f"{PACKAGE}.sub.b", f"{PACKAGE}.c"},
                     f"{PACKAGE}.sub.b": {f"{PACKAGE}.sub.a"}, f"{PACKAGE}.c": set()}
    assert architecture.circles(graph) == [[f"{PACKAGE}.sub.a", f"{PACKAGE}.sub.b"]]
    with pytest.raises(ValueError, match="module='numpy'"):
        architecture.floor_of("numpy")


def test_no_import_points_up_a_floor(graph):
    _compare(architecture.upward_arrows(graph), KNOWN_UPWARD, "upward imports")


def test_the_imports_form_no_circle(graph):
    assert architecture.circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]]
    _compare(architecture.circles(graph), KNOWN_CIRCLES, "import circles")


def test_no_new_private_name_crosses_a_module_line():
    _compare(architecture.private_imports(), KNOWN_PRIVATE_IMPORTS,
             "private names imported across modules")


def test_the_picture_is_drawn_from_the_graph(tmp_path, graph):
    pytest.importorskip("matplotlib")
    target = tmp_path / "architecture.png"
    architecture.draw(graph, target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = pytest.importorskip("PIL.Image")
    digest = architecture.picture(graph)["digest"]
    assert image.open(target).text[architecture.DIGEST_KEY].endswith(digest)
    stored = image.open(ROOT / "docs" / "architecture.png").text.get(architecture.DIGEST_KEY, "")
    assert stored.endswith(digest), "docs/architecture.png is stale: python docs/architecture.py"
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert "architecture.png" in page and "python docs/architecture.py" in page
    assert all(name in page for name in architecture.FLOOR_NAMES)


def test_every_module_that_registers_keras_objects_is_imported_when_keras_is():
    """keras_fedpriv/_lazy.py imports the root package's list as soon as Keras loads: a module
    missing from it would leave its objects unknown to ``keras.models.load_model``."""
    decorator = re.compile(r"^@keras\.saving\.register_keras_serializable\(", re.M)
    registering = sorted(module for module, path in architecture.modules().items()
                         if decorator.search(path.read_text(encoding="utf-8")))
    root = ast.parse((ROOT / PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    listed = next(ast.literal_eval(node.value) for node in root.body
                  if isinstance(node, ast.Assign) and node.targets[0].id == "_KERAS_OBJECTS")
    assert sorted(listed) == registering


def test_one_import_mechanism():
    """Lazy exports and the Keras registration are keras_fedpriv/_lazy.py's alone: no other
    module defines a module-level ``__getattr__`` or watches imports (``sys.meta_path``), but
    `logs.quiet_tensorflow`, which hides TensorFlow's start-up lines, not to import faster."""
    hooks = {}
    for module, path in architecture.modules().items():
        tree = architecture.syntax_tree(path)
        if any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
               for node in tree.body):
            hooks.setdefault(module, set()).add("__getattr__")
        if "sys.meta_path" in path.read_text(encoding="utf-8"):
            hooks.setdefault(module, set()).add("sys.meta_path")
    assert hooks == {f"{PACKAGE}._lazy": {"sys.meta_path"}, f"{PACKAGE}.logs": {"sys.meta_path"}}


def test_no_new_private_method_is_called_from_another_module():
    _compare(architecture.private_methods_called_elsewhere(), KNOWN_PRIVATE_METHODS,
             "private methods called from other modules")
