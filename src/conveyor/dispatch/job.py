"""One scheduled rollout as the dispatcher holds it, the stages it moves through, and the
cancel-and-wait that the dispatcher and its early first turns both end their tasks with."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from conveyor.runtime.base import Runtime
from conveyor.types import Message, Task, Trajectory

# The role of the `_meta` message that records one infrastructure retry in a trajectory.
INFRA_RETRY_ROLE = "infra_retry"


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
    # Why each earlier attempt was retried, in order: kept in the record (`retry_records`).
    retry_reasons: list[str] = field(default_factory=list)
    head: asyncio.Task[object] | None = None  # the first turn, started beside init
    head_slot: Callable[[], None] | None = None  # gives the first turn's engine place back


def retry_records(reasons: list[str]) -> list[Message]:
    """The `_meta` messages that keep why each attempt of a rollout was retried, so the run's
    records (rollouts.jsonl, trajectories.jsonl) say it and not only the `infra_retries` count."""
    return [
        {"role": INFRA_RETRY_ROLE, "content": f"attempt {i} retried: {reason}", "_meta": True}
        for i, reason in enumerate(reasons)
    ]


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
