"""`conveyor train` refuses at start what its parts cannot do, before any evaluation runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    sets = [arg for key in (*overrides, f"run.dir={run_dir}") for arg in ("--set", key)]
    config = str(REPO / "configs" / "filenav.yaml")
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "train", config, *sets],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_train_against_a_server_that_is_not_there_fails_at_start(tmp_path: Path) -> None:
    # Nothing listens on port 9: the start-up probe says so, before any evaluation.
    run_dir = tmp_path / "run"
    result = _train(run_dir, "engine.kind=openai", "engine.base_url=http://127.0.0.1:9/v1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no OpenAI-compatible server answers at http://127.0.0.1:9/v1" in result.stderr
    assert "Traceback" not in result.stderr
    # refused before the first evaluation
    assert not (run_dir / "eval_before.json").exists()
    assert not (run_dir / "eval_before.trajectories.jsonl").exists()


def test_train_with_a_nucleus_cut_is_refused_before_the_engine_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = _train(run_dir, "sampling.top_p=0.9")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "sampling.top_p=0.9" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "eval_before.json").exists()
