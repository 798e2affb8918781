"""The runtime-engine bound and `auto`'s KV-cache guard."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conveyor.bench.bound import makespan_bound
from conveyor.bench.dispatch import simulate
from conveyor.dispatch import DispatchSettings
from conveyor.dispatch.auto import AutoDispatcher
from conveyor.dispatch.base import Stage
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload
from conveyor.sim.virtual_loop import run_virtual

TIGHT = SweSimWorkload(tasks=16, samples_per_task=4, max_live_runtimes=32, cpu_slots=16)


def test_runtime_engine_bound_binds_where_r_is_tight_and_stays_below_every_makespan() -> None:
    bound = makespan_bound(TIGHT, 0)
    # R = 32 cannot feed 4 replicas a big batch: the coupled term exceeds every separate one
    assert bound.runtime_engine_s > bound.bound_s
    assert bound.tight_bound_s == bound.runtime_engine_s
    assert bound.as_dict()["tight_bound_s"] == bound.tight_bound_s
    for strategy, knobs in (
        ("bounded_batch", {"max_parallel": 32}),
        ("pipeline", {"p_init": 16, "p_run": 32, "p_reward": 16}),
    ):
        result = simulate(TIGHT, strategy, knobs, 0)
        assert result["makespan_s"] >= bound.tight_bound_s
        assert 0 < result["efficiency_tight"] <= 1
        assert result["efficiency_tight"] > result["efficiency"]


def test_runtime_engine_bound_never_undercuts_the_issue_bound() -> None:
    loose = TIGHT.model_copy(update={"max_live_runtimes": 512})
    bound = makespan_bound(loose, 0)
    assert bound.tight_bound_s == bound.bound_s  # plenty of runtimes: the coupling is slack


class _Engine:
    """Counters like the ones a vLLM client exposes (tokens, prefill, preemptions)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.generated_tokens = 0
        self.prefill_tokens = 0
        self.preemptions = 0


def _auto(engine: _Engine, r: int = 200) -> AutoDispatcher:
    settings = DispatchSettings(strategy="auto", max_live_runtimes=r)
    return AutoDispatcher(SimEnvironment(TIGHT, 0), settings, engine=engine)


def test_auto_cuts_the_run_pool_when_the_kv_cache_thrashes_and_never_regrows() -> None:
    async def scenario() -> list[int]:
        auto = _auto(_Engine())
        auto._completed[Stage.RUN] = 1000  # past the first wave: growth allowed when calm
        limits = [auto.pools[Stage.RUN].limit]  # starts at p_run (96), not at R
        # settled periods: ~2 prefill tokens per generated token
        for _ in range(3):
            assert auto._kv_state(50_000, 100_000, 0) == (False, True)
        auto._size_run_stage(2000.0, 80.0, busy=96.0)  # a new best throughput: recorded
        # calm and full: the pool grows by a tenth
        auto._size_run_stage(1990.0, 80.0, busy=96.0)
        limits.append(auto.pools[Stage.RUN].limit)
        # some pressure (prefill 1.5x-3x its floor): no growth
        assert auto._kv_state(50_000, 200_000, 0) == (False, False)
        auto._size_run_stage(1990.0, 80.0, busy=106.0, calm=False)
        limits.append(auto.pools[Stage.RUN].limit)
        # the cache overflows: prefixes re-prefilled, ratio x10
        assert auto._kv_state(50_000, 1_000_000, 0) == (True, False)
        auto._size_run_stage(1000.0, 80.0, busy=100.0, thrashing=True)
        limits.append(auto.pools[Stage.RUN].limit)  # 3/4 of 100 runs in flight
        # still thrashing while the runs drain: no second cut before the first took effect
        auto._size_run_stage(500.0, 80.0, busy=90.0, thrashing=True)
        limits.append(auto.pools[Stage.RUN].limit)
        # calm again, pool full: growth stops at the ceiling
        for _ in range(5):
            auto._size_run_stage(1900.0, 60.0, busy=float(auto.pools[Stage.RUN].limit))
        limits.append(auto.pools[Stage.RUN].limit)
        # a preemption alone is a thrash signal
        assert auto._kv_state(50_000, 100_000, 1) == (True, False)
        auto._size_run_stage(1000.0, 60.0, busy=60.0, thrashing=True)
        limits.append(auto.pools[Stage.RUN].limit)
        return limits

    assert run_virtual(scenario()) == [96, 106, 106, 75, 75, 75, 45]


