"""One scheduled rollout as the dispatcher holds it, and the stages it moves through."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

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
