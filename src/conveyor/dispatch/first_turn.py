"""The first turn beside init: a rollout's first generation overlapped with its sandbox set-up.

The first generation reads only the task's prompt, so it needs no runtime. A strategy that
overlaps it (`Dispatcher.overlaps_first_turn`, with `early_first_turn` on and stages that
implement `FirstTurnStages`) starts it at init start and the run stage continues from it. The
rules that keep it safe (docs/dispatch.md, "The first turn beside init"):

- it starts only inside the rollout's runtime slot and only on an engine place the strategy
  grants at once (`Dispatcher.first_turn_slot`), never waiting for one;
- the place goes back when the first turn ends or when the run stage takes it over, so a run
  waiting for its own first turn holds one place, not two;
- a failed or cancelled init cancels it; its engine failure is the run stage's infra fault.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from conveyor.dispatch.job import RolloutJob, cancel_and_wait
from conveyor.dispatch.stages import FirstTurnStages
from conveyor.runtime.base import Runtime
from conveyor.types import Trajectory

# A place for one first turn on the engine, as the function that gives it back, or None.
SlotGrant = Callable[[], Callable[[], None] | None]


class FirstTurns:
    """The first turns of one dispatcher: started, handed to run stages, or cancelled.

    `stages` is None when the strategy does not overlap first turns; then `start` does nothing
    and every run stage does its own first turn. `now` is the dispatcher's clock; `changed` is
    called whenever a first turn ends, so the dispatcher can tell when its run work is idle.
    """

    def __init__(
        self,
        stages: FirstTurnStages | None,
        *,
        now: Callable[[], float],
        changed: Callable[[], None],
    ) -> None:
        self.stages = stages
        self._now = now
        self._changed = changed
        self._generating: set[asyncio.Task[object]] = set()
        # rollouts whose first turn has started and whose run stage has not: engine sessions too
        self.waiting = 0

    @property
    def generating(self) -> int:
        """First turns still on the engine (not yet finished or cancelled)."""
        return len(self._generating)

    def start(self, job: RolloutJob, slot: SlotGrant) -> bool:
        """Start `job`'s first turn if the strategy grants it an engine place now; return
        whether it started."""
        if self.stages is None:
            return False
        release = slot()
        if release is None:
            return False
        job.timings["head_start"] = self._now()
        head = asyncio.get_running_loop().create_task(
            self.stages.first_turn(job.task, job.sample_index, job.attempt)
        )
        job.head, job.head_slot = head, release
        self.waiting += 1
        self._generating.add(head)
        attempt = job.attempt

        def finished(task: asyncio.Task[object]) -> None:
            self._generating.discard(task)
            if job.head is task:  # still waiting for its run stage: the engine place is free
                _give_back(job)
            if not task.cancelled():
                task.exception()  # retrieved here; `run` re-raises it
                if job.attempt == attempt:
                    job.timings["head_end"] = self._now()
            self._changed()

        head.add_done_callback(finished)
        return True

    def take(self, job: RolloutJob) -> asyncio.Task[object] | None:
        """Detach the job's first turn. Its engine place goes back now: the run stage holds its
        own, so a run waiting for its first turn takes one place, not two."""
        head, job.head = job.head, None
        if head is not None:
            self.waiting -= 1
            _give_back(job)
        return head

    def drop(self, job: RolloutJob) -> None:
        """Cancel a first turn whose rollout will not run (its init failed or was cancelled)."""
        head = self.take(job)
        if head is not None:
            head.cancel()

    async def run(self, job: RolloutJob, runtime: Runtime) -> Trajectory | None:
        """The run stage continued from the job's first turn, or None if it has none (its
        failure is the run stage's: an infra fault of this attempt)."""
        head_task = self.take(job)
        if head_task is None:
            return None
        assert self.stages is not None
        head = await head_task
        return await self.stages.run(job.task, job.sample_index, runtime, head=head)

    async def cancel_all(self) -> None:
        """Cancel every first turn still generating and wait for each to end (nobody is left
        to run them)."""
        await cancel_and_wait(self._generating)


def _give_back(job: RolloutJob) -> None:
    release, job.head_slot = job.head_slot, None
    if release is not None:
        release()
