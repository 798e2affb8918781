"""The architecture picture: conveyor's units in their layers and the imports between them.

Drawn with matplotlib (no graphviz needed) as an SVG whose labels stay text, so the file can be
searched and diffed. Layers are rows, top to bottom; an arrow means "imports". Solid arrows run
on import, dashed ones only inside a function; red arrows break a layer rule.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from conveyor.devtools.imports import ImportGraph, When, scan_package
from conveyor.devtools.layers import LAYERS, Layer, unit_of, violations

__all__ = ["UnitEdge", "main", "unit_edges", "write_svg"]


@dataclass(frozen=True)
class UnitEdge:
    """Imports from one unit into another, summed over their modules."""

    source: str
    target: str
    count: int
    on_import: bool
    breaks_rule: bool
    implied: bool


def unit_edges(graph: ImportGraph, layers: tuple[Layer, ...] = LAYERS) -> list[UnitEdge]:
    """The unit-level graph: one edge per importing/imported unit pair that runs."""
    pairs: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
    on_import: set[tuple[str, str]] = set()
    for edge in graph.runtime_edges():
        key = (unit_of(edge.source), unit_of(edge.target))
        if key[0] == key[1]:
            continue
        pairs[key].add((edge.source, edge.target))
        if edge.when is When.MODULE:
            on_import.add(key)
    broken = {(unit_of(v.edge.source), unit_of(v.edge.target)) for v in violations(graph, layers)}
    implied = _implied(set(pairs))
    return [
        UnitEdge(s, t, len(modules), (s, t) in on_import, (s, t) in broken, (s, t) in implied)
        for (s, t), modules in sorted(pairs.items())
    ]


def _implied(pairs: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Edges a -> c that a longer path a -> b -> ... -> c also gives (drawn faintly)."""
    successors: dict[str, set[str]] = defaultdict(set)
    for source, target in pairs:
        successors[source].add(target)

    def reachable_without(source: str, target: str) -> bool:
        stack = [n for n in successors[source] if n != target]
        seen = set(stack)
        while stack:
            node = stack.pop()
            if node == target:
                return True
            for nxt in successors[node] - seen:
                seen.add(nxt)
                stack.append(nxt)
        return False

    return {(s, t) for s, t in pairs if reachable_without(s, t)}


def _rows(graph: ImportGraph, edges: list[UnitEdge], layers: tuple[Layer, ...]) -> list[list[str]]:
    """Units present in the tree, row by row, ordered to keep arrows short (barycentres)."""
    # The package's own __init__ holds only its version: a node for it is noise.
    present = {unit_of(module) for module in graph.modules} - {graph.package}
    rows = [[u for u in layer.units if u in present] for layer in layers]
    neighbours: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        neighbours[edge.source].add(edge.target)
        neighbours[edge.target].add(edge.source)
    for _ in range(4):
        position = {u: (i + 0.5) / len(row) for row in rows for i, u in enumerate(row)}
        centres = {unit: _centre(unit, row, position, neighbours) for row in rows for unit in row}
        for row in rows:
            row.sort(key=centres.__getitem__)
    return rows


def _centre(
    unit: str, row: list[str], position: dict[str, float], neighbours: dict[str, set[str]]
) -> float:
    """Mean position of the unit's neighbours in other rows (its own place if it has none)."""
    others = [position[n] for n in neighbours[unit] if n in position and n not in row]
    return sum(others) / len(others) if others else position[unit]


def write_svg(graph: ImportGraph, out: Path, layers: tuple[Layer, ...] = LAYERS) -> None:
    """Draw `graph` by layers into the SVG file `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    edges = unit_edges(graph, layers)
    rows = _rows(graph, edges, layers)
    width, row_height = 12.0, 1.25
    height = row_height * len(rows) + 0.9
    xy: dict[str, tuple[float, float]] = {}
    for index, row in enumerate(rows):
        y = height - 0.9 - (index + 0.5) * row_height
        # Lone units zig-zag so that arrows skipping layers do not run over them.
        shift = (0.18 if index % 2 else -0.18) if len(row) == 1 else 0.0
        for i, unit in enumerate(row):
            xy[unit] = (2.4 + (width - 2.9) * ((i + 0.5) / len(row) + shift), y)

    plt.rcParams["svg.fonttype"] = "none"  # keep labels as searchable text
    plt.rcParams["svg.hashsalt"] = "conveyor"  # stable element ids: regenerating gives no diff
    figure, axes = plt.subplots(figsize=(width, height))
    axes.set_xlim(0, width)
    axes.set_ylim(0, height)
    axes.axis("off")
    axes.text(
        0.2,
        height - 0.35,
        "conveyor: layers and imports (generated by `conveyor dev graph`)\n"
        "arrow = imports; dashed = only inside a function; faint = also implied by a longer "
        "path; red = breaks a layer rule",
        fontsize=9.5,
        va="center",
    )
    for index, layer in enumerate(layers):
        y = height - 0.9 - (index + 0.5) * row_height
        axes.add_patch(
            FancyBboxPatch(
                (0.1, y - row_height / 2 + 0.06),
                width - 0.2,
                row_height - 0.12,
                boxstyle="round,pad=0,rounding_size=0.08",
                facecolor="#f3f5f9" if index % 2 else "#e8edf5",
                edgecolor="none",
                zorder=0,
            )
        )
        axes.text(0.25, y + 0.12, layer.name, fontsize=11, weight="bold", va="center")
        axes.text(0.25, y - 0.22, _wrap(layer.role), fontsize=6.5, va="center", color="#555")

    for edge in edges:
        if edge.source not in xy or edge.target not in xy:
            continue
        (x0, y0), (x1, y1) = xy[edge.source], xy[edge.target]
        same_row = abs(y0 - y1) < 1e-6
        axes.add_patch(
            FancyArrowPatch(
                (x0, y0),
                (x1, y1),
                arrowstyle="-|>",
                mutation_scale=9,
                shrinkA=17,
                shrinkB=17,
                connectionstyle=f"arc3,rad={0.35 if same_row else 0.08}",
                linestyle="-" if edge.on_import else (0, (4, 3)),
                linewidth=0.6 + 0.25 * min(edge.count, 8),
                color="#c0392b" if edge.breaks_rule else "#5b6b82",
                alpha=0.9 if edge.breaks_rule else (0.13 if edge.implied else 0.75),
                zorder=2 if edge.breaks_rule else 1,
            )
        )
    for unit, (x, y) in xy.items():
        axes.text(
            x,
            y,
            unit,
            ha="center",
            va="center",
            fontsize=10,
            zorder=3,
            bbox={"boxstyle": "round,pad=0.35", "facecolor": "white", "edgecolor": "#34495e"},
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)


def _wrap(text: str, limit: int = 28) -> str:
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= limit:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def main(out: Path) -> None:
    """`conveyor dev graph --out OUT`: draw the installed conveyor package's layers to `out`."""
    import conveyor

    root = Path(conveyor.__file__).parent
    write_svg(scan_package(root, "conveyor"), Path(out))
