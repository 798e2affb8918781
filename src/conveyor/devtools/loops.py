"""Import loops: groups of modules whose module-level imports reach each other.

A loop among module-level imports makes the outcome depend on which module is imported first
(a half-initialised module, an ImportError on a name defined later). Function-level and
TYPE_CHECKING imports do not run at import time, so they cannot close such a loop.

A *type-level* loop also counts TYPE_CHECKING imports (``types=True``). It never fails at run
time, yet it makes a low module's meaning depend on a higher one's (its annotations name types
defined above it), so the layers hold for readers and type checkers only without it.
Function-level imports are deliberate deferrals and count in neither.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from conveyor.devtools.imports import ImportEdge, ImportGraph

__all__ = ["import_loops", "loop_path"]


def import_loops(graph: ImportGraph, *, types: bool = False) -> list[list[str]]:
    """Each loop as a sorted list of its modules (strongly connected parts of size > 1);
    with `types`, TYPE_CHECKING imports count too."""
    successors: dict[str, set[str]] = defaultdict(set)
    for edge in _edges(graph, types):
        successors[edge.source].add(edge.target)
    return sorted(
        sorted(part) for part in _strongly_connected(graph.modules, successors) if len(part) > 1
    )


def loop_path(graph: ImportGraph, loop: list[str], *, types: bool = False) -> list[ImportEdge]:
    """One closed chain of imports through the loop's modules, for messages (`types` as for
    `import_loops`)."""
    members = set(loop)
    by_source: dict[str, list[ImportEdge]] = defaultdict(list)
    for edge in _edges(graph, types):
        if edge.source in members and edge.target in members:
            by_source[edge.source].append(edge)
    start = loop[0]
    # Breadth-first from `start` back to `start`; a loop guarantees a way round.
    frontier: list[tuple[str, list[ImportEdge]]] = [(start, [])]
    seen = {start}
    while frontier:
        nxt: list[tuple[str, list[ImportEdge]]] = []
        for node, path in frontier:
            for edge in sorted(by_source[node], key=lambda e: e.target):
                if edge.target == start:
                    return [*path, edge]
                if edge.target not in seen:
                    seen.add(edge.target)
                    nxt.append((edge.target, [*path, edge]))
        frontier = nxt
    return []


def _edges(graph: ImportGraph, types: bool) -> list[ImportEdge]:
    return graph.type_level_edges() if types else graph.module_level_edges()


def _strongly_connected(nodes: Iterable[str], successors: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative so deep packages cannot hit the recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    parts: list[set[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(successors[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                child = todo.pop()
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(successors[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                part: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.add(member)
                    if member == node:
                        break
                parts.append(part)
    return parts