class _KvEngine(_Engine):
    """Also the KV cache's size and the tokens running requests hold (vLLM: kv_cache_usage)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.kv_capacity_tokens = capacity
        self.kv_used_tokens = 0


def test_auto_projects_the_kv_working_set_of_every_run_in_flight() -> None:
    async def scenario() -> list[float | None]:
        auto = _auto(_KvEngine(1_000_000))
        no_reading = _auto(_Engine())
        return [
            # 50 requests generating hold 250k tokens; 100 runs in flight (half in tool calls,
            # their contexts cached for the next turn): 100 x 5k = half the cache
            auto._kv_load(250_000.0, 50.0, 100.0),
            auto._kv_load(0.0, 0.0, 100.0),  # nothing generating: no reading
            no_reading._kv_load(250_000.0, 50.0, 100.0),  # the engine has no KV counters
        ]

    assert run_virtual(scenario()) == [0.5, None, None]


def test_auto_sizes_the_run_pool_by_the_kv_working_set_and_learns_the_thrash_point() -> None:
    async def scenario() -> list[int]:
        auto = _auto(_KvEngine(1_000_000), r=256)
        pool = auto.pools[Stage.RUN]
        limits = [pool.limit]  # p_run = 96
        auto._size_run_stage(2000.0, 80.0, busy=96.0, kv_load=0.4)  # a new best: recorded
        # the working set leaves room, but no run has ended: young runs all grow their
        # contexts in step, so the pool waits for a mixed-age reading
        auto._size_run_stage(1990.0, 80.0, busy=96.0, kv_load=0.4)
        limits.append(pool.limit)
        # 40 runs ended (a quarter of the 136 started); 3 of them held 8k tokens over 100 s
        # lives: 96 x 8k = 0.77 of the cache
        auto._completed[Stage.RUN] = 40
        auto._run_contexts.extend([(100.0, 8000.0)] * 3)
        auto._size_run_stage(1990.0, 80.0, busy=96.0, kv_load=0.4)
        limits.append(pool.limit)
        # six 5 s runs of 2k: the plain mean (4k: 0.38 at 96 runs) would let it grow, but runs
        # are in flight in proportion to their durations (7.5k: 0.72, x1.1 past the target)
        auto._run_contexts.extend([(5.0, 2000.0)] * 6)
        auto._size_run_stage(1990.0, 80.0, busy=96.0, kv_load=0.4)
        limits.append(pool.limit)
        # twenty 100 s runs of 2k (2.8k weighted: 0.27 at 96 runs): it grows by a tenth
        auto._run_contexts.extend([(100.0, 2000.0)] * 20)
        auto._size_run_stage(1990.0, 80.0, busy=96.0, kv_load=0.4)
        limits.append(pool.limit)
        # growth would take the projection past the target (0.75): it stops
        auto._size_run_stage(1990.0, 80.0, busy=106.0, kv_load=0.7)
        limits.append(pool.limit)
        # contexts grew: above the high mark (0.85) it shrinks to the target's share of runs
        auto._size_run_stage(1990.0, 80.0, busy=106.0, kv_load=0.9)
        limits.append(pool.limit)  # floor(106 * 0.75 / 0.9) = 88
        # a thrash at a working set of 0.8: high mark 0.76, target 0.66, pool 0.9 of the runs
        auto._size_run_stage(1000.0, 80.0, busy=88.0, thrashing=True, kv_load=0.8)
        limits.append(pool.limit)  # floor(0.9 * 88) = 79
        # no permanent run ceiling: it regrows while the (learned) target allows it
        auto._size_run_stage(1900.0, 60.0, busy=79.0, kv_load=0.5)
        limits.append(pool.limit)
        auto._size_run_stage(1900.0, 60.0, busy=87.0, kv_load=0.62)  # 0.68 > 0.66: stays
        limits.append(pool.limit)
        auto._size_run_stage(1900.0, 60.0, busy=87.0, kv_load=0.78)  # above 0.76: shrinks
        limits.append(pool.limit)
        return limits

    assert run_virtual(scenario()) == [96, 96, 96, 96, 106, 106, 88, 79, 87, 87, 73]


def test_auto_reads_a_finished_runs_mean_context_from_turns_or_metrics() -> None:
    from conveyor.dispatch.auto import _mean_context
    from conveyor.types import Trajectory, Turn

    def turn(prompt: int, completion: int) -> Turn:
        ids = list(range(completion))
        return Turn(
            prompt_ids=list(range(prompt)),
            completion_ids=ids,
            completion_logprobs=[0.0] * completion,
            loss_mask=[1] * completion,
        )

    agent = Trajectory(task_id="t", turns=[turn(100, 20), turn(300, 50)])
    assert _mean_context(agent) == (100 + 350) / 2
    sim = Trajectory(task_id="t", metrics={"prompt_tokens": 2500.0, "context_tokens": 9500.0})
    assert _mean_context(sim) == 6000.0
    assert _mean_context(Trajectory(task_id="t")) is None


def test_sim_engine_reports_its_kv_cache() -> None:
    from conveyor.sim.engine import SimEngine

    engine = SimEngine(TIGHT, occupancy_reference=8.0)
    assert engine.kv_capacity_tokens == TIGHT.kv_capacity_tokens * TIGHT.engine_replicas
    assert engine.kv_used_tokens == 0
    assert engine.max_model_len == TIGHT.max_context_tokens


def test_auto_ignores_prefill_noise_of_small_periods_and_first_turns() -> None:
    async def scenario() -> list[tuple[bool, bool]]:
        auto = _auto(_Engine())
        return [
            auto._kv_state(None, None, None),  # an engine without counters: no verdict
            auto._kv_state(10, 10_000, 0),  # too few tokens to judge
            auto._kv_state(50_000, 60_000, 0),  # floor 1.2
            auto._kv_state(50_000, 350_000, 0),  # 7.0: a period of first turns, not a thrash
        ]

    assert run_virtual(scenario()) == [(False, True), (False, True), (False, True), (False, False)]


def test_auto_keeps_the_cpu_budget_at_the_measured_capacity() -> None:
    """Noisy latency medians once read as contention and shrank the CPU pools to a third of the
    CPUs (CPU x4: 4115 s); the budget now never drops below 1.25x the jobs recently served."""

    async def scenario() -> int:
        auto = _auto(_Engine())
        latencies = {Stage.INIT: [30.0] * 8, Stage.REWARD: [20.0] * 8, Stage.RUN: []}
        busy = {Stage.INIT: 20.0, Stage.REWARD: 12.0, Stage.RUN: 0.0}
        auto._size_cpu_stages(latencies, busy, full=True)  # 32 served at baseline latency
        inflated = {Stage.INIT: [75.0] * 3, Stage.REWARD: [50.0] * 3, Stage.RUN: []}
        for _ in range(4):  # noise reads as 2.5x inflation with few jobs in the stages
            auto._size_cpu_stages(inflated, {**busy, Stage.INIT: 5.0, Stage.REWARD: 3.0}, False)
        return auto.pools[Stage.INIT].limit + auto.pools[Stage.REWARD].limit

    assert run_virtual(scenario()) >= 40


def test_auto_at_r_256_avoids_the_thrash_of_an_unguarded_run_pool() -> None:
    """Starting the run pool at R over-filled the KV cache at R = 256 (2090 s on this seed)."""
    workload = SweSimWorkload(max_live_runtimes=256)

    result = simulate(workload, "auto", {}, 1)
    assert result["makespan_s"] < 1450  # 1263 s now (KV working-set rule)
    assert sum(result["statuses"].values()) == workload.trajectories
    assert result["peak_live_runtimes"] <= 256


def test_tuning_never_picks_a_grid_point_that_wins_by_failing_rollouts(monkeypatch) -> None:
    """Seen on the CPU x4 / R = 512 corner: bounded_batch at P = 512 flooded the 32 CPU slots,
    200 of 512 inits overran their budget (infra_error, never run) and its makespan came out
    the shortest of its grid. A point whose rollouts fail must rank after every clean one."""
    from conveyor.bench import dispatch as bench

    small = TIGHT.model_copy(update={"tasks": 4})
    grid = [{"max_parallel": 16, "init_timeout_s": 1.0}, {"max_parallel": 8}]
    monkeypatch.setitem(bench.GRIDS, "bounded_batch", ("test", lambda r: grid))
    runner = bench._Runner(1)
    point = bench.bench_point(small, [0], ["bounded_batch"], runner, with_defaults=False)
    failing = simulate(small, "bounded_batch", grid[0], 0)
    assert failing["statuses"].get("infra_error", 0) > 0  # the trap is real ...
    chosen = point["strategies"]["bounded_batch"]
    assert failing["makespan_s"] < chosen["makespan_s"]  # ... and shorter
    assert chosen["best_knobs"] == grid[1]
    assert bench.statuses_ok(chosen)


def test_runtime_engine_bound_charges_the_first_turn_to_no_runtime() -> None:
    """The first turn needs only the prompt, so a schedule may generate it before the sandbox
    exists: with one-turn rollouts and one runtime, the runtime side of the coupled term holds
    init and reward only (the issue's runtimes term still counts the generation)."""
    one_turn = TIGHT.model_copy(update={"turns_min": 1, "turns_max": 1, "max_live_runtimes": 1})
    bound = makespan_bound(one_turn, 0)
    init_and_reward_s = bound.cpu_s * one_turn.cpu_slots
    assert abs(bound.runtime_engine_s - init_and_reward_s) < 1e-6 * init_and_reward_s
    assert bound.runtimes_s > bound.runtime_engine_s


def _simulate_with(
    dispatcher: type[AutoDispatcher],
    workload: SweSimWorkload,
    seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    """One swe-sim run of `auto` with one of its rules swapped out by a subclass."""

    def make(settings, stages, **kwargs):  # type: ignore[no-untyped-def]
        return dispatcher(stages, settings, **kwargs)

    monkeypatch.setattr("conveyor.bench.dispatch.make_dispatcher", make)
    return simulate(workload, "auto", {}, seed)


def test_auto_lets_the_last_inits_go_ahead_of_the_rewards() -> None:
    """Once every rollout is admitted, the inits left may take the whole CPU budget (never
    more); before, they get only their share of it, and the rewards always keep theirs."""

    async def scenario(waiting: int) -> tuple[tuple[int, int], tuple[int, int]]:
        auto = _auto(_Engine())
        auto._queues = {Stage.INIT: asyncio.PriorityQueue()}
        for seq in range(waiting):
            auto._queues[Stage.INIT].put_nowait((1, seq, None))  # type: ignore[arg-type]
        latencies = {Stage.INIT: [30.0] * 8, Stage.REWARD: [20.0] * 8, Stage.RUN: []}
        busy = {Stage.INIT: 20.0, Stage.REWARD: 12.0, Stage.RUN: 0.0}
        auto._size_cpu_stages(latencies, busy, full=False)  # budget 32 + 32, split 30 : 20
        during = (auto.pools[Stage.INIT].limit, auto.pools[Stage.REWARD].limit)
        auto.admission_done = True
        auto._size_cpu_stages(latencies, busy, full=False)
        return during, (auto.pools[Stage.INIT].limit, auto.pools[Stage.REWARD].limit)

    assert run_virtual(scenario(60)) == ((38, 26), (60, 26))
    assert run_virtual(scenario(100)) == ((38, 26), (64, 26))  # at most the whole budget
    assert run_virtual(scenario(10)) == ((38, 26), (38, 26))  # never below the share


def test_auto_end_phase_shortens_a_cpu_bound_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU x4 (swe-sim, seed 0): with the share split alone the last inits waited behind
    rewards and the CPUs idled through the tail (3634 s); inits-first at the end: 3589 s."""
    workload = SweSimWorkload().scaled(cpu_factor=4.0, live_runtimes=128)
    with_end_phase = simulate(workload, "auto", {}, 0)

    class _ShareSplitOnly(AutoDispatcher):
        def _end_phase(self) -> bool:
            return False

    share_split_only = _simulate_with(_ShareSplitOnly, workload, 0, monkeypatch)
    assert sum(with_end_phase["statuses"].values()) == workload.trajectories
    assert with_end_phase["makespan_s"] < share_split_only["makespan_s"] - 20


def test_auto_end_phase_starts_when_the_inits_left_fit_in_one_run() -> None:
    """Before admission ends, the inits go ahead once the runs wait on them (empty run queue)
    and the inits not yet done fill the measured CPUs for no longer than a median run:
    512 rollouts, 30 s inits on 32 CPUs, 200 s runs -> 213 inits left or fewer."""

    async def scenario(inits_done: int, runs_waiting: int) -> bool:
        auto = _auto(_Engine())
        auto._total = 512
        auto._completed[Stage.INIT] = inits_done
        auto._baseline[Stage.INIT] = 30.0
        auto._cpu_served.append(32.0)
        auto._run_latencies.extend([150.0, 200.0, 260.0])
        auto._queues = {Stage.INIT: asyncio.PriorityQueue(), Stage.RUN: asyncio.PriorityQueue()}
        for seq in range(runs_waiting):
            auto._queues[Stage.RUN].put_nowait((1, seq, None))  # type: ignore[arg-type]
        return auto._end_phase()

    assert run_virtual(scenario(512 - 214, 0)) is False  # 214 x 30 / 32 = 200.6 s > 200 s
    assert run_virtual(scenario(512 - 213, 0)) is True
    assert run_virtual(scenario(512 - 100, 1)) is False  # runs wait for the engine, not inits


def test_auto_early_end_phase_shortens_the_tail_where_inits_bind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPU x1.5, R 192 (swe-sim, seed 0): with the end phase only after admission ends, the
    long runs of the last groups started 20-40 s later than bounded_batch's (1484 s against
    1459 s); starting it when the inits left fit in one run: 1449 s."""
    workload = SweSimWorkload().scaled(cpu_factor=1.5, live_runtimes=192)
    early = simulate(workload, "auto", {}, 0)

    class _AfterAdmissionOnly(AutoDispatcher):
        def _end_phase(self) -> bool:
            return self.admission_done

    late = _simulate_with(_AfterAdmissionOnly, workload, 0, monkeypatch)
    assert sum(early["statuses"].values()) == workload.trajectories
    assert early["makespan_s"] < late["makespan_s"] - 20


def test_auto_shrinks_the_cpu_budget_only_while_more_jobs_wait_than_the_cpus_served() -> None:
    """Inflated latencies with fewer CPU-stage jobs than the CPUs once served at the same time
    are long jobs, not queueing: the budget holds. With more jobs than that, it shrinks."""

    async def scenario(init_jobs: float, reward_jobs: float) -> int:
        auto = _auto(_Engine())
        latencies = {Stage.INIT: [30.0] * 8, Stage.REWARD: [20.0] * 8, Stage.RUN: []}
        busy = {Stage.INIT: 20.0, Stage.REWARD: 12.0, Stage.RUN: 0.0}
        auto._size_cpu_stages(latencies, busy, full=True)  # 32 served; budget grows to 96
        before = auto.pools[Stage.INIT].limit + auto.pools[Stage.REWARD].limit
        inflated = {Stage.INIT: [75.0] * 3, Stage.REWARD: [50.0] * 3, Stage.RUN: []}
        jobs = {**busy, Stage.INIT: init_jobs, Stage.REWARD: reward_jobs}
        auto._size_cpu_stages(inflated, jobs, full=False)
        return before - (auto.pools[Stage.INIT].limit + auto.pools[Stage.REWARD].limit)

    assert run_virtual(scenario(20.0, 10.0)) == 0  # 30 jobs <= 32 served: no shrink
    assert run_virtual(scenario(60.0, 40.0)) > 0  # 100 jobs queue for 32 CPUs: shrink


def test_auto_cpu_budget_does_not_ratchet_down_in_the_tail() -> None:
    """CPU x0.5, R 1024 (swe-sim, seed 2): noisy medians of the last few jobs once shrank the
    CPU budget to 4 and queued 58 rewards behind one worker (1799 s; seeds 0 and 1 ~1200 s)."""
    workload = SweSimWorkload().scaled(cpu_factor=0.5, live_runtimes=1024)
    result = simulate(workload, "auto", {}, 2)
    assert sum(result["statuses"].values()) == workload.trajectories
    assert result["makespan_s"] < 1400  # 1209 s


class _KvLimitEngine(_KvEngine):
    """Also the model's context limit (vLLM: `max_model_len`)."""

    def __init__(self, capacity: int, max_model_len: int) -> None:
        super().__init__(capacity)
        self.max_model_len = max_model_len


def test_auto_starts_the_run_pool_at_its_worst_case_size_and_grows_past_it_on_evidence() -> None:
    async def scenario() -> list[object]:
        auto = _auto(_KvLimitEngine(2_560_000, 32_768), r=256)
        pool = auto.pools[Stage.RUN]
        seen: list[object] = [pool.limit]  # p_run = 96
        # first turns running hold 2.5k tokens: a run that went on to the 32k limit would hold
        # (2.5k + 32.8k) / 2 = 17.6k over its life; 0.85 x 2.56M / 17.6k = 123 runs
        auto._start_at_worst_case(2500.0)
        seen.append(pool.limit)
        # before a quarter of the runs started have ended, growth stays within that worst case
        seen.append(auto._kv_room(0.3, busy=123.0))  # 123 x 1.1 runs: 0.93 > 0.85
        seen.append(auto._kv_room(0.3, busy=100.0))  # after a cut: 100 x 1.1 runs: 0.76
        # 50 of 173 started have ended, holding 10k over their lives: 123 x 1.1 x 10k = 0.53
        auto._completed[Stage.RUN] = 50
        auto._run_contexts.extend([(200.0, 10_000.0)] * 50)
        seen.append(auto._kv_room(0.3, busy=123.0))
        capped = _auto(_KvLimitEngine(2_560_000, 32_768), r=100)
        capped._start_at_worst_case(2500.0)
        seen.append(capped.pools[Stage.RUN].limit)  # never above R
        tiny = _auto(_KvLimitEngine(500_000, 32_768), r=256)
        tiny._start_at_worst_case(2500.0)
        seen.append(tiny.pools[Stage.RUN].limit)  # never below the config's p_run
        return seen

    assert run_virtual(scenario()) == [96, 123, False, True, True, 100, 96]


def test_auto_does_not_thrash_where_inits_are_fast_and_r_is_loose() -> None:
    """CPU x0.1, R 512 (swe-sim, seed 0): the first runs to end are the shortest, and their
    small contexts once let the run pool grow to ~200 while the first wave's contexts were still
    growing in step: the KV cache overflowed (1620 s, 46 preemptions over 3 seeds)."""
    workload = SweSimWorkload().scaled(cpu_factor=0.1, live_runtimes=512)
    result = simulate(workload, "auto", {}, 0)
    assert sum(result["statuses"].values()) == workload.trajectories
    assert result["makespan_s"] < 1300  # 1090 s; bounded_batch at P = 128: 1126 s


def test_auto_end_phase_sends_no_more_inits_than_finish_within_half_their_budget() -> None:
    async def scenario() -> list[int]:
        auto = _auto(_Engine())
        before = auto._inits_within_timeout()  # no init measured yet: the pool's own limit
        auto._baseline[Stage.INIT] = 120.0
        auto._cpu_served.append(32.0)
        # 600 s budget, 120 s inits, 32 CPUs: 80 inits clear the FIFO CPUs in 300 s
        return [before, auto._inits_within_timeout()]

    assert run_virtual(scenario()) == [32, 80]
