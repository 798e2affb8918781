"""`auto`: the pipeline, with stage pools sized while it runs instead of by hand.

Every control period (half the median init latency seen so far, between 1 s and 60 s) it
resizes the three pools of `pipeline`:

- CPU stages (init, reward) share one budget, split by their service times; it shrinks when
  latencies inflate past 2x their baseline while the CPUs hold more jobs than they ever served
  at once, and grows when a pool is full and latency stays near the baseline. In the end phase
  (the inits left fit in one run's time) the inits may take the whole budget.
- The run stage grows while the engine is calm and the projected KV working set (runs in
  flight x their context, worst case before a quarter of the runs have ended) stays below the
  cache's mark, and is cut on a KV thrash (preemptions or re-prefill) or when more requests in
  flight bring no more throughput. Without KV figures it uses its no-KV rules.

It never exceeds R and never drops a pool below 1. Why each rule and constant is what it is,
with the measurements and what was tried and dropped: docs/dispatch.md, "How `auto` sizes its
pools".
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections import deque
from collections.abc import Iterator

from conveyor.dispatch.base import EngineProbe, RolloutJob, Stage
from conveyor.dispatch.config import DispatchSettings
from conveyor.dispatch.pipeline import PipelineDispatcher
from conveyor.dispatch.stages import RolloutStages
from conveyor.dispatch.telemetry import Telemetry
from conveyor.engines.base import ContextLimit, EngineCounters, KVCacheStats
from conveyor.registry import STRATEGIES
from conveyor.types import Trajectory

_HISTORY = 256
_CAPACITY_PERIODS = 8  # CPU capacity = most CPU-stage jobs served in the last 8 periods
_MIN_TOKENS = 20_000  # generated tokens a period needs before its prefill ratio counts
_THRASH_PREFILL_RATIO = 3.0  # x the lowest ratio seen, and at least:
# a new session's first turn prefills its whole prompt (swe-sim: ~2500 / ~344 tokens = 7.3), so
# only a ratio above any mix of first and later turns means cached prefixes are re-prefilled
_THRASH_PREFILL_MIN = 8.0
_CALM_PREFILL_RATIO = 1.5  # the run pool grows only while prefill stays near its floor
_RUN_GROWTH = 1.1  # run pool growth per calm, full period
_RUN_CUT = 0.75  # a KV thrash cuts the run pool to this fraction of the runs in flight
_WARM_FRACTION = 0.5  # without a KV reading: grow only once half the pool's width of runs ended
_KV_HIGH = 0.85  # projected KV working set (fraction of the cache) above which the pool shrinks
_KV_TARGET = 0.75  # ... to this; and it grows only while growth keeps the projection below it
_KV_LEARN = 0.95  # a thrash at working set L lowers the high mark to 0.95 L (target 0.95 L - 0.1)
_MIN_ENDED_RUNS = 3  # ended runs before the mixed-age working set counts, and growth with it
# Growth waits until this fraction of the runs started have ended: the first runs to end are the
# shortest, so before that the mixed-age working set read from them is far too small.
_ENDED_FRACTION = 0.25
_KV_CUT = 0.9  # ... and, with a working-set reading, cuts the pool to 0.9 of the runs in flight
_END_PHASE_RUNS = 1.0  # the end phase starts when the inits left fill the CPUs for one run


def _mean_context(trajectory: Trajectory) -> float | None:
    """A finished run's context averaged over its life, (first prompt + final context) / 2:
    what a run in flight holds in the KV cache on average, once runs of every age are mixed."""
    if trajectory.turns:
        first, last = trajectory.turns[0], trajectory.turns[-1]
        final = len(last.prompt_ids) + len(last.completion_ids)
        return (len(first.prompt_ids) + final) / 2
    final_tokens = trajectory.metrics.get("context_tokens")
    prompt_tokens = trajectory.metrics.get("prompt_tokens")
    if final_tokens is None or prompt_tokens is None:
        return None
    return (prompt_tokens + final_tokens) / 2


def _delta(now: int | None, before: int | None) -> int | None:
    return now - before if now is not None and before is not None else None


@STRATEGIES.register("auto", run_pool="p_run", tunes_itself=True)
class AutoDispatcher(PipelineDispatcher):
    """A `pipeline` whose `p_init`, `p_run` and `p_reward` follow the measured load."""

    def __init__(
        self,
        stages: RolloutStages,
        settings: DispatchSettings,
        *,
        engine: EngineProbe | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        super().__init__(stages, settings, engine=engine, telemetry=telemetry)
        # what the engine reports; an engine without a protocol leaves auto on its other rules
        self._kv: KVCacheStats | None = engine if isinstance(engine, KVCacheStats) else None
        self._max_model_len = engine.max_model_len if isinstance(engine, ContextLimit) else 0
        self._counters: EngineCounters | None = (
            engine if isinstance(engine, EngineCounters) else None
        )
        self.pools[Stage.RUN].set_limit(min(settings.p_run, settings.max_live_runtimes))
        self._period_latencies: dict[Stage, list[float]] = {s: [] for s in Stage}
        self._baseline: dict[Stage, float] = dict.fromkeys(Stage, math.inf)
        self._init_latencies: deque[float] = deque(maxlen=_HISTORY)
        self._completed: dict[Stage, int] = dict.fromkeys(Stage, 0)
        self._best: tuple[float, float] = (0.0, 0.0)  # (throughput, engine in flight) at best
        self._run_ceiling = settings.max_live_runtimes
        self._kv_high = _KV_HIGH
        self._kv_target = _KV_TARGET
        self._cpu_served: deque[float] = deque(maxlen=_CAPACITY_PERIODS)
        self._prefill_floor = math.inf  # lowest prefill tokens per generated token seen
        self.decisions: list[dict[str, float]] = []
        # (duration, mean context over its life) of ended runs
        self._run_contexts: deque[tuple[float, float]] = deque(maxlen=_HISTORY)
        # a run's context over its life if it went on to the model's context limit, or 0.0
        self._worst_life_mean = 0.0
        self._run_latencies: deque[float] = deque(maxlen=_HISTORY)
        self._cpu_peak = 0.0  # most CPU-stage jobs ever served at once (without queueing)

    async def schedule(self, jobs: Iterator[RolloutJob]) -> None:
        self.spawn(self._control())
        await super().schedule(jobs)

    def stage_done(self, stage: Stage, job: RolloutJob) -> None:
        name = stage.name.lower()
        start, end = job.timings.get(f"{name}_start"), job.timings.get(f"{name}_end")
        if start is not None and end is not None:
            self._period_latencies[stage].append(end - start)
            self._completed[stage] += 1
            if stage is Stage.INIT:
                self._init_latencies.append(end - start)
            if stage is Stage.RUN:
                self._run_latencies.append(end - start)
                life_mean = _mean_context(job.trajectory) if job.trajectory is not None else None
                if life_mean is not None:
                    self._run_contexts.append((end - start, life_mean))

    def _period(self) -> float:
        init = self._init_latencies
        return min(60.0, max(1.0, 0.5 * statistics.median(init))) if init else 5.0

    async def _control(self) -> None:
        sub_steps = 10
        while True:
            period = self._period()
            completed = dict(self._completed)
            tokens = self._engine_tokens()
            prefill = self._prefill_tokens()
            preempted = self._preemptions()
            in_stage = dict.fromkeys(Stage, 0.0)
            full = dict.fromkeys(Stage, 0.0)
            in_flight = 0.0
            kv_used = 0.0
            for _ in range(sub_steps):  # average occupancies over the period
                await asyncio.sleep(period / sub_steps)
                for stage in Stage:
                    in_stage[stage] += self.in_stage[stage] / sub_steps
                    pool = self.pools[stage]
                    full[stage] += (pool.in_use >= pool.limit) / sub_steps
                in_flight += (self.engine.in_flight if self.engine is not None else 0) / sub_steps
                kv_used += (self._kv.kv_used_tokens if self._kv else 0) / sub_steps
            done = {s: self._completed[s] - completed[s] for s in Stage}
            latencies = self._period_latencies
            self._period_latencies = {s: [] for s in Stage}
            cpu_full = max(full[Stage.INIT], full[Stage.REWARD]) > 0.5
            self._size_cpu_stages(latencies, in_stage, cpu_full)
            now_tokens = self._engine_tokens()
            produced = (
                now_tokens - tokens
                if now_tokens is not None and tokens is not None
                else done[Stage.RUN]
            )
            thrashing, calm = self._kv_state(
                produced if now_tokens is not None and tokens is not None else None,
                _delta(self._prefill_tokens(), prefill),
                _delta(self._preemptions(), preempted),
            )
            kv_load = self._kv_load(kv_used, in_flight, in_stage[Stage.RUN])
            if not self._worst_life_mean and kv_load is not None:  # the first KV reading
                self._start_at_worst_case(kv_used / in_flight)
            self._size_run_stage(
                produced / period, in_flight, in_stage[Stage.RUN], thrashing, calm, kv_load
            )

    def _engine_tokens(self) -> int | None:
        return self._counters.generated_tokens if self._counters else None

    def _prefill_tokens(self) -> int | None:
        return self._counters.prefill_tokens if self._counters else None

    def _preemptions(self) -> int | None:
        return self._counters.preemptions if self._counters else None

    def _kv_capacity(self) -> int:
        return self._kv.kv_capacity_tokens if self._kv else 0

    def _kv_load(self, kv_used: float, in_flight: float, runs: float) -> float | None:
        """The KV working set of every run in flight as a fraction of the cache, or None.

        The engine counts only running requests; a run in a tool call keeps its context as a
        cached prefix that its next turn needs, so the working set is the mean context of a
        running request times the runs in flight."""
        capacity = self._kv_capacity()
        if not capacity or in_flight < 1 or kv_used <= 0:
            return None
        return kv_used / in_flight * runs / capacity

    def _kv_state(
        self, generated: int | None, prefilled: int | None, preempted: int | None
    ) -> tuple[bool, bool]:
        """(thrashing, calm): did the engine run out of KV cache this period (preemptions,
        re-prefilled prefixes), and was there no sign of pressure at all?"""
        if preempted:
            return True, False
        if generated is None or prefilled is None or generated < _MIN_TOKENS:
            return False, True
        ratio = prefilled / generated
        floor = self._prefill_floor
        thrashing = ratio > max(_THRASH_PREFILL_MIN, _THRASH_PREFILL_RATIO * floor)
        calm = ratio <= _CALM_PREFILL_RATIO * floor
        self._prefill_floor = min(floor, ratio)
        return thrashing, calm

    def _size_cpu_stages(
        self, latencies: dict[Stage, list[float]], in_stage: dict[Stage, float], full: bool
    ) -> None:
        """Init and reward share the CPUs, so one budget is sized and split between them."""
        stages = (Stage.INIT, Stage.REWARD)
        inflation: dict[Stage, float] = {}
        for stage in stages:
            if len(latencies[stage]) >= 3:
                latency = statistics.median(latencies[stage])
                if len(latencies[stage]) >= 8:
                    self._baseline[stage] = min(self._baseline[stage], latency)
                if math.isfinite(self._baseline[stage]):
                    inflation[stage] = latency / self._baseline[stage]
        if not inflation:
            return  # no evidence either way
        total = sum(self.pools[s].limit for s in stages)
        worst = max(inflation.values())
        served = sum(in_stage[s] / max(1.0, inflation.get(s, 1.0)) for s in stages)
        if all(s in inflation or in_stage[s] < 1 for s in stages):
            self._cpu_served.append(served)
        self._cpu_peak = max(self._cpu_peak, served)
        # Latency alone is no proof of queueing: with fewer jobs in the CPU stages than the CPUs
        # have ever served at once, a slow period is long jobs, not a wait for a CPU.
        contended = sum(in_stage[s] for s in stages) > self._cpu_peak
        if worst > 2.0 and contended:
            capacity = max(served, *self._cpu_served)
            total = max(2, math.ceil(1.25 * capacity), min(total // 2, math.ceil(2 * capacity)))
        elif full and worst <= 1.25:
            total = min(2 * self.settings.max_live_runtimes, math.ceil(total * 1.5))
        service = [self._baseline[s] for s in stages]
        share = service[0] / sum(service) if all(map(math.isfinite, service)) else 0.5
        init_limit = min(total - 1, max(1, round(total * share)))
        reward_limit = total - init_limit
        if self._end_phase():
            # the last inits go ahead of the rewards, up to the whole budget on their own
            inits_left = self.waiting(Stage.INIT) + self.pools[Stage.INIT].in_use
            init_limit = max(init_limit, min(inits_left, total, self._inits_within_timeout()))
        self.pools[Stage.INIT].set_limit(init_limit)
        self.pools[Stage.REWARD].set_limit(reward_limit)
        self._log(Stage.INIT, init_limit, worst, in_stage[Stage.INIT])
        self._log(Stage.REWARD, reward_limit, worst, in_stage[Stage.REWARD])

    def _inits_within_timeout(self) -> int:
        """The most inits the end phase may send to the CPUs at once so that each still
        finishes within half the init budget (the CPUs are FIFO: an init waits behind every
        job ahead of it). A safety bound: at `_END_PHASE_RUNS` = 1 it has not bound on the
        swe-sim points; with the end phase at two runs, CPU x4 / R 512 queued inits and
        rewards into their 600 s budgets (37 `infra_error`s on seed 1) through the CPU budget
        itself, which this does not limit."""
        service = self._baseline[Stage.INIT]
        if not math.isfinite(service) or not self._cpu_served:
            return self.pools[Stage.INIT].limit
        cpus = max(self._cpu_served)
        return max(1, math.floor(0.5 * self.settings.init_timeout_s / service * cpus))

    def _end_phase(self) -> bool:
        """May the inits left go ahead of the rewards? Once every rollout is admitted; and
        before that, once the runs wait on inits (the run queue is empty) and the inits not yet
        done would take the CPUs no longer than a median run: after the last init the batch
        still lasts about one run, and the rewards put off until then fill the CPUs in it."""
        if self.admission_done:
            return True
        init_service = self._baseline[Stage.INIT]
        if (
            self.waiting(Stage.RUN) > 0
            or not self._run_latencies
            or not self._cpu_served
            or not math.isfinite(init_service)
        ):
            return False
        inits_left = max(0, self.total - self._completed[Stage.INIT])
        cpu_time = inits_left * init_service / max(1.0, max(self._cpu_served))
        return cpu_time <= _END_PHASE_RUNS * statistics.median(self._run_latencies)

    def _size_run_stage(
        self,
        throughput: float,
        in_flight: float,
        busy: float,
        thrashing: bool = False,
        calm: bool = True,
        kv_load: float | None = None,
    ) -> None:
        pool = self.pools[Stage.RUN]
        best_throughput, best_in_flight = self._best
        if thrashing:
            if busy < pool.limit + 0.5:  # else the last cut has not taken effect yet
                if kv_load is None:  # no working-set reading: a run-count ceiling for good
                    self._run_ceiling = max(1, min(pool.limit, math.floor(_RUN_CUT * busy)))
                    pool.set_limit(self._run_ceiling)
                else:  # learn where this engine thrashes, in working-set terms
                    self._kv_high = min(self._kv_high, _KV_LEARN * kv_load)
                    self._kv_target = min(self._kv_target, self._kv_high - 0.1)
                    pool.set_limit(min(pool.limit, max(1, math.floor(_KV_CUT * busy))))
        elif throughput > best_throughput:
            self._best = (throughput, in_flight)
        elif in_flight > 1.25 * best_in_flight > 0 and throughput < 1.02 * best_throughput:
            pool.set_limit(max(1, math.ceil(busy * best_in_flight / in_flight)))
        elif kv_load is not None and kv_load > self._kv_high:
            target = math.floor(busy * self._kv_target / kv_load)
            pool.set_limit(min(pool.limit, max(1, target)))
        elif (
            busy >= pool.limit - 1
            and calm
            and (
                self._kv_room(kv_load, busy)
                if kv_load is not None  # the working set says how far the pool may grow
                else self._completed[Stage.RUN] >= _WARM_FRACTION * pool.limit
            )
        ):
            pool.set_limit(min(self._run_ceiling, math.ceil(pool.limit * _RUN_GROWTH)))
        self._log(Stage.RUN, pool.limit, throughput, busy, kv_load)

    def _start_at_worst_case(self, running_context: float) -> None:
        """Raise the run pool, once, to as many runs as the cache holds below the high mark
        even if every run went on to the model's context limit: a run's context over its life
        then averages (prompt + max_model_len) / 2, the prompt read as the mean context of the
        requests running at the first reading (first turns). Needs the engine's
        `max_model_len`."""
        capacity = self._kv_capacity()
        limit = self._max_model_len
        if not capacity or not limit:
            return
        self._worst_life_mean = (running_context + limit) / 2
        size = min(
            self.settings.max_live_runtimes,
            math.floor(_KV_HIGH * capacity / self._worst_life_mean),
        )
        pool = self.pools[Stage.RUN]
        if size > pool.limit:
            pool.set_limit(size)

    def _kv_room(self, kv_load: float, busy: float) -> bool:
        """May the run pool grow by a tenth? The working set now must stay below the target,
        and so must the one its runs will hold when they are of mixed ages: the mean context of
        ended runs over their lives, weighted by their durations (a run is in flight for as long
        as it lasts, so long runs, with long contexts, are most of the runs in flight), times the
        runs in flight. Young runs grow their contexts in step and the first runs to end are
        the shortest, so until a quarter of the runs started have ended the pool grows only
        within the worst case (every run going on to the context limit)."""
        if kv_load * _RUN_GROWTH >= self._kv_target:
            return False
        capacity = self._kv_capacity()
        if not capacity:
            return False
        ended = self._completed[Stage.RUN]
        if ended < _ENDED_FRACTION * (ended + busy):
            worst = self._worst_life_mean * busy * _RUN_GROWTH / capacity
            return bool(self._worst_life_mean) and worst < _KV_HIGH
        if len(self._run_contexts) < _MIN_ENDED_RUNS:
            return False
        seconds = sum(duration for duration, _ in self._run_contexts)
        if seconds <= 0:
            return False
        life_mean = sum(duration * mean for duration, mean in self._run_contexts) / seconds
        return life_mean * busy / capacity * _RUN_GROWTH < self._kv_target

    def _log(
        self, stage: Stage, limit: int, rate: float, busy: float, kv_load: float | None = None
    ) -> None:
        decision = {"t": self.now(), "stage": float(stage), "limit": limit, "rate": rate}
        decision["busy"] = busy
        if kv_load is not None:  # the run stage was sized by the engine's KV figures
            decision["kv_load"] = kv_load
        self.decisions.append(decision)
        if len(self.decisions) > 4 * _HISTORY:
            del self.decisions[: 2 * _HISTORY]
