"""`batch`: waves of rollouts; all inits of a wave, then all runs, then all rewards."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from itertools import islice

from conveyor.dispatch.base import Dispatcher, RolloutJob, Stage
from conveyor.registry import STRATEGIES


@STRATEGIES.register("batch")
class BatchDispatcher(Dispatcher):
    """Synchronous batching: a wave of `min(max_parallel, max_live_runtimes)` rollouts passes
    each stage together, with a barrier between stages and between waves.

    A rollout whose runtime fails later than init is re-initialised and caught up inside the
    phase where it failed, so the barrier still holds every rollout of the wave.
    """

    async def schedule(self, jobs: Iterator[RolloutJob]) -> None:
        wave_size = min(self.settings.max_parallel, self.settings.max_live_runtimes)
        while wave := list(islice(jobs, wave_size)):
            for job in wave:
                await self.admit(job)
            for until in (Stage.RUN, Stage.REWARD, None):
                await asyncio.gather(*(self.advance(job, until) for job in wave))
        await self.all_recorded()
