"""Where the stages run: in this process (asyncio) or in Ray actors (`ray_executor`).

Executors are named in `conveyor.registry.EXECUTORS` (`dispatch.executor` in config);
`make_executor(choice)` builds the one a config names, with its options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from conveyor.dispatch.stages import RolloutStages
from conveyor.registry import EXECUTORS

if TYPE_CHECKING:
    from conveyor.config.base import PartChoice


class Executor(Protocol):
    """Places the stages of rollouts; the strategy code is the same on every executor."""

    def place(self, stages: RolloutStages) -> RolloutStages:
        """Stages that run where this executor puts them (the same interface back)."""
        ...


@EXECUTORS.register("asyncio", in_process=True)
class AsyncioExecutor:
    """The default: every stage runs as a coroutine on the dispatcher's own event loop."""

    def place(self, stages: RolloutStages) -> RolloutStages:
        """The stages unchanged."""
        return stages


def make_executor(choice: PartChoice) -> Executor:
    """The executor `choice` names, built with its options' fields as keyword arguments (none
    for the built-in ones); `UnknownName` listing the known."""
    return EXECUTORS.get(choice.name)(**choice.options.model_dump())
