"""A dispatch strategy added from outside the package: one rollout at a time, start to end.

Useful as the slowest honest baseline; it records its runs in `$CONVEYOR_PLUGIN_LOG` under the
`label` of its options (``dispatch.strategy: {name: serial, options: {label: ...}}``), which it
reads typed from `settings.strategy.options` like a built-in part.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

from conveyor.dispatch.base import Dispatcher, RolloutJob
from conveyor.registry import STRATEGIES


class SerialOptions(BaseModel):
    """`dispatch.strategy.options` of `serial`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    label: str = Field("serial", min_length=1, description="Its name in the plugin log.")


@STRATEGIES.register("serial", options=SerialOptions)
class SerialDispatcher(Dispatcher):
    """Each rollout's init, run and reward finish before the next rollout is admitted."""

    async def schedule(self, jobs: Iterator[RolloutJob]) -> None:
        count = 0
        for job in jobs:
            await self.admit(job)
            await self.advance(job)
            count += 1
        await self.all_recorded()
        options = self.settings.strategy.options
        assert isinstance(options, SerialOptions)
        log = os.environ.get("CONVEYOR_PLUGIN_LOG")
        if log:
            with open(log, "a") as sink:
                sink.write(f"strategy {options.label} {count} rollouts\n")
