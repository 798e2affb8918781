"""Fault injection for the crash-resume tests: `kill -9` of the training process at a named point.

A test-only hook. `CONVEYOR_KILL_AT=POINT:STEP` makes the process send itself SIGKILL (no
handler, no cleanup, no flush: exactly a `kill -9`) when step STEP (1-based, the step being
produced) reaches POINT:

- `rollouts`: the first group of the step's rollouts is back, the others are still in flight;
- `train_step`: the optimizer step is done in memory, nothing of it is on disk or in the engine;
- `weight_sync`: the engine has taken the first tensor of the new weights, not the rest;
- `checkpoint_write`: every file of the step's checkpoint is written into its `.tmp-` folder,
  the rename that publishes it has not happened.

Unset (the normal case) it costs one dictionary lookup per point.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Iterator
from typing import TypeVar

from conveyor.config import ConfigError

ENV = "CONVEYOR_KILL_AT"
POINTS = ("rollouts", "train_step", "weight_sync", "checkpoint_write")

T = TypeVar("T")


def armed() -> tuple[str, int] | None:
    """The (point, step) of `CONVEYOR_KILL_AT`, or None; a malformed value is a clear error."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    point, _, step = value.partition(":")
    if point not in POINTS or not step.isdigit() or int(step) < 1:
        raise ConfigError(
            f"{ENV}={value!r}: expected POINT:STEP with POINT one of {', '.join(POINTS)} "
            "and STEP >= 1"
        )
    return point, int(step)


def kill_point(point: str, step: int) -> None:
    """SIGKILL this process if `CONVEYOR_KILL_AT` names `point` at `step`."""
    if armed() == (point, step):
        os.kill(os.getpid(), signal.SIGKILL)


def killing_midway(items: Iterable[T], step: int) -> Iterator[T]:
    """`items`, unless `weight_sync` is armed at `step`: then the process dies on taking the
    second one, while the consumer (the engine loading weights) holds only the first."""
    if armed() != ("weight_sync", step):
        yield from items
        return
    for index, item in enumerate(items):
        if index == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        yield item
