"""`pipeline`: a worker pool and a bounded hand-off queue per stage."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from conveyor.dispatch.base import Dispatcher, RolloutJob, Stage
from conveyor.dispatch.config import DispatchSettings
from conveyor.dispatch.limiter import AdjustableLimit
from conveyor.dispatch.stages import RolloutStages
from conveyor.dispatch.telemetry import Telemetry
from conveyor.registry import STRATEGIES

_QueueItem = tuple[int, int, RolloutJob]  # (retry first = 0 / fresh = 1, admission seq, job)


@STRATEGIES.register("pipeline", run_pool="p_run")
class PipelineDispatcher(Dispatcher):
    """Stage pools of width `p_init`, `p_run`, `p_reward` joined by priority queues.

    Admission feeds the init queue (at most `init_queue` fresh jobs waiting; retries go first
    and never block). A finished init waits for a place in the run queue (`run_queue` deep)
    while holding its runtime, and a finished run for the reward queue: that back-pressure,
    together with the live-runtime bound R taken at init start, keeps live runtimes <= R.
    Every queue serves the lowest admission number first, so the admission order (group-aware
    or trajectory-major) carries through every stage. With `early_first_turn` (and stages that
    implement `first_turn`) a rollout's first generation starts at its init start, beside the
    sandbox set-up, and its run stage continues from it.
    """

    overlaps_first_turn = True

    def __init__(
        self,
        stages: RolloutStages,
        settings: DispatchSettings,
        *,
        engine: Any = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        super().__init__(stages, settings, engine=engine, telemetry=telemetry)
        self.pools = {
            Stage.INIT: AdjustableLimit(settings.p_init),
            Stage.RUN: AdjustableLimit(settings.p_run),
            Stage.REWARD: AdjustableLimit(settings.p_reward),
        }
        self._queues: dict[Stage, asyncio.PriorityQueue[_QueueItem]] = {}
        self._init_slots = asyncio.Semaphore(settings.init_queue)
        self.admission_done = False  # every rollout of the batch has entered the init queue

    def queue_depths(self) -> dict[str, float]:
        """Waiting jobs per stage queue and busy workers per stage pool."""
        depths: dict[str, float] = {}
        for stage, queue in self._queues.items():
            depths[f"{stage.name.lower()}_queue"] = queue.qsize()
            depths[f"{stage.name.lower()}_busy"] = self.pools[stage].in_use
        return depths

    def waiting(self, stage: Stage) -> int:
        """Jobs waiting in the stage's hand-off queue (0 before the batch starts)."""
        queue = self._queues.get(stage)
        return queue.qsize() if queue is not None else 0

    async def schedule(self, jobs: Iterator[RolloutJob]) -> None:
        self._queues = {
            Stage.INIT: asyncio.PriorityQueue(),
            Stage.RUN: asyncio.PriorityQueue(maxsize=self.settings.run_queue),
            Stage.REWARD: asyncio.PriorityQueue(maxsize=self.settings.reward_queue),
        }
        for stage in Stage:
            self.spawn(self._pool(stage))
        self.spawn(self._admit_all(jobs))
        await self.all_recorded()

    async def _admit_all(self, jobs: Iterator[RolloutJob]) -> None:
        self.admission_done = False
        for job in jobs:
            await self._init_slots.acquire()
            await self.admit(job)
            self._queues[Stage.INIT].put_nowait((1, job.seq, job))
        self.admission_done = True

    async def _pool(self, stage: Stage) -> None:
        """Take the most urgent job whenever a worker of this stage is free."""
        pool, queue = self.pools[stage], self._queues[stage]
        while True:
            await pool.acquire()
            try:
                fresh, _, job = await queue.get()
            except BaseException:
                pool.release()
                raise
            if stage is Stage.INIT and fresh:
                self._init_slots.release()
            self.spawn(self._work(stage, job))

    async def _work(self, stage: Stage, job: RolloutJob) -> None:
        pool = self.pools[stage]
        try:
            next_stage = await self.step(job, stage)
            self.stage_done(stage, job)
            if next_stage is Stage.INIT:
                self._queues[Stage.INIT].put_nowait((0, job.seq, job))
            elif next_stage is not None:
                await self._queues[next_stage].put((1, job.seq, job))
        finally:
            pool.release()

    def first_turn_slot(self) -> Callable[[], None] | None:
        """A first turn is run-stage work on the engine: it takes a free run-pool place while it
        generates (never waiting for one), so the run pool bounds the engine's sessions."""
        pool = self.pools[Stage.RUN]
        return pool.release if pool.try_acquire() else None

    def stage_done(self, stage: Stage, job: RolloutJob) -> None:
        """Hook: a stage of `job` has ended (for strategies that learn from stage latencies,
        `auto`)."""
