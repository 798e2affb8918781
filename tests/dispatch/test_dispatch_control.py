"""Strategies' shared behaviour: groups, ordering, pause/drain, config, registry, crashes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from conveyor.dispatch import (
    Dispatcher,
    DispatchSettings,
    make_dispatcher,
)
from conveyor.dispatch.limiter import AdjustableLimit
from conveyor.registry import STRATEGIES
from conveyor.runtime.base import Runtime
from conveyor.sim.engine import SimEngine
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload
from conveyor.sim.virtual_loop import run_virtual
from conveyor.types import Status, Task, TaskDefect, Trajectory

SMALL = SweSimWorkload(
    tasks=8, samples_per_task=4, turns_min=3, turns_max=6, max_live_runtimes=12, cpu_slots=4
)


def _settings(strategy: str, **knobs: Any) -> DispatchSettings:
    base: dict[str, Any] = {
        "max_parallel": 12,
        "p_init": 4,
        "p_run": 12,
        "p_reward": 4,
        "max_live_runtimes": 12,
    }
    return DispatchSettings(strategy=strategy, **{**base, **knobs})


async def _group_times(strategy: str, order: str) -> list[float]:
    engine = SimEngine(SMALL, occupancy_reference=8)
    engine.start()
    env = SimEnvironment(SMALL, 0, engine)
    dispatcher = make_dispatcher(_settings(strategy, admission_order=order), env, engine=engine)
    loop = asyncio.get_running_loop()
    times = []
    async for group in dispatcher.groups(env.tasks(), SMALL.samples_per_task):
        assert [t.sample_index for t in group.trajectories] == list(range(4))
        assert {t.task_id for t in group.trajectories} == {group.task_id}
        times.append(loop.time())
    await engine.close()
    assert len(times) == SMALL.tasks
    return times


@pytest.mark.parametrize("strategy", ["bounded_batch", "pipeline"])
def test_group_aware_order_finishes_the_first_group_earlier(strategy: str) -> None:
    group_aware = run_virtual(_group_times(strategy, "group_aware"))
    trajectory_major = run_virtual(_group_times(strategy, "trajectory_major"))
    assert group_aware[0] < trajectory_major[0]


def test_pause_drains_the_run_stage_and_resume_finishes_everything() -> None:
    async def scenario() -> tuple[int, int, int]:
        engine = SimEngine(SMALL, occupancy_reference=8)
        engine.start()
        env = SimEnvironment(SMALL, 0, engine)
        dispatcher = make_dispatcher(_settings("pipeline"), env, engine=engine)
        out: list[Trajectory] = []

        async def consume() -> None:
            async for trajectory in dispatcher.rollouts(env.tasks(), 4):
                out.append(trajectory)

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(60.0)
        dispatcher.pause()
        await dispatcher.drain_run_stage()
        drained = dispatcher.runs_in_flight
        started_before = sum(1 for _ in out)
        await asyncio.sleep(200.0)  # paused: no run stage may start
        still_zero = dispatcher.runs_in_flight
        dispatcher.resume()
        await consumer
        await engine.close()
        assert started_before <= len(out)
        return drained, still_zero, len(out)

    drained, still_zero, total = run_virtual(scenario())
    assert drained == 0 and still_zero == 0
    assert total == SMALL.trajectories


def test_drain_without_pause_is_an_error() -> None:
    async def scenario() -> None:
        dispatcher = make_dispatcher(_settings("pipeline"), SimEnvironment(SMALL, 0))
        with pytest.raises(RuntimeError, match="pause"):
            await dispatcher.drain_run_stage()

    run_virtual(scenario())


def test_settings_fail_loud() -> None:
    with pytest.raises(ValidationError, match="unknown dispatch strategy 'pipelin'"):
        DispatchSettings(strategy="pipelin")
    with pytest.raises(ValidationError):
        DispatchSettings(p_runn=3)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        DispatchSettings(max_live_runtimes=0)
    assert {"batch", "bounded_batch", "pipeline", "auto"} <= set(STRATEGIES.names())


class _Broken:
    """Stages whose init raises an unexpected exception type and whose run raises TimeoutError."""

    def __init__(self) -> None:
        self.closed = 0

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        if sample_index == 0:
            raise ValueError("a bug in set-up code")
        env = SimEnvironment(SMALL, 0)
        runtime = await env.init(task, sample_index, attempt)
        original = runtime.close

        async def close() -> None:
            self.closed += 1
            await original()

        runtime.close = close  # type: ignore[method-assign]
        return runtime

    async def run(self, task: Task, sample_index: int, runtime: Runtime) -> Trajectory:
        if sample_index == 1:
            raise TimeoutError("the stage's own timeout, not the dispatcher's")
        return Trajectory(task_id=task.id, sample_index=sample_index)

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        return trajectory.model_copy(update={"reward": 1.0})


@pytest.mark.parametrize("strategy", ["batch", "bounded_batch", "pipeline", "auto"])
def test_unexpected_exceptions_become_infra_errors_not_hangs(strategy: str) -> None:
    stages = _Broken()

    async def scenario() -> list[Trajectory]:
        dispatcher = make_dispatcher(_settings(strategy, max_infra_retries=1), stages)
        return [t async for t in dispatcher.rollouts(SimEnvironment(SMALL, 0).tasks(3), 3)]

    out = run_virtual(scenario())
    assert len(out) == 9
    by_sample = {(t.task_id, t.sample_index): t for t in out}
    for (_, sample), trajectory in by_sample.items():
        if sample in (0, 1):
            assert trajectory.status is Status.INFRA_ERROR
            assert trajectory.counters["infra_retries"] == 1
        else:
            assert trajectory.status is Status.OK and trajectory.reward == 1.0
    assert "ValueError" in str(by_sample[("swe-sim-00000", 0)].error)
    assert stages.closed == 3 * 2 + 3  # sample 1: two attempts each; sample 2: once each


def test_a_crashing_strategy_raises_instead_of_hanging() -> None:
    @STRATEGIES.register("test-crash")
    class Crash(Dispatcher):
        async def schedule(self, jobs: Any) -> None:
            raise KeyError("scheduler bug")

    async def scenario() -> None:
        dispatcher = make_dispatcher(_settings("test-crash"), SimEnvironment(SMALL, 0))
        async for _ in dispatcher.rollouts(SimEnvironment(SMALL, 0).tasks(2), 2):
            pass

    with pytest.raises(RuntimeError, match="dispatcher failed"):
        run_virtual(scenario())


def test_adjustable_limit_grows_and_shrinks() -> None:
    async def scenario() -> list[int]:
        limit = AdjustableLimit(1)
        await limit.acquire()
        waiter = asyncio.create_task(limit.acquire())
        await asyncio.sleep(0)
        assert not waiter.done()
        limit.set_limit(2)
        await asyncio.sleep(0)
        assert waiter.done() and limit.in_use == 2
        limit.set_limit(1)
        limit.release()
        blocked = asyncio.create_task(limit.acquire())
        await asyncio.sleep(0)
        assert not blocked.done()  # 1 in use, limit 1
        blocked.cancel()
        limit.release()
        return [limit.in_use, limit.limit]

    assert run_virtual(scenario()) == [0, 1]


def test_virtual_loop_jumps_and_detects_deadlock() -> None:
    async def sleeper() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(7200)
        return loop.time()

    assert run_virtual(sleeper()) == pytest.approx(7200)

    async def deadlock() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(RuntimeError, match="deadlocked"):
        run_virtual(deadlock(), idle_wall_s=0.05)


class _DefectiveTask(_Broken):
    """Stages whose reward finds the task itself broken (its hidden tests do not apply)."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage
        self.rewards = 0

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        if self.stage == "init" and task.id.endswith("1"):
            raise TaskDefect(f"{task.id}: broken set-up")
        return await SimEnvironment(SMALL, 0).init(task, sample_index, attempt)

    async def run(self, task: Task, sample_index: int, runtime: Runtime) -> Trajectory:
        return Trajectory(task_id=task.id, sample_index=sample_index)

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        self.rewards += 1
        if self.stage == "reward" and task.id.endswith("1"):
            raise TaskDefect(f"{task.id}: hidden test patch does not apply")
        return trajectory.model_copy(update={"reward": 1.0})


@pytest.mark.parametrize("stage", ["init", "reward"])
@pytest.mark.parametrize("strategy", ["batch", "pipeline"])
def test_a_task_defect_stops_the_run_with_its_message_never_retried_or_scored(
    strategy: str, stage: str
) -> None:
    stages = _DefectiveTask(stage)
    seen: list[Trajectory] = []

    async def scenario() -> None:
        dispatcher = make_dispatcher(_settings(strategy, max_infra_retries=2), stages)
        async for trajectory in dispatcher.rollouts(SimEnvironment(SMALL, 0).tasks(3), 2):
            seen.append(trajectory)

    with pytest.raises(TaskDefect, match="swe-sim-00001"):
        run_virtual(scenario())
    # not an infra error to retry, and never a scored record of the broken task
    assert not any(t.task_id == "swe-sim-00001" for t in seen)
