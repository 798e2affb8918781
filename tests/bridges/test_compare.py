"""`conveyor bridge compare`: identical runs pass; a changed id, a logprob past the tolerance or
a missing rollout fails with the first mismatch named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conveyor.types import Status, Trajectory, Turn


def _trajectory(task: str, ids: list[int], logprob: float, reward: float) -> Trajectory:
    first = Turn(
        prompt_ids=[1, 2, 3],
        completion_ids=ids,
        completion_logprobs=[logprob] * len(ids),
        loss_mask=[1] * len(ids),
    )
    second = Turn(
        prompt_ids=[1, 2, 3, *ids, 9],
        completion_ids=[7, 8],
        completion_logprobs=[-0.5, -0.25],
        loss_mask=[1, 1],
    )
    return Trajectory(task_id=task, turns=[first, second], reward=reward, status=Status.OK)


def _run(folder: Path, trajectories: list[Trajectory]) -> Path:
    folder.mkdir()
    (folder / "trajectories.jsonl").write_text("".join(t.to_json() + "\n" for t in trajectories))
    return folder


def _compare(*args: str) -> tuple[int, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "bridge", "compare", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_identical_runs_within_tolerance_exit_0(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", [_trajectory("t1", [4, 5], -0.1, 1.0), _trajectory("t2", [6], -1, 0)])
    b = _run(
        tmp_path / "b", [_trajectory("t2", [6], -1.0004, 0), _trajectory("t1", [4, 5], -0.1, 1.0)]
    )
    code, out = _compare(str(a), str(b))
    assert code == 0
    assert out["turns"] == 4
    assert out["identical_ids"] is True
    assert out["first_mismatch"] is None
    assert abs(float(out["max_abs_logprob_diff"]) - 4e-4) < 1e-9  # type: ignore[arg-type]
    assert out["pass_at_1"] == [0.5, 0.5]


def test_a_changed_completion_id_is_the_first_mismatch_and_exits_1(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", [_trajectory("t1", [4, 5], -0.1, 1.0)])
    b = _run(tmp_path / "b", [_trajectory("t1", [4, 6], -0.1, 0.0)])
    code, out = _compare(str(a), str(b))
    assert code == 1
    assert out["identical_ids"] is False
    mismatch = out["first_mismatch"]
    assert isinstance(mismatch, dict)
    assert (mismatch["rollout"], mismatch["turn"], mismatch["field"]) == (
        "t1/0",
        0,
        "completion_ids",
    )
    assert out["pass_at_1"] == [1.0, 0.0]


def test_logprobs_past_the_tolerance_exit_1_but_a_looser_tol_passes(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", [_trajectory("t1", [4, 5], -0.1, 1.0)])
    b = _run(tmp_path / "b", [_trajectory("t1", [4, 5], -0.105, 1.0)])
    code, out = _compare(str(a), str(b))
    assert code == 1 and out["identical_ids"] is True
    code, _ = _compare(str(a), str(b), "--tol", "0.01")
    assert code == 0


def test_a_rollout_missing_from_one_run_fails(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", [_trajectory("t1", [4], -0.1, 1.0), _trajectory("t2", [4], -1, 1)])
    b = _run(tmp_path / "b", [_trajectory("t1", [4], -0.1, 1.0)])
    code, out = _compare(str(a), str(b / "trajectories.jsonl"))
    assert code == 1
    assert out["missing"] and "t2/0" in str(out["missing"])


def test_a_folder_without_trajectories_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "bridge",
            "compare",
            str(tmp_path / "empty"),
            str(tmp_path / "empty"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "no trajectories.jsonl" in done.stderr
