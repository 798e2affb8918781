"""`conveyor bench dispatch --workload real`: the strategies on the real agent workload.

The embedded model on in-process vLLM runs the built-in task families through each strategy,
under identical limits (one engine, the same `dispatch` settings, the same seeded tasks and
sampling seeds). The engine is warmed up first so no strategy pays vLLM's start.

Order and caches: a strategy run after another finds the engine's prefix cache and the code
index cache warm with the same prompts and repositories, so a fixed order would favour the
later strategies. Every strategy therefore starts cold (`reset_caches`: the prefix cache, where
the engine can reset it, and every `IndexCache`), and the strategies run `repeats` rounds, each
in a rotated order, so every strategy takes each place in turn. Reported per strategy: each
run's makespan, throughput, engine occupancy (mean requests in flight over
`engine.max_num_seqs`, sampled every 50 ms), peak live runtimes, time until the first whole
group, statuses and mean reward; their mean, min, max and standard deviation over the rounds;
and ratios against `bounded_batch` and `batch` taken within each round, with the same spread.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from conveyor.config import ConveyorConfig
from conveyor.dispatch.base import Dispatcher, EngineProbe
from conveyor.tasks.swe.codesearch.index import IndexCache

SPREAD_KEYS = ("makespan_s", "throughput", "engine_utilisation", "first_group_fraction")
RATIO_BASELINES = ("bounded_batch", "bounded_batch_overlap", "batch")


@runtime_checkable
class PrefixCacheOwner(Protocol):
    """An engine whose prefix cache can be emptied between contenders."""

    async def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (the next request of each session prefills in full)."""
        ...


async def reset_caches(engine: object) -> dict[str, Any]:
    """Empty the caches one strategy's run leaves warm for the next; say what was reset."""
    prefix = False
    if isinstance(engine, PrefixCacheOwner):
        await engine.reset_prefix_cache()
        prefix = True
    return {"prefix_cache": prefix, "code_indexes_dropped": IndexCache.clear_all()}


def rotated(strategies: Sequence[str], round_index: int) -> list[str]:
    """The order of round `round_index`: the list rotated by one place per round."""
    shift = round_index % len(strategies) if strategies else 0
    return [*strategies[shift:], *strategies[:shift]]


async def measure(
    dispatcher: Dispatcher, engine: EngineProbe, tasks: Sequence[Any], k: int, capacity: int
) -> dict[str, Any]:
    """One dispatcher over every task x k samples; times on the running loop's clock."""
    loop = asyncio.get_running_loop()
    samples: list[int] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            samples.append(int(engine.in_flight))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    start = loop.time()
    first_group = None
    count = 0
    statuses: dict[str, int] = {}
    rewards: list[float] = []
    try:
        async for group in dispatcher.groups(tasks, k):
            count += 1
            if first_group is None:
                first_group = loop.time() - start
            for trajectory in group.trajectories:
                statuses[str(trajectory.status)] = statuses.get(str(trajectory.status), 0) + 1
                if trajectory.reward is not None:
                    rewards.append(trajectory.reward)
    finally:
        stop.set()
        await watcher
    makespan = loop.time() - start
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


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, min, max and sample standard deviation (0 for one value)."""
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


async def compare(
    strategies: Sequence[str],
    repeats: int,
    run_one: Callable[[str], Awaitable[dict[str, Any]]],
    reset: Callable[[], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """`repeats` rounds of every strategy, rotated, `reset` before each run; the runs, each
    strategy's spread and the within-round ratios with theirs."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs: list[dict[str, Any]] = []
    for round_index in range(repeats):
        for position, name in enumerate(rotated(strategies, round_index)):
            cold = await reset()
            result = await run_one(name)
            runs.append(
                {"round": round_index, "position": position, "strategy": name, "reset": cold}
                | result
            )
    summary: dict[str, Any] = {}
    for name in strategies:
        mine = [run for run in runs if run["strategy"] == name]
        statuses: dict[str, int] = {}
        for run in mine:
            for status, n in run["statuses"].items():
                statuses[status] = statuses.get(status, 0) + n
        summary[name] = {
            **{key: spread([run[key] for run in mine]) for key in SPREAD_KEYS},
            "mean_reward": statistics.fmean(run["mean_reward"] for run in mine),
            "statuses": statuses,  # summed over the rounds
            "runs": len(mine),
        }
    ratios: dict[str, dict[str, float]] = {}
    for base in RATIO_BASELINES:
        for name in ("pipeline", "auto"):
            if base in strategies and name in strategies:
                per_round = [
                    _makespan(runs, r, base) / _makespan(runs, r, name) for r in range(repeats)
                ]
                ratios[f"{name}_over_{base}"] = spread(per_round)
    return {"runs": runs, "strategies": summary, "ratios": ratios}


def _makespan(runs: list[dict[str, Any]], round_index: int, name: str) -> float:
    return float(
        next(r for r in runs if r["round"] == round_index and r["strategy"] == name)["makespan_s"]
    )


async def run_real(
    config: ConveyorConfig, strategies: Sequence[str], repeats: int = 3
) -> dict[str, Any]:
    """Run every strategy `repeats` times, rotated, on the same tasks and engine."""
    from conveyor.app.compose import Composition

    parts = Composition(config)
    model_dir = parts.model_dir
    engine: Any = parts.engine
    tasks = parts.tasks()
    k = config.tasks.group_size
    report: dict[str, Any] = {
        "workload": "real",
        "model": str(model_dir),
        "trajectories": len(tasks) * k,
        "repeats": repeats,
        "order": "rotated by one place per round; caches reset before every run",
        "limits": config.dispatch.model_dump(),
        "engine_max_num_seqs": config.engine.max_num_seqs,
    }
    try:
        stages = parts.stages()
        async for _ in parts.dispatcher(stages).rollouts(tasks[:2], 1):
            pass

        async def run_one(name: str) -> dict[str, Any]:
            dispatcher = parts.dispatcher(stages, engine=engine, strategy=name)
            return await measure(dispatcher, engine, tasks, k, config.engine.max_num_seqs)

        report |= await compare(strategies, repeats, run_one, lambda: reset_caches(engine))
    finally:
        await parts.close()
    return report
