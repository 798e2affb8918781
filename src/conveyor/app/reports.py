"""The one home of evaluation reports: pass@k summaries of `conveyor eval` and pass rates with
their intervals for `conveyor train`'s held-out evaluations.

Both count a rollout as solved by `Trajectory.solved` (the one "solved" rule) and never score an
infrastructure error: it is counted, and left out of every rate.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from conveyor.types import Status, Task, Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def summarize(trajectories: Sequence[Trajectory], tasks: Sequence[Task], k: int) -> dict[str, Any]:
    """Aggregate metrics of an evaluation; infra errors are counted, never scored as failures."""
    family_of = {t.id: t.family for t in tasks}
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_task[trajectory.task_id].append(trajectory)

    def block(task_ids: list[str]) -> dict[str, Any]:
        scored = [t for i in task_ids for t in by_task[i] if t.status is not Status.INFRA_ERROR]
        out: dict[str, Any] = {
            "tasks": len(task_ids),
            "rollouts": sum(len(by_task[i]) for i in task_ids),
            "scored_rollouts": len(scored),
            "statuses": dict(
                Counter(t.status.value for t in (x for i in task_ids for x in by_task[i]))
            ),
            "mean_reward": _mean([t.reward or 0.0 for t in scored]),
            "pass@1": _mean([1.0 if t.solved else 0.0 for t in scored]),
            "mean_turns": _mean([float(len(t.turns)) for t in scored]),
            "mean_completion_tokens": _mean(
                [t.metrics.get("completion_tokens", 0.0) for t in scored]
            ),
            "mean_tool_calls": _mean([float(t.counters.get("tool_calls", 0)) for t in scored]),
            "mean_hints": _mean([float(t.counters.get("hints", 0)) for t in scored]),
            "splits": sum(t.counters.get("splits", 0) for t in scored),
        }
        for kk in range(1, k + 1):
            values = []
            for i in task_ids:
                group = [t for t in by_task[i] if t.status is not Status.INFRA_ERROR]
                if len(group) >= kk:
                    correct = sum(1 for t in group if t.solved)
                    values.append(pass_at_k(len(group), correct, kk))
            out[f"pass@{kk}"] = _mean(values)
        return out

    families = sorted({family_of[t] for t in by_task if t in family_of})
    summary: dict[str, Any] = {"overall": block(list(by_task))}
    summary["families"] = {
        f: block([i for i in by_task if family_of.get(i) == f]) for f in families
    }
    stage_keys = sorted({key for t in trajectories for key in t.timings})
    summary["stage_times_mean_s"] = {
        key: _mean([t.timings[key] for t in trajectories if key in t.timings]) for key in stage_keys
    }
    return summary


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


Z95 = 1.959964  # the two-sided 95% quantile of the standard normal


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval (95% by default) of a proportion; fractional successes are allowed
    (a mean of per-task pass@k). With no trials it is the whole [0, 1]."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def eval_report(trajectories: Sequence[Trajectory], tasks: Sequence[Task]) -> dict[str, Any]:
    """Pass rate with its 95% interval, overall and per family; infra errors are not scored."""
    family = {t.id: t.family for t in tasks}

    def block(items: list[Trajectory]) -> dict[str, Any]:
        scored = [t for t in items if t.status is not Status.INFRA_ERROR]
        wins = sum(1 for t in scored if t.solved)
        low, high = wilson_interval(wins, len(scored))
        return {
            "pass_rate": wins / len(scored) if scored else 0.0,
            "n": len(scored),
            "ci95": [low, high],
            "infra_errors": len(items) - len(scored),
            "statuses": {s.value: sum(1 for t in items if t.status is s) for s in Status},
        }

    report = block(list(trajectories))
    report["families"] = {
        name: block([t for t in trajectories if family.get(t.task_id) == name])
        for name in sorted(set(family.values()))
    }
    return report
