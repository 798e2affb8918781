"""The real dispatch workload: every strategy on the embedded model through in-process vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_real_workload_reports_every_strategy(model_dir: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "bench",
            "dispatch",
            "--workload",
            "real",
            "--json",
            "--strategies",
            "batch,bounded_batch,pipeline",
            "--set",
            "tasks.num_tasks=2",
            "--set",
            "tasks.group_size=2",
            "--set",
            "agent.max_turns=2",
            "--set",
            "agent.max_completion_tokens=24",
            "--set",
            "dispatch.max_parallel=4",
            "--set",
            "dispatch.p_run=4",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["trajectories"] == 8
    assert set(report["strategies"]) == {"batch", "bounded_batch", "pipeline"}
    for numbers in report["strategies"].values():
        assert numbers["makespan_s"] > 0 and 0 < numbers["first_group_fraction"] <= 1
        assert 0 <= numbers["engine_utilisation"] <= 1
        assert sum(numbers["statuses"].values()) == 8  # every rollout, each with its status
        assert 0 <= numbers["mean_reward"] <= 1
    assert report["ratios"]["pipeline_over_bounded_batch"] > 0
