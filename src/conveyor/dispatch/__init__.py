"""The rollout dispatcher: strategies that schedule init, run and reward of many rollouts.

`make_dispatcher(settings, stages)` builds the strategy that `settings.strategy` names.
"""

from __future__ import annotations

from conveyor.dispatch.base import Dispatcher, EngineProbe, Stage
from conveyor.dispatch.config import DispatchSettings
from conveyor.dispatch.factory import make_dispatcher
from conveyor.dispatch.stages import RolloutStages
from conveyor.dispatch.telemetry import Telemetry

__all__ = [
    "DispatchSettings",
    "Dispatcher",
    "EngineProbe",
    "RolloutStages",
    "Stage",
    "Telemetry",
    "make_dispatcher",
]
