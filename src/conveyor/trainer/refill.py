"""Per-sample refill: re-run the samples a group lost to infrastructure, so groups stay whole.

The dispatcher already retries an infra failure on a fresh runtime `max_infra_retries` times; a
sample still `infra_error` after that leaves its group short. With `rl.groups.incomplete:
refill`, once a step's groups are back each missing sample is run again through a dispatcher
(fresh runtime, same task, same sample index), up to `rl.groups.max_refills` rounds. A refill
round is a new attempt series: its attempt numbers continue after the ones already spent, so
stages that derive a runtime (or a fault) from the attempt get a fresh one. The `infra_error`
record a refill replaces is kept (`RefillReport.superseded`) for the run's record, never trained.
What is still missing after the last round is left to the fallback rule (`train_partial` or
`drop`, `rl.groups.refill_fallback`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from conveyor.dispatch.base import Dispatcher
from conveyor.dispatch.stages import FirstTurnStages, RolloutStages
from conveyor.runtime.base import Runtime
from conveyor.types import Status, Task, Trajectory, TrajectoryGroup

# Builds the dispatcher that runs one batch of refills (the run's strategy, settings and engine).
DispatcherFactory = Callable[[RolloutStages], Dispatcher]


@dataclass
class RefillReport:
    """What refilling did in one step."""

    missing: int = 0  # samples short after the dispatcher's own retries
    refilled: int = 0  # of those, filled by a scored trajectory
    failed: int = 0  # of those, still infra_error after the last round
    rollouts: int = 0  # refill rollouts run (a sample may take several rounds)
    rounds: int = 0
    superseded: list[Trajectory] = field(default_factory=list)  # infra_error records replaced

    def metrics(self) -> dict[str, float]:
        """Counters for `metrics.jsonl`."""
        return {
            "filter/refill_missing": float(self.missing),
            "filter/refilled_samples": float(self.refilled),
            "filter/refill_failed": float(self.failed),
            "filter/refill_rollouts": float(self.rollouts),
            "filter/refill_rounds": float(self.rounds),
        }


class SlotStages:
    """The run's stages, re-aimed at chosen samples: the dispatcher's sample 0 of task T is T's
    missing sample `slots[T.id]`, and its attempt `a` is attempt `a + attempt_offset`."""

    def __init__(self, inner: RolloutStages, slots: dict[str, int], attempt_offset: int) -> None:
        self.inner = inner
        self.slots = slots
        self.attempt_offset = attempt_offset

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        """A fresh runtime for the missing sample (an attempt number not used before)."""
        return await self.inner.init(task, self.slots[task.id], attempt + self.attempt_offset)

    async def run(self, task: Task, sample_index: int, runtime: Runtime) -> Trajectory:
        """The agent loop of the missing sample."""
        return await self.inner.run(task, self.slots[task.id], runtime)

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        """The task's reward, unchanged."""
        return await self.inner.reward(task, trajectory, runtime)


class SlotFirstTurnStages(SlotStages):
    """`SlotStages` of stages with a first turn: refills keep the early first generation."""

    inner: FirstTurnStages

    async def first_turn(self, task: Task, sample_index: int, attempt: int) -> object:
        """The missing sample's first generation, beside its init."""
        return await self.inner.first_turn(task, self.slots[task.id], attempt + self.attempt_offset)

    async def run(
        self, task: Task, sample_index: int, runtime: Runtime, head: object = None
    ) -> Trajectory:
        """The agent loop of the missing sample, continuing from its first turn."""
        return await self.inner.run(task, self.slots[task.id], runtime, head=head)


async def refill(
    groups: Sequence[TrajectoryGroup],
    tasks: Sequence[Task],
    stages: RolloutStages,
    dispatcher: DispatcherFactory,
    *,
    max_rounds: int,
    attempts_per_round: int,
    on_batch: Callable[[list[Task]], None] | None = None,
) -> tuple[list[TrajectoryGroup], RefillReport]:
    """`groups` with their `infra_error` samples re-run (see the module docstring).

    `attempts_per_round` is the dispatcher's attempts per rollout (`max_infra_retries + 1`): the
    first refill round starts at that attempt number. `on_batch` hears of every batch of
    refills before it starts (one task per refilled sample).
    """
    by_id = {task.id: task for task in tasks}
    members = {g.task_id: list(g.trajectories) for g in groups}
    report = RefillReport(missing=sum(_missing_count(t) for t in members.values()))
    for round_ in range(1, max_rounds + 1):
        missing = {
            task_id: [t.sample_index for t in trajectories if t.status is Status.INFRA_ERROR]
            for task_id, trajectories in members.items()
        }
        if not any(missing.values()):
            break
        report.rounds = round_
        # One dispatch per layer: a dispatcher tells samples apart only by task, so a group
        # short of two samples has them re-run in two layers.
        depth = max(len(samples) for samples in missing.values())
        for layer in range(depth):
            slots = {k: v[layer] for k, v in missing.items() if len(v) > layer}
            batch = [by_id[k] for k in slots]
            if on_batch is not None:
                on_batch(batch)
            kind = SlotFirstTurnStages if isinstance(stages, FirstTurnStages) else SlotStages
            slot_stages = kind(stages, slots, round_ * attempts_per_round)
            async for trajectory in dispatcher(slot_stages).rollouts(batch, 1):
                sample = slots[trajectory.task_id]
                report.rollouts += 1
                fresh = trajectory.model_copy(
                    update={
                        "sample_index": sample,
                        "counters": {**trajectory.counters, "refill_round": round_},
                    }
                )
                group = members[trajectory.task_id]
                position = next(i for i, t in enumerate(group) if t.sample_index == sample)
                report.superseded.append(group[position])
                group[position] = fresh
    report.failed = sum(_missing_count(t) for t in members.values())
    report.refilled = report.missing - report.failed
    refilled = [g.model_copy(update={"trajectories": members[g.task_id]}) for g in groups]
    return refilled, report


def _missing_count(trajectories: Sequence[Trajectory]) -> int:
    return sum(1 for t in trajectories if t.status is Status.INFRA_ERROR)
