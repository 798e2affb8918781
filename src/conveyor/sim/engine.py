"""A simulated LLM engine with continuous batching, a KV-cache limit and prefix caching.

Modelled on vLLM's scheduler: each step decodes one token for every running request; new
requests join at step boundaries while their whole context fits in the KV cache (prefill cost
charged in that step, at most `max_batched_tokens` of prefill per step); when the running
contexts outgrow the cache, the newest request is preempted (recompute: it re-prefills its
whole context when readmitted). Finished sessions stay in the prefix cache, evicted LRU when
running requests need the room, so a session's next turn only prefills its new tokens on a hit.

Each replica has its own prefix cache; a router policy (`conveyor.sim.router`) picks the replica
of every request. `prefill_tokens_recomputed` counts the prompt tokens computed that a perfect
per-session prefix cache would not have needed: at each admission of a request (first or after
a preemption), the tokens of its context that its session had already computed, on any replica,
minus those the serving replica still held, i.e. min(context, session's computed tokens) - cached
prefix. Split by cause (`recomputed_by_cause`): `preemption` (the request's own tokens, lost when
it was preempted), `routing` (the session's previous request ran on another replica), `eviction`
(same replica, but its prefix was evicted, or prefix caching is off). The prompt of a session's
first request is never counted (no per-session cache holds it; sharing between sessions is not
modelled).

Step time = base + per_seq * batch + per_context_token * (tokens in the batch's contexts)
+ prefill_per_token * prefill tokens. Between events (a request finishing, the cache filling)
the batch is constant, so the engine advances up to `event_steps` steps per timer: exact in
token counts, and new arrivals wait at most that many steps.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import OrderedDict, deque

from conveyor.sim.router import DEFAULT_SIM_ROUTER, make_router
from conveyor.sim.swe import SweSimWorkload


class _Request:
    __slots__ = (
        "closed",
        "context",
        "epoch",
        "future",
        "gen_before",
        "session",
        "start_step",
        "target",
    )

    def __init__(self, session: str, context: int, target: int, future: asyncio.Future[None]):
        self.session = session
        self.context = context
        self.target = target
        self.future = future
        self.gen_before = 0
        self.start_step = 0
        self.epoch = 0
        self.closed = False


class _Replica:
    def __init__(self, engine: SimEngine, index: int) -> None:
        self.engine = engine
        self.index = index
        self.step = 0
        self.running: list[_Request] = []
        self.finish_heap: list[tuple[int, int, int, _Request]] = []
        self.waiting: deque[_Request] = deque()
        self.kv_used = 0
        self.idle: OrderedDict[str, int] = OrderedDict()
        self.idle_total = 0
        self.wake: asyncio.Future[None] | None = None
        self.counter = 0

    @property
    def requests_in_flight(self) -> int:
        """Requests running or waiting here (what a router reads as load)."""
        return len(self.running) + len(self.waiting)

    def submit(self, request: _Request) -> None:
        self.waiting.append(request)
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    def _admit(self) -> int:
        w = self.engine.workload
        prefill = 0
        while self.waiting and len(self.running) < w.max_num_seqs:
            request = self.waiting[0]
            size = request.context + request.gen_before
            if self.kv_used + size > w.kv_capacity_tokens and self.running:
                break
            cached = self.idle.pop(request.session, 0) if w.prefix_caching else 0
            self.idle_total -= cached
            new = max(1, size - cached)
            if prefill and prefill + new > w.max_batched_tokens:
                self.idle[request.session] = cached  # keep its cache entry; retry next step
                self.idle_total += cached
                break
            self.waiting.popleft()
            self.engine.book_admission(request, self.index, size, cached)
            prefill += new
            request.start_step = self.step
            self.running.append(request)
            self.kv_used += size
            self.counter += 1
            finish = self.step + request.target - request.gen_before
            heapq.heappush(self.finish_heap, (finish, self.counter, request.epoch, request))
        self._evict()
        return prefill

    def _evict(self) -> None:
        room = self.engine.workload.kv_capacity_tokens - self.kv_used
        while self.idle and self.idle_total > room:
            _, tokens = self.idle.popitem(last=False)
            self.idle_total -= tokens

    def _preempt_until_fits(self) -> None:
        capacity = self.engine.workload.kv_capacity_tokens
        while len(self.running) > 1 and self.kv_used + len(self.running) > capacity:
            victim = self.running.pop()
            generated = victim.gen_before + self.step - victim.start_step
            self.kv_used -= victim.context + generated
            self.engine.book_computed(victim.session, victim.context + generated)
            victim.gen_before = generated
            victim.epoch += 1
            self.waiting.appendleft(victim)
            self.engine.preemptions += 1

    def abort(self, request: _Request) -> None:
        if request.closed:
            return
        request.closed = True
        self.engine.in_flight -= 1
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.running:
            self.running.remove(request)
            self.kv_used -= request.context + request.gen_before + self.step - request.start_step
            request.epoch += 1

    async def serve(self) -> None:
        w = self.engine.workload
        loop = asyncio.get_running_loop()
        while True:
            if not self.running and not self.waiting:
                self.wake = loop.create_future()
                await self.wake
                self.wake = None
            prefill = self._admit()
            self._preempt_until_fits()
            batch = len(self.running)
            k_finish = self.finish_heap[0][0] - self.step
            k_kv = (w.kv_capacity_tokens - self.kv_used) // batch
            k = max(1, min(k_finish, k_kv, self.engine.event_steps))
            duration = (
                k
                * (
                    w.step_base_s
                    + w.step_per_seq_s * batch
                    + w.step_per_context_token_s * self.kv_used
                )
                + w.step_per_context_token_s * batch * k * (k - 1) / 2
                + w.prefill_per_token_s * prefill
            )
            self.engine.account(batch, duration, prefill)
            await asyncio.sleep(duration)
            self.step += k
            self.kv_used += batch * k
            self.engine.generated_tokens += batch * k
            self._finish()

    def _finish(self) -> None:
        heap = self.finish_heap
        while heap and heap[0][0] <= self.step:
            _, _, epoch, request = heapq.heappop(heap)
            if epoch != request.epoch:
                continue  # preempted since; a fresh entry was pushed on readmission
            self.running.remove(request)
            request.closed = True
            total = request.context + request.target
            self.kv_used -= total
            self.engine.book_computed(request.session, total)
            if self.engine.workload.prefix_caching:
                self.idle[request.session] = total
                self.idle_total += total
            self.engine.in_flight -= 1
            if not request.future.done():
                request.future.set_result(None)
        self._evict()


class SimEngine:
    """The simulated engine fleet: `engine_replicas` replicas, each request routed by `router`
    (a name in `conveyor.sim.router.ROUTERS`; `seed` seeds the `random` policy).

    Reports `EngineStats` and `EngineCounters` (`conveyor.engines.base`) as vLLM does, so the
    `auto` dispatcher reads the same figures here as on a real engine.

    `occupancy_reference` is the best feasible batch per replica; utilisation is measured
    against it (a replica running that many requests all the time scores 1.0).
    """

    def __init__(
        self,
        workload: SweSimWorkload,
        occupancy_reference: float,
        event_steps: int = 8,
        router: str = DEFAULT_SIM_ROUTER,
        seed: int = 0,
    ) -> None:
        self.workload = workload
        self.occupancy_reference = max(1.0, occupancy_reference)
        self.event_steps = event_steps
        self.in_flight = 0
        self.generated_tokens = 0
        self.prefill_tokens = 0
        self.preemptions = 0
        self.prefill_tokens_recomputed = 0
        self.recomputed_by_cause = {"routing": 0, "eviction": 0, "preemption": 0}
        self.busy_s = 0.0
        self.occupancy_s = 0.0
        self.router_name = router
        self._router = make_router(router, seed)
        self._replicas = [_Replica(self, i) for i in range(workload.engine_replicas)]
        self._computed: dict[str, int] = {}  # session -> tokens it has computed (any replica)
        self._served_by: dict[str, int] = {}  # session -> replica of its last admission
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def kv_capacity_tokens(self) -> int:
        """KV-cache tokens over all replicas (vLLM: num_gpu_blocks * block_size per engine)."""
        return self.workload.kv_capacity_tokens * len(self._replicas)

    @property
    def max_model_len(self) -> int:
        """The longest context a request may have (vLLM's `max_model_len`)."""
        return self.workload.max_context_tokens

    @property
    def kv_used_tokens(self) -> int:
        """KV-cache tokens held by running requests now, over all replicas (vLLM's
        `kv_cache_usage_perc` x capacity: cached prefixes of idle sessions are not counted)."""
        return sum(replica.kv_used for replica in self._replicas)

    @property
    def running_requests(self) -> int:
        """Requests in a replica's batch now, over all replicas."""
        return sum(len(replica.running) for replica in self._replicas)

    @property
    def waiting_requests(self) -> int:
        """Requests queued for a replica's batch (new or preempted), over all replicas."""
        return sum(len(replica.waiting) for replica in self._replicas)

    def start(self) -> None:
        """Start the replicas' schedulers on the running loop."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(replica.serve()) for replica in self._replicas]

    async def close(self) -> None:
        """Stop the schedulers; idempotent."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []

    async def generate(self, session: str, context_tokens: int, completion_tokens: int) -> None:
        """Generate `completion_tokens` after a prompt of `context_tokens` for `session`."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        replica = self._replicas[self._router.route(session, self._replicas)]
        request = _Request(session, context_tokens, completion_tokens, future)
        self.in_flight += 1
        replica.submit(request)
        try:
            await future
        except asyncio.CancelledError:
            replica.abort(request)  # like vLLM's abort: the slot and its KV are freed now
            raise

    @property
    def requests_per_replica(self) -> list[int]:
        """Requests in flight on each replica now."""
        return [replica.requests_in_flight for replica in self._replicas]

    def book_admission(self, request: _Request, replica: int, size: int, cached: int) -> None:
        """Count the admitted request's recomputed prefill (module docstring) and its cause."""
        computed = self._computed.get(request.session, 0)
        missed = max(0, min(size, computed) - cached)
        if missed:
            if request.epoch:
                cause = "preemption"
            elif self._served_by.get(request.session, replica) != replica:
                cause = "routing"
            else:
                cause = "eviction"
            self.recomputed_by_cause[cause] += missed
            self.prefill_tokens_recomputed += missed
        self._computed[request.session] = max(computed, size)
        self._served_by[request.session] = replica

    def end_session(self, session: str) -> None:
        """Forget a finished session's bookkeeping (memory stays flat over a long run)."""
        self._computed.pop(session, None)
        self._served_by.pop(session, None)

    def book_computed(self, session: str, tokens: int) -> None:
        """The session has computed `tokens` of context (a request finished or was preempted)."""
        self._computed[session] = max(self._computed.get(session, 0), tokens)

    def account(self, batch: int, duration: float, prefill: int) -> None:
        """Book one engine timer: busy time, occupancy against the reference batch, prefill."""
        self.busy_s += duration
        self.occupancy_s += duration * min(1.0, batch / self.occupancy_reference)
        self.prefill_tokens += prefill
