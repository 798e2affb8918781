"""`conveyor bridge compare RUN...`: do runs of one task set on different backends sample the
same tokens?

Each RUN is a run folder (its `trajectories.jsonl`) or a trajectories JSONL file. Rollouts are
matched by (task id, sample index) and compared turn by turn against the first run: prompt and
completion ids must be equal, and completion logprobs within `tol`. Greedy runs of the same
weights on in-process vLLM, a vLLM server and the recording gateway must agree exactly on ids;
logprobs may differ by numerics only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.types import Status, Trajectory

TRAJECTORIES = "trajectories.jsonl"


def read_run(path: Path) -> list[Trajectory]:
    """The trajectories of a run folder (`trajectories.jsonl`) or of a JSONL file."""
    file = path / TRAJECTORIES if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no {TRAJECTORIES} (not an eval run folder)")
    out: list[Trajectory] = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(Trajectory.model_validate_json(line))
            except ValueError as exc:
                raise ValueError(f"{file}:{number}: not a trajectory: {exc}") from exc
    return out


@dataclass
class Comparison:
    """What `compare` found; `as_json` is the command's last line."""

    runs: list[str]
    turns: int = 0
    identical_ids: bool = True
    first_mismatch: dict[str, Any] | None = None
    max_abs_logprob_diff: float = 0.0
    pass_at_1: list[float] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def ok(self, tol: float) -> bool:
        """Identical ids, logprobs within `tol`, the same rollouts in every run."""
        return self.identical_ids and self.max_abs_logprob_diff <= tol and not self.missing

    def as_json(self) -> dict[str, Any]:
        """`{"turns", "identical_ids", "first_mismatch", "max_abs_logprob_diff", "pass_at_1"}`
        plus the runs and any rollout missing from a run."""
        return {
            "turns": self.turns,
            "identical_ids": self.identical_ids,
            "first_mismatch": self.first_mismatch,
            "max_abs_logprob_diff": self.max_abs_logprob_diff,
            "pass_at_1": self.pass_at_1,
            "runs": self.runs,
            "missing": self.missing,
        }


def _pass_at_1(trajectories: list[Trajectory]) -> float:
    scored = [t for t in trajectories if t.status is not Status.INFRA_ERROR]
    return sum(t.solved for t in scored) / len(scored) if scored else 0.0


def compare(paths: list[Path]) -> Comparison:
    """Compare every run with the first, turn by turn (see the module doc)."""
    if len(paths) < 2:
        raise ValueError("compare needs at least two runs")
    runs = [read_run(p) for p in paths]
    result = Comparison(runs=[str(p) for p in paths], pass_at_1=[_pass_at_1(r) for r in runs])
    keyed = [{(t.task_id, t.sample_index): t for t in run} for run in runs]
    reference = keyed[0]
    for index, other in enumerate(keyed[1:], 1):
        for key in sorted(set(reference) ^ set(other)):
            where = paths[0] if key not in reference else paths[index]
            result.missing.append(f"{key[0]}/{key[1]} missing from {where}")
        for key in sorted(set(reference) & set(other)):
            _compare_rollout(result, key, reference[key], other[key], paths[index])
    if result.missing:
        result.identical_ids = False
    return result


def _compare_rollout(
    result: Comparison, key: tuple[str, int], a: Trajectory, b: Trajectory, run: Path
) -> None:
    rollout = f"{key[0]}/{key[1]}"
    if len(a.turns) != len(b.turns):
        _mismatch(
            result,
            rollout,
            min(len(a.turns), len(b.turns)),
            run,
            "turn count",
            f"{len(a.turns)} vs {len(b.turns)} turns",
        )
    for turn, (x, y) in enumerate(zip(a.turns, b.turns, strict=False)):
        result.turns += 1
        if list(x.prompt_ids) != list(y.prompt_ids):
            _mismatch(
                result, rollout, turn, run, "prompt_ids", _first_diff(x.prompt_ids, y.prompt_ids)
            )
            continue
        if list(x.completion_ids) != list(y.completion_ids):
            _mismatch(
                result,
                rollout,
                turn,
                run,
                "completion_ids",
                _first_diff(x.completion_ids, y.completion_ids),
            )
            continue
        for p, q in zip(x.completion_logprobs, y.completion_logprobs, strict=True):
            result.max_abs_logprob_diff = max(result.max_abs_logprob_diff, abs(p - q))


def _first_diff(a: list[int], b: list[int]) -> str:
    at = next(
        (i for i, (p, q) in enumerate(zip(a, b, strict=False)) if p != q), min(len(a), len(b))
    )
    return (
        f"differ at token {at} ({a[at : at + 3]} vs {b[at : at + 3]}; lengths {len(a)}, {len(b)})"
    )


def _mismatch(
    result: Comparison, rollout: str, turn: int, run: Path, what: str, detail: str
) -> None:
    result.identical_ids = False
    if result.first_mismatch is None:
        result.first_mismatch = {
            "rollout": rollout,
            "turn": turn,
            "run": str(run),
            "field": what,
            "detail": detail,
        }
