"""What a `--resume` does to a run folder before the first resumed step, and what it counts.

A run killed at any point (`kill -9`) resumes from its newest complete checkpoint (step K, or
the start when there is none). Everything after K is re-run, nothing is recovered: the rollouts
of a step after K were sampled by weights that, in async mode, K does not hold, and even in sync
mode their step's update is lost; re-running them from K's data cursor gives the same tasks in
the same order. Before the first resumed step:

- `metrics.jsonl`, `rollouts.jsonl` and `progress.jsonl` lose their records of steps after K and
  a torn last line (see `conveyor.trainer.jsonl`);
- the trajectories of those steps that had reached `rollouts.jsonl` move to
  `rollouts.discarded.jsonl` (nothing silently dropped);
- `progress.jsonl` (one record per step whose rollouts started) says which steps were begun
  after K and how many rollouts they had scheduled: these are the re-run rollouts, counted in
  the first resumed step's metrics (`resume/*`) and said in the resume log line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from conveyor.trainer.jsonl import append_records, repair

METRICS = "metrics.jsonl"
ROLLOUTS = "rollouts.jsonl"
DISCARDED = "rollouts.discarded.jsonl"
PROGRESS = "progress.jsonl"


@dataclass(frozen=True)
class ResumeReport:
    """What preparing a resume from step `step` removed and what will be re-run."""

    step: int
    rerun_steps: tuple[int, ...] = ()  # steps begun after the checkpoint
    rerun_rollouts: int = 0  # rollouts those steps had scheduled (in flight or finished)
    discarded_trajectories: int = 0  # of those, recorded in rollouts.jsonl, now moved aside
    torn_lines: int = 0  # partial last lines dropped, over all files

    def metrics(self) -> dict[str, float]:
        """The counters for the first resumed step's `metrics.jsonl` line."""
        return {
            "resume/from_step": float(self.step),
            "resume/rerun_steps": float(len(self.rerun_steps)),
            "resume/rerun_rollouts": float(self.rerun_rollouts),
            "resume/discarded_trajectories": float(self.discarded_trajectories),
            "resume/torn_lines": float(self.torn_lines),
        }

    def describe(self) -> str:
        """One line for the console."""
        if not self.rerun_steps:
            return f"nothing begun after step {self.step} to re-run"
        steps = ", ".join(str(s) for s in self.rerun_steps)
        return (
            f"re-running step(s) {steps}: {self.rerun_rollouts} rollouts begun before the kill "
            f"are run again, none recovered ({self.discarded_trajectories} already recorded "
            f"moved to {DISCARDED}); {self.torn_lines} torn line(s) dropped"
        )


def prepare_resume(run_dir: Path, step: int) -> ResumeReport:
    """Cut the run's append-only records back to `step` and count what will be re-run."""
    metrics = repair(run_dir / METRICS, step)
    rollouts = repair(run_dir / ROLLOUTS, step)
    progress = repair(run_dir / PROGRESS, step)
    append_records(run_dir / DISCARDED, rollouts.dropped)
    begun = sorted({int(r["step"]) for r in progress.dropped})
    return ResumeReport(
        step=step,
        rerun_steps=tuple(begun),
        rerun_rollouts=sum(int(r["rollouts"]) for r in progress.dropped),
        discarded_trajectories=len(rollouts.dropped),
        torn_lines=metrics.torn + rollouts.torn + progress.torn,
    )
