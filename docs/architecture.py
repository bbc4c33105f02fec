"""The package's floors and its import graph, read from the source; draws docs/architecture.png.

Usage: ``python docs/architecture.py [OUTPUT.png]`` (default ``docs/architecture.png``; needs
matplotlib, the ``bench`` extra). The picture is generated from the code, never drawn by
hand: redraw it after moving or adding a module. ``python docs/architecture.py --breaches``
prints every breach of the rules, as ``tests/test_architecture.py`` lists them.

Every module of ``keras_fedpriv`` sits on one floor, chosen by its dotted path (the longest
prefix in `PLACES`), so a new module or subpackage falls on the floor of the package that
holds it. An import may point down or stay on its floor, never up, and the imports may form
no circle; ``tests/test_architecture.py`` keeps it so, in the manner of import-linter's layer
contracts. The imports are read with `ast` (nothing is imported): every ``import`` and
``from ... import`` statement, also those inside functions (the lazy ones), and the package
modules named by strings in tables (the lazy exports') or given to ``importlib.import_module``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import sys
import textwrap
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

PACKAGE = "keras_fedpriv"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

#: The floors, lowest first: (name, what lives there). A module may import from its own floor
#: and the floors below it.
FLOORS = (
    ("foundation", "Keras backends (TensorFlow, JAX), logging, text tables, lazy imports"),
    ("mechanisms", "randomized response, Laplace, Gaussian, SignDS, quantize; DP events, ledger"),
    ("layers / encoders", "LabelDPLayer, EmbeddingDPLayer, VAEBottom, privatize; SignDS encoder "
                          "and optimizer"),
    ("accounting / attacks", "privacy report, budget, plans, audit, dELDP; the attacks"),
    ("protocols", "horizontal and vertical FL: parties, loop, wire, in-process driver; uploads, "
                  "MagRR, LaplaceEvaluation"),
    ("runtimes", "Flower: server and client apps, strategies, central DP, party worker"),
    ("face", "the package's exports, the command line, demos, data sets, examples' models, "
             "tuning"),
)
FLOOR_NAMES = tuple(name for name, _ in FLOORS)

#: dotted path -> floor; a module sits on the floor of the longest path it starts with (the
#: package itself, ``keras_fedpriv``, is the face).
PLACES = {
    f"{PACKAGE}.backend": "foundation",
    f"{PACKAGE}.logs": "foundation",
    f"{PACKAGE}.text_table": "foundation",
    f"{PACKAGE}._lazy": "foundation",
    f"{PACKAGE}.mechanisms": "mechanisms",
    f"{PACKAGE}.layers": "layers / encoders",
    f"{PACKAGE}.optimizers": "layers / encoders",
    f"{PACKAGE}.privatize": "layers / encoders",
    f"{PACKAGE}.privacy": "accounting / attacks",
    f"{PACKAGE}.attacks": "accounting / attacks",
    f"{PACKAGE}.federated": "protocols",
    f"{PACKAGE}.callbacks": "protocols",
    f"{PACKAGE}.federated.flower": "runtimes",
    PACKAGE: "face",
}


def module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    """The dotted name of the module in file ``path`` (a package's ``__init__.py``: the package).

    Example: ``module_name(PACKAGE_DIR / "layers" / "__init__.py")`` is ``"keras_fedpriv.layers"``.
    """
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Every module of the package: dotted name -> file.

    Example: ``modules()["keras_fedpriv.mechanisms.laplace"].name`` is ``"laplace.py"``.
    """
    return {module_name(p, package_dir): p for p in sorted(package_dir.rglob("*.py"))}


def floor_of(module: str) -> str:
    """The floor of ``module`` (a dotted name in the package): that of its longest `PLACES` path.

    Example: ``floor_of("keras_fedpriv.federated.flower.strategy")`` is ``"runtimes"``.
    """
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        place = PLACES.get(".".join(parts[:n]))
        if place is not None:
            return place
    raise ValueError(f"module={module!r} is outside the package {PACKAGE!r}")


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """The parsed source of the file at ``path`` (read once per process).

    Example: ``syntax_tree(PACKAGE_DIR / "logs.py").body``.
    """
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The package module that ``name`` (a module, or a name inside one) resolves to."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(tree: ast.AST, module: str, is_package: bool, known: dict[str, Path]):
    """The dotted names that the module's imports (and module-naming strings) refer to."""
    base_package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import
                anchor = base_package.split(".")[:len(base_package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield full if full in known else base
        elif isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set, ast.Call)):
            yield from _module_strings(node, known)


def _module_strings(node: ast.AST, known: dict[str, Path]):
    """Package module names written as strings in a table (a lazy export's module: a dict's
    value, an item of a tuple, list or set) or given to ``importlib.import_module``; a string
    elsewhere (a message, a logger's name) is no import, nor the package's own name (``python
    -m keras_fedpriv`` in a command line)."""
    if isinstance(node, ast.Dict):
        items = node.values
    elif isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        items = node.args if name == "import_module" else []
    else:
        items = node.elts
    for item in items:
        if (isinstance(item, ast.Constant) and isinstance(item.value, str)
                and item.value in known and item.value != PACKAGE):
            yield item.value


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """Module -> the package modules it imports (itself left out), read from the source.

    Example: ``import_graph()["keras_fedpriv.mechanisms.laplace"]`` holds
    ``"keras_fedpriv.mechanisms.validation"``.
    """
    known = modules(package_dir)
    graph = {}
    for module, path in known.items():
        names = _imported_names(syntax_tree(path), module, path.name == "__init__.py", known)
        graph[module] = {_owner(n, known) for n in names if n.split(".")[0] == PACKAGE} - {
            module, None}
    return graph


def upward_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that point from a lower floor to a higher one, sorted.

    Example: ``upward_arrows({"keras_fedpriv.mechanisms.random": {"keras_fedpriv.layers"}})``
    is ``[("keras_fedpriv.mechanisms.random", "keras_fedpriv.layers")]``.
    """
    level = {name: n for n, name in enumerate(FLOOR_NAMES)}
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if level[floor_of(b)] > level[floor_of(a)])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each group of modules that reach one another, sorted; [] if none.

    Example: ``circles({"a": {"b"}, "b": {"a"}, "c": {"a"}})`` is ``[["a", "b"]]``.
    """
    names = sorted(set(graph) | {b for targets in graph.values() for b in targets})
    index = {name: n for n, name in enumerate(names)}
    rows = [index[a] for a, targets in graph.items() for _ in targets]
    cols = [index[b] for targets in graph.values() for b in targets]
    matrix = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
    _, labels = connected_components(matrix, directed=True, connection="strong")
    groups: dict[int, list[str]] = {}
    for name, label in zip(names, labels):
        groups.setdefault(label, []).append(name)
    return sorted(group for group in groups.values() if len(group) > 1)


def _short(module: str) -> str:
    return module[len(PACKAGE) + 1:]


def private_imports(package_dir: Path = PACKAGE_DIR) -> set[tuple[str, str, str]]:
    """(importer, defining module, name) for each ``_name`` that one package module takes from
    another: ``from keras_fedpriv.m import _name``, or ``m._name`` on an imported module.
    Module names are written without the ``keras_fedpriv.`` prefix.

    Example: ``("privacy.run_plan", "privacy.planning", "_event") in private_imports()`` while
    run_plan imports planning's private ``_event``.
    """
    known = modules(package_dir)
    found = set()
    for module, path in known.items():
        tree = syntax_tree(path)
        aliases = {}  # local name -> the package module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in known:
                        aliases[alias.asname or alias.name] = full
                    elif alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.add((module, node.module, alias.name))
            elif isinstance(node, ast.Import):
                aliases.update({alias.asname: alias.name for alias in node.names
                                if alias.asname and alias.name.startswith(PACKAGE)})
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                found.add((module, aliases[node.value.id], node.attr))
    return {(_short(a), _short(b), name) for a, b, name in found if a != b}


def private_methods_called_elsewhere(package_dir: Path = PACKAGE_DIR) -> set[tuple[str, str, str]]:
    """(caller, defining module, method) for each ``obj._m`` outside the modules whose classes
    define a method ``_m``, found by name (``self._m``, ``cls._m`` and ``super()._m`` aside).
    Module names are written without the ``keras_fedpriv.`` prefix.

    Example: ``("federated.magrr", "mechanisms.random", "_mark_restored_from_config")`` while
    MagRR calls the seeded state's private restore step.
    """
    known = modules(package_dir)
    defined: dict[str, set[str]] = {}  # method name -> the modules whose classes define it
    for module, path in known.items():
        for node in ast.walk(syntax_tree(path)):
            if isinstance(node, ast.ClassDef):
                defined.update({item.name: defined.get(item.name, set()) | {module}
                                for item in node.body
                                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                                and item.name.startswith("_") and not item.name.endswith("__")})
    found = set()
    for module, path in known.items():
        for node in ast.walk(syntax_tree(path)):
            if not isinstance(node, ast.Attribute) or module in defined.get(node.attr, {module}):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and getattr(owner.func, "id", "") == "super":
                continue
            found.update((_short(module), _short(where), node.attr)
                         for where in defined[node.attr])
    return found


def breaches(package_dir: Path = PACKAGE_DIR) -> dict[str, list]:
    """Every breach of the rules today, by kind, sorted: what tests/test_architecture.py lists.

    Example: ``breaches()["circles"]`` is ``[]`` once the imports form no circle.
    """
    graph = import_graph(package_dir)
    return {"upward imports": upward_arrows(graph), "circles": circles(graph),
            "private imports": sorted(private_imports(package_dir)),
            "private methods": sorted(private_methods_called_elsewhere(package_dir))}


def group_of(module: str, packages: set[str]) -> str:
    """The box a module is drawn in: its package (a package or a top-level module: itself),
    without the ``keras_fedpriv.`` prefix; ``packages`` are the package's packages.

    Example: ``group_of("keras_fedpriv.federated.flower.worker", {"keras_fedpriv.federated"})``
    is ``"federated.flower"``.
    """
    if module in packages or module.count(".") <= 1:
        return module.partition(".")[2] or PACKAGE
    return module.rpartition(".")[0].partition(".")[2]


def picture(graph: dict[str, set[str]]) -> dict:
    """What the picture shows, as data: ``boxes`` (box -> its modules' short names),
    ``floors`` (floor -> its boxes, left to right), ``arrows`` ((box, box) -> imports) and
    ``upward`` (the arrows that point up), and ``digest``, a hash of all four that the PNG
    carries, so that a stale picture is caught (tests/test_architecture.py).

    Example: ``picture(import_graph())["floors"]["runtimes"]`` is ``["federated.flower"]``.
    """
    packages = {module.rpartition(".")[0] for module in graph}
    box_of = functools.partial(group_of, packages=packages)
    boxes: dict[str, list[str]] = {}
    for module in sorted(graph):  # a box lists its modules (a package or top module aside)
        boxes.setdefault(box_of(module), [])
        if module not in packages and module.count(".") > 1:
            boxes[box_of(module)].append(module.rpartition(".")[2])
    floors: dict[str, list[str]] = {name: [] for name in FLOOR_NAMES}
    for box in sorted(boxes):
        floors[floor_of(f"{PACKAGE}.{box}" if box != PACKAGE else PACKAGE)].append(box)
    arrows: dict[tuple[str, str], int] = {}
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            pair = (box_of(a), box_of(b))
            if pair[0] != pair[1]:
                arrows[pair] = arrows.get(pair, 0) + 1
    upward = sorted({(box_of(a), box_of(b)) for a, b in upward_arrows(graph)})
    shown = repr((sorted(boxes.items()), sorted(floors.items()), sorted(arrows.items()), upward))
    return {"boxes": boxes, "floors": floors, "arrows": arrows, "upward": upward,
            "digest": hashlib.sha256(shown.encode()).hexdigest()}


#: the PNG text field that holds `picture`'s digest
DIGEST_KEY = "Description"


def draw(graph: dict[str, set[str]], output: Path) -> None:
    """Draw the floors, a box per package with its modules, and the arrows between boxes.

    An arrow goes from the importing box to the imported one, wider for more imports; red
    where it points up (none should). The PNG carries `picture`'s digest in its text field
    `DIGEST_KEY`. Example: ``draw(import_graph(), Path("arch.png"))``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch
    from PIL import Image, PngImagePlugin

    shown = picture(graph)
    boxes, floors = shown["boxes"], shown["floors"]
    width, floor_height = 26.0, 2.3
    fig, ax = plt.subplots(figsize=(width, floor_height * len(FLOORS) + 0.6))
    centers = {}
    for level, (name, about) in enumerate(FLOORS):
        y = level * floor_height
        ax.add_patch(FancyBboxPatch((0, y + 0.1), width, floor_height - 0.2,
                                    boxstyle="round,pad=0.02", color=f"C{level}", alpha=0.08))
        ax.text(0.15, y + floor_height - 0.3, f"{level}. {name}", fontsize=13, weight="bold",
                va="top")
        ax.text(0.15, y + floor_height - 0.65, textwrap.fill(about, 34), fontsize=8, va="top",
                color="0.3")
        row = floors[name]
        slot = (width - 4.2) / max(len(row), 1)
        for n, box in enumerate(row):
            x = 4.2 + slot * (n + 0.5)
            members = " ".join(boxes[box])
            label = box + ("\n" + textwrap.fill(members, min(max(int(slot * 6), 18), 56))
                           if members else "")
            ax.text(x, y + floor_height / 2, label, ha="center", va="center", fontsize=8.5,
                    bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": f"C{level}"})
            centers[box] = (x, y + floor_height / 2)
    for (a, b), count in sorted(shown["arrows"].items()):
        (xa, ya), (xb, yb) = centers[a], centers[b]
        bad = (a, b) in shown["upward"]
        ax.annotate("", xy=(xb, yb + 0.35 if yb < ya else yb - 0.35),
                    xytext=(xa, ya - 0.35 if yb < ya else ya + 0.35),
                    arrowprops={"arrowstyle": "-|>", "lw": 0.4 + 0.25 * min(count, 8),
                                "color": "red" if bad else "0.45", "alpha": 0.9 if bad else 0.35,
                                "connectionstyle": "arc3,rad=0.08" if ya != yb else
                                "arc3,rad=0.12"})
    ax.set_xlim(0, width)
    ax.set_ylim(0, floor_height * len(FLOORS))
    ax.axis("off")
    ax.set_title("keras_fedpriv: modules by floor (boxes: packages); arrows: imports, pointing "
                 "down (red: pointing up)", fontsize=12)
    fig.tight_layout()
    rendered = io.BytesIO()
    fig.savefig(rendered, dpi=80)
    plt.close(fig)
    # 256 colours (a third of the bytes; Pillow comes with matplotlib), and the digest
    info = PngImagePlugin.PngInfo()
    info.add_text(DIGEST_KEY, f"{PACKAGE} imports {shown['digest']}")
    image = Image.open(rendered).convert("RGB").quantize(256, Image.Quantize.MEDIANCUT)
    image.save(output, optimize=True, pnginfo=info)


def main(argv: list[str]) -> None:
    """``python docs/architecture.py [OUTPUT.png]`` draws the picture; ``--breaches [DIR]``
    prints every breach of the rules in the package at DIR (default: this checkout's), one
    per line, as tests/test_architecture.py lists them.

    Example: ``main(["--breaches"])``.
    """
    if argv[:1] == ["--breaches"]:
        found = breaches(Path(argv[1]) if len(argv) > 1 else PACKAGE_DIR)
        for kind, items in found.items():
            print(f"{kind}: {len(items)}")
            for item in items:
                print(f"    {tuple(item)!r},")
        return
    target = Path(argv[0]) if argv else Path(__file__).with_suffix(".png")
    draw(import_graph(), target)
    print(f"wrote {target}")


if __name__ == "__main__":
    main(sys.argv[1:])
