"""Reading run folders, and the summary numbers computed from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conveyor.app.reports import wilson_interval as wilson
from conveyor.types import Status, Trajectory
from conveyor.view.build import compare_tasks, page_data, tokenizer_decoder
from conveyor.view.data import RunFolderError, family_of, read_run
from conveyor.view.select import shown_trajectories
from conveyor.view.stats import pass_at_ks, summarize_source

from .conftest import as_record, chosen_outcome_trajectory, write_jsonl


def test_an_eval_folder_reads_every_trajectory_with_its_family(eval_run: Path) -> None:
    records = read_run(eval_run)
    assert records.kind == "eval" and records.sources == ["eval"]
    assert len(records.trajectories) == 8
    assert {t["family"] for t in records.trajectories} == {"arithmetic", "filenav"}
    assert records.warnings == []


def test_a_torn_last_line_is_skipped_and_said_but_a_bad_middle_line_is_an_error(
    eval_run: Path,
) -> None:
    path = eval_run / "trajectories.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[0][:50]]) + "\n")
    records = read_run(eval_run)
    assert len(records.trajectories) == 8
    assert any("torn last line 9" in w for w in records.warnings)
    path.write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    with pytest.raises(RunFolderError, match=r"trajectories\.jsonl:2"):
        read_run(eval_run)


def test_a_folder_without_trajectories_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match="not a run folder"):
        read_run(tmp_path)
    with pytest.raises(RunFolderError, match="is not a folder"):
        read_run(tmp_path / "missing")


def test_family_of_prefers_configured_names_then_the_id_pattern() -> None:
    assert family_of("swe-lite-eval-0003", ["swe-lite", "arithmetic"]) == "swe-lite"
    assert family_of("filenav-train-0012", []) == "filenav"
    assert family_of("django__django-1234", ["swe"]) == "swe"
    assert family_of("django__django-1234", ["swe", "other"]) == "unknown"


def test_summary_excludes_infra_errors_and_gives_pass_at_k_per_task(
    eval_trajectories: list[Trajectory],
) -> None:
    records = [as_record(t, family=t.task_id.split("-")[0]) for t in eval_trajectories]
    summary = summarize_source(records)
    overall = summary["overall"]
    assert overall["rollouts"] == 8 and overall["scored"] == 6
    assert overall["statuses"] == {"ok": 2, "truncated": 2, "policy_error": 2, "infra_error": 2}
    assert overall["pass1"] == pytest.approx(1 / 6)
    # arithmetic-eval-0000 passes with one of two samples: pass@1 = 1/2, pass@2 = 1.
    ks = {row["k"]: row for row in summary["pass_at_k"]}
    assert ks[1]["tasks"] == 3 and ks[1]["value"] == pytest.approx(0.5 / 3)
    assert ks[2]["value"] == pytest.approx(1 / 3)
    low, high = ks[2]["ci"]
    assert low < 1 / 3 < high
    assert summary["families"]["filenav"]["scored"] == 2
    assert summary["families"]["arithmetic"]["mean_hints"] == 0.5


def test_wilson_interval_matches_the_textbook_values() -> None:
    low, high = wilson(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)
    assert pass_at_ks([]) == []


def test_a_training_folder_lists_every_source_and_pairs_eval_tasks(
    tmp_path: Path, tokenizer: Any
) -> None:
    run = tmp_path / "train-run"
    run.mkdir()
    before = [
        chosen_outcome_trajectory(tokenizer, f"filenav-eval-{i:04d}", reward=0.0) for i in range(3)
    ]
    after = [
        chosen_outcome_trajectory(tokenizer, f"filenav-eval-{i:04d}", reward=float(i == 2))
        for i in range(3)
    ]
    write_jsonl(run / "eval_before.trajectories.jsonl", [as_record(t) for t in before])
    write_jsonl(run / "eval_after.trajectories.jsonl", [as_record(t) for t in after])
    rollout = chosen_outcome_trajectory(tokenizer, "filenav-train-0000", status=Status.TRUNCATED)
    write_jsonl(
        run / "rollouts.jsonl",
        [
            as_record(rollout, step=1),
            as_record(
                rollout.model_copy(update={"status": Status.INFRA_ERROR}),
                step=1,
                superseded_by_refill=True,
            ),
        ],
    )
    write_jsonl(run / "metrics.jsonl", [{"step": 1, "train/loss": 0.5}])
    (run / "eval_before.json").write_text(json.dumps({"pass_rate": 0.0}))
    records = read_run(run)
    assert records.kind == "train"
    assert records.sources == ["eval_before", "eval_after", "rollouts"]
    assert records.reports["eval_before"] == {"pass_rate": 0.0}
    assert records.metrics == [{"step": 1, "train/loss": 0.5}]
    # The task whose reward changed comes first: it is the one worth looking at.
    assert compare_tasks(records.trajectories) == [
        "filenav-eval-0002",
        "filenav-eval-0000",
        "filenav-eval-0001",
    ]


def _rollout_records(steps: int, per_step: int) -> list[dict[str, Any]]:
    return [
        {"source": "rollouts", "step": s, "task_id": f"filenav-train-{s:04d}", "sample_index": i}
        for s in range(1, steps + 1)
        for i in range(per_step)
    ]


def test_long_training_runs_show_whole_steps_evenly_spaced_with_first_and_last() -> None:
    evals = [{"source": "eval_before", "task_id": "filenav-eval-0000"}]
    records = evals + _rollout_records(10, 4)
    shown, note = shown_trajectories(records, 12)
    assert sorted({t["step"] for t in shown if "step" in t}) == [1, 5, 10]
    assert evals[0] in shown and len(shown) == 1 + 12
    assert note is not None and "3 of 10 steps" in note and "12 of 40 rollouts" in note
    assert shown_trajectories(records, 40) == (records, None)
    shown, note = shown_trajectories(records, 0)
    assert shown == evals and note is not None
    assert {t["step"] for t in shown_trajectories(records, 5)[0] if "step" in t} == {10}
    with pytest.raises(ValueError, match="max_rollouts"):
        shown_trajectories(records, -1)


def test_the_page_says_which_steps_it_shows_and_counts_every_rollout(
    tmp_path: Path, tokenizer: Any, model_dir: Path
) -> None:
    run = tmp_path / "train"
    run.mkdir()
    rollout = chosen_outcome_trajectory(tokenizer, "filenav-train-0000", status=Status.TRUNCATED)
    write_jsonl(run / "rollouts.jsonl", [as_record(rollout, step=s) for s in range(1, 6)])
    data, _ = page_data(read_run(run), tokenizer_decoder(str(model_dir)), max_rollouts=2)
    assert [t["step"] for t in data["trajectories"]] == [1, 5]
    assert any("2 of 5 steps" in w for w in data["warnings"])
    assert data["sources"][0]["summary"]["overall"]["rollouts"] == 5
