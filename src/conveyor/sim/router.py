"""Router policies of the simulated engine fleet: which replica serves a request.

A replica's prefix cache holds only what that replica computed, so a policy that moves a
session between replicas makes the next replica prefill the session's history again.

- `session_sticky` (Conveyor's router, issue 18): every request of a session goes to the replica
  that served its first; a new session goes to the least-loaded replica: fewest requests in
  flight (running + waiting), then least KV in use, then the lowest index.
- `session_hash`: sticky as well, but a new session's replica is crc32(session id) mod N,
  blind to load. The simulator's routing before routers existed; it stays the engine's default
  so the recorded strategy results (docs/dispatch.md, the golden makespans) keep their meaning.
- `round_robin`: request i goes to replica i mod N, whatever its session.
- `random`: each request to a replica drawn uniformly from a seeded generator.

With one replica every policy routes identically.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

from conveyor.engines.placement import StickyPlacement


class ReplicaLoad(Protocol):
    """What a router may read of a replica: the load figures a real engine reports."""

    @property
    def requests_in_flight(self) -> int:
        """Requests running or waiting on the replica."""
        ...

    @property
    def kv_used(self) -> int:
        """KV-cache tokens held by the replica's running requests."""
        ...


class Router(Protocol):
    """Chooses a replica for each request of a session."""

    def route(self, session: str, replicas: Sequence[ReplicaLoad]) -> int:
        """The index in `replicas` of the replica that serves this request."""
        ...


class SessionStickyRouter:
    """A session stays on the replica of its first request; new sessions go least-loaded:
    fewest requests in flight, then least KV in use, then the lowest index (the engine router's
    placement, `conveyor.engines.placement`, over the simulated load figures)."""

    def __init__(self, seed: int = 0) -> None:
        self._placement: StickyPlacement[int] = StickyPlacement()

    def route(self, session: str, replicas: Sequence[ReplicaLoad]) -> int:
        """The session's replica, chosen least-loaded on its first request."""
        home, _ = self._placement.place(
            session,
            range(len(replicas)),
            lambda i: (replicas[i].requests_in_flight, replicas[i].kv_used, i),
        )
        return home


class SessionHashRouter:
    """A session stays on replica crc32(session id) mod N."""

    def __init__(self, seed: int = 0) -> None:
        pass

    def route(self, session: str, replicas: Sequence[ReplicaLoad]) -> int:
        """The replica the session id hashes to."""
        return zlib.crc32(session.encode()) % len(replicas)


class RoundRobinRouter:
    """Request i to replica i mod N, sessions ignored."""

    def __init__(self, seed: int = 0) -> None:
        self._next = 0

    def route(self, session: str, replicas: Sequence[ReplicaLoad]) -> int:
        """The next replica in turn."""
        index = self._next % len(replicas)
        self._next += 1
        return index


class RandomRouter:
    """Each request to a uniformly drawn replica (seeded: a run is reproducible)."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(f"router:{seed}")

    def route(self, session: str, replicas: Sequence[ReplicaLoad]) -> int:
        """A replica drawn at random."""
        return self._rng.randrange(len(replicas))


ROUTERS: dict[str, Callable[[int], Router]] = {
    "session_sticky": SessionStickyRouter,
    "session_hash": SessionHashRouter,
    "round_robin": RoundRobinRouter,
    "random": RandomRouter,
}
DEFAULT_SIM_ROUTER = "session_hash"  # the engine's routing the recorded results were made with


def make_router(name: str, seed: int = 0) -> Router:
    """The named policy; a clear error for an unknown name."""
    try:
        factory = ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}") from None
    return factory(seed)
