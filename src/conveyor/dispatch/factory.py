"""Build the dispatcher a config names, on the executor it names."""

from __future__ import annotations

from conveyor.dispatch.base import Dispatcher, EngineProbe
from conveyor.dispatch.config import DispatchSettings
from conveyor.dispatch.executors import AsyncioExecutor, Executor
from conveyor.dispatch.stages import RolloutStages
from conveyor.dispatch.telemetry import Telemetry
from conveyor.registry import STRATEGIES


def make_dispatcher(
    settings: DispatchSettings,
    stages: RolloutStages,
    *,
    executor: Executor | None = None,
    engine: EngineProbe | None = None,
    telemetry: Telemetry | None = None,
) -> Dispatcher:
    """The strategy `settings.strategy` driving `stages` placed by `executor` (asyncio default)."""
    placed = (executor or AsyncioExecutor()).place(stages)
    return STRATEGIES.get(settings.strategy)(placed, settings, engine=engine, telemetry=telemetry)
