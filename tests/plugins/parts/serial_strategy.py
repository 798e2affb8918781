"""A dispatch strategy added from outside the package: one rollout at a time, start to end.

Useful as the slowest honest baseline; it records its runs in `$CONVEYOR_PLUGIN_LOG`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from conveyor.dispatch.base import Dispatcher, RolloutJob
from conveyor.registry import STRATEGIES


@STRATEGIES.register("serial")
class SerialDispatcher(Dispatcher):
    """Each rollout's init, run and reward finish before the next rollout is admitted."""

    async def schedule(self, jobs: Iterator[RolloutJob]) -> None:
        count = 0
        for job in jobs:
            await self.admit(job)
            await self.advance(job)
            count += 1
        await self.all_recorded()
        log = os.environ.get("CONVEYOR_PLUGIN_LOG")
        if log:
            with open(log, "a") as sink:
                sink.write(f"strategy serial {count} rollouts\n")
