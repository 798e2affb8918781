"""Shared pieces of the SWE tests: factory-built task sets (cached), and a rollout whose
workspace is edited with the real editor tool and rewarded by the rollout stages' reward stage,
as a run grades it."""

from __future__ import annotations

import asyncio
import fcntl
from collections.abc import Sequence
from typing import Any

from conveyor.agent.tools import ToolContext
from conveyor.config import ConveyorConfig
from conveyor.rollout import AgentStages
from conveyor.tasks.swe.dataset import SweRow, load_rows, write_rows
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.family import SweFamily
from conveyor.types import ToolCall, Trajectory

DEFAULT_SIZE = 2  # rows built per project, whatever the first asker wants


def factory_rows(name: str, version: str, size: int = 2) -> list[SweRow]:
    """`size` factory mutation tasks of a project release, cached under the SWE home's
    `test-sets/` (minutes the first time). Every SWE test file takes its rows from here, under
    a lock between processes: two test workers asking for the same project build it once (each
    used to build it, and a file asking for fewer rows overwrote the cache of one asking for
    more, so the next asker built it again)."""
    path = swe_home() / "test-sets" / f"{name}-{version}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists() and len(rows := load_rows(path)) >= size:
            return rows[:size]
        from conveyor.tasks.swe.factory import build_mutation_tasks, prepare_project
        from conveyor.tasks.swe.projects import spec_for

        ctx = prepare_project(spec_for(name), version)
        rows = asyncio.run(build_mutation_tasks(ctx, max(size, DEFAULT_SIZE)))
        write_rows(path, rows)
        return rows[:size]


def reward_stages(family: SweFamily, rollout_timeout_s: float = 120) -> AgentStages:
    """Rollout stages of the swe family alone; only their reward stage is used (it samples
    nothing, so no engine or renderer)."""
    return AgentStages(
        client=None,  # type: ignore[arg-type]
        make_renderer=lambda schemas: None,  # type: ignore[arg-type,return-value]
        agent=ConveyorConfig().agent,
        sampling=ConveyorConfig().sampling,
        rollout_timeout_s=rollout_timeout_s,
        families={"swe": family},
    )


def edited_rollout_reward(
    row: SweRow, editor_calls: Sequence[dict[str, Any]], rollout_timeout_s: float = 120
) -> Trajectory:
    """A rollout of the swe family on `row` whose workspace gets `editor_calls` (arguments of
    `str_replace_editor`, each must succeed), rewarded by the reward stage
    (`AgentStages.reward` -> `SweFamily.grade`)."""
    family = SweFamily()
    task = family.task(row)
    stages = reward_stages(family, rollout_timeout_s)

    async def main() -> Trajectory:
        runtime = await family.make_runtime(task)
        try:
            for arguments in editor_calls:
                outcome = await family.tools().execute(
                    ToolCall(name="str_replace_editor", arguments=dict(arguments)),
                    ToolContext(task=task, runtime=runtime),
                    timeout_s=60,
                    max_output_chars=10_000,
                )
                assert not outcome.is_error, outcome.output
            return await stages.reward(task, Trajectory(task_id=task.id), runtime)
        finally:
            await runtime.close()

    return asyncio.run(main())
