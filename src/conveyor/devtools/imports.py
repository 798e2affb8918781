"""The import graph of a Python package, read from its source with `ast`.

Each import statement becomes an `ImportEdge` with a `when`:

- ``module``: runs when the importing module is imported (these are what can form import loops);
- ``function``: inside a function body, so it runs only when the function is called;
- ``type_checking``: under ``if TYPE_CHECKING:``, so it never runs.

Only imports of modules inside the analysed package are kept.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

__all__ = ["ImportEdge", "ImportGraph", "When", "scan_package"]


class When(StrEnum):
    """When an import statement runs."""

    MODULE = "module"
    FUNCTION = "function"
    TYPE_CHECKING = "type_checking"


@dataclass(frozen=True)
class ImportEdge:
    """`source` imports `target` (both dotted module names) at `line` of `source`'s file."""

    source: str
    target: str
    line: int
    when: When


@dataclass
class ImportGraph:
    """The modules of one package and the imports between them."""

    package: str
    modules: dict[str, Path] = field(default_factory=dict)
    edges: list[ImportEdge] = field(default_factory=list)

    def runtime_edges(self) -> list[ImportEdge]:
        """Edges that execute at some point (module- and function-level, not TYPE_CHECKING)."""
        return [e for e in self.edges if e.when is not When.TYPE_CHECKING]

    def module_level_edges(self) -> list[ImportEdge]:
        """Edges that execute on import: the only ones that can make an import loop."""
        return [e for e in self.edges if e.when is When.MODULE]

    def type_level_edges(self) -> list[ImportEdge]:
        """Module-level edges plus TYPE_CHECKING ones: what a type checker (or a reader) must
        follow to make sense of a module. A loop among these never fails at run time, but it
        ties lower layers to upper ones through their annotations."""
        return [e for e in self.edges if e.when is not When.FUNCTION]


def scan_package(root: Path, package: str | None = None) -> ImportGraph:
    """Parse every ``.py`` file under `root` (a package folder) into an `ImportGraph`.

    `package` is the dotted name of `root` (default: the folder's name).
    """
    root = Path(root)
    if not (root / "__init__.py").is_file():
        raise ValueError(f"{root} is not a Python package (no __init__.py)")
    name = package or root.name
    graph = ImportGraph(package=name)
    for path in sorted(root.rglob("*.py")):
        graph.modules[_module_name(root, name, path)] = path
    for module, path in graph.modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node, when in _imports(tree.body, When.MODULE):
            for target in dict.fromkeys(_targets(node, module, is_package, graph.modules)):
                if target != module:
                    graph.edges.append(ImportEdge(module, target, node.lineno, when))
    return graph


def _module_name(root: Path, package: str, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imports(
    body: Iterable[ast.stmt], when: When
) -> Iterator[tuple[ast.Import | ast.ImportFrom, When]]:
    """Every import statement in `body`, with when it runs, descending into nested blocks."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, when
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inner = When.TYPE_CHECKING if when is When.TYPE_CHECKING else When.FUNCTION
            yield from _imports(_body_of(node), inner)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.body, When.TYPE_CHECKING)
            yield from _imports(node.orelse, when)
        else:
            # Class bodies, try/with/for/if blocks run with their enclosing scope.
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _imports([child], when)


def _body_of(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.stmt]:
    return node.body if isinstance(node.body, list) else []


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: dict[str, Path]
) -> list[str]:
    """The package's modules `node` makes Python import, resolved to dotted names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return [t for t in (_nearest_module(n, known) for n in names) if t]
    base = _absolute_base(node, module, is_package)
    if base is None:
        return []
    targets = []
    for alias in node.names:
        # `from pkg import sub` imports the submodule when one exists, else a name of pkg.
        candidate = f"{base}.{alias.name}" if base else alias.name
        target = candidate if candidate in known else _nearest_module(base, known)
        if target:
            targets.append(target)
    return targets


def _absolute_base(node: ast.ImportFrom, module: str, is_package: bool) -> str | None:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    # A package's own name is its "current package"; a plain module's is its parent.
    drop = node.level - 1 if is_package else node.level
    if drop >= len(parts):
        return None
    anchor = parts[: len(parts) - drop]
    return ".".join(anchor + ([node.module] if node.module else []))


def _nearest_module(name: str, known: dict[str, Path]) -> str | None:
    """`name` or its nearest enclosing module that belongs to the package, if any."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None
