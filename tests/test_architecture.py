"""The package boundaries of docs/architecture.md, checked on every module's imports (ast).

(a) No module imports another package's private module: ``gradspec.X._y`` is imported
    only from inside ``gradspec.X`` (``gradspec._y`` only from inside ``gradspec``); other
    packages use what ``gradspec.X`` exports. :data:`KNOWN_PRIVATE` lists the violations
    not yet fixed (none now); a new one fails.
(b) The package graph: the trainer (``train``) knows nothing of recording (``collect``) or
    of the optimizers (``optim``); the optimizers are hooks of the trainer, never of
    ``collect``; only ``gradspec.store`` imports zarr.

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


def package(module: str) -> str:
    """``gradspec.X`` for a module of the library (``gradspec`` for its top-level modules),
    ``cli``/``analyses`` for the shell and the reproductions, else the top-level name."""
    parts = module.split(".")
    if parts[0] == "gradspec" and len(parts) > 1 and not parts[1].startswith("_"):
        return f"gradspec.{parts[1]}"
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
    for importer, imported in sorted(private_imports()):
        print(f"private: {importer} -> {imported}")


if __name__ == "__main__":
    main()
