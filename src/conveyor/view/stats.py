"""Summary numbers of one trajectory source (an eval, or a training run's rollouts), computed from
the trajectories themselves so every source of every run is summarized the same way.

Infra errors are counted but never scored (see `conveyor.types.Status`). pass@k is the unbiased
per-task estimate (`conveyor.eval.pass_at_k`) averaged over tasks; its 95% interval is Wilson's
with the tasks as the trials, since tasks, not rollouts of one task, are the independent draws.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from conveyor.eval import pass_at_k

_Z95 = 1.959964


def wilson(successes: float, trials: int) -> tuple[float, float]:
    """Wilson score 95% interval of a proportion (fractional successes allowed)."""
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    denominator = 1 + _Z95**2 / trials
    centre = (p + _Z95**2 / (2 * trials)) / denominator
    half = _Z95 * math.sqrt(p * (1 - p) / trials + _Z95**2 / (4 * trials**2)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def _passed(record: dict[str, Any]) -> bool:
    return float(record.get("reward") or 0.0) >= 1.0


def _scored(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("status") != "infra_error"]


def block(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts, statuses, pass@1 with its interval and means of a set of trajectories."""
    scored = _scored(records)
    wins = sum(1 for r in scored if _passed(r))
    low, high = wilson(wins, len(scored))
    rewards = [float(r.get("reward") or 0.0) for r in scored]
    return {
        "rollouts": len(records),
        "scored": len(scored),
        "statuses": dict(Counter(str(r.get("status", "ok")) for r in records)),
        "pass1": wins / len(scored) if scored else 0.0,
        "pass1_ci": [low, high],
        "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "mean_turns": _mean([len(r.get("turns") or []) for r in scored]),
        "mean_hints": _mean([(r.get("counters") or {}).get("hints", 0) for r in scored]),
        "splits": sum((r.get("counters") or {}).get("splits", 0) for r in scored),
    }


def pass_at_ks(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """pass@k for k = 1 .. the largest group, each over tasks with at least k scored rollouts."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in _scored(records):
        by_task[str(record.get("task_id"))].append(record)
    largest = max((len(group) for group in by_task.values()), default=0)
    rows = []
    for k in range(1, largest + 1):
        values = [
            pass_at_k(len(group), sum(1 for r in group if _passed(r)), k)
            for group in by_task.values()
            if len(group) >= k
        ]
        mean = sum(values) / len(values)
        low, high = wilson(mean * len(values), len(values))
        rows.append({"k": k, "value": mean, "ci": [low, high], "tasks": len(values)})
    return rows


def summarize_source(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one source: overall block, pass@k rows and a block per family."""
    families: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        families[str(record.get("family", "unknown"))].append(record)
    return {
        "overall": block(records),
        "pass_at_k": pass_at_ks(records),
        "families": {name: block(families[name]) for name in sorted(families)},
    }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0
