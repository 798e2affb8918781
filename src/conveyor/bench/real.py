"""`conveyor bench dispatch --workload real`: the strategies on the real agent workload.

The embedded model on in-process vLLM runs the built-in task families through each strategy in
turn, under identical limits (one engine, the same `dispatch` settings, the same seeded tasks and
sampling seeds). Reported per strategy: makespan, throughput, engine occupancy (mean requests in
flight over `engine.max_num_seqs`, sampled every 50 ms), peak live runtimes, the time until the
first whole group, the count of each status and the mean reward; ratios against `bounded_batch`
and `batch`. The engine is warmed up first so no strategy pays vLLM's start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from conveyor.config import ConveyorConfig


async def _measure(
    dispatcher: Any, engine: Any, tasks: Sequence[Any], k: int, capacity: int
) -> dict[str, Any]:
    samples: list[int] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            samples.append(int(engine.in_flight))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    start = time.monotonic()
    first_group = None
    count = 0
    statuses: dict[str, int] = {}
    rewards: list[float] = []
    try:
        async for group in dispatcher.groups(tasks, k):
            count += 1
            if first_group is None:
                first_group = time.monotonic() - start
            for trajectory in group.trajectories:
                statuses[str(trajectory.status)] = statuses.get(str(trajectory.status), 0) + 1
                if trajectory.reward is not None:
                    rewards.append(trajectory.reward)
    finally:
        stop.set()
        await watcher
    makespan = time.monotonic() - start
    return {
        "makespan_s": makespan,
        "throughput": count * k / makespan,
        "engine_utilisation": (sum(samples) / len(samples) / capacity) if samples else 0.0,
        "engine_busy_fraction": (sum(1 for s in samples if s) / len(samples)) if samples else 0.0,
        "peak_live_runtimes": float(dispatcher.peak_live_runtimes),
        "first_group_s": first_group or makespan,
        "first_group_fraction": (first_group or makespan) / makespan,
        # a strategy that wins by failing rollouts is no win: the statuses say so
        "statuses": statuses,
        "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
    }


async def run_real(config: ConveyorConfig, strategies: Sequence[str]) -> dict[str, Any]:
    """Run every strategy once on the same tasks and engine; returns the report."""
    from conveyor.app.compose import Composition
    from conveyor.dispatch.config import DispatchSettings
    from conveyor.dispatch.factory import make_dispatcher
    from conveyor.engines.factory import build_engine, load_tokenizer
    from conveyor.models import resolve_model_path
    from conveyor.rollout import AgentStages

    model_dir = resolve_model_path(config.model.path)
    tokenizer = load_tokenizer(model_dir)
    engine: Any = build_engine(config, model_dir)
    tasks = Composition(config).tasks()
    k = config.tasks.group_size
    report: dict[str, Any] = {
        "workload": "real",
        "model": str(model_dir),
        "trajectories": len(tasks) * k,
        "limits": config.dispatch.model_dump(),
        "engine_max_num_seqs": config.engine.max_num_seqs,
        "strategies": {},
    }
    try:
        stages = AgentStages.from_config(config, engine, tokenizer)
        warm = make_dispatcher(DispatchSettings.from_config(config), stages)
        async for _ in warm.rollouts(tasks[:2], 1):
            pass
        for name in strategies:
            settings = DispatchSettings.from_config(config).model_copy(update={"strategy": name})
            dispatcher = make_dispatcher(settings, stages, engine=engine)
            report["strategies"][name] = await _measure(
                dispatcher, engine, tasks, k, config.engine.max_num_seqs
            )
    finally:
        await engine.close()
    done = report["strategies"]
    ratios = {}
    if "pipeline" in done and "bounded_batch" in done:
        ratios["pipeline_over_bounded_batch"] = (
            done["bounded_batch"]["makespan_s"] / done["pipeline"]["makespan_s"]
        )
    if "pipeline" in done and "batch" in done:
        ratios["pipeline_over_batch"] = done["batch"]["makespan_s"] / done["pipeline"]["makespan_s"]
    report["ratios"] = ratios
    return report
