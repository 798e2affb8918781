"""Shared pieces of the SWE tests: factory-built task sets (cached) and the rollout stages whose
reward stage grades a rollout as a run does."""

from __future__ import annotations

import asyncio

from conveyor.config import ConveyorConfig
from conveyor.rollout import AgentStages
from conveyor.swe.dataset import SweRow, load_rows, write_rows
from conveyor.swe.environment import swe_home
from conveyor.swe.family import SweFamily


def factory_rows(name: str, version: str, size: int = 2) -> list[SweRow]:
    """`size` factory mutation tasks of a project release, cached under the SWE home's
    `test-sets/` (minutes the first time)."""
    path = swe_home() / "test-sets" / f"{name}-{version}.jsonl"
    if path.exists() and len(rows := load_rows(path)) >= size:
        return rows[:size]
    from conveyor.swe.factory import build_mutation_tasks, prepare_project
    from conveyor.swe.projects import spec_for

    ctx = prepare_project(spec_for(name), version)
    rows = asyncio.run(build_mutation_tasks(ctx, size))
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
