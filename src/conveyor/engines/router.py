"""Engine replicas behind one sampling client, routed by rollout.

`route(replicas, names)` puts N replica clients (the servers of `engine.base_urls`, or the local
servers `engine.replicas` starts) behind one `RoutedEngine`:

- **Sticky sessions.** Every request of a rollout (one `session_id`) goes to the replica that
  served its first request: that replica's prefix cache holds the rollout's history.
- **Least-loaded placement.** A new session goes to the healthy replica with the fewest requests
  in flight (counted here), then the lowest KV-cache use where the replica reports
  `KVCacheStats`, then the fewest sessions placed, then the lowest index.
  (Stickiness and placement are `conveyor.engines.placement`, which the simulator's
  `session_sticky` router uses too.)
- **Failover.** A replica whose client raises `EngineDown` (its server did not answer for
  `engine.reconnect_s`) is out for the rest of the run. The request that found it raises a plain
  `EngineError`, which the dispatcher treats as an infrastructure failure of the rollout: the
  rollout starts again from init (counted in its `infra_retries`). Its retried first request, and
  the next request of every other session of that replica, is placed on a healthy replica
  (counted as moved). Only when no replica is left does a request raise `EngineDown`, which
  stops the run. A replica that is out is never taken back: after a weight sync, a server that
  restarted would serve the base weights.

The optional engine protocols are forwarded when every replica has them: statistics are summed
over the healthy replicas (`max_model_len` is the smallest), cumulative counters over all;
`policy_version` is the lowest any healthy replica serves. `update_weights` reads the weights
once and loads them into every healthy replica at once, under one version; new requests wait
until every replica has finished, so sampling resumes only when all serve the new version. A
replica that fails to load is taken out (the others go on; if none took them, an `EngineError`).
`replica_fingerprints` gives each replica's fingerprint, and `checked_sync`
(`conveyor.trainer.weight_sync`) compares every one with the trainer's: the sync passes only
when every replica serves the new weights. Start-up checks (`check_served`,
`check_trainable`) ask every replica and name each that fails, in one `EngineError`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from conveyor.engines.base import (
    ContextLimit,
    EngineCounters,
    EngineDown,
    EngineError,
    EngineStats,
    KVCacheStats,
    RequestCounters,
    SampleRequest,
    SampleResult,
    SamplingClient,
    ServedModelCheck,
    ServesFingerprint,
    TrainableCheck,
    WeightFingerprint,
    WeightFolder,
    WeightReceiver,
)
from conveyor.engines.placement import Placed, StickyPlacement

if TYPE_CHECKING:
    from torch import Tensor

logger = logging.getLogger(__name__)

# Sessions remembered for stickiness; the oldest is forgotten first (its rollout long ended: a
# session is one rollout, and the dispatcher bounds how many run at once).
MAX_SESSIONS = 100_000


@dataclass
class Replica:
    """One replica behind the router and what the router did with it."""

    index: int
    name: str
    client: SamplingClient
    in_flight: int = 0  # requests sent to it and not yet answered
    requests: int = 0  # requests routed to it
    sessions: int = 0  # new sessions placed on it
    moved_in: int = 0  # sessions moved to it from a replica that went down
    down: str | None = None  # why it is out of the rotation; None while healthy
    log: str | None = None  # its server's log, where the run started the server

    def counts(self) -> dict[str, Any]:
        """What the run summary records of this replica."""
        return {
            "name": self.name,
            "log": self.log,
            "requests": self.requests,
            "sessions": self.sessions,
            "moved_in": self.moved_in,
            "down": self.down,
            # how the last weight sync reached it ('collective', 'safetensors'; '' before any)
            "weight_sync": str(getattr(self.client, "weight_sync_used", "")),
        }


class RoutedEngine:
    """A `SamplingClient` over N replica clients: sticky sessions, least-loaded placement,
    failover (see the module docstring). Build it with `route`, which adds the optional
    protocols every replica has."""

    def __init__(
        self,
        replicas: Sequence[SamplingClient],
        names: Sequence[str] | None = None,
        *,
        logs: Sequence[str] | None = None,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        labels = (
            list(names) if names is not None else [f"replica-{i}" for i in range(len(replicas))]
        )
        logged: list[str | None] = list(logs) if logs is not None else [None] * len(replicas)
        if not len(labels) == len(logged) == len(replicas):
            raise ValueError(f"{len(labels)} names, {len(logged)} logs, {len(replicas)} replicas")
        self.replicas = [
            Replica(index=i, name=label, client=client, log=log)
            for i, (label, client, log) in enumerate(zip(labels, replicas, logged, strict=True))
        ]
        self.moved_sessions = 0
        self._kv = [r.client if isinstance(r.client, KVCacheStats) else None for r in self.replicas]
        self._placement: StickyPlacement[Replica] = StickyPlacement(max_sessions)
        self._update: asyncio.Event | None = None  # a weight update under way (set when done)

    # -- SamplingClient ---------------------------------------------------------------------

    async def sample(self, request: SampleRequest) -> SampleResult:
        """Send `request` to its session's replica (placing a new session); `EngineError` when
        that replica fails, `EngineDown` once no replica is left."""
        while (update := self._update) is not None:
            await update.wait()  # no request samples from a mix of old and new weights
        replica = self._place(request.session_id)
        replica.in_flight += 1
        replica.requests += 1
        try:
            return await replica.client.sample(request)
        except EngineDown as exc:
            self._take_out(replica, str(exc))
            if not self.healthy():
                raise EngineDown(self._none_left()) from exc
            raise EngineError(
                f"replica {replica.name} is down ({exc}); its rollouts move to the other replicas"
            ) from exc
        finally:
            replica.in_flight -= 1

    @property
    def in_flight(self) -> int:
        """Requests routed and not yet answered, over all replicas."""
        return sum(r.in_flight for r in self.replicas)

    @property
    def policy_version(self) -> int:
        """The lowest policy version a healthy replica serves (all of them, once none is)."""
        serving = self.healthy() or self.replicas
        return min(r.client.policy_version for r in serving)

    async def close(self) -> None:
        """Close every replica (all of them, even when one fails to; then its error)."""
        results = await asyncio.gather(
            *(r.client.close() for r in self.replicas), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    # -- routing ----------------------------------------------------------------------------

    def healthy(self) -> list[Replica]:
        """The replicas new requests may go to."""
        return [r for r in self.replicas if r.down is None]

    def _place(self, session: str) -> Replica:
        healthy = self.healthy()
        if not healthy:
            raise EngineDown(self._none_left())
        chosen, placed = self._placement.place(session, healthy, self._load)
        if placed is Placed.MOVED:
            chosen.moved_in += 1
            self.moved_sessions += 1
        elif placed is Placed.NEW:
            chosen.sessions += 1
        return chosen

    def _load(self, replica: Replica) -> tuple[int, float, int, int]:
        stats = self._kv[replica.index]
        kv = 0.0
        if stats is not None and stats.kv_capacity_tokens > 0:
            kv = stats.kv_used_tokens / stats.kv_capacity_tokens
        return (replica.in_flight, kv, replica.sessions + replica.moved_in, replica.index)

    def _take_out(self, replica: Replica, why: str) -> None:
        if replica.down is None:
            replica.down = why
            left = len(self.healthy())
            logger.warning("engine replica %s is out (%s); %d left", replica.name, why, left)

    def _none_left(self) -> str:
        reasons = "; ".join(f"{r.name}: {r.down}" for r in self.replicas)
        return f"all {len(self.replicas)} engine replicas are down ({reasons})"

    def replica_of(self, session: str) -> str | None:
        """The name of the replica `session` is routed to now (None: not placed, or forgotten)."""
        known = self._placement.home(session)
        return known.name if known is not None else None

    def routing_summary(self) -> dict[str, Any]:
        """Per-replica counts (requests routed, sessions placed, sessions moved in, why a
        replica is out) and totals, for the run's `summary.json` (`engine_replicas`)."""
        return {
            "replicas": [r.counts() for r in self.replicas],
            "moved_sessions": self.moved_sessions,
            "replicas_down": sum(1 for r in self.replicas if r.down is not None),
        }


