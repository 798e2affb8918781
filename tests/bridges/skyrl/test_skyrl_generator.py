"""`ConveyorGenerator` on a real batch: filenav tasks through our dispatcher on the embedded model
(in-process transformers engine, `engine.kind: hf`), then `conveyor bridge check --backend skyrl`
on the trajectories it recorded.

The trajectories are real rollouts, made once per module into tmp.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor.app.compose import Composition
from conveyor.bridges.skyrl import ConveyorGenerator
from conveyor.bridges.skyrl.bridge_check import REPO_ROOT
from conveyor.bridges.skyrl.validation import TrajectoryRef
from conveyor.config import load_config
from conveyor.types import Trajectory

pytestmark = pytest.mark.slow

REPETITIONS = 2


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("skyrl")
    config = load_config(
        None,
        [
            "engine.kind=hf",
            "tasks.families=[filenav]",
            "tasks.split=eval",
            # Sampled, so only the batch's temperature 0 makes the repetitions equal.
            "sampling.temperature=1.0",
            "agent.max_turns=3",
            "agent.max_completion_tokens=48",
            "agent.hints.enabled=false",
        ],
    ).config
    parts = Composition(config)
    tasks = parts.tasks(2)
    rows = [(task, r) for task in tasks for r in range(REPETITIONS)]
    input_batch = {
        "prompts": [task.prompt for task, _ in rows],
        "env_classes": ["conveyor"] * len(rows),
        "env_extras": [{"task": task.model_dump_json()} for task, _ in rows],
        # SkyRL-train's default vLLM parameters, greedy.
        "sampling_params": {
            **{"min_tokens": 1, "skip_special_tokens": True, "include_stop_str_in_output": True},
            **{"max_tokens": 1024, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0},
            **{"logprobs": 1, "stop": None},
        },
        "trajectory_ids": [TrajectoryRef(task.id, r) for task, r in rows],
        "batch_metadata": None,
    }
    path = folder / "trajectories.jsonl"
    generator = ConveyorGenerator.from_composition(parts, trajectories_path=path)

    async def run() -> dict[str, Any]:
        try:
            return await generator.generate(input_batch)
        finally:
            await parts.close()

    output = asyncio.run(run())
    return {"output": output, "rows": rows, "path": path, "input": input_batch}


def test_generate_returns_one_aligned_row_per_input_row(generated: dict[str, Any]) -> None:
    output, rows = generated["output"], generated["rows"]
    n = len(rows)
    for key in ("prompt_token_ids", "response_ids", "rewards", "loss_masks", "rollout_logprobs"):
        assert len(output[key]) == n, key
    assert output["stop_reasons"] and len(output["stop_reasons"]) == n
    assert output["trajectory_ids"] == generated["input"]["trajectory_ids"]  # echoed, in order
    for i in range(n):
        response = output["response_ids"][i]
        assert response and len(output["loss_masks"][i]) == len(response)
        assert len(output["rollout_logprobs"][i]) == len(response)
        assert any(output["loss_masks"][i])  # sampled tokens train
        assert isinstance(output["rewards"][i], float)
    # temperature 0 from SkyRL's sampling_params reached the engine: repetitions are equal.
    for i in range(0, n, REPETITIONS):
        assert output["response_ids"][i] == output["response_ids"][i + 1]
    # Every rollout was recorded, and each row is its trajectory's first sample.
    recorded = {
        (t.task_id, t.sample_index): t
        for t in map(Trajectory.from_json, generated["path"].read_text().splitlines())
    }
    assert len(recorded) == n
    for i, (task, r) in enumerate(rows):
        sample = recorded[(task.id, r)].samples()[0]
        assert output["prompt_token_ids"][i] + output["response_ids"][i] == sample.input_ids
        assert output["rollout_logprobs"][i] == sample.logprobs[sample.prompt_length :]


def bridge_check(path: Path, venv: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "conveyor.cli", "bridge", "check", "--backend", "skyrl"),
            *("--trajectories", str(path), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CONVEYOR_SKYRL_VENV": str(venv)},
    )


def test_bridge_check_passes_on_real_trajectories_with_the_wheel_fallback(
    generated: dict[str, Any], tmp_path: Path
) -> None:
    done = bridge_check(generated["path"], tmp_path / "no-venv")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["samples"] >= len(generated["rows"])
    assert report["version"] == "0.4.0 (wheel, parsed)" and report["python"].endswith("(fallback)")
    names = {c["name"] for c in report["checks"]}
    assert "skyrl validate_generator_output (step_wise)" in names


def test_bridge_check_passes_in_venv_skyrl(generated: dict[str, Any]) -> None:
    venv = Path(os.environ.get("CONVEYOR_SKYRL_VENV", REPO_ROOT / ".venv-skyrl"))
    if not (venv / "bin" / "python").exists():
        pytest.skip("no .venv-skyrl (bash scripts/venv-skyrl.sh builds it where Python 3.12 is)")
    done = bridge_check(generated["path"], venv)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["version"] == "0.4.0"
    assert tuple(int(x) for x in report["python"].split(".")[:2]) >= (3, 12)
