"""`kill -9` of a real `conveyor train` at four points, then `--resume`: nothing lost or repeated.

Real pieces: the CLI in a subprocess, the embedded model on in-process vLLM, the trainer, real
checkpoints in a real run folder. The kill is a real SIGKILL that the process sends itself at a
named point of a named step (the test-only `CONVEYOR_KILL_AT` hook, `conveyor.trainer.faults`).
Steps are two tasks x two samples, checkpointed after every step.

Each process starts the engine and the trainer (most of its time), so the four sync kill points
are one chain in one run folder, not four runs: the run is killed in step 2, its resume in step
3, that resume's resume in step 4 and so on, each at the next point, and the last resume
finishes. Every kill is checked on what it left and every resume on what it re-ran, as four
separate runs were: a point whose kill or resume broke fails its own link of the chain (the
message names the point). Async mode, whose kill re-runs two steps, is its own run.
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

CONFIG = "configs/filenav.yaml"
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
KEEP_CHECKPOINTS = 2  # rl.checkpoints.keep's default: the newest two stay published


def train(*args: str, mode: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    # Unbuffered: a killed resume's "resumed from" line reaches the pipe before the SIGKILL.
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_KILL_AT"}
    env["PYTHONUNBUFFERED"] = "1"
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


SHAPES = {
    "sync": ["rl.steps=5", "rl.mode=sync"],
    "async": ["rl.steps=3", "rl.mode=async"],
}
# The sync chain: (point, step killed in, that step's trajectories on disk at the kill). Each
# step after the first is killed once, so each kill's resume re-runs exactly the step killed.
CHAIN = [
    ("rollouts", 2, 0),
    ("train_step", 3, 4),
    ("weight_sync", 4, 4),
    ("checkpoint_write", 5, 4),
]


def check_killed(
    killed: subprocess.CompletedProcess[str],
    run_dir: Path,
    point: str,
    step: int,
    recorded: int,
    rerun: list[int],
) -> None:
    """What a kill at `point` of `step` left: whole lines, checkpoints up to the step before."""
    assert killed.returncode == -signal.SIGKILL, f"{point}: {killed.stderr[-3000:]}"
    checkpoints = run_dir / "checkpoints"
    published = [f"step_{s:06d}" for s in range(max(1, step - KEEP_CHECKPOINTS), step)]
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == (
        published
    ), point
    if point == "checkpoint_write":
        # The step's checkpoint is complete in its temp folder, marker and all, but unpublished.
        assert (checkpoints / f".tmp-step_{step:06d}" / "checkpoint.json").is_file()
    # What the kill left is whole lines only; the steps it interrupted had begun.
    before = list(range(1, rerun[0]))  # up to the checkpoint the resume will load
    assert [r["step"] for r in records(run_dir / "progress.jsonl")] == [*before, *rerun], point
    metrics_at_kill = [r["step"] for r in records(run_dir / "metrics.jsonl")]
    assert metrics_at_kill == ([*before, step] if point == "checkpoint_write" else before), point
    at_kill = [r for r in records(run_dir / "rollouts.jsonl") if r["step"] == step]
    assert len(at_kill) == recorded, point


def check_resumed(stdout: str, point: str, rerun: list[int]) -> None:
    """What a resume said: the published checkpoint before the re-run steps is the one loaded
    (never the temp folder), and which steps it re-runs."""
    origin = rerun[0] - 1
    assert f"resumed from step_{origin:06d}: step {origin}, cursor {2 * origin}" in stdout, (
        point,
        stdout[-3000:],
    )
    listed = ", ".join(str(s) for s in rerun)
    rerun_rollouts = ROLLOUTS_PER_STEP * len(rerun)
    assert f"re-running step(s) {listed}: {rerun_rollouts} rollouts" in stdout, point


def check_finished(run_dir: Path, steps: int, kills: list[tuple[str, int, int, list[int]]]) -> None:
    """The finished run: every step once, in an uninterrupted run's order, each resume counted
    in the first step it re-ran, and served by the weights of the checkpoint before it."""
    checkpoints = run_dir / "checkpoints"
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".")]
    metrics = records(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))  # none repeated or skipped
    resumed_at = {rerun[0]: (point, recorded, rerun) for point, _, recorded, rerun in kills}
    for m in metrics:
        if m["step"] not in resumed_at:
            assert "resume/rerun_rollouts" not in m, m["step"]
            continue
        point, recorded, rerun = resumed_at[m["step"]]
        assert m["resume/from_step"] == m["step"] - 1, point
        assert m["resume/rerun_steps"] == len(rerun), point
        assert m["resume/rerun_rollouts"] == ROLLOUTS_PER_STEP * len(rerun), point
        assert m["resume/discarded_trajectories"] == recorded, point
    rollouts = records(run_dir / "rollouts.jsonl")
    assert [r["step"] for r in rollouts] == [
        s for s in range(1, steps + 1) for _ in range(ROLLOUTS_PER_STEP)
    ]
    # The same data order as an uninterrupted run.
    assert tasks_by_step(rollouts) == expected_tasks(steps)
    assert [r["tasks"] for r in records(run_dir / "progress.jsonl")] == list(
        expected_tasks(steps).values()
    )
    discarded = records(run_dir / "rollouts.discarded.jsonl")
    for point, step, recorded, rerun in kills:
        # The engine served the checkpoint's weights for the re-run step.
        versions = {
            t["policy_version"] for r in rollouts if r["step"] == rerun[0] for t in r["turns"]
        }
        assert versions == {rerun[0] - 1}, point
        assert len([r for r in discarded if r["step"] == step]) == recorded, point
    assert len(discarded) == sum(recorded for _, _, recorded, _ in kills)


def test_kill_9_at_each_point_of_a_sync_run_then_resume_repeats_and_skips_nothing(
    tmp_path: Path, model_dir: Path
) -> None:
    """Five steps, killed at `rollouts` in step 2, its resume at `train_step` in step 3, that
    one's resume at `weight_sync` in step 4, the next at `checkpoint_write` in step 5; the last
    resume finishes. Each link asserts what the separate runs did: after each kill what is on
    disk (`check_killed`), after each resume what it loaded and re-ran (`check_resumed`, from
    the killed resume's own output), and at the end every resumed step's counters, versions
    and discarded trajectories, per point (`check_finished`)."""
    run_dir = tmp_path / "run"
    kills = [(point, step, recorded, [step]) for point, step, recorded in CHAIN]
    t0 = time.monotonic()
    process = train("--set", f"run.dir={run_dir}", mode="sync", kill_at="rollouts:2")
    for index, (point, step, recorded, rerun) in enumerate(kills):
        if index:
            process = train("--resume", str(run_dir), mode="sync", kill_at=f"{point}:{step}")
            # This resume, killed in its second step, first re-ran the step killed before.
            check_resumed(process.stdout, kills[index - 1][0], kills[index - 1][3])
        check_killed(process, run_dir, point, step, recorded, rerun)
    resumed = train("--resume", str(run_dir), mode="sync")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    check_resumed(resumed.stdout, kills[-1][0], kills[-1][3])
    print(f"\nsync chain of {len(kills)} kills: {time.monotonic() - t0:.1f}s")
    check_finished(run_dir, 5, kills)


def test_kill_9_in_an_async_update_then_resume_reruns_the_two_steps_begun(
    tmp_path: Path, model_dir: Path
) -> None:
    """Killed in step 2's update while step 3's rollouts are already generating: the two steps
    begun after checkpoint 1 are re-run."""
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    killed = train("--set", f"run.dir={run_dir}", mode="async", kill_at="train_step:2")
    check_killed(killed, run_dir, "train_step", 2, 4, [2, 3])
    resumed = train("--resume", str(run_dir), mode="async")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    print(f"\nasync train_step: {time.monotonic() - t0:.1f}s")
    check_resumed(resumed.stdout, "train_step", [2, 3])
    check_finished(run_dir, 3, [("train_step", 2, 4, [2, 3])])
