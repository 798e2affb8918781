"""The router-policy comparison of `conveyor bench dispatch --replicas N` (swe-sim).

The pipeline strategy at one fixed grid point (its tuned best, chosen on the tuning seeds under
the engine's default `session_hash` routing, so by none of the compared policies) runs under
each router policy on the same reported seeds: the same rollouts, the same fleet of
`engine_replicas` replicas, only the routing differs. Each seed is one repeat; the policies'
order is rotated by one per repeat. On the virtual clock the order cannot change a result (each
run has its own loop), it only sets the order the jobs reach the process pool.

Per policy: makespan (mean over seeds, min, max, standard deviation), its ratio to
`session_sticky` on the same seed, and the prefill tokens recomputed (defined in
`conveyor.sim.engine`: prompt tokens computed that a perfect per-session prefix cache would not
have needed), in total and by cause.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from conveyor.sim.router import ROUTERS
from conveyor.sim.swe import SweSimWorkload

Knobs = dict[str, Any]
RouterJob = tuple[SweSimWorkload, str, Knobs, int, str]

ROUTER_POLICIES = ("session_sticky", "round_robin", "random", "session_hash")
REFERENCE = "session_sticky"  # Conveyor's router (issue 18): the ratios' denominator
STRATEGY = "pipeline"


def rotated_jobs(
    workload: SweSimWorkload, seeds: Sequence[int], knobs: Knobs, routers: Sequence[str]
) -> list[RouterJob]:
    """One job per (seed, policy); repeat i runs the policies rotated by i."""
    jobs: list[RouterJob] = []
    for i, seed in enumerate(seeds):
        shift = i % len(routers)
        order = [*routers[shift:], *routers[:shift]]
        jobs += [(workload, STRATEGY, knobs, seed, name) for name in order]
    return jobs


def bench_routers(
    workload: SweSimWorkload,
    seeds: Sequence[int],
    knobs: Knobs,
    run_jobs: Callable[[list[Any]], list[dict[str, Any]]],
    routers: Sequence[str] = ROUTER_POLICIES,
) -> dict[str, Any]:
    """The `routers` block (policy -> figures) and how it was made, as report keys."""
    unknown = [name for name in routers if name not in ROUTERS]
    if unknown or not routers:
        raise ValueError(f"unknown router(s) {unknown}; known: {', '.join(ROUTERS)}")
    jobs = rotated_jobs(workload, seeds, knobs, routers)
    results = run_jobs(list(jobs))
    runs: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in routers}
    for job, result in zip(jobs, results, strict=True):
        runs[job[4]][job[3]] = result
    block = {name: _summary(runs[name], seeds) for name in routers}
    if REFERENCE in runs:
        for name in routers:
            ratios = [
                runs[name][seed]["makespan_s"] / runs[REFERENCE][seed]["makespan_s"]
                for seed in seeds
            ]
            block[name]["makespan_over_session_sticky"] = {
                "mean": statistics.fmean(ratios),
                "min": min(ratios),
                "max": max(ratios),
            }
    return {
        "routers": block,
        "routers_setup": {
            "strategy": STRATEGY,
            "knobs": knobs,
            "knobs_from": "the pipeline's tuned best grid point (tuning seeds, session_hash)",
            "engine_replicas": workload.engine_replicas,
            "kv_capacity_tokens_per_replica": workload.kv_capacity_tokens,
            "seeds": list(seeds),
            "order": [job[4] for job in jobs],
            "reference": REFERENCE,
        },
    }


def _summary(by_seed: dict[int, dict[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    runs = [by_seed[seed] for seed in seeds]
    makespans = [run["makespan_s"] for run in runs]
    causes = runs[0]["recomputed_by_cause"]
    total = sum(run["trajectories"] for run in runs)
    failed = sum(sum(run["statuses"].values()) != run["trajectories"] for run in runs)
    return {
        "makespan_s": statistics.fmean(makespans),
        "makespan_min_s": min(makespans),
        "makespan_max_s": max(makespans),
        "makespan_std_s": statistics.stdev(makespans) if len(makespans) > 1 else 0.0,
        "throughput": total / sum(makespans),
        "prefill_tokens_recomputed": statistics.fmean(
            run["prefill_tokens_recomputed"] for run in runs
        ),
        "recomputed_by_cause": {
            cause: statistics.fmean(run["recomputed_by_cause"][cause] for run in runs)
            for cause in causes
        },
        "prefill_tokens": statistics.fmean(run["prefill_tokens"] for run in runs),
        "preemptions": statistics.fmean(run["preemptions"] for run in runs),
        "engine_utilisation": statistics.fmean(run["engine_utilisation"] for run in runs),
        "peak_live_runtimes": max(run["peak_live_runtimes"] for run in runs),
        "statuses": _summed(run["statuses"] for run in runs),
        "runs_unaccounted": failed,
        "runs": len(runs),
    }


def _summed(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for statuses in items:
        for status, n in statuses.items():
            out[status] = out.get(status, 0) + n
    return out