# -- the optional protocols, each forwarded when every replica has it ------------------------


class _KVStats(RoutedEngine):
    @property
    def kv_capacity_tokens(self) -> int:
        """KV-cache tokens of the healthy replicas together."""
        return sum(cast(KVCacheStats, r.client).kv_capacity_tokens for r in self.healthy())

    @property
    def kv_used_tokens(self) -> int:
        """KV-cache tokens held by running requests on the healthy replicas together."""
        return sum(cast(KVCacheStats, r.client).kv_used_tokens for r in self.healthy())


class _ContextLimit(RoutedEngine):
    @property
    def max_model_len(self) -> int:
        """The smallest context limit of any replica (0 when none states one)."""
        limits = [cast(ContextLimit, r.client).max_model_len for r in self.replicas]
        return min((n for n in limits if n > 0), default=0)


class _SchedulerStats(RoutedEngine):
    @property
    def running_requests(self) -> int:
        """Requests being generated on the healthy replicas together."""
        return sum(cast(EngineStats, r.client).running_requests for r in self.healthy())

    @property
    def waiting_requests(self) -> int:
        """Requests waiting for room on the healthy replicas together."""
        return sum(cast(EngineStats, r.client).waiting_requests for r in self.healthy())


class _Counters(RoutedEngine):
    @property
    def generated_tokens(self) -> int:
        """Completion tokens generated by every replica so far."""
        return sum(cast(EngineCounters, r.client).generated_tokens for r in self.replicas)

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens computed by every replica so far."""
        return sum(cast(EngineCounters, r.client).prefill_tokens for r in self.replicas)

    @property
    def preemptions(self) -> int:
        """Preemptions on every replica so far."""
        return sum(cast(EngineCounters, r.client).preemptions for r in self.replicas)


class _Fingerprints(RoutedEngine):
    async def replica_fingerprints(
        self, probe_ids: Sequence[int]
    ) -> list[tuple[str, WeightFingerprint]]:
        """Each healthy replica's fingerprint, by replica name (what `checked_sync` checks)."""
        targets = self.healthy()
        if not targets:
            raise EngineDown(self._none_left())
        prints = await asyncio.gather(
            *(cast(ServesFingerprint, r.client).weight_fingerprint(probe_ids) for r in targets)
        )
        return [(r.name, fp) for r, fp in zip(targets, prints, strict=True)]

    async def weight_fingerprint(self, probe_ids: Sequence[int]) -> WeightFingerprint:
        """One fingerprint for all healthy replicas: the lowest policy version, each digest
        where all agree (a marker that matches nothing where they do not), and the first
        replica's probe logprobs. `replica_fingerprints` has every replica's."""
        served = await self.replica_fingerprints(probe_ids)
        first = served[0][1]
        digests = {
            name: digest
            if all(fp.digests.get(name) == digest for _, fp in served)
            else "replicas differ"
            for name, digest in first.digests.items()
        }
        return first.model_copy(
            update={
                "policy_version": min(fp.policy_version for _, fp in served),
                "digests": digests,
            }
        )


