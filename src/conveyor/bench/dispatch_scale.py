"""`conveyor bench dispatch-scale`: the dispatcher's own wall time on many simulated rollouts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from conveyor.config import PartChoice
from conveyor.dispatch import DispatchSettings, make_dispatcher
from conveyor.sim.engine import SimEngine
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload
from conveyor.sim.virtual_loop import run_virtual

Knobs = dict[str, Any]

SCALE_TARGET_WALL_S = 60.0  # issue 3: 10,000 simulated trajectories in under a minute


async def _stream_all(workload: SweSimWorkload, settings: DispatchSettings) -> dict[str, Any]:
    """Every rollout of `workload` through one dispatcher; the consumer keeps only counts."""
    loop = asyncio.get_running_loop()
    engine = SimEngine(workload, occupancy_reference=40)
    engine.start()
    env = SimEnvironment(workload, 0, engine)
    dispatcher = make_dispatcher(settings, env, engine=engine)
    started = loop.time()
    statuses: dict[str, int] = {}
    async for trajectory in dispatcher.rollouts(env.tasks(), workload.samples_per_task):
        statuses[str(trajectory.status)] = statuses.get(str(trajectory.status), 0) + 1
    makespan = loop.time() - started
    await engine.close()
    return {"statuses": statuses, "simulated_makespan_s": makespan, "leaked_runtimes": env.live}


def run_scale(
    trajectories: int = 10_000,
    strategies: tuple[str, ...] = ("pipeline", "auto"),
    baseline: str = "bounded_batch",
) -> dict[str, Any]:
    """Wall time of the dispatcher itself on `trajectories` simulated rollouts (virtual clock,
    R = 512), each strategy against `baseline` measured in the same run."""
    import resource

    tasks = max(1, trajectories // 8)
    workload = SweSimWorkload(tasks=tasks, max_live_runtimes=512)
    r = workload.max_live_runtimes
    knobs: dict[str, Knobs] = {
        "bounded_batch": {"max_parallel": r},
        "batch": {"max_parallel": r},
        "pipeline": {"p_run": r},
        "auto": {},
    }
    report: dict[str, Any] = {
        "trajectories": workload.trajectories,
        "target_wall_s": SCALE_TARGET_WALL_S,
        "baseline": baseline,
        "strategies": {},
    }
    for name in (baseline, *[s for s in strategies if s != baseline]):
        settings = DispatchSettings(
            strategy=PartChoice(name=name), max_live_runtimes=r, **knobs.get(name, {})
        )
        started = time.perf_counter()
        result = run_virtual(_stream_all(workload, settings))
        wall = time.perf_counter() - started
        result.update(
            wall_s=wall,
            trajectories_per_wall_s=workload.trajectories / wall,
            accounted=sum(result["statuses"].values()) == workload.trajectories,
            met=wall < SCALE_TARGET_WALL_S,
            max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        )
        report["strategies"][name] = result
    base_wall = report["strategies"][baseline]["wall_s"]
    report["wall_over_baseline"] = {
        n: s["wall_s"] / base_wall for n, s in report["strategies"].items() if n != baseline
    }
    return report
