"""The layer rules of conveyor as data: which top-level unit sits in which layer.

Dependencies point downward only: a module may import modules of its own layer or of a layer
below it. A *unit* is a top-level module or subpackage of ``conveyor`` (``dispatch``, ``eval``);
every unit must be placed in exactly one layer, so a new package cannot slip past the rules.

`PENDING` lists the upward imports that exist today and are scheduled to go (issue 15 moves
the commands out of ``trainer/`` into ``app/``). The architecture test expects each of them to
still exist (strict xfail), so whoever removes one deletes its line here, and nobody can add one
without editing this table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from conveyor.devtools.imports import ImportEdge, ImportGraph

__all__ = [
    "LAYERS",
    "ONLY_IMPORTS",
    "PENDING",
    "Layer",
    "Violation",
    "layer_of",
    "unit_of",
    "unplaced_units",
    "violations",
]


@dataclass(frozen=True)
class Layer:
    """One row of the architecture: its name, its units, and what it is for."""

    name: str
    units: tuple[str, ...]
    role: str


# Top to bottom. The package's own __init__ is the unit "conveyor" and sits at the bottom.
LAYERS: tuple[Layer, ...] = (
    Layer(
        "app",
        ("cli", "app", "view", "doctor", "bench", "devtools"),
        "commands: build the parts and run them",
    ),
    Layer(
        "bridges",
        ("bridges", "gateway"),
        "other training systems' backends and the recording gateway for outside agents",
    ),
    Layer("sim", ("sim",), "the dispatch simulator the benchmarks drive"),
    Layer("recipes", ("tasks", "rollout"), "task families and the stages that run them"),
    Layer("trainer", ("trainer",), "the RL core: advantages, losses, steps, weight sync"),
    Layer("dispatch", ("dispatch",), "strategies that schedule init / run / reward"),
    Layer("agent", ("agent",), "the agent loop, tools, chat rendering"),
    Layer("runtime", ("runtime",), "sandboxes and workspaces"),
    Layer("engines", ("engines",), "sampling clients"),
    Layer(
        "core",
        ("conveyor", "types", "config", "registry", "models"),
        "data model, configuration, registries, model files",
    ),
)

# Units with a narrower allowance than their layer gives them.
ONLY_IMPORTS: Mapping[str, frozenset[str]] = {
    "sim": frozenset({"sim", "dispatch", "engines", "runtime", "types", "registry"}),
}

# (importing module, imported module) -> why it is still there.
PENDING: Mapping[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Violation:
    """An import that breaks a layer rule."""

    edge: ImportEdge
    rule: str

    @property
    def pair(self) -> tuple[str, str]:
        return (self.edge.source, self.edge.target)

    def __str__(self) -> str:
        return f"{self.edge.source}:{self.edge.line} imports {self.edge.target} ({self.rule})"


def unit_of(module: str) -> str:
    """The top-level unit a dotted module name belongs to (``conveyor.a.b`` -> ``a``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(unit: str, layers: tuple[Layer, ...] = LAYERS) -> int | None:
    """Index of the unit's layer in `layers` (0 = top), or None when it is not placed."""
    for index, layer in enumerate(layers):
        if unit in layer.units:
            return index
    return None


def unplaced_units(graph: ImportGraph, layers: tuple[Layer, ...] = LAYERS) -> list[str]:
    """Units of the package that no layer names."""
    units = {unit_of(module) for module in graph.modules}
    return sorted(u for u in units if layer_of(u, layers) is None)


def violations(
    graph: ImportGraph,
    layers: tuple[Layer, ...] = LAYERS,
    only_imports: Mapping[str, frozenset[str]] = ONLY_IMPORTS,
) -> list[Violation]:
    """Every import that runs (module- or function-level) and points up a layer.

    TYPE_CHECKING imports never run, so annotations may name types from any layer.
    """
    found = []
    for edge in graph.runtime_edges():
        source, target = unit_of(edge.source), unit_of(edge.target)
        if source == target:
            continue
        allowed = only_imports.get(source)
        if allowed is not None and target not in allowed:
            found.append(Violation(edge, f"{source} may import only {', '.join(sorted(allowed))}"))
            continue
        above, below = layer_of(source, layers), layer_of(target, layers)
        if above is None or below is None:
            continue  # reported by unplaced_units
        if below < above:
            rule = f"{layers[above].name} may not import {layers[below].name}"
            found.append(Violation(edge, rule))
    return found
