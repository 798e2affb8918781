"""Build the dispatcher a config names, on the executor it names."""

from __future__ import annotations

from conveyor.dispatch.base import Dispatcher, EngineProbe
from conveyor.dispatch.config import DispatchSettings
from conveyor.dispatch.executors import Executor, make_executor
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
    """The strategy `settings.strategy` driving `stages` placed by `executor` (default: the
    executor `settings.executor` names, asyncio unless configured)."""
    placed = (executor or make_executor(settings.executor)).place(stages)
    return STRATEGIES.get(settings.strategy)(placed, settings, engine=engine, telemetry=telemetry)
