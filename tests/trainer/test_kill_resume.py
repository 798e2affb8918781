"""`kill -9` of a real `conveyor train` at four points, then `--resume`: nothing lost or repeated.

Real pieces: the CLI in a subprocess, the embedded model on in-process vLLM, the trainer, real
checkpoints in a real run folder. The kill is a real SIGKILL that the process sends itself at a
named point of step 2 (the test-only `CONVEYOR_KILL_AT` hook, `conveyor.trainer.faults`). Runs
are two (sync) or three (async) steps of two tasks x two samples, checkpointed after every step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor.app.compose import Composition
from conveyor.config import load_config
from conveyor.trainer.loop import TaskStream

pytestmark = pytest.mark.slow

CONFIG = "configs/quickstart.yaml"
TINY = [
    "rl.eval.tasks=0",
    "rl.warm_start.steps=0",
    "rl.export_final=false",
    "tasks.num_tasks=8",
    "rl.tasks_per_step=2",
    "tasks.group_size=2",
    "agent.max_turns=2",
    "agent.max_completion_tokens=32",
    "rl.checkpoints.every=1",
]
ROLLOUTS_PER_STEP = 2 * 2


def train(*args: str, mode: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_KILL_AT"}
    if kill_at is not None:
        env["CONVEYOR_KILL_AT"] = kill_at
    command = [sys.executable, "-m", "conveyor.cli", "train", CONFIG]
    for item in [*TINY, *SHAPES[mode]]:
        command += ["--set", item]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=600, env=env)


def records(path: Path) -> list[dict[str, Any]]:
    """Every line of an append-only file, each of which must be a whole JSON record."""
    text = path.read_text() if path.is_file() else ""
    assert not text or text.endswith("\n"), f"{path.name} ends in a torn line"
    return [json.loads(line) for line in text.splitlines()]


def expected_tasks(steps: int) -> dict[int, list[str]]:
    """The tasks of each step as an uninterrupted run draws them."""
    config = load_config(CONFIG, TINY).config
    stream = TaskStream(
        Composition(config).tasks(config.tasks.num_tasks, "train"), config.tasks.task_seed
    )
    return {step: [t.id for t in stream.take(2)] for step in range(1, steps + 1)}


def tasks_by_step(rows: list[dict[str, Any]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for row in rows:
        ids = out.setdefault(row["step"], [])
        if row["task_id"] not in ids:
            ids.append(row["task_id"])
    return out


# sync: two steps, killed in step 2. async: three steps, killed in step 2's update while step 3's
# rollouts are already generating, so two steps begun after the checkpoint are re-run.
SHAPES = {
    "sync": ["rl.steps=2", "rl.mode=sync"],
    "async": ["rl.steps=3", "rl.mode=async"],
}
# (mode, point, step 2's trajectories on disk at the kill, steps begun after checkpoint 1)
CASES = [
    ("sync", "rollouts", 0, [2]),
    ("sync", "train_step", 4, [2]),
    ("sync", "weight_sync", 4, [2]),
    ("sync", "checkpoint_write", 4, [2]),
    ("async", "train_step", 4, [2, 3]),
]


@pytest.mark.parametrize(("mode", "point", "recorded", "rerun"), CASES)
def test_kill_9_then_resume_repeats_and_skips_nothing(
    mode: str, point: str, recorded: int, rerun: list[int], tmp_path: Path, model_dir: Path
) -> None:
    steps = int(SHAPES[mode][0].split("=")[1])
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    killed = train("--set", f"run.dir={run_dir}", mode=mode, kill_at=f"{point}:2")
    killed_s = time.monotonic() - t0
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == [
        "step_000001"
    ]
    if point == "checkpoint_write":
        # Step 2's checkpoint is complete in its temp folder, marker and all, but unpublished.
        assert (checkpoints / ".tmp-step_000002" / "checkpoint.json").is_file()
    # What the kill left is whole lines only; the steps it interrupted had begun.
    assert [r["step"] for r in records(run_dir / "progress.jsonl")] == [1, *rerun]
    metrics_at_kill = [r["step"] for r in records(run_dir / "metrics.jsonl")]
    assert metrics_at_kill == ([1, 2] if point == "checkpoint_write" else [1])
    at_kill = [r for r in records(run_dir / "rollouts.jsonl") if r["step"] == 2]
    assert len(at_kill) == recorded

    t0 = time.monotonic()
    resumed = train("--resume", str(run_dir), mode=mode)
    resumed_s = time.monotonic() - t0
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    print(f"\n{mode} {point}: killed run {killed_s:.1f}s, resume {resumed_s:.1f}s")
    # The published checkpoint of step 1 is the one loaded, never the temp folder.
    assert "resumed from step_000001: step 1, cursor 2" in resumed.stdout
    rerun_rollouts = ROLLOUTS_PER_STEP * len(rerun)
    listed = ", ".join(str(s) for s in rerun)
    assert f"re-running step(s) {listed}: {rerun_rollouts} rollouts" in resumed.stdout
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".")]

    metrics = records(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))  # none repeated or skipped
    assert "resume/rerun_rollouts" not in metrics[0]
    assert all("resume/rerun_rollouts" not in m for m in metrics[2:])
    assert metrics[1]["resume/from_step"] == 1
    assert metrics[1]["resume/rerun_steps"] == len(rerun)
    assert metrics[1]["resume/rerun_rollouts"] == rerun_rollouts
    assert metrics[1]["resume/discarded_trajectories"] == recorded
    rollouts = records(run_dir / "rollouts.jsonl")
    assert [r["step"] for r in rollouts] == [
        s for s in range(1, steps + 1) for _ in range(ROLLOUTS_PER_STEP)
    ]
    # The same data order as an uninterrupted run.
    assert tasks_by_step(rollouts) == expected_tasks(steps)
    assert [r["tasks"] for r in records(run_dir / "progress.jsonl")] == list(
        expected_tasks(steps).values()
    )
    # The engine served the checkpoint's weights (policy version 1) for the re-run step 2.
    versions = {t["policy_version"] for r in rollouts if r["step"] == 2 for t in r["turns"]}
    assert versions == {1}
    discarded = records(run_dir / "rollouts.discarded.jsonl")
    assert len(discarded) == recorded
    assert all(r["step"] == 2 for r in discarded)
