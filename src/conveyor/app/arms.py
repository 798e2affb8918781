"""RL's own share, arm by arm: the report of `conveyor report arms`.

An arm is a name and the run folders of its seeds (`conveyor train` runs with a warm start and
held-out evaluations: `eval_after_sft.json` and `eval_after.json`, each with per-instance
`outcomes`). Per run: the pass rates before, after the warm start and after RL, and RL's share
(after RL minus after the warm start) with its paired test on the same instances. Per arm: the
mean share over seeds with a 95% t-interval, whether every seed's share is positive, and the
paired test pooled over all seeds' instances. The protocol it serves (an RL arm beside `lr=0`
and shuffled-reward controls) is in docs/algorithms.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conveyor.app.reports import mean_interval, paired_comparison

SIGNIFICANCE = 0.05


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing (a training run with a warm start and rl.eval.tasks > 0 writes it)"
        )
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def run_result(run_dir: Path) -> dict[str, Any]:
    """One seed's numbers from its run folder."""
    after_sft = _read(run_dir / "eval_after_sft.json")
    after = _read(run_dir / "eval_after.json")
    before_path = run_dir / "eval_before.json"
    before = json.loads(before_path.read_text()) if before_path.is_file() else None
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    share = paired_comparison(after_sft, after)
    return {
        "run": str(run_dir),
        "before": before["pass_rate"] if before else None,
        "after_sft": after_sft["pass_rate"],
        "after_sft_ci95": after_sft.get("ci95"),
        "after": after["pass_rate"],
        "after_ci95": after.get("ci95"),
        "share": share,
        "wall_s": summary.get("timings", {}).get("wall_s"),
        "outcomes": (after_sft["outcomes"], after["outcomes"]),
    }


def arm_result(runs: Sequence[Path]) -> dict[str, Any]:
    """The seeds of one arm, with the mean share, its interval and the pooled paired test."""
    if not runs:
        raise ValueError("an arm needs at least one run folder")
    results = [run_result(run) for run in runs]
    shares = [r["share"]["delta"] for r in results]
    mean, low, high = mean_interval(shares)
    pooled_sft: dict[str, int] = {}
    pooled_after: dict[str, int] = {}
    for index, result in enumerate(results):
        sft, after = result.pop("outcomes")
        pooled_sft.update({f"{index}/{k}": v for k, v in sft.items()})
        pooled_after.update({f"{index}/{k}": v for k, v in after.items()})
    pooled = paired_comparison({"outcomes": pooled_sft}, {"outcomes": pooled_after})
    return {
        "seeds": results,
        "share_mean": mean,
        "share_ci95": [low, high],
        "every_share_positive": all(s > 0 for s in shares),
        "every_seed_significant": all(
            r["share"]["mcnemar_p"] < SIGNIFICANCE and r["share"]["delta"] > 0 for r in results
        ),
        "pooled": pooled,
        "pooled_significant": pooled["mcnemar_p"] < SIGNIFICANCE and pooled["delta"] > 0,
    }


def arms_report(arms: Mapping[str, Sequence[Path]]) -> dict[str, Any]:
    """Every arm's `arm_result`, by name."""
    return {name: arm_result(runs) for name, runs in arms.items()}


def parse_arm(text: str) -> tuple[str, list[Path]]:
    """`NAME=DIR[,DIR...]` -> (name, folders); `ValueError` for anything else."""
    name, sep, dirs = text.partition("=")
    folders = [Path(d) for d in dirs.split(",") if d]
    if not sep or not name or not folders:
        raise ValueError(f"an arm is NAME=DIR[,DIR...], got {text!r}")
    return name, folders


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def arms_table(report: Mapping[str, Any]) -> str:
    """A Markdown table: one row per arm and seed, then each arm's mean share."""
    lines = [
        "| arm | run | before | after warm start | after RL | RL's share [95%] | gained/lost | "
        "McNemar p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, arm in report.items():
        for seed in arm["seeds"]:
            share = seed["share"]
            low, high = share["ci95"]
            lines.append(
                f"| {name} | {Path(seed['run']).name} | {_pct(seed['before'])} | "
                f"{_pct(seed['after_sft'])} | {_pct(seed['after'])} | "
                f"{100 * share['delta']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] | "
                f"{share['gained']}/{share['lost']} | {share['mcnemar_p']:.3g} |"
            )
        low, high = arm["share_ci95"]
        pooled = arm["pooled"]
        lines.append(
            f"| **{name}** | mean of {len(arm['seeds'])} | | | | "
            f"**{100 * arm['share_mean']:+.1f}** [{100 * low:+.1f}, {100 * high:+.1f}] | "
            f"{pooled['gained']}/{pooled['lost']} (pooled) | {pooled['mcnemar_p']:.3g} |"
        )
    return "\n".join(lines)
