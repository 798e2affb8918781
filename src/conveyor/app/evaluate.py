"""`conveyor eval CONFIG`: run the agent over a task set and write a run folder.

The run folder holds `config.yaml` (the resolved config), `trajectories.jsonl` (one line per
rollout, appended and flushed as each finishes, so a crash loses nothing already done) and
`summary.json` (pass@1, pass@k, statuses, turns, tokens, stage times, wall time). A run with
SWE tasks also writes `predictions.jsonl` in the official SWE-bench harness's format
(`instance_id`, `model_name_or_path`, `model_patch`: each instance's first graded sample), for
`python -m swebench.harness.run_evaluation --predictions_path`.

With a benchmark plan (`conveyor eval --benchmark NAME`, `conveyor.app.benchmarks`) the tasks are
the benchmark's whole set, and `benchmark.json` holds its report (the leaderboard's metric, whether
the number is comparable, the deviations that remain), also under `summary.json`'s `benchmark`.
The policy is the configured model, or a scripted one (`oracle`: the families' oracle calls;
`empty`: an empty reply), which needs no engine and runs each task once.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Literal

from conveyor.app import benchmarks
from conveyor.app.compose import Composition, make_run_dir
from conveyor.app.reports import summarize
from conveyor.config import ConveyorConfig, ResolvedConfig, config_to_yaml
from conveyor.engines.base import RequestCounters
from conveyor.engines.router import RoutedEngine
from conveyor.types import Task, ToolCall, Trajectory

POLICIES = ("model", "oracle", "empty")


async def run_eval(
    resolved: ResolvedConfig,
    *,
    show_progress: bool = True,
    plan: benchmarks.Plan | None = None,
    policy: str = "model",
) -> Path:
    """Evaluate the configured model (or a scripted `policy`) on the configured tasks, or on
    `plan`'s benchmark; returns the run folder."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    config = plan.config if plan is not None else resolved.config
    if policy != "model":
        return await _scripted_eval(config, plan, policy)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    parts = Composition(config)
    # A Ray cluster that cannot host the runtimes says so first, before any file is loaded.
    parts.start_cluster()
    model_dir = parts.model_dir
    if plan is not None:
        tasks = benchmarks.build_tasks(plan, parts.families[plan.spec.family])
    else:
        tasks = parts.tasks()
    started = time.monotonic()
    parts.tokenizer  # noqa: B018 - loaded before the clock of the engine start stops
    try:
        # checked before the run folder exists: a wrong URL or model name leaves nothing behind
        client = await parts.checked_engine()
        engine_ready = time.monotonic() - started
        run_dir = make_run_dir(config, "eval")
    except BaseException:
        await parts.close()
        raise
    (run_dir / "config.yaml").write_text(config_to_yaml(config))
    dispatcher = parts.dispatcher(parts.stages(), engine=client)
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
                passed = sum(1 for t in results if t.solved)
                progress.update(bar, advance=1, pass1=passed / len(results))
    finally:
        await parts.close()
    summary = summarize(results, tasks, k)
    summary["wall_s"] = time.monotonic() - started
    summary["engine_start_s"] = engine_ready
    summary["model"] = str(model_dir)
    summary["engine"] = config.engine.kind
    # sandbox starts: how many, how long the start limits held them, warm pool hits
    summary["runtime_starts"] = parts.runtime_starts.report()
    if isinstance(client, RequestCounters):
        # retried requests cost time but not correctness: said here, never silent
        summary["engine_requests"] = client.request_counters()
    if isinstance(client, RoutedEngine):
        # requests, sessions and moved sessions per replica: where the load went
        summary["engine_replicas"] = client.routing_summary()
    predictions = write_predictions_file(run_dir, results, model_dir.name)
    if predictions is not None:
        summary["swebench_predictions"] = predictions
    if plan is not None:
        sampling = config.sampling.model_dump(mode="json")
        _benchmark_report(run_dir, summary, plan, results, tasks, "model", sampling)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir


