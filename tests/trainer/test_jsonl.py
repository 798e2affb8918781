"""Torn-line-safe JSONL records, the resume's cut-back of a run folder, the kill hook's parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.config import ConfigError
from conveyor.trainer.faults import armed, killing_midway
from conveyor.trainer.jsonl import append_records, read_records, repair
from conveyor.trainer.resume import prepare_resume


def test_repair_drops_a_torn_tail_and_later_steps(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_records(path, [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}, {"step": 3, "a": 3.0}])
    with path.open("ab") as sink:
        sink.write(b'{"step": 4, "a": 4.')  # a write cut short by a kill
    assert [r["step"] for r in read_records(path)] == [1, 2, 3]  # readers skip the tail
    report = repair(path, 2)
    assert report.torn == 1
    assert [r["step"] for r in report.dropped] == [3]
    assert path.read_text() == '{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n'
    # Appends after the repair start on a line of their own.
    append_records(path, [{"step": 3, "a": 9.0}])
    assert [r["a"] for r in read_records(path)] == [1.0, 2.0, 9.0]
    assert not list(tmp_path.glob(".tmp-*"))


def test_repair_of_a_clean_file_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    append_records(path, [{"step": 1}, {"step": 2}])
    before = path.stat().st_mtime_ns
    assert repair(path, 5).torn == 0 and repair(path, 5).dropped == []
    assert path.stat().st_mtime_ns == before
    assert repair(tmp_path / "missing.jsonl", 0).torn == 0


def test_a_broken_line_inside_the_file_is_an_error_not_a_skip(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2"):
        repair(path, 3)
    path.write_text('{"step": 1}\n{"task_id": "a"}\n')
    with pytest.raises(ValueError, match="record 2 has no integer 'step'"):
        repair(path, 3)


def test_prepare_resume_counts_the_rerun_and_keeps_discarded_trajectories(
    tmp_path: Path,
) -> None:
    append_records(tmp_path / "metrics.jsonl", [{"step": 1}, {"step": 2}])
    append_records(
        tmp_path / "progress.jsonl",
        [
            {"step": 1, "tasks": ["a", "b"], "rollouts": 4},
            {"step": 2, "tasks": ["c", "d"], "rollouts": 4},
            {"step": 2, "refill": ["c"], "rollouts": 1},
            {"step": 3, "tasks": ["e", "f"], "rollouts": 4},
        ],
    )
    append_records(
        tmp_path / "rollouts.jsonl",
        [{"step": s, "task_id": t} for s, t in [(1, "a"), (1, "b"), (2, "c"), (2, "d")]],
    )
    with (tmp_path / "rollouts.jsonl").open("a") as sink:
        sink.write('{"step": 2, "task_')
    report = prepare_resume(tmp_path, 1)
    assert report.rerun_steps == (2, 3)
    assert report.rerun_rollouts == 9
    assert report.discarded_trajectories == 2
    assert report.torn_lines == 1
    assert report.metrics()["resume/rerun_rollouts"] == 9.0
    assert "re-running step(s) 2, 3: 9 rollouts" in report.describe()
    assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl")] == [1]
    assert [r["task_id"] for r in read_records(tmp_path / "rollouts.jsonl")] == ["a", "b"]
    aside = read_records(tmp_path / "rollouts.discarded.jsonl")
    assert [r["task_id"] for r in aside] == ["c", "d"]
    # A second resume from the same checkpoint finds nothing more to re-run.
    again = prepare_resume(tmp_path, 1)
    assert again.rerun_steps == () and again.torn_lines == 0
    # Killed before the first checkpoint: everything is re-run from step 0.
    first = prepare_resume(tmp_path, 0)
    assert first.rerun_steps == (1,) and first.rerun_rollouts == 4
    assert read_records(tmp_path / "metrics.jsonl") == []
    assert len(read_records(tmp_path / "rollouts.discarded.jsonl")) == 4


def test_kill_hook_parses_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVEYOR_KILL_AT", raising=False)
    assert armed() is None
    monkeypatch.setenv("CONVEYOR_KILL_AT", "weight_sync:2")
    assert armed() == ("weight_sync", 2)
    # Not armed for this step: the weights pass through untouched.
    assert list(killing_midway([("a", 1), ("b", 2)], 1)) == [("a", 1), ("b", 2)]
    for bad in ("weights:2", "rollouts", "rollouts:0", "rollouts:x"):
        monkeypatch.setenv("CONVEYOR_KILL_AT", bad)
        with pytest.raises(ConfigError, match="CONVEYOR_KILL_AT"):
            armed()
