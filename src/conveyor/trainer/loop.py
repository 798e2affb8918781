"""The RL loop: tasks -> dispatcher -> groups -> statuses -> advantages -> update -> weight sync.

`RLLoop` is generic over the rollout stages and the training backend: the agent recipes hand it
`AgentStages`, tests hand it tiny stages of their own. It talks to the trainer only through the
`TrainingBackend` protocol and to the engine only through the weight sync it is handed.

Modes:
- `sync`: each step's rollouts are generated with the current weights, then the update runs.
- `async`: generation runs up to `rl.max_staleness` steps ahead of training (1: the rollouts of
  step k+1 are generated while step k trains; 2: those of k+2 may start while k trains); the
  engine takes the new weights between its own steps, so a trajectory may mix policy versions.
  Staleness of a trajectory = the policy version being trained minus the oldest version among
  its turns; samples staler than `rl.max_staleness` are dropped and counted, never trained.

Every step appends one line to `metrics.jsonl` and its trajectories (with a `step` field) to
`rollouts.jsonl`; `progress.jsonl` records each step's tasks when its rollouts start.
Checkpoints carry the data cursor and step, so `--resume` continues with the next step and
neither repeats nor skips one (`conveyor.trainer.resume` says what is re-run).

Groups still short of samples after the dispatcher's infra retries are refilled
(`rl.groups.incomplete: refill`, see `conveyor.trainer.refill`) or left to the status policy.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.config import ConveyorConfig
from conveyor.dispatch.config import DispatchSettings
from conveyor.dispatch.factory import make_dispatcher
from conveyor.dispatch.stages import RolloutStages
from conveyor.trainer.advantages import (
    assign_to_samples,
    build_advantage,
    group_rewards,
    shuffled_rewards,
)
from conveyor.trainer.backend import StepResult, TrainBatch, TrainingBackend
from conveyor.trainer.faults import kill_point
from conveyor.trainer.filtering import StatusPolicy, select
from conveyor.trainer.jsonl import append_records
from conveyor.trainer.refill import RefillReport, refill
from conveyor.trainer.resume import PROGRESS, ROLLOUTS
from conveyor.types import Status, Task, TrainingSample, TrajectoryGroup

# Makes the sampling side serve the backend's current weights (the argument is the RL step, for
# fault injection); returns seconds. `conveyor.trainer.weight_sync.checked_sync` builds one.
WeightSync = Callable[[int], Awaitable[float]]


@dataclass
class TaskStream:
    """An endless, seeded order over the training tasks; `cursor` is all a checkpoint needs."""

    tasks: Sequence[Task]
    seed: int
    cursor: int = 0

    def take(self, n: int) -> list[Task]:
        """The next `n` distinct tasks (a fresh shuffle each epoch, decided by seed and epoch).

        Where a step spans two epochs, a task already in it is skipped, so a group never mixes
        two copies of one task.
        """
        if n > len(self.tasks):
            raise ValueError(f"{n} tasks per step, but only {len(self.tasks)} training tasks")
        out: list[Task] = []
        seen: set[str] = set()
        while len(out) < n:
            task = self._at(self.cursor)
            self.cursor += 1
            if task.id not in seen:
                seen.add(task.id)
                out.append(task)
        return out

    def _at(self, index: int) -> Task:
        epoch, offset = divmod(index, len(self.tasks))
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return self.tasks[order[offset]]


@dataclass
class Collected:
    """One step's rollouts as they go into the update."""

    groups: list[TrajectoryGroup]
    seconds: float
    refill: RefillReport = field(default_factory=RefillReport)


@dataclass
class StepRecord:
    """What one step did, as written to `metrics.jsonl`."""

    step: int
    metrics: dict[str, float] = field(default_factory=dict)


def staleness(sample: TrainingSample, version: int) -> int:
    """Policy versions between the oldest turn of a sample and the weights being trained."""
    return version - sample.min_policy_version


