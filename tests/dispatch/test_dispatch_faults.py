"""Fault isolation: injected infra and policy faults, every rollout accounted for, R respected."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from conveyor.bench.bound import makespan_bound
from conveyor.dispatch import DispatchSettings, make_dispatcher
from conveyor.dispatch.base import Dispatcher
from conveyor.dispatch.job import INFRA_RETRY_ROLE
from conveyor.engines.base import EngineDown, EngineError
from conveyor.sim.engine import SimEngine
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload, plan_rollout
from conveyor.sim.virtual_loop import run_virtual
from conveyor.types import Status, Trajectory

STRATEGIES = ["batch", "bounded_batch", "bounded_batch_overlap", "pipeline", "auto"]
FAULTY = SweSimWorkload(
    tasks=12,
    samples_per_task=4,
    turns_min=3,
    turns_max=8,
    max_live_runtimes=10,
    cpu_slots=4,
    init_failure_rate=0.2,
    tool_hang_rate=0.05,
    reward_failure_rate=0.02,
)
RUN_TIMEOUT_S = 900.0
MAX_RETRIES = 2


def expected_outcome(
    workload: SweSimWorkload, seed: int, task: int, sample: int
) -> tuple[str, int]:
    """What the rules say must happen to one rollout: (status, infra retries used)."""
    for attempt in range(MAX_RETRIES + 1):
        plan = plan_rollout(workload, seed, task, sample, attempt)
        if plan.init_fails:
            continue
        calls = plan.turns if plan.truncated else plan.turns[:-1]
        hung = any(turn.tool_hangs for turn in calls)
        if plan.reward_fails:
            continue
        if hung:
            return str(Status.TIMEOUT), attempt
        return str(Status.TRUNCATED if plan.truncated else Status.OK), attempt
    return str(Status.INFRA_ERROR), MAX_RETRIES


def _seed_with_every_outcome() -> int:
    """A seed whose draws include retries exhausted and hung tools (so both paths are tested)."""
    for seed in range(200):
        outcomes = Counter(
            expected_outcome(FAULTY, seed, task, sample)[0]
            for task in range(FAULTY.tasks)
            for sample in range(FAULTY.samples_per_task)
        )
        if outcomes[str(Status.INFRA_ERROR)] and outcomes[str(Status.TIMEOUT)]:
            return seed
    raise AssertionError("no seed gives every outcome")


async def _run_all(
    workload: SweSimWorkload, strategy: str, seed: int, make: Any = make_dispatcher
) -> tuple[list[Trajectory], SimEnvironment, Dispatcher]:
    """Every rollout of `workload` through `strategy` (made by `make`, as `make_dispatcher`)."""
    engine = SimEngine(workload, occupancy_reference=8)
    engine.start()
    env = SimEnvironment(workload, seed, engine)
    settings = DispatchSettings(
        strategy=strategy,
        max_parallel=8,
        p_init=4,
        p_run=8,
        p_reward=3,
        run_queue=2,
        max_live_runtimes=workload.max_live_runtimes,
        run_timeout_s=RUN_TIMEOUT_S,
        max_infra_retries=MAX_RETRIES,
    )
    dispatcher = make(settings, env, engine=engine)
    out = [t async for t in dispatcher.rollouts(env.tasks(), workload.samples_per_task)]
    await engine.close()
    return out, env, dispatcher


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_rollout_accounted_for_with_the_right_status(strategy: str) -> None:
    seed = _seed_with_every_outcome()
    out, env, dispatcher = run_virtual(_run_all(FAULTY, strategy, seed))
    peak = dispatcher.peak_live_runtimes
    keys = [(t.task_id, t.sample_index) for t in out]
    assert len(out) == FAULTY.trajectories  # count in == count out
    assert len(set(keys)) == len(keys)  # exactly one record each
    for trajectory in out:
        index = int(trajectory.task_id.rsplit("-", 1)[1])
        status, retries = expected_outcome(FAULTY, seed, index, trajectory.sample_index)
        assert (str(trajectory.status), trajectory.counters["infra_retries"]) == (status, retries)
        # why each attempt was retried is in the record, not only the count
        reasons = [m["content"] for m in trajectory.messages if m["role"] == INFRA_RETRY_ROLE]
        stages = [
            "init"
            if plan_rollout(FAULTY, seed, index, trajectory.sample_index, a).init_fails
            else "reward"
            for a in range(retries)
        ]
        assert [r.split(" stage")[0].split(": ")[-1] for r in reasons] == stages, reasons
        if trajectory.status is Status.INFRA_ERROR:
            assert trajectory.reward is None  # never scored
        else:
            assert trajectory.reward in (0.0, 1.0)  # timeouts are scored too
    counts = Counter(str(t.status) for t in out)
    assert counts[str(Status.INFRA_ERROR)] > 0 and counts[str(Status.TIMEOUT)] > 0
    assert sum(t.counters["infra_retries"] for t in out) > 0
    assert peak <= FAULTY.max_live_runtimes and env.peak_live <= FAULTY.max_live_runtimes
    assert env.live == 0  # every runtime closed


def _seed_with_a_failed_init_after_a_failed_reward() -> int:
    """A seed where some rollout's reward fails and its retry's init fails too: the retry must
    not pair its own stage start with the end of the attempt before."""
    for seed in range(500):
        for task in range(FAULTY.tasks):
            for sample in range(FAULTY.samples_per_task):
                reward_failed = False  # the attempt before got as far as a failed reward
                for attempt in range(MAX_RETRIES + 1):
                    plan = plan_rollout(FAULTY, seed, task, sample, attempt)
                    if plan.init_fails and reward_failed:
                        return seed
                    if not (plan.init_fails or plan.reward_fails):
                        break  # finished: no more attempts
                    reward_failed = not plan.init_fails
    raise AssertionError("no seed fails an init after a failed reward")


def test_a_retry_drops_the_stage_timings_of_the_attempt_before() -> None:
    """Stale `init_end`s once paired with a retry's `init_start` gave negative init latencies:
    `auto` read them as no queueing at all, its CPU budget floor jumped to every job in the
    CPU stages, and on swe-sim CPU x4 / R 512 a reward pool of 1 ran for 10,000 s."""
    from conveyor.dispatch.auto import AutoDispatcher
    from conveyor.dispatch.base import Stage

    seen: list[tuple[str, float, float]] = []

    class _Recording(AutoDispatcher):
        def stage_done(self, stage, job):  # type: ignore[no-untyped-def]
            name = stage.name.lower()
            start, end = job.timings.get(f"{name}_start"), job.timings.get(f"{name}_end")
            if start is not None and end is not None:
                seen.append((name, start, end))
            super().stage_done(stage, job)

    def make(settings, stages, **kwargs):  # type: ignore[no-untyped-def]
        return _Recording(stages, settings, **kwargs)

    seed = _seed_with_a_failed_init_after_a_failed_reward()
    out, _, auto = run_virtual(_run_all(FAULTY, "auto", seed, make))
    assert isinstance(auto, _Recording) and len(out) == FAULTY.trajectories
    assert seen and all(end >= start for _, start, end in seen), [s for s in seen if s[2] < s[1]]
    assert min(auto._init_latencies) >= 0 and min(auto._run_latencies) >= 0
    assert auto._completed[Stage.INIT] == sum(1 for name, _, _ in seen if name == "init")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_timings_are_ordered(strategy: str) -> None:
    clean = FAULTY.model_copy(
        update={"init_failure_rate": 0.0, "tool_hang_rate": 0.0, "reward_failure_rate": 0.0}
    )
    out, _, _ = run_virtual(_run_all(clean, strategy, 1))
    for t in out:
        times = [
            t.timings[k]
            for k in (
                "admitted",
                "init_start",
                "init_end",
                "run_start",
                "run_end",
                "reward_start",
                "reward_end",
                "finished",
            )
        ]
        assert times == sorted(times)
        assert t.timings["run_queue_wait"] == pytest.approx(
            t.timings["run_start"] - t.timings["init_end"]
        )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cancellation_closes_every_runtime(strategy: str) -> None:
    async def scenario() -> tuple[int, int, int]:
        engine = SimEngine(FAULTY, occupancy_reference=8)
        engine.start()
        env = SimEnvironment(FAULTY, 3, engine)
        settings = DispatchSettings(strategy=strategy, max_live_runtimes=10, run_timeout_s=900)
        dispatcher = make_dispatcher(settings, env, engine=engine)
        got: list[Trajectory] = []

        async def consume() -> None:
            async for trajectory in dispatcher.rollouts(env.tasks(), 4):
                got.append(trajectory)

        task = asyncio.create_task(consume())
        await asyncio.sleep(150.0)
        live_before = env.live
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        in_flight = engine.in_flight
        await engine.close()
        return live_before, env.live, in_flight

    live_before, live_after, in_flight = run_virtual(scenario())
    assert live_before > 0
    assert live_after == 0
    assert in_flight == 0  # the agent loops' engine requests were aborted too


def test_bound_is_below_every_makespan() -> None:
    clean = FAULTY.model_copy(
        update={"init_failure_rate": 0.0, "tool_hang_rate": 0.0, "reward_failure_rate": 0.0}
    )
    bound = makespan_bound(clean, 1).bound_s

    async def makespan(strategy: str) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await _run_all(clean, strategy, 1)
        return loop.time() - start

    for strategy in STRATEGIES:
        assert run_virtual(makespan(strategy)) >= bound


class _EngineDiesAfter(SimEnvironment):
    """swe-sim whose engine goes down for good once `runs_before` run stages have ended (and
    meanwhile, for one rollout, drops a connection while staying up: a plain engine error)."""

    def __init__(self, runs_before: int) -> None:
        clean = FAULTY.model_copy(
            update={"init_failure_rate": 0.0, "tool_hang_rate": 0.0, "reward_failure_rate": 0.0}
        )
        super().__init__(clean, 1, SimEngine(clean, occupancy_reference=8))
        self.runs_before = runs_before
        self.runs_done = 0
        self.down: EngineDown | None = None
        self.flaked = False

    def _check(self) -> None:
        if self.down is not None:
            raise self.down

    async def first_turn(self, task: Any, sample_index: int, attempt: int) -> Any:
        self._check()
        head = await super().first_turn(task, sample_index, attempt)
        self._check()
        return head

    async def run(self, task: Any, sample_index: int, runtime: Any, head: object = None) -> Any:
        self._check()
        if not self.flaked:
            self.flaked = True
            raise EngineError("connection reset; the server answers again")
        trajectory = await super().run(task, sample_index, runtime, head)
        self._check()  # a run that the dead engine cut short has no trajectory
        self.runs_done += 1
        if self.runs_done == self.runs_before:
            self.down = EngineDown("http://engine/v1: connection refused for 30s, so it is down")
        return trajectory


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_dead_engine_stops_the_run_with_every_rollout_recorded(strategy: str) -> None:
    env = _EngineDiesAfter(runs_before=10)
    assert env.engine is not None
    settings = DispatchSettings(
        strategy=strategy, max_parallel=8, p_init=4, p_run=8, p_reward=3, max_live_runtimes=10
    )
    out: list[Trajectory] = []

    async def scenario() -> None:
        assert env.engine is not None
        env.engine.start()
        dispatcher = make_dispatcher(settings, env, engine=env.engine)
        try:
            async for trajectory in dispatcher.rollouts(env.tasks(), FAULTY.samples_per_task):
                out.append(trajectory)
        finally:
            await env.engine.close()

    with pytest.raises(EngineDown, match=r"the run stopped: .*so it is down; (\d+) of 48") as err:
        run_virtual(scenario())
    keys = [(t.task_id, t.sample_index) for t in out]
    assert len(out) == FAULTY.trajectories == len(set(keys))  # one record each, then the error
    stopped = [t for t in out if t.stop_reason == "engine_down"]
    scored = [t for t in out if t.reward is not None]
    # Every run that ended before the engine died is scored, not thrown away.
    assert len(scored) == env.runs_before and all(t.status is Status.OK for t in scored)
    assert all(t.status is Status.INFRA_ERROR and t.reward is None for t in stopped)
    assert len(stopped) + len(scored) == len(out)
    assert f"{len(stopped)} of 48" in str(err.value)
    # The flaky connection was an infra retry of its rollout, not a stop.
    assert sum(t.counters["infra_retries"] for t in out) >= 1
    assert env.live == 0  # every runtime closed
