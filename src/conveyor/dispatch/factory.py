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
    """The strategy `settings.strategy` names driving `stages` placed by `executor` (default:
    the executor `settings.executor` names, asyncio unless configured). The strategy reads its
    options as `settings.strategy.options`."""
    placed = (executor or make_executor(settings.executor)).place(stages)
    strategy = STRATEGIES.get(settings.strategy.name)
    return strategy(placed, settings, engine=engine, telemetry=telemetry)