class RLLoop:
    """Drives rollouts and updates for `config.rl.steps` steps."""

    def __init__(
        self,
        config: ConveyorConfig,
        stages: RolloutStages,
        backend: TrainingBackend,
        sync_weights: WeightSync,
        train_tasks: Sequence[Task],
        run_dir: Path,
        *,
        engine_probe: Any = None,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> None:
        self.config = config
        self.rl = config.rl
        self.stages = stages
        self.backend = backend
        self.sync_weights = sync_weights
        self.stream = TaskStream(train_tasks, config.tasks.task_seed)
        self.run_dir = run_dir
        self.engine_probe = engine_probe
        self.on_step = on_step
        self.step = 0
        # Counters of the resume that set `step` (`resume/*`), logged with the first step.
        self.resume_metrics: dict[str, float] = {}
        groups = self.rl.groups
        self.policy = StatusPolicy(
            truncated=groups.truncated,
            # What refilling leaves short falls to the fallback rule.
            incomplete_group=(
                groups.refill_fallback if groups.incomplete == "refill" else groups.incomplete
            ),
            min_partial_size=groups.min_partial_size,
            filter_zero_variance_groups=groups.filter_zero_variance,
        )
        self.estimator = build_advantage(self.rl.advantage.name, self.rl.advantage.options)

    # -- rollouts -----------------------------------------------------------------------------
    async def collect(self, tasks: Sequence[Task], step: int) -> Collected:
        """All groups of `tasks` for `step`, through a fresh dispatcher, refilled if asked."""
        start = time.monotonic()
        settings = DispatchSettings.from_config(self.config)
        size = self.config.tasks.group_size
        self._record_begun(step, tasks, "tasks", len(tasks) * size)
        dispatcher = make_dispatcher(settings, self.stages, engine=self.engine_probe)
        groups: list[TrajectoryGroup] = []
        async for group in dispatcher.groups(tasks, size):
            groups.append(group)
            kill_point("rollouts", step)
        report = RefillReport()
        if self.rl.groups.incomplete == "refill" and self.rl.groups.max_refills:
            groups, report = await refill(
                groups,
                tasks,
                self.stages,
                lambda stages: make_dispatcher(settings, stages, engine=self.engine_probe),
                max_rounds=self.rl.groups.max_refills,
                attempts_per_round=settings.max_infra_retries + 1,
                on_batch=lambda batch: self._record_begun(step, batch, "refill", len(batch)),
            )
        # Completion order depends on timing; the update must not.
        order = {task.id: i for i, task in enumerate(tasks)}
        groups.sort(key=lambda g: order[g.task_id])
        return Collected(groups, time.monotonic() - start, report)

    def _record_rollouts(self, step: int, collected: Collected) -> None:
        """Every trajectory of the step, trained on or not, and the infra_error records a refill
        replaced, for inspection; the step field lets a resume cut the file back."""
        final = [t for g in collected.groups for t in g.trajectories]
        records = [{"step": step, **t.model_dump(mode="json")} for t in final]
        records += [
            {"step": step, "superseded_by_refill": True, **t.model_dump(mode="json")}
            for t in collected.refill.superseded
        ]
        append_records(self.run_dir / ROLLOUTS, records)

    def _record_begun(self, step: int, tasks: Sequence[Task], key: str, rollouts: int) -> None:
        """Say in `progress.jsonl` that rollouts of `step` start: a resume re-runs them."""
        record = {"step": step, key: [t.id for t in tasks], "rollouts": rollouts}
        append_records(self.run_dir / PROGRESS, [record])

    # -- one update ---------------------------------------------------------------------------
    def build_batch(self, groups: Sequence[TrajectoryGroup]) -> tuple[TrainBatch, dict[str, float]]:
        """Statuses -> advantages -> samples, dropping (and counting) over-stale samples."""
        selection = select(groups, self.policy)
        advantages = self.estimator(group_rewards(selection.groups)) if selection.groups else []
        items = assign_to_samples(selection.groups, advantages, selection.trainable)
        version = self.backend.policy_version
        fresh = [(s, a) for s, a in items if staleness(s, version) <= self.rl.max_staleness]
        stale = [staleness(s, version) for s, _ in items]
        metrics: dict[str, float] = {
            **{k: float(v) for k, v in selection.metrics().items()},
            "staleness/max": float(max(stale, default=0)),
            "staleness/mean": float(sum(stale) / len(stale)) if stale else 0.0,
            "staleness/dropped_samples": float(len(items) - len(fresh)),
            "samples": float(len(fresh)),
        }
        return TrainBatch(items=fresh), metrics

    @staticmethod
    def rollout_metrics(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """Reward, pass rate, statuses, turns, tokens and stage times of a step's rollouts."""
        trajectories = [t for g in groups for t in g.trajectories]
        scored = [t for t in trajectories if t.status is not Status.INFRA_ERROR]
        rewards = [t.reward or 0.0 for t in scored]
        out: dict[str, float] = {
            "rollout/reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
            "rollout/pass_rate": (
                sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else 0.0
            ),
            "rollout/trajectories": float(len(trajectories)),
            "rollout/turns_mean": (
                sum(len(t.turns) for t in scored) / len(scored) if scored else 0.0
            ),
            "rollout/completion_tokens": float(
                sum(len(turn.completion_ids) for t in scored for turn in t.turns)
            ),
        }
        for status in Status:
            out[f"status/{status.value}"] = float(
                sum(1 for t in trajectories if t.status is status)
            )
        for key in ("hints", "splits", "tool_calls", "tool_errors"):
            out[f"rollout/{key}"] = float(sum(t.counters.get(key, 0) for t in scored))
        for key in sorted({k for t in trajectories for k in t.timings}):
            values = [t.timings[key] for t in trajectories if key in t.timings]
            out[f"time/{key}"] = sum(values) / len(values)
        return out

    async def update(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """One optimizer step on `groups` (skipped, and said so, when nothing is trainable)."""
        step = self.step + 1
        if self.rl.controls.reward == "shuffle":
            groups = shuffled_rewards(groups, self.config.trainer.seed, step)
        batch, metrics = self.build_batch(groups)
        if batch.items:
            result: StepResult = await asyncio.to_thread(self.backend.step, batch)
            kill_point("train_step", step)
            metrics.update(result.as_dict())
            sync_s = await self.sync_weights(step)
            metrics["time/weight_sync_s"] = sync_s
        else:
            metrics["train/skipped"] = 1.0
        return metrics

    # -- the loop -----------------------------------------------------------------------------
    async def run(self) -> list[StepRecord]:
        """Steps from `self.step` to `rl.steps`; returns their records."""
        from conveyor.trainer.checkpoint import save_checkpoint
        from conveyor.trainer.tracking import Tracker

        logging = self.rl.logging
        tracker = Tracker(self.run_dir, tensorboard=logging.tensorboard, wandb=logging.wandb)
        records: list[StepRecord] = []
        # Generation runs ahead of training by up to `ahead` steps (0 in sync mode), one step's
        # collection after another: the collection of step j starts once step j-1's has ended
        # and update j-1-ahead is done, so its oldest turn is at most `ahead` versions stale.
        ahead = self.rl.max_staleness if self.rl.mode == "async" else 0
        ready: asyncio.Queue[tuple[Collected, int]] = asyncio.Queue()
        trained = asyncio.Condition()
        first = self.step + 1

        async def produce() -> None:
            for j in range(first, self.rl.steps + 1):
                ready_from = j - 1 - ahead  # the updates done before step j may generate

                def may_start(done: int = ready_from) -> bool:
                    return self.step >= done

                async with trained:
                    await trained.wait_for(may_start)
                tasks = self.stream.take(self.rl.tasks_per_step)
                after = self.stream.cursor
                await ready.put((await self.collect(tasks, j), after))

        producer = asyncio.create_task(produce())
        try:
            while self.step < self.rl.steps:
                started = time.monotonic()
                step = self.step + 1
                got = asyncio.create_task(ready.get())
                await asyncio.wait({got, producer}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done() and producer.done() and producer.exception() is not None:
                    got.cancel()
                    await producer  # the producer failed: its error is raised here
                # a producer that finished left every remaining step in the queue
                collected, after = await got
                groups = collected.groups
                self._record_rollouts(step, collected)
                metrics = self.rollout_metrics(groups)
                metrics["time/generation_s"] = collected.seconds
                metrics.update(collected.refill.metrics())
                metrics.update(await self.update(groups))
                metrics.update(self.resume_metrics)
                self.resume_metrics = {}
                self.step = step
                metrics["time/step_s"] = time.monotonic() - started
                async with trained:
                    trained.notify_all()
                metrics["data/cursor"] = float(after)  # past this step's tasks
                record = StepRecord(step=self.step, metrics=metrics)
                records.append(record)
                tracker.log(self.step, metrics)
                if self.on_step is not None:
                    self.on_step(record)
                every = self.rl.checkpoints.every
                if every and (self.step % every == 0 or self.step == self.rl.steps):
                    # A resumed run continues right after this step's tasks; in async mode
                    # the next step's tasks, already taken, are generated again.
                    save_checkpoint(
                        self.run_dir,
                        self.step,
                        self.backend,
                        {"step": self.step, "cursor": after},
                        keep_last=self.rl.checkpoints.keep,
                    )
        finally:
            tracker.close()
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
        return records

    def restore(self, extra: dict[str, Any]) -> None:
        """Continue after a checkpoint: its step and data cursor."""
        self.step = int(extra["step"])
        self.stream.cursor = int(extra["cursor"])
