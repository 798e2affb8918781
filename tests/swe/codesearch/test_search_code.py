"""The `search_code` tool's output and errors, and the search benchmark's parts."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from conveyor.agent.tools import ToolContext, ToolOutcome, ToolRegistry
from conveyor.bench import search as bench
from conveyor.bench.search_cli import register
from conveyor.tasks.swe.codesearch.index import CodeIndex
from conveyor.tasks.swe.codesearch.tool import (
    MAX_HITS,
    mentioned_identifiers,
    rank_definitions,
    render_search,
    search_code,
)
from conveyor.types import Task, ToolCall

SAMPLE = Path(__file__).parents[2] / "fixtures" / "code_index_sample"
HIT = re.compile(r"^\S+\.py:\d+-\d+  (class |module )?[\w.]+(\(.*\).*)?(  — .+)?$")
GOLD_PATCH = """\
diff --git a/shapes/core.py b/shapes/core.py
--- a/shapes/core.py
+++ b/shapes/core.py
@@ -40,5 +40,5 @@ def parse_shape(text: str, *, strict: bool = False) -> Shape:
     name, _, sides = text.partition(":")
-    if strict and not sides:
+    if strict and not sides.strip():
         raise ValueError(text)
     return Polygon(name, int(sides or 0))
"""


def _call(arguments: dict, state: dict) -> ToolOutcome:
    ctx = ToolContext(task=Task(id="t", family="swe", prompt=[]), state=state)
    call = ToolCall(name="search_code", arguments=arguments)
    registry = ToolRegistry([search_code])
    return asyncio.run(registry.execute(call, ctx, timeout_s=30, max_output_chars=20_000))


def test_schema_exposes_query_and_kind_but_not_the_context() -> None:
    params = search_code.schema["function"]["parameters"]
    assert set(params["properties"]) == {"query", "kind"}
    assert params["required"] == ["query"]
    assert params["properties"]["kind"]["enum"] == [
        "auto", "definition", "references", "callers", "text"
    ]  # fmt: skip


def test_definition_hits_are_one_compact_line_each(index: CodeIndex) -> None:
    out = _call({"query": "parse_shap"}, {"code_index": index})
    assert out.kind == "ok"
    header, first, *_ = out.output.splitlines()
    assert header == "Definitions matching 'parse_shap':"
    assert first == (
        "shapes/core.py:36-44  shapes.core.parse_shape(text: str, *, strict: bool = False) "
        "-> Shape  — Parse a textual description such as 'square:4' into a Shape."
    )
    assert all(HIT.match(line) for line in out.output.splitlines()[1:])
    classes = render_search(index, "Polygon", "definition").splitlines()
    assert classes[1] == "shapes/core.py:24-33  class shapes.core.Polygon(Shape)  — " + (
        "A shape with straight sides."
    )


def test_auto_uses_bm25_for_descriptions_and_for_unknown_names(index: CodeIndex) -> None:
    out = render_search(index, "length of the long side of a right triangle")
    assert out.splitlines()[0].startswith("Text search (BM25)")
    assert "shapes.geometry.measure.compute_hypotenuse(a: float, b: float)" in out.splitlines()[1]
    fallback = render_search(index, "triangle")
    assert fallback.splitlines()[0] == (
        "No definition is named like 'triangle'; text search (BM25) instead:"
    )
    assert "compute_hypotenuse" in fallback.splitlines()[1]
    assert render_search(index, "zzzqqq").startswith("No definitions match 'zzzqqq'")


def test_auto_favours_definitions_a_description_names(index: CodeIndex) -> None:
    assert mentioned_identifiers("why does `Shape` call parse_shape() or Renderer.draw?") == [
        "Shape", "parse_shape", "Renderer.draw"
    ]  # fmt: skip
    plain, _ = rank_definitions(index, "one line about the shape")
    assert plain[0].definition.qualname == "shapes.core.Shape.describe"
    survey = "shapes.geometry.measure.Survey.report"
    assert survey not in [m.definition.qualname for m in plain[:3]]
    # naming a definition in prose adds a bonus on top of its text score
    named, _ = rank_definitions(index, "one line about the shape from `Survey.report`")
    assert [m.definition.qualname for m in named[:2]] == [survey, "shapes.core.Shape.describe"]


def test_references_and_callers_name_the_target_and_show_source(index: CodeIndex) -> None:
    refs = render_search(index, "shapes.parse", "references", SAMPLE).splitlines()
    assert refs[0] == "References to shapes.core.parse_shape (shapes/core.py:36): 8"
    assert (
        "shapes/geometry/measure.py:16  in shapes.geometry.measure.measure  | "
        + ("shape = sc.parse_shape(text)")
        in refs
    )
    callers = render_search(index, "describe", "callers").splitlines()
    assert callers[0] == "Callers of shapes.core.Shape.describe (shapes/core.py:19): 3"
    assert callers[1].startswith("shapes/core.py:31-33  shapes.core.Polygon.summary(self) -> str")
    assert callers[1].endswith("[calls at line 33]")
    typo = render_search(index, "perimter", "references")
    assert "using the closest, shapes.core.Polygon.perimeter" in typo


def test_long_listings_are_cut_at_max_hits(tmp_path: Path) -> None:
    body = "".join(f"def handler_{i}():\n    '''Handle event {i}.'''\n\n" for i in range(30))
    (tmp_path / "many.py").write_text(body)
    out = render_search(CodeIndex.build(tmp_path), "handle event", "text").splitlines()
    assert len(out) == 1 + MAX_HITS + 1
    assert out[-1] == "... 10 more (narrow the query)"


def test_without_an_index_or_workspace_the_tool_says_so() -> None:
    out = _call({"query": "parse"}, {})
    assert out.kind == "raised"
    assert out.output.startswith("Error: CodeIndexUnavailable: search_code is not available")
    assert "grep" in out.output
    missing = _call({"query": "parse"}, {"workspace_root": "/nonexistent/folder"})
    assert missing.kind == "raised" and "CodeIndexUnavailable" in missing.output
    empty = _call({"query": "  "}, {"workspace_root": str(SAMPLE)})
    assert empty.kind == "raised" and "query is empty" in empty.output


def test_the_index_is_built_lazily_from_the_workspace_once(sample: Path) -> None:
    state: dict = {"workspace_root": str(sample)}
    out = _call({"query": "Shape.area", "kind": "references"}, state)
    assert out.kind == "ok" and out.output.startswith("References to shapes.core.Shape.area")
    built = state["code_index"]
    assert isinstance(built, CodeIndex)
    _call({"query": "render"}, state)
    assert state["code_index"] is built


def test_touched_lines_and_gold_of_a_patch(index: CodeIndex) -> None:
    assert bench.touched_lines(GOLD_PATCH) == {"shapes/core.py": [41, 41]}
    files, functions = bench.gold_of_patch(index, GOLD_PATCH)
    assert files == ("shapes/core.py",)
    assert functions == ("shapes.core.parse_shape",)


def test_synthetic_tasks_hide_the_function_name(index: CodeIndex) -> None:
    tasks = bench.synthetic_tasks(index, "shapes", count=10, seed=1)
    assert tasks
    for task in tasks:
        (gold,) = task.gold_functions
        name = gold.rsplit(".", 1)[1]
        assert name.lower() not in task.query.lower()
        definition = index.definition(gold)
        assert definition is not None and task.gold_files == (definition.path,)


def test_grep_baseline_ranks_by_keyword_counts(index: CodeIndex) -> None:
    files, functions = bench.GrepBaseline(index).rank("the perimeter and the lengths")
    assert files[0] == "shapes/core.py"
    assert functions[0].qualname == "shapes.core.Polygon.perimeter"


def _rows_file(tmp_path: Path) -> Path:
    rows = [
        {"instance_id": "x-1", "problem_statement": "strict parsing of a textual description "
         "does not reject an empty number of sides", "patch": GOLD_PATCH},
        {"instance_id": "x-2", "problem_statement": "docs only", "patch": ""},
    ]  # fmt: skip
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_bench_on_rows_reports_hit_rates_and_latency(tmp_path: Path, sample: Path) -> None:
    pairs = bench.load_rows(_rows_file(tmp_path), sample)
    report = bench.bench_rows(pairs)
    assert report["tasks"] == 1 and report["skipped_rows"] == 1
    for method in bench.METHODS:
        rates = report["methods"][method]
        assert set(rates) == {f"{lvl}_top{k}" for lvl in ("file", "function") for k in bench.KS}
        assert rates["file_top10"] == 1.0
    assert report["methods"]["search_code"]["function_top1"] == 1.0
    group = report["groups"][0]
    assert group["index"]["build_seconds"] > 0 and group["index"]["failed_files"] == 1
    assert group["methods"]["bm25"]["latency_ms_median"] >= 0


def test_bench_cli_prints_one_json_line(tmp_path: Path) -> None:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Test app."""

    register(app)
    runner = CliRunner()
    tasks = _rows_file(tmp_path)
    result = runner.invoke(app, ["search", "--tasks", str(tasks), "--repo-root", str(SAMPLE)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["benchmark"] == "search" and report["rows"]["tasks"] == 1
    assert runner.invoke(app, ["search"]).exit_code != 0
    assert runner.invoke(app, ["search", "--synthetic", "nosuch"]).exit_code != 0
