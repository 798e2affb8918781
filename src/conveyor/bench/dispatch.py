"""`conveyor bench dispatch`: every strategy on the swe-sim workload, on a virtual clock.

Fairness: every run gets the same engine (KV capacity included), CPU slots and bound R; each
strategy is tuned over its own named grid (`GRIDS`) and compared best against best; each is
also reported at the seed's default P = 96. Tuning ranks grid points by makespan on the first
seed, then re-runs the three best on every seed and keeps the best mean, for every strategy
alike. `auto` is never tuned per point; its constants were set while looking at sweep points
(docs/dispatch.md says which), so it is also judged on points outside the sweep.
Each run reports efficiency against the issue's bound and against the tighter runtime-engine
bound (`bench/bound.py`).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from conveyor.bench.bound import makespan_bound
from conveyor.dispatch import DispatchSettings, Telemetry, make_dispatcher
from conveyor.sim.engine import SimEngine
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload
from conveyor.sim.virtual_loop import run_virtual
from conveyor.types import Status

Knobs = dict[str, Any]
SEED_DEFAULT_P = 96
TUNE_TOP = 3


def _bounded_grid(r: int) -> list[Knobs]:
    values = sorted({min(p, r) for p in (32, 48, 64, 96, 128, 192, 256, 384, 512)})
    return [{"max_parallel": p} for p in values]


def _batch_grid(r: int) -> list[Knobs]:
    values = sorted({min(p, r) for p in (32, 64, 128, 256, 512)})
    return [{"max_parallel": p} for p in values]


def _pipeline_grid(r: int) -> list[Knobs]:
    # 128 (32 per replica) as well: at R >= 256 every fraction of R over-fills the KV cache
    runs = sorted({max(1, r // 2), max(1, 3 * r // 4), r, min(r, 128)})
    return [
        {"p_run": p_run, "p_init": p_init, "p_reward": p_reward, "run_queue": queue}
        for p_run in runs
        for p_init in (16, 32, 64)
        for p_reward in (16, 32)
        for queue in (4, 32)
    ]


GRIDS: dict[str, tuple[str, Callable[[int], list[Knobs]]]] = {
    "batch": ("batch-P{32..512}", _batch_grid),
    "bounded_batch": ("bounded-P{32..512}", _bounded_grid),
    "pipeline": (
        "pipeline-Prun{R/2,3R/4,R,min(R,128)}xPinit{16,32,64}xPreward{16,32}xQrun{4,32}",
        _pipeline_grid,
    ),
    "auto": ("none (self-sizing)", lambda r: [{}]),
}

SEED_DEFAULTS: dict[str, Knobs] = {
    "batch": {"max_parallel": SEED_DEFAULT_P},
    "bounded_batch": {"max_parallel": SEED_DEFAULT_P},
    "pipeline": {"p_init": SEED_DEFAULT_P, "p_run": SEED_DEFAULT_P, "p_reward": SEED_DEFAULT_P},
    "auto": {},
}


async def _simulate(
    workload: SweSimWorkload, settings: DispatchSettings, seed: int, telemetry: Telemetry | None
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    bound = makespan_bound(workload, seed)
    engine = SimEngine(workload, occupancy_reference=bound.best_batch)
    engine.start()
    env = SimEnvironment(workload, seed, engine)
    dispatcher = make_dispatcher(settings, env, engine=engine, telemetry=telemetry)
    start = loop.time()
    group_times: list[float] = []
    statuses: dict[str, int] = {}
    count = 0
    async for group in dispatcher.groups(env.tasks(), workload.samples_per_task):
        group_times.append(loop.time() - start)
        for trajectory in group.trajectories:
            count += 1
            statuses[str(trajectory.status)] = statuses.get(str(trajectory.status), 0) + 1
    makespan = loop.time() - start
    await engine.close()
    deciles = statistics.quantiles(group_times, n=10) if len(group_times) > 1 else [0.0] * 9
    return {
        "makespan_s": makespan,
        "throughput": count / makespan,
        "engine_utilisation": engine.occupancy_s / (makespan * workload.engine_replicas),
        "engine_busy": engine.busy_s / (makespan * workload.engine_replicas),
        "peak_live_runtimes": env.peak_live,
        "runtime_seconds": env.runtime_seconds,
        "first_group_s": group_times[0],
        "first_group_fraction": group_times[0] / makespan,
        "group_spread_s": deciles[-1] - deciles[0],
        "preemptions": engine.preemptions,
        "trajectories": count,
        "statuses": statuses,
        "leaked_runtimes": env.live,
        "bound_s": bound.bound_s,
        "efficiency": bound.bound_s / makespan,
        "tight_bound_s": bound.tight_bound_s,
        "efficiency_tight": bound.tight_bound_s / makespan,
    }


def simulate(
    workload: SweSimWorkload,
    strategy: str,
    knobs: Knobs,
    seed: int,
    telemetry: Telemetry | None = None,
) -> dict[str, Any]:
    """One swe-sim run of one strategy at one grid point, on a fresh virtual-time loop."""
    settings = DispatchSettings(
        strategy=strategy, max_live_runtimes=workload.max_live_runtimes, **knobs
    )
    return run_virtual(_simulate(workload, settings, seed, telemetry))


def _job(args: tuple[SweSimWorkload, str, Knobs, int]) -> dict[str, Any]:
    return simulate(*args)


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, int | float):
            out[key] = statistics.fmean(run[key] for run in runs)
    out["peak_live_runtimes"] = max(run["peak_live_runtimes"] for run in runs)
    statuses: dict[str, int] = {}
    for run in runs:
        for status, n in run["statuses"].items():
            statuses[status] = statuses.get(status, 0) + n
    out["statuses"] = statuses  # summed over the runs (trajectories is the mean per run)
    out["runs"] = len(runs)
    return out


class _Runner:
    """Runs batches of simulations on all cores (the simulations are independent)."""

    def __init__(self, processes: int) -> None:
        self._pool = ProcessPoolExecutor(processes) if processes > 1 else None

    def map(self, jobs: list[tuple[SweSimWorkload, str, Knobs, int]]) -> list[dict[str, Any]]:
        if self._pool is None:
            return [_job(job) for job in jobs]
        return list(self._pool.map(_job, jobs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def bench_point(
    workload: SweSimWorkload,
    seeds: list[int],
    strategies: Iterable[str],
    runner: _Runner,
    with_defaults: bool = True,
) -> dict[str, Any]:
    """Tune every strategy on its grid at one workload point; best against best."""
    r = workload.max_live_runtimes
    result: dict[str, Any] = {"strategies": {}, "at_p96": {}}
    for name in strategies:
        grid_name, grid = GRIDS[name]
        points = grid(r)
        if len(points) > 1:
            first = runner.map([(workload, name, knobs, seeds[0]) for knobs in points])
            # a grid point whose rollouts fail (init or reward overruns of a flooded CPU, with
            # faults off) is not a win however short its makespan: it ranks after every clean one
            ranked = sorted(
                range(len(points)),
                key=lambda i: (not statuses_ok(first[i]), first[i]["makespan_s"]),
            )
            candidates = [points[i] for i in ranked[:TUNE_TOP]]
        else:
            candidates = points
        jobs = [(workload, name, knobs, seed) for knobs in candidates for seed in seeds]
        runs = runner.map(jobs)
        means = [_mean(runs[i * len(seeds) : (i + 1) * len(seeds)]) for i in range(len(candidates))]
        best = min(
            range(len(candidates)),
            key=lambda i: (not statuses_ok(means[i]), means[i]["makespan_s"]),
        )
        result["strategies"][name] = {
            **means[best],
            "best_knobs": candidates[best],
            "grid": grid_name,
            "grid_points": len(points),
        }
        if with_defaults and name in SEED_DEFAULTS and name != "auto":
            runs = runner.map([(workload, name, SEED_DEFAULTS[name], seed) for seed in seeds])
            result["at_p96"][name] = _mean(runs)
    best = result["strategies"]
    if "pipeline" in best:
        result["ratios"] = {
            f"pipeline_over_{base}": best[base]["makespan_s"] / best["pipeline"]["makespan_s"]
            for base in ("bounded_batch", "batch")
            if base in best
        }
        if "bounded_batch" in result["at_p96"] and "pipeline" in result["at_p96"]:
            at = result["at_p96"]
            result["ratios_at_p96"] = {
                "pipeline_over_bounded_batch": at["bounded_batch"]["makespan_s"]
                / at["pipeline"]["makespan_s"],
                # the paper's comparison: a tuned pipeline against naive batching at P = 96
                "pipeline_best_over_bounded_batch": at["bounded_batch"]["makespan_s"]
                / best["pipeline"]["makespan_s"],
            }
    if "auto" in best:
        tuned = [best[n]["makespan_s"] for n in best if n != "auto"]
        result["auto_over_best_grid"] = min(tuned) / best["auto"]["makespan_s"] if tuned else None
    bounds = [makespan_bound(workload, seed).as_dict() for seed in seeds]
    result["bound_s"] = statistics.fmean(float(b["bound_s"]) for b in bounds)
    result["tight_bound_s"] = statistics.fmean(float(b["tight_bound_s"]) for b in bounds)
    result["bound_terms"] = bounds[0]
    return result


def _compact(point: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "makespan_s",
        "throughput",
        "efficiency",
        "efficiency_tight",
        "first_group_fraction",
        "best_knobs",
    )
    return {
        "strategies": {n: {k: s[k] for k in keys} for n, s in point["strategies"].items()},
        "ratios": point.get("ratios"),
        "ratios_at_p96": point.get("ratios_at_p96"),
        "auto_over_best_grid": point.get("auto_over_best_grid"),
        "bound_s": point["bound_s"],
        "tight_bound_s": point["tight_bound_s"],
        "binding": point["bound_terms"]["binding"],
    }


CPU_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
LIVE_RUNTIMES = (64, 128, 256, 512)
# two corners of the grid: loose runtimes with light and with heavy CPU stages (the latter is
# the regime of the seed study's 1.56x: CPU stages 4x heavier)
CORNERS = ((0.25, 512), (4.0, 512))
PAPER_RATIO = 1.55


def sweep_points(default_r: int) -> list[tuple[float, int]]:
    """(CPU factor, R) of the sweep: the CPU factors at the default R, the R values at CPU x1,
    then the corners (the default point itself is reported on its own)."""
    points: list[tuple[float, int]] = []
    for factor in CPU_FACTORS:
        if factor != 1.0:
            points.append((factor, default_r))
        else:
            points += [(1.0, live) for live in LIVE_RUNTIMES if live != default_r]
    return points + [corner for corner in CORNERS if corner not in points]


def run_bench(
    seeds: int = 3,
    sweep: bool = False,
    processes: int | None = None,
    strategies: tuple[str, ...] = ("batch", "bounded_batch", "pipeline", "auto"),
    workload: SweSimWorkload | None = None,
) -> dict[str, Any]:
    """The whole benchmark as one JSON-ready dict (the CLI prints it)."""
    started = time.perf_counter()
    base = workload or SweSimWorkload()
    seed_list = list(range(seeds))
    runner = _Runner(processes or os.cpu_count() or 1)
    try:
        point = bench_point(base, seed_list, strategies, runner)
        report: dict[str, Any] = {
            "workload": "swe-sim",
            "trajectories": base.trajectories,
            "seeds": seed_list,
            "throughput_unit": "trajectories per simulated second",
            "limits": {
                "max_live_runtimes": base.max_live_runtimes,
                "cpu_slots": base.cpu_slots,
                "engine_replicas": base.engine_replicas,
                "kv_capacity_tokens": base.kv_capacity_tokens,
            },
            **point,
            "efficiency": point["strategies"].get("pipeline", {}).get("efficiency"),
            "efficiency_tight": point["strategies"].get("pipeline", {}).get("efficiency_tight"),
        }
        if sweep:
            rows = []
            for factor, live in sweep_points(base.max_live_runtimes):
                scaled = base.scaled(cpu_factor=factor, live_runtimes=live)
                result = bench_point(scaled, seed_list, strategies, runner)
                rows.append(
                    {
                        "cpu_factor": factor,
                        "max_live_runtimes": live,
                        "held_back_for_auto": True,
                        **_compact(result),
                    }
                )
            report["sweep"] = rows
            report["paper_ratio"] = _paper_ratio(report, rows)
    finally:
        runner.close()
    report["wall_s"] = time.perf_counter() - started
    return report


def _paper_ratio(report: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the paper's 1.55x over naive batching is reached: best against best, and with
    the pipeline tuned against bounded_batch left at the seed's P = 96."""
    points = [
        {
            "cpu_factor": 1.0,
            "max_live_runtimes": report["limits"]["max_live_runtimes"],
            "ratios": report.get("ratios"),
            "ratios_at_p96": report.get("ratios_at_p96"),
        }
    ]
    points += rows
    reached: dict[str, list[str]] = {"best_vs_best": [], "pipeline_best_vs_bounded_at_p96": []}
    for point in points:
        name = f"cpu x{point['cpu_factor']:g} / R {point['max_live_runtimes']}"
        ratios, at = point.get("ratios") or {}, point.get("ratios_at_p96") or {}
        if ratios.get("pipeline_over_bounded_batch", 0.0) >= PAPER_RATIO:
            reached["best_vs_best"].append(name)
        if at.get("pipeline_best_over_bounded_batch", 0.0) >= PAPER_RATIO:
            reached["pipeline_best_vs_bounded_at_p96"].append(name)
    return {"target": PAPER_RATIO, "reached_at": reached}


def statuses_ok(run: dict[str, Any]) -> bool:
    """Every rollout accounted for, none an infra error (no faults in the benchmark)."""
    return (
        sum(run["statuses"].values()) == run["trajectories"] * run.get("runs", 1)
        and run["statuses"].get(str(Status.INFRA_ERROR), 0) == 0
    )


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
        settings = DispatchSettings(strategy=name, max_live_runtimes=r, **knobs.get(name, {}))
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
