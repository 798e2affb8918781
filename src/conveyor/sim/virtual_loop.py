"""A discrete-event asyncio loop: time jumps to the next timer whenever nothing is ready.

The same dispatcher code runs on it unchanged (it reads time only through `loop.time()`, sleeps
with `asyncio.sleep` and bounds stages with `asyncio.timeout`), so an hour of simulated rollouts
takes as long as the Python work of its events. Real file descriptors still work: the loop polls
them without blocking before it jumps.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.BaseSelector):
    """Wraps a real selector; instead of sleeping until a timer is due, it moves the clock."""

    def __init__(self, loop: VirtualTimeLoop, idle_wall_s: float) -> None:
        self._loop = loop
        self._real = selectors.DefaultSelector()
        self._idle_wall_s = idle_wall_s

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._real.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            # Nothing scheduled, nothing ready: only another thread could wake us. Wait a
            # little in real time, then call it what it is rather than hang forever.
            events = self._real.select(self._idle_wall_s)
            if not events:
                raise RuntimeError(
                    "virtual-time loop deadlocked: no timer scheduled and nothing ready"
                )
            return events
        self._loop.advance_to_next_timer(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual: it starts at 0 and jumps between timers."""

    def __init__(self, idle_wall_s: float = 5.0) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_JumpingSelector(self, idle_wall_s))

    def time(self) -> float:
        """Virtual seconds since the loop was made."""
        return self._virtual_now

    def advance_to_next_timer(self, timeout: float) -> None:
        """Move the clock to the earliest scheduled callback (or by `timeout`)."""
        scheduled = getattr(self, "_scheduled", None)
        if scheduled:
            self._virtual_now = max(self._virtual_now, scheduled[0].when())
        else:
            self._virtual_now += timeout


def run_virtual(coro: Coroutine[Any, Any, T], idle_wall_s: float = 5.0) -> T:
    """Run `coro` to completion on a fresh `VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(idle_wall_s)) as runner:
        return runner.run(coro)
