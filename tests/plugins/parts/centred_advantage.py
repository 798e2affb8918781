"""An advantage estimator added from outside the package: the group mean as baseline, no scaling.

It records every call in the file `$CONVEYOR_PLUGIN_LOG` (when set), so a test can see that the
name in the config reached this class.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from conveyor.trainer.advantages import GroupAdvantages, GroupRewards, register_advantage


@register_advantage("centred")
@dataclass(frozen=True)
class Centred:
    """`r - mean(group)`: GRPO without the division by the group's standard deviation."""

    name: ClassVar[str]

    def __call__(self, rewards: GroupRewards) -> GroupAdvantages:
        """One advantage per reward, nested like `rewards`."""
        out = [[r - sum(group) / len(group) for r in group] if group else [] for group in rewards]
        log = os.environ.get("CONVEYOR_PLUGIN_LOG")
        if log:
            with open(log, "a") as sink:
                sink.write(f"advantage centred {len(rewards)} groups\n")
        return out
