"""A counting limit whose size can change while it is in use (stage pools of `auto`)."""

from __future__ import annotations

import asyncio
from collections import deque


class AdjustableLimit:
    """Like `asyncio.Semaphore`, but `limit` can be raised or lowered at any time.

    Lowering never interrupts holders: it only delays new acquisitions until `in_use < limit`.
    Waiters are served first come, first served.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._limit = limit
        self._in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def limit(self) -> int:
        """The current bound."""
        return self._limit

    @property
    def in_use(self) -> int:
        """Slots held now."""
        return self._in_use

    def set_limit(self, limit: int) -> None:
        """Change the bound; waiters are woken if it grew."""
        self._limit = max(1, int(limit))
        self._wake()

    async def acquire(self) -> None:
        """Wait for a free slot and take it."""
        if self._in_use < self._limit and not self._waiters:
            self._in_use += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._in_use -= 1  # granted and cancelled in the same step: give it back
                self._wake()
            else:
                self._waiters.remove(future)
            raise

    def try_acquire(self) -> bool:
        """Take a free slot now if there is one (nobody waiting), without waiting."""
        if self._in_use < self._limit and not self._waiters:
            self._in_use += 1
            return True
        return False

    def release(self) -> None:
        """Give a slot back."""
        if self._in_use <= 0:
            raise RuntimeError("release() without acquire()")
        self._in_use -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._in_use < self._limit:
            future = self._waiters.popleft()
            if not future.done():
                self._in_use += 1
                future.set_result(None)
