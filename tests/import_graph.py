"""The project's import graph from its source (ast, nothing imported), for tests/test_import_layers.py.

What counts as an import of module A by module B: every `import` and `from … import` statement in
B's file, wherever it stands — module level, inside a function (a deferred import is still a
dependency: it runs the first time the function does), and under `if TYPE_CHECKING:`. Type-only
imports count too: the annotation is part of what a reader must hold and what mypy follows, and a
circle through one means neither module can be read or checked apart (the memory plan and the
settings were such a circle). `from pkg import name` is an import of `pkg.name` where that is a
module, else of `pkg`; relative imports are resolved. The parent packages Python runs on the way
(`pkg/__init__.py` for `import pkg.mod`) are not counted: a package that re-exports its modules
would otherwise be in a circle with each of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} (line {self.line}) imports {self.imported}"


def modules(root: Path, packages: Iterable[str], exclude: Iterable[str] = ()) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under each package (or a top-level module file)."""
    skip = tuple(exclude)

    def excluded(name: str) -> bool:
        return any(name == s or name.startswith(f"{s}.") for s in skip)

    found: dict[str, Path] = {}
    for package in packages:
        single = root / f"{package}.py"
        if single.is_file():
            found[package] = single
            continue
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if not excluded(name):
                found[name] = path
    return found


def edges(found: dict[str, Path]) -> list[Edge]:
    """Every import of one of `found`'s modules by another (see the module's docstring)."""
    out: list[Edge] = []
    for importer, path in found.items():
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base for a in node.names]
            for name in targets:
                # `import a.b.c` of a module a.b.c, or of a name inside one: the longest known module.
                target = name
                while target and target not in found:
                    target = target.rpartition(".")[0]
                if target and target != importer:
                    out.append(Edge(importer, target, node.lineno))
    return out


def cycles(all_edges: list[Edge]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in all_edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def against_layers(all_edges: list[Edge], layers: list[set[str]]) -> list[Edge]:
    """Imports from a lower layer of a higher one, or between two packages of one layer (siblings
    such as cdk_constructs and k8s stay apart). `layers` lists top-level packages, lowest first."""
    rank = {package: i for i, layer in enumerate(layers) for package in layer}
    bad = []
    for e in all_edges:
        src, dst = e.importer.split(".")[0], e.imported.split(".")[0]
        if src != dst and rank[dst] >= rank[src]:
            bad.append(e)
    return bad
