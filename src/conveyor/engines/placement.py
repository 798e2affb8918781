"""Session-sticky placement, the one rule both routers follow: the real one over engine
replicas (`conveyor.engines.router`) and the simulator's (`conveyor.sim.router`).

A replica's prefix cache holds only what that replica computed, so every request of a session
(one rollout) goes to the replica that served its first; a new session goes to the candidate
with the least load, as the caller measures it (its key ends with the replica's index, so ties
are broken the same way every time).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, Generic, TypeVar

R = TypeVar("R")

__all__ = ["Placed", "StickyPlacement"]


class Placed(Enum):
    """How a request found its replica."""

    KEPT = "kept"  # the session's replica, still a candidate
    NEW = "new"  # a session's first request: placed least-loaded
    MOVED = "moved"  # the session's replica is no longer a candidate: placed again
    ONCE = "once"  # no session (a one-off request): least-loaded, not remembered


class StickyPlacement(Generic[R]):
    """Each session's replica; the last `max_sessions` sessions used are remembered (None: all).

    A forgotten session is placed again as a new one, as if never seen.
    """

    def __init__(self, max_sessions: int | None = None) -> None:
        self.max_sessions = max_sessions
        self._homes: OrderedDict[str, R] = OrderedDict()

    def place(
        self, session: str, candidates: Iterable[R], load: Callable[[R], Any]
    ) -> tuple[R, Placed]:
        """The replica for a request of `session` among `candidates` (those that may take new
        work), placing the session by the least `load` if it has no replica among them."""
        pool = list(candidates)
        known = self._homes.get(session) if session else None
        if known is not None and known in pool:
            self._homes.move_to_end(session)
            return known, Placed.KEPT
        chosen = min(pool, key=load)
        if not session:
            return chosen, Placed.ONCE
        self._homes[session] = chosen
        self._homes.move_to_end(session)
        if self.max_sessions is not None:
            while len(self._homes) > self.max_sessions:
                self._homes.popitem(last=False)
        return chosen, Placed.NEW if known is None else Placed.MOVED

    def home(self, session: str) -> R | None:
        """The replica `session` is placed on (None: not placed, or forgotten)."""
        return self._homes.get(session)