def write_predictions_file(
    run_dir: Path, results: list[Trajectory], model: str
) -> dict[str, int] | None:
    """`run_dir/predictions.jsonl` from the SWE grade records of `results` (one per instance:
    its lowest sample index that was graded); None (no file) when no rollout carries one.
    Returns `{"written", "ungraded"}`: instances whose every sample ended without a grade (an
    infrastructure error, a broken task) are counted, not written."""
    from conveyor.tasks.swe.dataset import prediction, write_predictions
    from conveyor.tasks.swe.family import PREDICTION_RECORD

    found: dict[str, tuple[int, dict[str, str]]] = {}
    swe_tasks: set[str] = set()
    for trajectory in results:
        for message in trajectory.messages:
            if message.get("name") == PREDICTION_RECORD and message.get("_meta"):
                swe_tasks.add(trajectory.task_id)
                instance = str(message["instance_id"])
                record = prediction(instance, str(message.get("content") or ""), model)
                if instance not in found or trajectory.sample_index < found[instance][0]:
                    found[instance] = (trajectory.sample_index, record)
    if not found:
        return None
    ordered = [found[key][1] for key in sorted(found)]
    written = write_predictions(run_dir / "predictions.jsonl", ordered)
    swe_ids = {t.task_id for t in results if t.task_id.startswith("swe-")}
    return {"written": written, "ungraded": len(swe_ids - swe_tasks)}


async def _scripted_eval(config: ConveyorConfig, plan: benchmarks.Plan | None, policy: str) -> Path:
    """One rollout per task with the scripted `policy` through the real loop, tools and grader
    (`conveyor.app.families.scripted_rollouts`), budgets widened as `conveyor tasks check` does
    so the oracle's longest rollout fits."""
    from conveyor.app.families import EMPTY_REPLY, check_config, scripted_rollouts
    from conveyor.tasks.family import say

    if len(config.tasks.families) == 1:
        config = check_config(config, config.tasks.families[0])
    parts = Composition(config)
    started = time.monotonic()
    try:
        if plan is not None:
            tasks = benchmarks.build_tasks(plan, parts.families[plan.spec.family])
        else:
            tasks = parts.tasks()
        run_dir = make_run_dir(config, "eval")
        (run_dir / "config.yaml").write_text(config_to_yaml(config))
        if policy == "oracle":
            steps = {t.id: parts.families[t.family].oracle_calls(t) for t in tasks}
            parts.config = _oracle_budgets(parts, steps)
            results = await scripted_rollouts(parts, tasks, lambda t: steps[t.id])
        else:
            results = await scripted_rollouts(parts, tasks, lambda _t: [say(EMPTY_REPLY)])
    finally:
        await parts.close()
    with (run_dir / "trajectories.jsonl").open("w") as sink:
        for trajectory in results:
            sink.write(trajectory.to_json() + "\n")
    summary = summarize(results, tasks, 1)
    summary["wall_s"] = time.monotonic() - started
    summary["policy"] = policy
    predictions = write_predictions_file(run_dir, results, f"conveyor-{policy}")
    if predictions is not None:
        summary["swebench_predictions"] = predictions
    if plan is not None:
        _benchmark_report(run_dir, summary, plan, results, tasks, policy, {})
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir


def _oracle_budgets(parts: Composition, steps: dict[str, list[ToolCall]]) -> ConveyorConfig:
    """The config with room for the oracle's longest rollout: its turns, its longest reply (a
    reasoning-gym answer can run to thousands of tokens) and all its replies in the context."""
    from conveyor.agent.parsing import format_tool_call

    config = parts.config
    fmt: Literal["hermes", "xml"] = "xml" if config.model.tool_format == "xml" else "hermes"
    tokenizer = parts.tokenizer

    def tokens(call: ToolCall) -> int:
        return len(tokenizer.encode(format_tool_call(call, fmt), add_special_tokens=False))

    sizes = [[tokens(call) for call in calls] for calls in steps.values()]
    turns = max((len(s) for s in sizes), default=1)
    reply = max((max(s, default=0) for s in sizes), default=0) + 64
    path = max((sum(s) for s in sizes), default=0)
    agent = config.agent
    context = max(agent.max_context_tokens, agent.max_context_tokens + path)
    update = {
        "max_turns": max(agent.max_turns, turns),
        "max_completion_tokens": max(agent.max_completion_tokens, reply),
        "max_context_tokens": context,
        "max_prompt_tokens": max(agent.max_prompt_tokens, context - 256),
    }
    return config.model_copy(update={"agent": agent.model_copy(update=update)})


def _benchmark_report(
    run_dir: Path,
    summary: dict[str, Any],
    plan: benchmarks.Plan,
    results: list[Trajectory],
    tasks: list[Task],
    policy: str,
    sampling: dict[str, Any],
) -> None:
    report = benchmarks.report(plan, results, tasks, policy=policy, sampling=sampling)
    summary["benchmark"] = report
    (run_dir / "benchmark.json").write_text(json.dumps(report, indent=2))


def eval_main(
    resolved: ResolvedConfig, plan: benchmarks.Plan | None = None, policy: str = "model"
) -> Path:
    """Synchronous entry point for the CLI."""
    return asyncio.run(run_eval(resolved, plan=plan, policy=policy))
