"""`conveyor eval CONFIG`: run the agent over a task set and write a run folder.

The run folder holds `config.yaml` (the resolved config), `trajectories.jsonl` (one line per
rollout, appended and flushed as each finishes, so a crash loses nothing already done) and
`summary.json` (pass@1, pass@k, statuses, turns, tokens, stage times, wall time).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conveyor.config import ConveyorConfig, ResolvedConfig, config_to_yaml
from conveyor.types import Status, Task, Trajectory


def make_run_dir(config: ConveyorConfig, kind: str) -> Path:
    """`run.dir`, or a fresh `runs/<kind>-<timestamp>`; an explicit folder must be new or empty."""
    if config.run.dir is not None:
        run_dir = Path(config.run.dir)
        if run_dir.exists() and any(run_dir.iterdir()):
            raise FileExistsError(
                f"run folder {run_dir} already holds a run; choose another run.dir"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = Path("runs") / f"{kind}-{stamp}"
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = Path("runs") / f"{kind}-{stamp}-{suffix}"
    run_dir.mkdir(parents=True)
    return run_dir


def build_tasks(config: ConveyorConfig) -> list[Task]:
    """The configured families' instances of the configured split."""
    from conveyor.tasks.family import get_family

    tasks: list[Task] = []
    for name in config.tasks.families:
        family = get_family(name)
        tasks.extend(
            family.make_tasks(config.tasks.num_tasks, config.tasks.task_seed, config.tasks.split)
        )
    return tasks


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
            "pass@1": _mean([1.0 if (t.reward or 0.0) >= 1.0 else 0.0 for t in scored]),
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
                    correct = sum(1 for t in group if (t.reward or 0.0) >= 1.0)
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


async def run_eval(resolved: ResolvedConfig, *, show_progress: bool = True) -> Path:
    """Evaluate the configured model on the configured tasks; returns the run folder."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from conveyor.dispatch.config import DispatchSettings
    from conveyor.dispatch.factory import make_dispatcher
    from conveyor.engines.factory import build_engine, load_tokenizer
    from conveyor.models import resolve_model_path
    from conveyor.rollout import AgentStages

    config = resolved.config
    model_dir = resolve_model_path(config.model.path)
    tasks = build_tasks(config)
    run_dir = make_run_dir(config, "eval")
    (run_dir / "config.yaml").write_text(config_to_yaml(config))
    started = time.monotonic()
    tokenizer = load_tokenizer(model_dir)
    client = build_engine(config, model_dir)
    engine_ready = time.monotonic() - started
    stages = AgentStages.from_config(config, client, tokenizer)
    settings = DispatchSettings.from_config(config)
    dispatcher = make_dispatcher(settings, stages, engine=client)
    k = config.tasks.group_size
    results: list[Trajectory] = []
    total = len(tasks) * k
    try:
        with (
            (run_dir / "trajectories.jsonl").open("w") as sink,
            Progress(
                TextColumn("[bold]eval[/bold]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("pass@1 {task.fields[pass1]:.2f}"),
                TimeElapsedColumn(),
                disable=not show_progress,
            ) as progress,
        ):
            bar = progress.add_task("rollouts", total=total, pass1=0.0)
            async for trajectory in dispatcher.rollouts(tasks, k):
                results.append(trajectory)
                sink.write(trajectory.to_json() + "\n")
                sink.flush()
                passed = sum(1 for t in results if (t.reward or 0.0) >= 1.0)
                progress.update(bar, advance=1, pass1=passed / len(results))
    finally:
        await client.close()
    summary = summarize(results, tasks, k)
    summary["wall_s"] = time.monotonic() - started
    summary["engine_start_s"] = engine_ready
    summary["model"] = str(model_dir)
    summary["engine"] = config.engine.kind
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir


def eval_main(resolved: ResolvedConfig) -> Path:
    """Synchronous entry point for the CLI."""
    return asyncio.run(run_eval(resolved))