class _Receiver(_Fingerprints):
    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> float:
        """Load `weights` into every healthy replica at once, all under one version; new
        requests wait meanwhile. A replica that fails is taken out; `EngineError` if none took
        them. Returns the seconds until the last replica finished."""
        start = time.perf_counter()
        targets = self.healthy()
        if not targets:
            raise EngineDown(self._none_left())
        named = list(weights)  # read once (a generator under FSDP), loaded N times
        if version is None:
            version = max(r.client.policy_version for r in targets) + 1
        update = asyncio.Event()
        self._update = update
        try:
            results = await asyncio.gather(
                *(cast(WeightReceiver, r.client).update_weights(named, version) for r in targets),
                return_exceptions=True,
            )
            failed = [
                (r, e)
                for r, e in zip(targets, results, strict=True)
                if isinstance(e, BaseException)
            ]
            for _, error in failed:
                if not isinstance(error, Exception):
                    raise error  # cancelled: not the replica's fault
            if len(failed) == len(targets):
                raise EngineError(
                    f"no engine replica took weight version {version}: "
                    + "; ".join(f"{r.name}: {e}" for r, e in failed)
                ) from failed[0][1]
            for replica, error in failed:
                self._take_out(replica, f"it failed to load weight version {version}: {error}")
        finally:
            self._update = None
            update.set()
        return time.perf_counter() - start


