"""The three stages of a rollout, as the dispatcher sees them.

The dispatcher never knows what a task is; it drives these three coroutines and owns everything
around them: concurrency, queues, timeouts, retries, closing runtimes and timings.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from conveyor.runtime.base import Runtime
from conveyor.types import Task, Trajectory


class RolloutStages(Protocol):
    """What one rollout does in each stage; implemented by the agent layer (and by simulations)."""

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        """Start a fresh runtime for this rollout (CPU-bound set-up: sandbox, workspace, repo).

        Raises `RuntimeFailure` on an infrastructure failure. If cancelled, it must release what
        it has started so far: the dispatcher only knows about a runtime once this returns.
        """
        ...

    async def run(self, task: Task, sample_index: int, runtime: Runtime) -> Trajectory:
        """The agent loop: generations on the engine and tool calls on `runtime`.

        A failure the policy caused is a status inside the returned trajectory; `EngineError`
        or `RuntimeFailure` raised from here is an infrastructure failure.
        """
        ...

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        """Score the trajectory (tests, verifier) and return it with `reward` set.

        Raises `RuntimeFailure` if the runtime failed while scoring (an infrastructure failure).
        """
        ...


@runtime_checkable
class FirstTurnStages(RolloutStages, Protocol):
    """Stages whose run can begin before its runtime exists (optional).

    The first generation of a rollout reads only the task's prompt: no tool output yet, so no
    runtime. `first_turn` does that work; the `pipeline` and `auto` dispatchers start it beside
    `init` (at init start, inside the rollout's runtime slot) and hand its result to `run` as
    `head`, so the sandbox start and the first generation overlap instead of following each
    other. `run` must accept `head=None` (no head start: paused, or the strategy has none).
    """

    async def first_turn(self, task: Task, sample_index: int, attempt: int) -> object:
        """The run stage's work that needs no runtime (the first generation). Raises like `run`:
        `EngineError` is an infrastructure failure of the attempt. Cancelled when init fails."""
        ...

    async def run(
        self, task: Task, sample_index: int, runtime: Runtime, head: object = None
    ) -> Trajectory:
        """The agent loop, continuing from `head` (what `first_turn` returned) when given."""
        ...
