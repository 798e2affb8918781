"""`conveyor train` refuses at start what its parts cannot do, before any evaluation runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_train_with_an_engine_that_cannot_take_weights_fails_at_start(tmp_path: Path) -> None:
    # Nothing listens on port 9: the refusal must come from the check, not from a connection.
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "train",
            str(REPO / "configs" / "quickstart.yaml"),
            "--set",
            "engine.kind=openai",
            "--set",
            "engine.base_url=http://127.0.0.1:9/v1",
            "--set",
            f"run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "engine.kind='openai'" in result.stderr and "weight_fingerprint" in result.stderr
    assert "Traceback" not in result.stderr
    # refused before the first evaluation
    assert not (run_dir / "eval_before.json").exists()
    assert not (run_dir / "eval_before.trajectories.jsonl").exists()
