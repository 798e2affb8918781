"""Summary numbers of one trajectory source (an eval, or a training run's rollouts), computed from
the trajectories themselves so every source of every run is summarized the same way.

Infra errors are counted but never scored (see `conveyor.types.Status`). pass@k is the unbiased
per-task estimate (`conveyor.app.reports.pass_at_k`) averaged over tasks; its 95% interval is
Wilson's with the tasks as the trials, since tasks, not rollouts of one task, are the independent
draws.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from conveyor.app.reports import pass_at_k, wilson_interval
from conveyor.types import is_solved


def _passed(record: dict[str, Any]) -> bool:
    reward = record.get("reward")
    return is_solved(float(reward) if reward is not None else None)


def _scored(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("status") != "infra_error"]


def block(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts, statuses, pass@1 with its interval and means of a set of trajectories."""
    scored = _scored(records)
    wins = sum(1 for r in scored if _passed(r))
    low, high = wilson_interval(wins, len(scored))
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
        low, high = wilson_interval(mean * len(values), len(values))
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
