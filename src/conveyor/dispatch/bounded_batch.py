"""`bounded_batch`: the paper's naive asynchronous batching."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from conveyor.dispatch.base import Dispatcher, RolloutJob
from conveyor.registry import STRATEGIES


@STRATEGIES.register("bounded_batch")
class BoundedBatchDispatcher(Dispatcher):
    """At most `max_parallel` rollouts in flight; each holds its slot through init, run and
    reward (and any infra retries), and the next rollout is admitted when one finishes."""

    async def schedule(self, jobs: Iterator[RolloutJob]) -> None:
        slots = asyncio.Semaphore(self.settings.max_parallel)
        for job in jobs:
            await slots.acquire()
            await self.admit(job)
            self.spawn(self._drive(job, slots))
        await self.all_recorded()

    async def _drive(self, job: RolloutJob, slots: asyncio.Semaphore) -> None:
        try:
            await self.advance(job)
        finally:
            slots.release()