class _Folder(RoutedEngine):
    def use_weights_dir(self, path: Path) -> None:
        """Replica i writes its weight versions under `path/replica-i` (each server reads its
        own: replicas never overwrite each other's version folder mid-load)."""
        for replica in self.replicas:
            cast(WeightFolder, replica.client).use_weights_dir(
                Path(path) / f"replica-{replica.index}"
            )


class _ServedCheck(RoutedEngine):
    async def check_served(self) -> None:
        """Every replica answers and serves the model; else one `EngineError` naming each
        replica that does not."""
        await _check_all(self.replicas, lambda c: cast(ServedModelCheck, c).check_served())


class _TrainableCheck(RoutedEngine):
    async def check_trainable(self) -> None:
        """Training can reach every replica; else one `EngineError` naming each that fails."""
        await _check_all(self.replicas, lambda c: cast(TrainableCheck, c).check_trainable())


class _RequestCounts(RoutedEngine):
    def request_counters(self) -> dict[str, int]:
        """Every replica client's counters (retries, resends, ...), summed by name."""
        total: Counter[str] = Counter()
        for replica in self.replicas:
            total.update(cast(RequestCounters, replica.client).request_counters())
        return dict(total)


async def _check_all(replicas: Sequence[Replica], check: Any) -> None:
    results = await asyncio.gather(*(check(r.client) for r in replicas), return_exceptions=True)
    failed = [
        (r, e) for r, e in zip(replicas, results, strict=True) if isinstance(e, BaseException)
    ]
    for _, error in failed:
        if not isinstance(error, EngineError):
            raise error
    if failed:
        raise EngineError(
            f"{len(failed)} of {len(replicas)} engine replicas failed the start-up check: "
            + "; ".join(f"replica {r.name}: {e}" for r, e in failed)
        ) from failed[0][1]


# Each protocol and the class that forwards it; `_Receiver` brings `_Fingerprints` with it.
_FORWARDED: tuple[tuple[type, type[RoutedEngine]], ...] = (
    (KVCacheStats, _KVStats),
    (ContextLimit, _ContextLimit),
    (EngineStats, _SchedulerStats),
    (EngineCounters, _Counters),
    (WeightReceiver, _Receiver),
    (ServesFingerprint, _Fingerprints),
    (WeightFolder, _Folder),
    (ServedModelCheck, _ServedCheck),
    (TrainableCheck, _TrainableCheck),
    (RequestCounters, _RequestCounts),
)
_CLASSES: dict[tuple[type[RoutedEngine], ...], type[RoutedEngine]] = {}


def route(
    replicas: Sequence[SamplingClient],
    names: Sequence[str] | None = None,
    *,
    logs: Sequence[str] | None = None,
    max_sessions: int = MAX_SESSIONS,
) -> RoutedEngine:
    """A `RoutedEngine` over `replicas` (named by `names`, default `replica-i`) that is also
    every optional engine protocol all replicas implement, and no other: a command's start-up
    checks (`isinstance(engine, WeightReceiver)`, ...) see what the replicas can do. `logs`
    names each replica's server log (servers the run started)."""
    mixins: list[type[RoutedEngine]] = []
    for protocol, mixin in _FORWARDED:
        if all(isinstance(r, protocol) for r in replicas) and not any(
            issubclass(m, mixin) for m in mixins
        ):
            mixins.append(mixin)
    key = tuple(mixins)
    cls = _CLASSES.get(key)
    if cls is None:
        cls = type("RoutedEngine", (*mixins, RoutedEngine), {"__doc__": RoutedEngine.__doc__})
        _CLASSES[key] = cls
    return cls(replicas, names, logs=logs, max_sessions=max_sessions)
