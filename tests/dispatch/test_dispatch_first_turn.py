"""The first turn started beside init (`early_first_turn`), on the swe-sim stages and engine.

The first generation of a rollout reads only its prompt, so `pipeline` and `auto` start it at
init start, inside the rollout's runtime slot, and the run stage continues from it. The engine
and the sandboxes are the simulated ones (virtual clock); the dispatcher is the real one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conveyor.dispatch import DispatchSettings, make_dispatcher
from conveyor.dispatch.base import Dispatcher
from conveyor.registry import STRATEGIES
from conveyor.sim.engine import SimEngine
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload, plan_rollout
from conveyor.sim.virtual_loop import run_virtual
from conveyor.types import Status, Trajectory

# Inits (30 s) far longer than a first turn, and R binding: the regime where the overlap pays.
WORKLOAD = SweSimWorkload(
    tasks=8, samples_per_task=4, turns_min=3, turns_max=8, max_live_runtimes=12, cpu_slots=4
)


def _make(
    workload: SweSimWorkload, strategy: str, **knobs: Any
) -> tuple[SimEngine, SimEnvironment, Dispatcher]:
    """A started engine, the seeded stages and a dispatcher (`knobs` override the settings)."""
    engine = SimEngine(workload, occupancy_reference=8)
    engine.start()
    env = SimEnvironment(workload, 5, engine)
    settings = DispatchSettings(
        **{
            "strategy": strategy,
            "max_parallel": 12,
            "p_init": 4,
            "p_run": 12,
            "p_reward": 4,
            "max_live_runtimes": workload.max_live_runtimes,
            "run_timeout_s": 900.0,
            **knobs,
        }
    )
    return engine, env, make_dispatcher(settings, env, engine=engine)


async def _run(
    workload: SweSimWorkload, strategy: str, **knobs: Any
) -> tuple[list[Trajectory], SimEnvironment, SimEngine, Dispatcher]:
    engine, env, dispatcher = _make(workload, strategy, **knobs)
    out = [t async for t in dispatcher.rollouts(env.tasks(), workload.samples_per_task)]
    await engine.close()
    return out, env, engine, dispatcher


async def _peak_run(strategy: str, **knobs: Any) -> tuple[int, float, list[Trajectory]]:
    """One dispatch of WORKLOAD: the most requests the engine held at once, the makespan and
    the rollouts."""
    engine, env, dispatcher = _make(WORKLOAD, strategy, **knobs)
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, engine.in_flight)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    out = [t async for t in dispatcher.rollouts(env.tasks(), WORKLOAD.samples_per_task)]
    makespan = dispatcher.now()
    watcher.cancel()
    await engine.close()
    return peak, makespan, out


@pytest.mark.parametrize("strategy", ["pipeline", "auto"])
def test_the_first_turn_overlaps_init_and_generates_the_same_tokens(strategy: str) -> None:
    early, env_early, engine_early, _ = run_virtual(_run(WORKLOAD, strategy))
    late, env_late, engine_late, _ = run_virtual(_run(WORKLOAD, strategy, early_first_turn=False))
    started = [t for t in early if "head_start" in t.timings]
    assert len(started) == len(early)  # the run pool had room for every first turn here
    for t in started:
        assert t.timings["head_start"] == t.timings["init_start"]
        assert t.timings["head_end"] <= t.timings["run_end"]
    # generated while the sandbox started (a long first turn may outlast its init)
    within = sum(t.timings["head_end"] < t.timings["init_end"] for t in started)
    assert within >= len(started) / 2
    assert not any("head_start" in t.timings for t in late)
    # the same rollouts, the first turn generated exactly once
    by_key = {(t.task_id, t.sample_index): t for t in late}
    for t in early:
        other = by_key[(t.task_id, t.sample_index)]
        assert (t.status, t.reward, t.metrics) == (other.status, other.reward, other.metrics)
    assert engine_early.generated_tokens == engine_late.generated_tokens
    # each runtime lives a first turn less
    assert env_early.runtime_seconds < env_late.runtime_seconds
    assert env_early.live == env_late.live == 0


@pytest.mark.parametrize("strategy", ["batch", "bounded_batch"])
def test_the_papers_baselines_keep_their_stages_sequential(strategy: str) -> None:
    out, _, _, _ = run_virtual(_run(WORKLOAD, strategy))
    assert len(out) == WORKLOAD.trajectories
    assert not any("head_start" in t.timings for t in out)


def test_the_overlap_control_is_registered_and_bounded_by_its_slots() -> None:
    """`bounded_batch_overlap` is named like any strategy; its first turns live inside the
    rollout's slot, so the engine never holds more than `max_parallel` of our sessions, and
    with the overlap the batch ends earlier than plain bounded_batch at the same P."""
    assert "bounded_batch_overlap" in STRATEGIES.names()
    assert (
        DispatchSettings(strategy="bounded_batch_overlap").strategy.name == "bounded_batch_overlap"
    )

    peak, overlapped, out = run_virtual(_peak_run("bounded_batch_overlap", max_parallel=5))
    _, plain, plain_out = run_virtual(_peak_run("bounded_batch", max_parallel=5))
    assert len(out) == len(plain_out) == WORKLOAD.trajectories
    assert all(t.status is Status.OK or t.status is Status.TRUNCATED for t in out)
    assert all(t.timings["head_start"] == t.timings["init_start"] for t in out)
    assert 0 < peak <= 5
    assert overlapped < plain


def test_a_failed_init_cancels_its_first_turn() -> None:
    """Every init fails (infra): each first turn is cancelled with its attempt, nothing is left
    on the engine, and every rollout is recorded as `infra_error` after its retries."""
    broken = WORKLOAD.model_copy(update={"init_failure_rate": 1.0})
    out, env, engine, dispatcher = run_virtual(_run(broken, "pipeline", max_infra_retries=1))
    assert len(out) == broken.trajectories
    assert all(t.status is Status.INFRA_ERROR for t in out)
    assert engine.in_flight == 0 and env.live == 0
    assert dispatcher.first_turns == 0 and not dispatcher._first_turns.generating
    # a failing init ends halfway through its 30 s: the longer first turns were cut there
    whole = sum(
        plan_rollout(broken, 5, task, sample, attempt).turns[0].completion_tokens
        for task in range(broken.tasks)
        for sample in range(broken.samples_per_task)
        for attempt in range(2)
    )
    assert 0 < engine.generated_tokens < whole


def test_first_turns_only_take_free_run_pool_places() -> None:
    """A first turn is run-stage work on the engine: with a run pool of 2 and 4 inits at a time,
    the engine never holds more than 2 of our requests."""
    peak, _, out = run_virtual(_peak_run("pipeline", p_init=4, p_run=2, p_reward=2))
    assert len(out) == WORKLOAD.trajectories
    assert peak == 2
    assert any("head_start" in t.timings for t in out)


def test_no_first_turn_starts_while_paused_and_drain_waits_for_them() -> None:
    async def scenario() -> tuple[list[Trajectory], float, float, int]:
        engine, env, dispatcher = _make(WORKLOAD, "pipeline", p_init=4, p_run=12, p_reward=4)
        out: list[Trajectory] = []

        async def consume() -> None:
            async for trajectory in dispatcher.rollouts(env.tasks(), WORKLOAD.samples_per_task):
                out.append(trajectory)

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(40.0)
        dispatcher.pause()
        await dispatcher.drain_run_stage()
        drained_in_flight = engine.in_flight  # nothing of ours on the engine: weights may change
        paused_at = dispatcher.now()
        await asyncio.sleep(60.0)  # inits go on; their first turns must wait
        resumed_at = dispatcher.now()
        dispatcher.resume()
        await consumer
        await engine.close()
        return out, paused_at, resumed_at, drained_in_flight

    out, paused_at, resumed_at, drained_in_flight = run_virtual(scenario())
    assert len(out) == WORKLOAD.trajectories
    assert drained_in_flight == 0
    heads = [t.timings["head_start"] for t in out if "head_start" in t.timings]
    assert heads and not any(paused_at <= h < resumed_at for h in heads)
    inits = [t.timings["init_start"] for t in out]
    assert any(paused_at <= i < resumed_at for i in inits)  # they did start, without a head
