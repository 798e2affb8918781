"""`auto`: placeholder until the adaptive pool sizing lands (registered so config can name it)."""

from __future__ import annotations

from conveyor.dispatch.pipeline import PipelineDispatcher
from conveyor.dispatch.registry import register_strategy


@register_strategy("auto")
class AutoDispatcher(PipelineDispatcher):
    """Pipeline whose stage pools are sized online (see module docstring)."""
