"""The import structure of conveyor: no import loops, dependencies point down the layers.

The analyser is tested on tiny packages written into tmp_path with known loops and layer
breaks, then run on the real source tree. Upward imports that exist today and are scheduled to
go are listed in `conveyor.devtools.layers.PENDING`; each is a strict xfail here, so removing one
without deleting its line (or adding one without a line) fails the suite.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
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


def test_analyser_finds_a_loop_closed_only_by_a_type_checking_import(tmp_path: Path) -> None:
    root = _package(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            # low names high's type in an annotation; high imports low for real.
            "low.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.high import Thing\n"
                "def make() -> 'Thing': ...\n"
            ),
            "high.py": "from pkg import low\nclass Thing: ...\n",
            # A function-level import is a deliberate deferral: it closes no loop of either kind.
            "late.py": "import pkg.high\n",
            "other.py": "def f():\n    import pkg.late\n",
        },
    )
    graph = scan_package(root)

    assert import_loops(graph) == []
    assert import_loops(graph, types=True) == [["pkg.high", "pkg.low"]]
    chain = loop_path(graph, ["pkg.high", "pkg.low"], types=True)
    assert [(e.source, e.target, e.when) for e in chain] == [
        ("pkg.high", "pkg.low", When.MODULE),
        ("pkg.low", "pkg.high", When.TYPE_CHECKING),
    ]


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


def _loop_report(tree: ImportGraph, loops: list[list[str]], types: bool) -> str:
    chains = []
    for loop in loops:
        chain = loop_path(tree, loop, types=types)
        steps = [f"{e.target} ({e.source}:{e.line}, {e.when})" for e in chain]
        chains.append(" -> ".join([chain[0].source, *steps]))
    return "\n".join(chains)


def test_conveyor_has_no_import_loops(tree: ImportGraph) -> None:
    loops = import_loops(tree)
    assert loops == [], "import loops:\n" + _loop_report(tree, loops, types=False)


def test_conveyor_has_no_type_level_import_loops(tree: ImportGraph) -> None:
    """TYPE_CHECKING imports count too: a low module whose annotations name a higher module's
    types is tied to it for every reader and type checker, even though nothing fails at run
    time. A lower layer that needs such a type declares a Protocol of its own instead."""
    loops = import_loops(tree, types=True)
    assert loops == [], "type-level import loops:\n" + _loop_report(tree, loops, types=True)


def test_every_conveyor_unit_is_placed_in_a_layer(tree: ImportGraph) -> None:
    assert unplaced_units(tree) == [], "add these to LAYERS in conveyor/devtools/layers.py"


def test_no_upward_imports_beyond_the_pending_table(tree: ImportGraph) -> None:
    new = [str(v) for v in violations(tree) if v.pair not in PENDING]
    assert new == [], "imports against the layer rules:\n" + "\n".join(new)


def test_every_pending_upward_import_still_exists(tree: ImportGraph) -> None:
    """A pair listed in PENDING whose import is gone must leave the table with it."""
    gone = set(PENDING) - {v.pair for v in violations(tree)}
    assert gone == set(), f"delete these from PENDING in conveyor/devtools/layers.py: {gone}"


def test_trainer_imports_no_recipe_or_command_beyond_pending(tree: ImportGraph) -> None:
    forbidden = {"tasks", "rollout", "bench", "app", "cli", "view", "doctor"}
    found = {
        (e.source, e.target)
        for e in tree.runtime_edges()
        if unit_of(e.source) == "trainer" and unit_of(e.target) in forbidden
    }
    assert found - set(PENDING) == set()


def test_the_registry_imports_nothing_of_conveyor_not_even_for_types(
    tree: ImportGraph,
) -> None:
    """Part specs type their `build` as a callable, so the bottom layer names no upper type."""
    assert [e.target for e in tree.edges if e.source == "conveyor.registry"] == []


# --- the picture ------------------------------------------------------------------------------


def _svg_texts(path: Path) -> set[str]:
    texts = ET.parse(path).getroot().iter("{http://www.w3.org/2000/svg}text")
    return {"".join(t.itertext()).strip() for t in texts}


def _expected_labels(tree: ImportGraph) -> set[str]:
    units = {unit_of(m) for m in tree.modules} - {"conveyor"}
    return units | {layer.name for layer in LAYERS}


def test_graph_command_draws_every_package_and_layer(tree: ImportGraph, tmp_path: Path) -> None:
    out = tmp_path / "deep" / "architecture.svg"
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "dev", "graph", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)

    missing = _expected_labels(tree) - _svg_texts(out)
    assert missing == set()


def test_committed_picture_names_every_package() -> None:
    tree = scan_package(SOURCE, "conveyor")
    missing = _expected_labels(tree) - _svg_texts(DOCS_PICTURE)
    assert missing == set(), "regenerate: conveyor dev graph --out docs/architecture.svg"


# --- the architecture page ------------------------------------------------------------------

DOC = DOCS_PICTURE.with_name("architecture.md")
REPO = DOCS_PICTURE.parents[1]
# Config keys the page names that look like module paths (a section shares its layer's name).
CONFIG_KEYS = {
    "config.trainer",
    "config.trainer.backend.options",
    "config.trainer.loss",
    "config.engine.options",
    "engine.options",
    "runtime.options",
    "settings.strategy.options",
    "dispatch.executor",
    "dispatch.strategy",
    "runtime.kind",
    "tasks.families",
    "trainer.loss",
    "trainer.loss.options.reduction",
}


def _defined_names(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolves(tree: ImportGraph, dotted: str) -> bool:
    """Whether `dotted` (``engines.factory.build_engine``, ``rollout.AgentStages.from_config``)
    names a module of conveyor, or a name defined in one (and a member of a class defined there)."""
    parts = dotted.removeprefix("conveyor.").split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(["conveyor", *parts[:cut]])
        if module not in tree.modules:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        body = ast.parse(tree.modules[module].read_text()).body
        if rest[0] not in _defined_names(body):
            return False
        if len(rest) == 1:
            return True
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == rest[0]]
        return bool(classes) and rest[1] in _defined_names(classes[0].body)
    return False


def test_architecture_page_names_only_things_that_exist(tree: ImportGraph) -> None:
    text = DOC.read_text()
    units = {unit_of(m) for m in tree.modules}
    dotted = {
        token.rstrip("()")
        for token in re.findall(r"`([A-Za-z_][\w.]*\.[\w]+(?:\(\))?)`", text)
        if token.split(".")[0] in units | {"conveyor"}
    } - CONFIG_KEYS
    paths = set(re.findall(r"[\w/]+\.(?:py|md|svg)\b", text))

    assert len(dotted) > 20 and len(paths) > 5  # the patterns still find what the page names
    assert sorted(d for d in dotted if not _resolves(tree, d)) == []
    roots = (REPO, REPO / "src" / "conveyor", REPO / "src", REPO / "docs")
    assert sorted(p for p in paths if not any((r / p).exists() for r in roots)) == []


_RUN_DOC_EXAMPLES = """
import re, sys
from pathlib import Path
from conveyor.dispatch import DispatchSettings, make_dispatcher
from conveyor.sim.engine import SimEngine
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload
from conveyor.sim.virtual_loop import run_virtual

