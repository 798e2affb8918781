"""An advantage estimator with options of its own, added from outside the package.

`rl.advantage: {name: shifted, options: {baseline: 0.5, scale: 2.0}}` gives every trajectory
`scale * (reward - baseline)`: a fixed baseline instead of the group's. The options model checks
the YAML like a built-in's (a wrong key or type is refused naming `rl.advantage.options.<key>`).
Every call is recorded in `$CONVEYOR_PLUGIN_LOG` (when set) with the options it got.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from conveyor.trainer.advantages import GroupAdvantages, GroupRewards, register_advantage


class ShiftedOptions(BaseModel):
    """`rl.advantage.options` of `shifted`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    baseline: float = Field(default=0.5, description="Subtracted from every reward.")
    scale: float = Field(default=1.0, gt=0, description="Multiplies the difference.")


@register_advantage("shifted", ShiftedOptions)
@dataclass(frozen=True)
class Shifted:
    """`scale * (r - baseline)` for every reward."""

    name: ClassVar[str]
    baseline: float = 0.5
    scale: float = 1.0

    def __call__(self, rewards: GroupRewards) -> GroupAdvantages:
        """One advantage per reward, nested like `rewards`."""
        log = os.environ.get("CONVEYOR_PLUGIN_LOG")
        if log:
            with open(log, "a") as sink:
                sink.write(f"advantage shifted baseline={self.baseline} scale={self.scale}\n")
        return [[self.scale * (r - self.baseline) for r in group] for group in rewards]
