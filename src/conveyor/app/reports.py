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


def pass_hat_k(n: int, c: int, k: int) -> float:
    """tau-bench's pass^k from n samples with c correct: the chance that k samples drawn
    without replacement are ALL correct, C(c, k) / C(n, k) (Yao et al., 2024)."""
    return math.comb(c, k) / math.comb(n, k) if n >= k else 0.0


def summarize(trajectories: Sequence[Trajectory], tasks: Sequence[Task], k: int) -> dict[str, Any]:
    """Aggregate metrics of an evaluation; infra errors are counted, never scored as failures."""
    family_of = {t.id: t.family for t in tasks}
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_task[trajectory.task_id].append(trajectory)

    def block(task_ids: list[str]) -> dict[str, Any]:
        scored = [t for i in task_ids for t in by_task[i] if t.status is not Status.INFRA_ERROR]
        # With no scored rollout (all infrastructure errors) there is no rate: every rate is
        # None and `no_data` says why, never a pass@1 of 0.0 the policy did not earn.
        rate = _mean if scored else _no_data
        out: dict[str, Any] = {
            "tasks": len(task_ids),
            "rollouts": sum(len(by_task[i]) for i in task_ids),
            "scored_rollouts": len(scored),
            "statuses": dict(
                Counter(t.status.value for t in (x for i in task_ids for x in by_task[i]))
            ),
            "mean_reward": rate([t.reward or 0.0 for t in scored]),
            "pass@1": rate([1.0 if t.solved else 0.0 for t in scored]),
            "mean_turns": rate([float(len(t.turns)) for t in scored]),
            "mean_completion_tokens": rate(
                [t.metrics.get("completion_tokens", 0.0) for t in scored]
            ),
            "mean_tool_calls": rate([float(t.counters.get("tool_calls", 0)) for t in scored]),
            "mean_hints": rate([float(t.counters.get("hints", 0)) for t in scored]),
            "splits": sum(t.counters.get("splits", 0) for t in scored),
            "no_data": not scored,
        }
        for kk in range(1, k + 1):
            values, every = [], []
            for i in task_ids:
                group = [t for t in by_task[i] if t.status is not Status.INFRA_ERROR]
                if len(group) >= kk:
                    correct = sum(1 for t in group if t.solved)
                    values.append(pass_at_k(len(group), correct, kk))
                    every.append(pass_hat_k(len(group), correct, kk))
            out[f"pass@{kk}"] = rate(values)
            out[f"pass^{kk}"] = rate(every)  # tau2's metric: all of k tries solve it
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


def _no_data(values: Sequence[float]) -> None:
    """The rate of a block with no scored rollout: none."""
    return None


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
    """Pass rate with its 95% interval, overall and per family; infra errors are not scored,
    and a block with only infra errors has `pass_rate` None and `no_data` true."""
    family = {t.id: t.family for t in tasks}

    def block(items: list[Trajectory]) -> dict[str, Any]:
        scored = [t for t in items if t.status is not Status.INFRA_ERROR]
        wins = sum(1 for t in scored if t.solved)
        low, high = wilson_interval(wins, len(scored))
        return {
            "pass_rate": wins / len(scored) if scored else None,
            "no_data": not scored,
            "n": len(scored),
            "ci95": [low, high],
            "infra_errors": len(items) - len(scored),
            "statuses": {s.value: sum(1 for t in items if t.status is s) for s in Status},
        }

    report = block(list(trajectories))
    # Per instance, for paired comparisons of two evaluations on the same instances.
    report["outcomes"] = {
        t.task_id: int(t.solved) for t in trajectories if t.status is not Status.INFRA_ERROR
    }
    report["families"] = {
        name: block([t for t in trajectories if family.get(t.task_id) == name])
        for name in sorted(set(family.values()))
    }
    return report


def mcnemar_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: the binomial test of `gained` against `lost` discordant
    pairs (instances solved by only one of the two policies) at probability 1/2."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_comparison(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """`after` against `before`, two evaluation reports (their `outcomes`), on the instances
    both scored: the pass-rate difference with a 95% interval (normal, of the per-instance
    differences), the discordant counts and the exact McNemar p-value."""
    a, b = before.get("outcomes"), after.get("outcomes")
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise ValueError("paired comparison needs per-instance outcomes in both reports")
    common = sorted(set(a) & set(b))
    diffs = [int(b[i]) - int(a[i]) for i in common]
    n = len(diffs)
    mean = sum(diffs) / n if n else 0.0
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    half = Z95 * math.sqrt(var / n) if n else 0.0
    gained, lost = diffs.count(1), diffs.count(-1)
    return {
        "n": n,
        "before": sum(int(a[i]) for i in common) / n if n else 0.0,
        "after": sum(int(b[i]) for i in common) / n if n else 0.0,
        "delta": mean,
        "ci95": [mean - half, mean + half],
        "gained": gained,
        "lost": lost,
        "mcnemar_p": mcnemar_p(gained, lost),
    }


# Two-sided 97.5% quantiles of Student's t by degrees of freedom (a 95% interval of a mean over a
# few seeds); beyond the table the normal quantile is close enough.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean of `values` and its 95% t-interval (the seeds of one arm); one value: no width."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _T975.get(n - 1, Z95) * sd / math.sqrt(n)
    return mean, mean - half, mean + half
