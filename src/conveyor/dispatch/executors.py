"""Where the stages run: in this process (asyncio) or in Ray actors (`ray_executor`)."""

from __future__ import annotations

from typing import Protocol

from conveyor.dispatch.stages import RolloutStages


class Executor(Protocol):
    """Places the stages of rollouts; the strategy code is the same on every executor."""

    def place(self, stages: RolloutStages) -> RolloutStages:
        """Stages that run where this executor puts them (the same interface back)."""
        ...


class AsyncioExecutor:
    """The default: every stage runs as a coroutine on the dispatcher's own event loop."""

    def place(self, stages: RolloutStages) -> RolloutStages:
        """The stages unchanged."""
        return stages
