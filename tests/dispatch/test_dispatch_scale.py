"""Scale: 10,000 simulated trajectories all accounted for, memory flat in the number finished.

The wall-time target (10,000 in under a minute) is a benchmark, not a test:
`conveyor bench dispatch-scale --json` measures it against bounded_batch in the same run.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc

import pytest

from conveyor.dispatch import DispatchSettings, make_dispatcher
from conveyor.sim.engine import SimEngine
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload
from conveyor.sim.virtual_loop import run_virtual


async def _stream(workload: SweSimWorkload, marks: tuple[int, ...] = ()) -> dict[int, int]:
    engine = SimEngine(workload, occupancy_reference=40)
    engine.start()
    env = SimEnvironment(workload, 0, engine)
    settings = DispatchSettings(
        strategy="pipeline",
        p_run=workload.max_live_runtimes,
        max_live_runtimes=workload.max_live_runtimes,
    )
    dispatcher = make_dispatcher(settings, env, engine=engine)
    memory: dict[int, int] = {}
    done = 0
    async for _ in dispatcher.rollouts(env.tasks(), workload.samples_per_task):
        done += 1  # the consumer keeps nothing
        if done in marks:
            await asyncio.sleep(0)
            memory[done] = tracemalloc.get_traced_memory()[0]
    await engine.close()
    assert done == workload.trajectories and env.live == 0
    return memory


@pytest.mark.slow
def test_ten_thousand_trajectories_all_accounted_for() -> None:
    workload = SweSimWorkload(tasks=1250, max_live_runtimes=512)
    assert workload.trajectories == 10_000
    run_virtual(_stream(workload))  # asserts every rollout came out and no runtime leaked


def test_bench_dispatch_scale_reports_wall_time_against_its_baseline() -> None:
    from typer.testing import CliRunner

    from conveyor.cli import app

    result = CliRunner().invoke(
        app,
        ["bench", "dispatch-scale", "--trajectories", "64", "--strategies", "pipeline", "--json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["trajectories"] == 64 and report["baseline"] == "bounded_batch"
    assert set(report["strategies"]) == {"bounded_batch", "pipeline"}
    for run in report["strategies"].values():
        assert run["accounted"] and run["leaked_runtimes"] == 0
        assert sum(run["statuses"].values()) == 64 and run["wall_s"] > 0
    assert report["wall_over_baseline"]["pipeline"] > 0


@pytest.mark.slow
def test_memory_does_not_grow_with_finished_trajectories() -> None:
    workload = SweSimWorkload(tasks=400, turns_min=3, turns_max=6, max_live_runtimes=128)
    tracemalloc.start()
    try:
        memory = run_virtual(_stream(workload, marks=(800, 2800)))
    finally:
        tracemalloc.stop()
    growth = memory[2800] - memory[800]
    assert growth < 200_000, f"{growth} bytes more after 2,000 more finished trajectories"
