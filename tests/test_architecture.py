"""The import structure of conveyor: no import loops, dependencies point down the layers.

The analyser is tested on tiny packages written into tmp_path with known loops and layer
breaks, then run on the real source tree. Upward imports that exist today and are scheduled to
go are listed in `conveyor.devtools.layers.PENDING`; each is a strict xfail here, so removing one
without deleting its line (or adding one without a line) fails the suite.
"""

from __future__ import annotations

import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import conveyor
from conveyor.devtools.imports import ImportGraph, When, scan_package
from conveyor.devtools.layers import (
    LAYERS,
    PENDING,
    Layer,
    unit_of,
    unplaced_units,
    violations,
)
from conveyor.devtools.loops import import_loops, loop_path
from conveyor.devtools.picture import main as draw_graph

SOURCE = Path(conveyor.__file__).parent
DOCS_PICTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.svg"


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture(scope="module")
def tree() -> ImportGraph:
    return scan_package(SOURCE, "conveyor")


# --- the analyser, on packages with known answers -------------------------------------------


def test_analyser_finds_a_module_level_loop_and_ignores_deferred_imports(tmp_path: Path) -> None:
    root = _package(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "import pkg.b\nfrom pkg import e\n",
            "b.py": "from pkg.c import thing\n",
            "c.py": "from . import a\nthing = 1\n",
            # d -> a runs only when f() is called; a -> e -> d would otherwise close a loop.
            "d.py": "def f():\n    from pkg import a\n",
            "e.py": (
                "from typing import TYPE_CHECKING\nimport pkg.d\n"
                "if TYPE_CHECKING:\n    from pkg.a import x\n"
            ),
        },
    )
    graph = scan_package(root)

    assert import_loops(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    chain = loop_path(graph, ["pkg.a", "pkg.b", "pkg.c"])
    assert [(e.source, e.target) for e in chain] == [
        ("pkg.a", "pkg.b"),
        ("pkg.b", "pkg.c"),
        ("pkg.c", "pkg.a"),
    ]
    whens = {(e.source, e.target): e.when for e in graph.edges}
    assert whens[("pkg.d", "pkg.a")] is When.FUNCTION
    assert whens[("pkg.e", "pkg.a")] is When.TYPE_CHECKING
    assert whens[("pkg.e", "pkg.d")] is When.MODULE


def test_analyser_resolves_relative_and_package_imports(tmp_path: Path) -> None:
    root = _package(
        tmp_path / "pkg",
        {
            "__init__.py": "from .sub import helper\n",
            "top.py": "import json\nfrom pkg import sub\nfrom pkg.sub import Name\n",
            "sub/__init__.py": "from . import mod\nfrom .mod import helper\n",
            "sub/mod.py": "from .. import top\nfrom ..sub import Name\nimport pkg.sub.mod as m\n",
        },
    )
    edges = {(e.source, e.target) for e in scan_package(root).edges}

    assert edges == {
        ("pkg", "pkg.sub"),
        ("pkg.top", "pkg.sub"),  # `from pkg.sub import Name`: a name of the package
        ("pkg.sub", "pkg.sub.mod"),
        ("pkg.sub.mod", "pkg.top"),
        ("pkg.sub.mod", "pkg.sub"),
    }


def test_layer_rules_flag_upward_imports_only(tmp_path: Path) -> None:
    root = _package(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "high.py": "import pkg.low\n",
            "low.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import pkg.high\n"
                "def late():\n    import pkg.high\n"
            ),
            "stray.py": "",
        },
    )
    layers = (Layer("top", ("high",), ""), Layer("bottom", ("low", "pkg"), ""))
    graph = scan_package(root)

    found = violations(graph, layers)
    # The function-level import runs, so it counts; the TYPE_CHECKING one never runs.
    assert [(v.pair, v.edge.when, v.rule) for v in found] == [
        (("pkg.low", "pkg.high"), When.FUNCTION, "bottom may not import top")
    ]
    assert unplaced_units(graph, layers) == ["stray"]


# --- the real tree ----------------------------------------------------------------------------


def test_conveyor_has_no_import_loops(tree: ImportGraph) -> None:
    loops = import_loops(tree)
    chains = [
        " -> ".join([c[0].source] + [e.target for e in c])
        for c in map(lambda loop: loop_path(tree, loop), loops)
    ]
    assert loops == [], "import loops:\n" + "\n".join(chains)


def test_every_conveyor_unit_is_placed_in_a_layer(tree: ImportGraph) -> None:
    assert unplaced_units(tree) == [], "add these to LAYERS in conveyor/devtools/layers.py"


def test_no_upward_imports_beyond_the_pending_table(tree: ImportGraph) -> None:
    new = [str(v) for v in violations(tree) if v.pair not in PENDING]
    assert new == [], "imports against the layer rules:\n" + "\n".join(new)


@pytest.mark.parametrize(
    "pair",
    [
        pytest.param(pair, marks=pytest.mark.xfail(strict=True, reason=why), id="->".join(pair))
        for pair, why in PENDING.items()
    ],
)
def test_pending_upward_import_is_gone(tree: ImportGraph, pair: tuple[str, str]) -> None:
    """XPASS (a failure, strict) means the import is gone: delete its line from PENDING."""
    assert pair not in {v.pair for v in violations(tree)}


def test_trainer_imports_no_recipe_or_command_beyond_pending(tree: ImportGraph) -> None:
    forbidden = {"tasks", "swe", "rollout", "eval", "bench", "app", "cli", "view", "doctor"}
    found = {
        (e.source, e.target)
        for e in tree.runtime_edges()
        if unit_of(e.source) == "trainer" and unit_of(e.target) in forbidden
    }
    assert found - set(PENDING) == set()


def test_type_checking_imports_are_seen_but_not_held_against_the_layers(
    tree: ImportGraph,
) -> None:
    upward = [
        e
        for e in tree.edges
        if e.source == "conveyor.registry" and e.target == "conveyor.dispatch.base"
    ]
    assert [e.when for e in upward] == [When.TYPE_CHECKING]
    assert not [v for v in violations(tree) if v.edge.source == "conveyor.registry"]


# --- the picture ------------------------------------------------------------------------------


def _svg_texts(path: Path) -> set[str]:
    texts = ET.parse(path).getroot().iter("{http://www.w3.org/2000/svg}text")
    return {"".join(t.itertext()).strip() for t in texts}


def _expected_labels(tree: ImportGraph) -> set[str]:
    units = {unit_of(m) for m in tree.modules} - {"conveyor"}
    return units | {layer.name for layer in LAYERS}


def test_graph_command_draws_every_package_and_layer(tree: ImportGraph, tmp_path: Path) -> None:
    out = tmp_path / "deep" / "architecture.svg"
    draw_graph(out)

    missing = _expected_labels(tree) - _svg_texts(out)
    assert missing == set()


def test_committed_picture_names_every_package() -> None:
    tree = scan_package(SOURCE, "conveyor")
    missing = _expected_labels(tree) - _svg_texts(DOCS_PICTURE)
    assert missing == set(), "regenerate: conveyor dev graph --out docs/architecture.svg"