spaces = []
for block in re.findall(r"```python\\n(.*?)```", Path(sys.argv[1]).read_text(), re.S):
    spaces.append({"__name__": "doc_example"})
    exec(compile(block, "architecture.md", "exec"), spaces[-1])
workload = SweSimWorkload(
    tasks=3, samples_per_task=2, turns_min=2, turns_max=3, max_live_runtimes=4, cpu_slots=2
)

async def dispatch():
    engine = SimEngine(workload, occupancy_reference=8)
    engine.start()
    env = SimEnvironment(workload, 0, engine)
    settings = DispatchSettings(strategy="one_at_a_time", max_live_runtimes=4)
    out = [t async for t in make_dispatcher(settings, env, engine=engine).rollouts(env.tasks(), 2)]
    await engine.close()
    return out

done = run_virtual(dispatch())
spans = sorted((t.timings["admitted"], t.timings["finished"]) for t in done)
print("statuses", sorted({t.status.value for t in done}), len(done))
print("sequential", all(a[1] <= b[0] for a, b in zip(spans, spans[1:])))
tool = next(s["word_count"] for s in spaces if "word_count" in s)
print("tool", tool.name, sorted(tool.schema["function"]["parameters"]["properties"]))
"""


def test_architecture_page_examples_run(tmp_path: Path) -> None:
    """The page's strategy and tool run as printed; in a child process, so the example strategy
    is not left registered in this process's STRATEGIES."""
    script = tmp_path / "run_examples.py"
    script.write_text(_RUN_DOC_EXAMPLES)
    env = {**os.environ, "PYTHONPATH": str(SOURCE.parent), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), str(DOC)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "statuses ['ok'] 6",
        "sequential True",
        "tool word_count ['text']",
    ]
