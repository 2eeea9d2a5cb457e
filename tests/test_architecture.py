"""The package boundaries of docs/architecture.md, checked on every module's imports (ast).

(a) No module imports another package's private module: ``gradspec.X._y`` is imported
    only from inside ``gradspec.X`` (``gradspec._y`` only from inside ``gradspec``); other
    packages use what ``gradspec.X`` exports. :data:`KNOWN_PRIVATE` lists the violations
    not yet fixed (none now); a new one fails.
(b) The package graph: the trainer (``train``) knows nothing of recording (``collect``) or
    of the optimizers (``optim``); the optimizers are hooks of the trainer, never of
    ``collect``; only ``gradspec.store`` imports zarr.
(c) No circles: the module graph (every explicit import, lazy ones too) has no cycle,
    within a package or between packages, and every package import points down the
    floors of :data:`FLOORS` (docs/architecture.md draws them).

``python -m tests.test_architecture`` prints the package graph (docs/architecture.md
shows it) and the private imports.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("gradspec", "cli", "analyses")  # the library, its shell and the reproductions

#: Private imports across packages that are still to be fixed (importer, imported). Empty:
#: the last ones (cli/retrain.py's) are fixed; never add one.
KNOWN_PRIVATE: frozenset[tuple[str, str]] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def modules() -> dict[str, Path]:
    """Every scanned module by dotted name."""
    out = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def imports(path: Path) -> set[str]:
    """The dotted names a module imports, at any depth (lazy imports in functions too).

    ``from a.b import c`` yields ``a.b`` and, when ``c`` is a submodule (a file or a
    package here), ``a.b.c`` too.
    """
    name = _module_name(path)
    package = name if _is_package(path) else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.add(target)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                where = ROOT / Path(*sub.split("."))
                if where.with_suffix(".py").exists() or (where / "__init__.py").exists():
                    out.add(sub)
    return out


def owner(module: str) -> str:
    """The package whose private parts ``module``'s name reaches into: ``gradspec.X`` for
    ``gradspec.X._y...``, ``gradspec`` for ``gradspec._y``; '' for a public name."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__") and i > 0:
            return ".".join(parts[:i])
    return ""


def private_imports() -> set[tuple[str, str]]:
    """(importer, imported) pairs where the importer is outside the imported module's owner."""
    found = set()
    for name, path in modules().items():
        for target in imports(path):
            own = owner(target)
            if own.startswith("gradspec") and not (name == own or name.startswith(own + ".")):
                found.add((name, target))
    return found


#: The shared floor: gradspec's top-level private modules (``gradspec._enums``,
#: ``_layout``, ``_device``, ``_json``, ...), below every package. ``gradspec`` itself is the
#: flat API (``gradspec/__init__.py``), above every package.
BASE = "gradspec._base"


def package(module: str) -> str:
    """``gradspec.X`` for a module of the library, :data:`BASE` for its shared top-level
    modules, ``gradspec`` for the flat API, ``cli``/``analyses`` for the shell and the
    reproductions, else the top-level name."""
    parts = module.split(".")
    if parts[0] == "gradspec" and len(parts) > 1:
        return BASE if parts[1].startswith("_") else f"gradspec.{parts[1]}"
    return parts[0]


def package_graph() -> dict[str, set[str]]:
    """Package -> the packages (of gradspec, and zarr) its modules import."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules().items():
        src = package(name)
        for target in imports(path):
            dst = package(target)
            if dst != src and (dst.startswith("gradspec") or dst == "zarr"):
                graph[src].add(dst)
    return dict(graph)


# ---------------------------------------------------------------------- (a)
def test_no_new_private_imports_across_packages():
    new = sorted(private_imports() - KNOWN_PRIVATE)
    assert not new, (
        "these modules import another package's private module; export the name from the "
        "package's __init__ and import it from there:\n" + "\n".join(f"  {a} -> {b}" for a, b in new))


def module_graph() -> dict[str, set[str]]:
    """Module -> the gradspec modules it imports (each import resolved to the deepest
    scanned module it names: ``from gradspec.store import X`` is an arrow to the package
    ``gradspec.store``, i.e. its ``__init__``)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = set()
        for target in imports(path):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name and target.split(".")[0] in SCANNED:
                targets.add(target)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


