"""One scheduled rollout as the dispatcher holds it, the stages it moves through, and the
cancel-and-wait that the dispatcher and its early first turns both end their tasks with."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from conveyor.runtime.base import Runtime
from conveyor.types import Task, Trajectory


class Stage(IntEnum):
    """The three stages of a rollout, in order."""

    INIT = 0
    RUN = 1
    REWARD = 2


@dataclass(slots=True)
class RolloutJob:
    """One scheduled rollout while the dispatcher holds it; dropped once its record is yielded."""

    task: Task
    sample_index: int
    seq: int
    attempt: int = 0
    runtime: Runtime | None = None
    trajectory: Trajectory | None = None
    next_stage: Stage | None = Stage.INIT
    ready_at: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    head: asyncio.Task[object] | None = None  # the first turn, started beside init
    head_slot: Callable[[], None] | None = None  # gives the first turn's engine place back


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every task, then wait for each to end, whatever it ends with (cancelled, or
    failed: the caller has accounted for it)."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        try:
            await task
        except BaseException:
            pass
