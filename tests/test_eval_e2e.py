"""`conveyor eval` end to end: the embedded model on in-process vLLM over both built-in families."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor.types import Status, Trajectory

pytestmark = pytest.mark.slow


def test_eval_writes_a_complete_run_folder(quickstart_eval: tuple[Path, str]) -> None:
    # `conveyor eval configs/quickstart-eval.yaml`, 2 tasks x 2 samples, 2 turns of 32 tokens:
    # the run made once per test run (tests/conftest.py), which the viewer and bridge tests read
    made, printed = quickstart_eval
    run_dir = Path(printed.strip().splitlines()[-1])
    assert run_dir == made
    lines = (run_dir / "trajectories.jsonl").read_text().splitlines()
    trajectories = [Trajectory.from_json(line) for line in lines]
    assert len(trajectories) == 2 * 2 * 2  # families x tasks x samples: every rollout recorded
    assert {t.task_id.split("-")[0] for t in trajectories} == {"arithmetic", "filenav"}
    for t in trajectories:
        assert t.status in set(Status)
        if t.status is not Status.INFRA_ERROR:
            assert t.reward is not None and t.turns
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["overall"]["rollouts"] == 8
    assert {"pass@1", "pass@2", "mean_turns", "statuses"} <= set(summary["overall"])
    assert set(summary["families"]) == {"arithmetic", "filenav"}
    assert summary["wall_s"] > 0 and summary["stage_times_mean_s"]
    assert (run_dir / "config.yaml").is_file()
