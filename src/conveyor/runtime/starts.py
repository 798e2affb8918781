"""Runtime starts of one run: a rate limit, a bound on starts in flight, and a warm pool.

A run of 512 rollouts would otherwise ask for hundreds of sandboxes in the same second (every
init of the first wave at once, and again after each weight sync): a docker daemon, a remote
sandbox service or the host's disk then serve them all slowly, or fail some. `RuntimeStarts`
spreads them out and, with `runtime.warm_pool: K`, keeps K runtimes started ahead.

- **Rate limit** (`runtime.start_rate` starts per second, `runtime.start_burst`): a token
  bucket. It holds at most `start_burst` tokens, gains `start_rate` per second, and every start
  takes one (waiting, in arrival order, when there is none). So in any window of `w` seconds at
  most `start_burst + start_rate * w` runtimes start.
- **Starts in flight** (`runtime.max_concurrent_starts`): at most this many `start()` calls run
  at once.
- **Warm pool** (`runtime.warm_pool`): for a runtime that does not depend on the task (a
  *recipe*, e.g. the executor's sandbox over an empty workspace), K of them are started ahead,
  under the same limits, and each request takes one (a *hit*) and triggers a refill. When none
  is ready the request waits for the oldest pool start in flight that no other request waits
  for (a *join*: it began earlier than a start of the request's own would, but the request
  still waits for it, so it is counted apart from the hits, which waited for nothing); only a
  failed pool start or a closed pool means a fresh start (a *miss*). A pooled runtime is handed
  out once, never returned, and closed like any other by whoever took it; `close()` closes the
  ones still in the pool.

Every start goes through `conveyor.runtime.selection.started`, which applies the `RuntimeStarts`
active in the calling task (`active()`, set by the rollout stages around each family call);
outside a run (offline tools, tests of one runtime) nothing limits a start.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conveyor.config.sections import RuntimeConfig
from conveyor.runtime.base import Runtime

R = TypeVar("R", bound=Runtime)
RECENT_STARTS = 10_000  # start times kept for inspection; the one-second peak counts them all

logger = logging.getLogger(__name__)

_ACTIVE: contextvars.ContextVar[RuntimeStarts | None] = contextvars.ContextVar(
    "conveyor_runtime_starts", default=None
)


def active_starts() -> RuntimeStarts | None:
    """The `RuntimeStarts` of the run the calling task belongs to, if any."""
    return _ACTIVE.get()


@dataclass
class StartCounters:
    """What the starts of a run did (`RuntimeStarts.counters()` reports them).

    `starts`: runtimes started (fresh and for the pool); `failures`: starts that raised;
    `rate_waits` / `rate_wait_s`: starts that waited for the rate limit, and how long in all;
    `slot_waits`: starts that waited for a place among `max_concurrent_starts`;
    `warm_hits`: requests a pool served with a ready runtime (no wait for a start);
    `warm_joins`: requests that waited for a pool start already in flight (none was ready): a
    pool that is always empty when asked saves little, and shows joins, not hits;
    `warm_misses`: requests the pool could not serve (started fresh);
    `warm_discarded`: pooled runtimes found dead when taken (closed, never handed out);
    `start_times`: when the last `RECENT_STARTS` starts were let through (`time.monotonic()`;
    bounded, so a week-long run's counters stay small); `peak_starts_1s`: the most starts let
    through in any one second of the whole run, kept as they happen.
    """

    starts: int = 0
    failures: int = 0
    rate_waits: int = 0
    rate_wait_s: float = 0.0
    slot_waits: int = 0
    warm_hits: int = 0
    warm_misses: int = 0
    warm_joins: int = 0
    warm_discarded: int = 0
    start_times: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STARTS))
    peak_starts_1s: int = 0

    def record_start(self, now: float) -> None:
        """A start let through at `now` (monotonic, never earlier than the last)."""
        self.start_times.append(now)
        in_window = 0
        for t in reversed(self.start_times):
            if now - t > 1.0:
                break
            in_window += 1
        self.peak_starts_1s = max(self.peak_starts_1s, in_window)


class StartGate:
    """The token bucket and the bound on starts in flight; `slot()` waits for both.

    `rate` None: no rate limit; `max_concurrent` None: no bound. Grant times (`time.monotonic`)
    are kept in `counters.start_times`. The asyncio primitives are made per event loop, so a
    gate outlives one `asyncio.run`.
    """

    def __init__(
        self,
        rate: float | None,
        burst: int,
        max_concurrent: int | None,
        counters: StartCounters | None = None,
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"start rate must be > 0 starts per second, got {rate}")
        if burst < 1:
            raise ValueError(f"start burst must be >= 1, got {burst}")
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max concurrent starts must be >= 1, got {max_concurrent}")
        self.rate = rate
        self.burst = burst
        self.max_concurrent = max_concurrent
        self.counters = counters if counters is not None else StartCounters()
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self._slots: asyncio.Semaphore | None = None

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a place among the starts in flight, then take a token; start inside."""
        self._bind()
        slots = self._slots
        if slots is not None:
            if slots.locked():
                self.counters.slot_waits += 1
            await slots.acquire()
        try:
            await self._take_token()
            self.counters.record_start(time.monotonic())
            yield
        finally:
            if slots is not None:
                slots.release()

    async def _take_token(self) -> None:
        if self.rate is None:
            return
        # One waiter at a time, in arrival order: the first in line sleeps until its token.
        async with self._lock:
            self._refill()
            if self._tokens < 1.0:
                self.counters.rate_waits += 1
            while self._tokens < 1.0:  # a timer may fire a hair early: wait for a whole token
                wait = (1.0 - self._tokens) / self.rate
                self.counters.rate_wait_s += wait
                await asyncio.sleep(wait)
                self._refill()
            self._tokens -= 1.0

    def _refill(self) -> None:
        assert self.rate is not None
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def __getstate__(self) -> dict[str, Any]:
        # a copy in another process (a Ray actor) gets the limits, not this loop's primitives
        return {**self.__dict__, "_loop": None, "_lock": asyncio.Lock(), "_slots": None}

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        self._loop = loop
        self._lock = asyncio.Lock()
        if self.max_concurrent is not None:
            self._slots = asyncio.Semaphore(self.max_concurrent)


class _Fill:
    """One pool start in flight; `claimed` once a request waits for it (`handed` then gets the
    runtime, or None when the start failed or the pool closed)."""

    def __init__(self) -> None:
        self.claimed = False
        self.handed: asyncio.Future[Runtime | None] = asyncio.get_running_loop().create_future()


class WarmPool:
    """Up to `size` started runtimes of one recipe (`build`: a not yet started runtime), kept
    full in the background through `gate`. `take()` hands one out: a ready one, else the oldest
    start in flight that no other request waits for (never later than a start of its own,
    which would queue behind it at the gate); None when the pool could not serve."""

    def __init__(
        self,
        size: int,
        build: Callable[[], Runtime],
        gate: StartGate,
        counters: StartCounters,
    ) -> None:
        self.size = size
        self.build = build
        self.gate = gate
        self.counters = counters
        self.ready: list[Runtime] = []
        self._fills: list[_Fill] = []  # in flight, oldest first
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def take(self) -> Runtime | None:
        """A started runtime from the pool (a refill begins), or None: the pool is closed, or
        the start this request waited for failed (the caller starts one itself and sees why)."""
        while self.ready:
            runtime = self.ready.pop(0)
            if runtime.alive():
                self.counters.warm_hits += 1
                self.refill()
                return runtime
            self.counters.warm_discarded += 1
            self._spawn(_close_quietly(runtime))
        self.refill()
        fill = next((f for f in self._fills if not f.claimed), None)
        if fill is None:  # closed
            return None
        fill.claimed = True
        self.refill()  # the claimed start no longer counts towards the pool's size
        try:
            joined = await fill.handed
        except asyncio.CancelledError:
            # the runtime may have been handed in the same instant: nobody else will close it
            if fill.handed.done() and not fill.handed.cancelled():
                handed = fill.handed.result()
                if handed is not None:
                    self._spawn(_close_quietly(handed))
            raise
        if joined is not None:
            self.counters.warm_joins += 1
        return joined

    def refill(self) -> None:
        """Start as many runtimes as the pool lacks (ready + unclaimed starts < size)."""
        if self._closed:
            return
        unclaimed = sum(not f.claimed for f in self._fills)
        for _ in range(max(0, self.size - len(self.ready) - unclaimed)):
            fill = _Fill()
            self._fills.append(fill)
            self._spawn(self._fill_one(fill))

    async def _fill_one(self, fill: _Fill) -> None:
        runtime: Runtime | None = None
        try:
            runtime = await start_gated(self.build(), self.gate)
        except asyncio.CancelledError:
            raise
        except Exception:
            # a broken recipe must not spin: requests start fresh and report the error themselves
            logger.warning("starting a runtime for the warm pool failed", exc_info=True)
        finally:
            self._fills.remove(fill)
            if runtime is not None and self._closed:
                await _close_quietly(runtime)
                runtime = None
            if fill.claimed and not fill.handed.done():
                fill.handed.set_result(runtime)
            elif runtime is not None:
                self.ready.append(runtime)  # unclaimed, or its request was cancelled

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop refilling and close every runtime still in the pool (requests waiting for a
        start get None); idempotent."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ready, self.ready = self.ready, []
        for runtime in ready:
            await _close_quietly(runtime)


class RuntimeStarts:
    """The starts of one run's runtimes, from the `runtime` settings: rate limit, bound on
    starts in flight, warm pools (one per recipe, made on its first request). Owned by the run
    (`Composition`), which awaits `close()` at the end, on success, failure or cancellation."""

    def __init__(self, settings: RuntimeConfig) -> None:
        self.settings = settings
        self.counters = StartCounters()
        self.gate = StartGate(
            settings.start_rate,
            settings.start_burst,
            settings.max_concurrent_starts,
            self.counters,
        )
        self._pools: dict[Hashable, WarmPool] = {}
        self._closed = False

    @contextlib.contextmanager
    def active(self) -> Iterator[RuntimeStarts]:
        """Make this the run whose limits `started()` applies, in the calling task."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    async def start(self, runtime: R) -> R:
        """`runtime`, started through the rate limit; closed again if its start fails."""
        return await start_gated(runtime, self.gate)

    async def warm(self, recipe: Hashable, build: Callable[[], Runtime]) -> Runtime:
        """A started runtime of `recipe` (a key naming what `build` makes, equal for equal
        runtimes): from its warm pool (a ready one, or a pool start in flight), else `build()`
        started now. Without a warm pool (`warm_pool: 0`) always the latter, and no hit, join or
        miss is counted."""
        if self.settings.warm_pool == 0 or self._closed:
            return await self.start(build())
        pool = self._pools.get(recipe)
        if pool is None:
            pool = self._pools[recipe] = WarmPool(
                self.settings.warm_pool, build, self.gate, self.counters
            )
        runtime = await pool.take()
        if runtime is not None:
            return runtime
        self.counters.warm_misses += 1
        return await self.start(build())

    def __getstate__(self) -> dict[str, Any]:
        # runtimes cannot move between processes: a copy starts with empty pools
        return {**self.__dict__, "_pools": {}}

    def warm_ready(self) -> int:
        """Runtimes started and waiting in the warm pools now."""
        return sum(len(pool.ready) for pool in self._pools.values())

    def sample(self) -> dict[str, float]:
        """The counters a telemetry sample takes (cheap: no pass over the start times)."""
        c = self.counters
        return {
            "starts": c.starts,
            "rate_waits": c.rate_waits,
            "warm_hits": c.warm_hits,
            "warm_joins": c.warm_joins,
            "warm_misses": c.warm_misses,
            "warm_ready": self.warm_ready(),
        }

    def report(self) -> dict[str, float]:
        """The counters for a run's summary (start times left out)."""
        c = self.counters
        return {
            "starts": c.starts,
            "failures": c.failures,
            "rate_waits": c.rate_waits,
            "rate_wait_s": round(c.rate_wait_s, 3),
            "slot_waits": c.slot_waits,
            "warm_hits": c.warm_hits,
            "warm_joins": c.warm_joins,
            "warm_misses": c.warm_misses,
            "warm_discarded": c.warm_discarded,
            "warm_ready": self.warm_ready(),
            "peak_starts_1s": c.peak_starts_1s,
        }

    async def close(self) -> None:
        """Close every warm pool and the runtimes in it; later warm requests start fresh."""
        self._closed = True
        pools = list(self._pools.values())
        self._pools.clear()
        for pool in pools:
            await pool.close()


async def start_gated(runtime: R, gate: StartGate | None) -> R:
    """`runtime.start()` inside `gate.slot()` (none: at once); closed again, nothing leaked,
    when the start fails or is cancelled."""
    try:
        if gate is None:
            await runtime.start()
        else:
            async with gate.slot():
                gate.counters.starts += 1
                await runtime.start()
    except BaseException as error:
        if gate is not None and isinstance(error, Exception):
            gate.counters.failures += 1  # a cancelled start is not a failing runtime
        await _close_quietly(runtime)
        raise
    return runtime


async def _close_quietly(runtime: Runtime) -> None:
    try:
        await runtime.close()
    except Exception:
        logger.warning("closing a runtime failed", exc_info=True)
