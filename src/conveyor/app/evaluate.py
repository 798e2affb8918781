"""`conveyor eval CONFIG`: run the agent over a task set and write a run folder.

The run folder holds `config.yaml` (the resolved config), `trajectories.jsonl` (one line per
rollout, appended and flushed as each finishes, so a crash loses nothing already done) and
`summary.json` (pass@1, pass@k, statuses, turns, tokens, stage times, wall time). A run with
SWE tasks also writes `predictions.jsonl` in the official SWE-bench harness's format
(`instance_id`, `model_name_or_path`, `model_patch`: each instance's first graded sample), for
`python -m swebench.harness.run_evaluation --predictions_path`.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from conveyor.app.compose import Composition, make_run_dir
from conveyor.app.reports import summarize
from conveyor.config import ResolvedConfig, config_to_yaml
from conveyor.engines.base import RequestCounters
from conveyor.engines.router import RoutedEngine
from conveyor.types import Trajectory


async def run_eval(resolved: ResolvedConfig, *, show_progress: bool = True) -> Path:
    """Evaluate the configured model on the configured tasks; returns the run folder."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    config = resolved.config
    parts = Composition(config)
    # A Ray cluster that cannot host the runtimes says so first, before any file is loaded.
    parts.start_cluster()
    model_dir = parts.model_dir
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


def eval_main(resolved: ResolvedConfig) -> Path:
    """Synchronous entry point for the CLI."""
    return asyncio.run(run_eval(resolved))
