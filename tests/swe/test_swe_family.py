"""The `swe` family on the tiny project: oracle through the editor, search, splits, export."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tiny_project import tiny_row

from conveyor.agent.tools import ToolContext
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.tasks.family import get_family, split_of
from conveyor.tasks.swe.dataset import load_rows, prediction, write_predictions, write_rows
from conveyor.tasks.swe.family import SweFamily, gold_edits
from conveyor.tasks.swe.grading import row_template
from conveyor.types import ToolCall

AVAILABLE, WHY = bubblewrap_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=WHY)


def test_gold_edits_are_str_replace_calls() -> None:
    row = tiny_row()
    calls = gold_edits(row, row_template(row))
    assert [c.arguments["command"] for c in calls] == ["str_replace"]
    assert calls[0].arguments["old_str"].count("a - b") == 1
    assert calls[0].arguments["path"] == "/workspace/tinycalc/__init__.py"


@needs_sandbox
def test_oracle_through_the_editor_scores_one_and_search_works() -> None:
    family = get_family("swe")
    assert isinstance(family, SweFamily)
    task = family.task(tiny_row())

    async def rollout(apply: bool) -> tuple[float, str]:
        runtime = await family.make_runtime(task)
        try:
            ctx = ToolContext(task=task, runtime=runtime)
            tools = family.tools()
            found = await tools.execute(
                ToolCall(name="search_code", arguments={"query": "clamp"}),
                ctx,
                timeout_s=60,
                max_output_chars=4000,
            )
            calls = family.oracle_calls(task) if apply else [family.oracle_calls(task)[-1]]
            for call in calls:
                outcome = await tools.execute(call, ctx, timeout_s=60, max_output_chars=4000)
                assert not outcome.is_error, outcome.output
            tests = await tools.execute(
                ToolCall(name="bash", arguments={"command": "python -m pytest -q tests"}),
                ctx,
                timeout_s=60,
                max_output_chars=4000,
            )
            assert ("4 passed" in tests.output) == apply, tests.output
            return await family.score(task, ctx.state.get("answer"), runtime), found.output
        finally:
            await runtime.close()

    score, found = asyncio.run(rollout(apply=True))
    assert score == 1.0
    assert "tinycalc/__init__.py" in found and "clamp" in found
    assert asyncio.run(rollout(apply=False))[0] == 0.0


def test_make_tasks_reads_the_configured_files_and_keeps_splits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [tiny_row(f"tiny-{i:03d}") for i in range(60)]
    write_rows(tmp_path / "a.jsonl", rows[:30])
    write_rows(tmp_path / "b.jsonl", rows[30:])
    monkeypatch.setenv("CONVEYOR_SWE_TASKS", f"{tmp_path / 'a.jsonl'}:{tmp_path / 'b.jsonl'}")
    family = SweFamily()
    evals = [r for r in rows if split_of(r.instance_id) == "eval"]
    tasks = family.make_tasks(len(evals), seed=0, split="eval")
    assert sorted(t.data["row"]["instance_id"] for t in tasks) == sorted(
        r.instance_id for r in evals
    )
    assert tasks == family.make_tasks(len(evals), seed=0, split="eval")
    assert tasks[0].prompt[1]["content"] == "add() subtracts instead of adding."
    with pytest.raises(ValueError, match="only"):
        family.make_tasks(len(evals) + 1, seed=0, split="eval")


def test_rows_round_trip_and_predictions_export(tmp_path: Path) -> None:
    row = tiny_row()
    write_rows(tmp_path / "rows.jsonl", [row])
    assert load_rows(tmp_path / "rows.jsonl") == [row]
    count = write_predictions(
        tmp_path / "predictions.jsonl", [prediction(row.instance_id, "d", "m")]
    )
    line = json.loads((tmp_path / "predictions.jsonl").read_text())
    assert count == 1
    assert line == {"instance_id": row.instance_id, "model_name_or_path": "m", "model_patch": "d"}