#: The floors, bottom up: a package imports only packages on a lower floor (never one on
#: its own floor or above). docs/architecture.md draws the same floors.
FLOORS: tuple[tuple[str, ...], ...] = (
    (BASE,),  # enums, layout, device, json, attention masks: shared, zarr-free
    ("gradspec.privacy", "gradspec.store"),
    ("gradspec.sketch",),  # the plan and factors, and the stated error of a stored sketch (reads stores)
    ("gradspec.linalg", "gradspec.spectrum", "gradspec.tasks"),
    ("gradspec.plot", "gradspec.train"),
    ("gradspec.collect", "gradspec.optim"),
    ("gradspec.report",),  # the page of a run: reads every part, so above them all
    ("gradspec",),  # the flat API
    ("cli", "analyses"),
)


def floor_of(pkg: str) -> int:
    for level, members in enumerate(FLOORS):
        if pkg in members:
            return level
    raise KeyError(pkg)


# ---------------------------------------------------------------------- (b)
FORBIDDEN = {  # package -> packages it never imports
    "gradspec.optim": {"gradspec.collect"},
    "gradspec.train": {"gradspec.collect", "gradspec.optim"},
    "gradspec.store": {"gradspec.train", "gradspec.collect", "gradspec.optim"},
    "gradspec.privacy": {"gradspec.train", "gradspec.collect", "gradspec.optim", "gradspec.store"},
}


def test_package_graph():
    graph = package_graph()
    broken = {pkg: sorted(graph.get(pkg, set()) & never) for pkg, never in FORBIDDEN.items()}
    assert not any(broken.values()), f"forbidden package imports: { {k: v for k, v in broken.items() if v} }"
    assert graph.get("gradspec.collect", set()) >= {"gradspec.train", "gradspec.store"}


def test_only_the_store_imports_zarr():
    users = sorted(pkg for pkg, deps in package_graph().items() if "zarr" in deps)
    assert users == ["gradspec.store"], users


def test_the_scan_sees_imports():
    """The scanner itself: absolute, relative, lazy and ``from package import _module``."""
    found = imports(ROOT / "gradspec" / "collect" / "__init__.py")
    assert {"gradspec.collect._collect", "gradspec.train"} <= found
    assert owner("gradspec.train._loop") == "gradspec.train" and owner("gradspec.train") == ""
    assert owner("gradspec._enums") == "gradspec"


# ---------------------------------------------------------------------- (c)
def test_no_import_circles_between_modules():
    found = circles(module_graph())
    assert not found, (
        "import circles (each line one strongly connected set of modules; move the shared "
        "piece below both, and import siblings, not the package's __init__):\n"
        + "\n".join("  " + " <-> ".join(c) for c in found))


def test_every_package_import_points_down_the_floors():
    graph = package_graph()
    unplaced = sorted((set(graph) | {d for ds in graph.values() for d in ds}) - {"zarr"}
                      - {p for f in FLOORS for p in f})
    assert not unplaced, f"packages without a floor in FLOORS: {unplaced}"
    upward = sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
                    if dst != "zarr" and floor_of(dst) >= floor_of(src))
    assert not upward, "imports that do not point down the floors:\n  " + "\n  ".join(upward)


#: The most lines a module may have: past it, two concepts usually share a room (split it
#: along its seams, as docs/architecture.md describes).
MAX_LINES = 500


def test_every_module_is_at_most_500_lines():
    long = sorted(f"{name}: {n} lines" for name, path in modules().items()
                  if (n := len(path.read_text().splitlines())) > MAX_LINES)
    assert not long, "modules over the limit:\n  " + "\n  ".join(long)


def test_the_circle_finder_finds_circles():
    """The checker itself, on a made-up graph: a 3-cycle, a 2-cycle, and a chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "f"}, "f": set()}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def graph_lines() -> list[str]:
    """The package graph, one line per package, as docs/architecture.md shows it."""
    graph = package_graph()
    return [f"{pkg:<18} -> {', '.join(sorted(graph[pkg]))}" for pkg in sorted(graph)]


def test_the_documented_graph_is_the_scanned_one():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = doc.split("## Packages and who may import whom", 1)[1].split("Rules the test enforces", 1)[0]
    documented = [line for line in block.splitlines() if re.match(r"[\w.]+ +-> ", line)]
    assert documented == graph_lines(), (
        "docs/architecture.md shows another package graph; paste the output of "
        "`python -m tests.test_architecture`:\n" + "\n".join(graph_lines()))


def main() -> None:
    print("\n".join(graph_lines()))
    print()
    for circle in circles(module_graph()):
        print("circle: " + " <-> ".join(circle))
    for importer, imported in sorted(private_imports()):
        print(f"private: {importer} -> {imported}")


if __name__ == "__main__":
    main()
