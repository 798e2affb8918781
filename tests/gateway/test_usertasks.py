"""Your own tasks and reward (`usertasks`): a JSONL tasks file and a reward command or the
agent's own `finish` reward, reached from the config, run through `ExternalAgentStages` with a
real agent program (a process speaking HTTP to the real gateway). Only the engine's words are
scripted (a SimulatedEngine over the real tokenizer)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor.config import ConveyorConfig
from conveyor.runtime.base import RuntimeFailure
from conveyor.tasks.family import build_families, options_services
from conveyor.types import Status
from gateway.test_external_outcomes import _engine, _rollout, _stages

GRADER = """
import json, sys
asked = json.load(sys.stdin)
print("grading", asked["task_id"])
print(1.0 if asked["answer"] == asked["data"]["answer"] else 0.0)
"""


def _config(tmp_path: Path, **usertasks: Any) -> ConveyorConfig:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "\n".join(
            json.dumps(line)
            for line in [
                {"id": "t1", "prompt": "Say 7.", "data": {"answer": "7"}, "split": "eval"},
                {"id": "t2", "prompt": [{"role": "user", "content": "Say 8."}], "split": "train"},
            ]
        )
    )
    options = {"path": str(tasks), **usertasks}
    return ConveyorConfig.model_validate(
        {"tasks": {"families": ["usertasks"], "num_tasks": 1, "options": {"usertasks": options}}}
    )


def _user_stages(tokenizer: Any, tmp_path: Path, config: ConveyorConfig, *argv: str) -> Any:
    stages = _stages(tokenizer, tmp_path, _engine(tokenizer), *argv)
    families = build_families(["usertasks"], services=options_services(config.tasks.options))
    stages._families.update(families)  # as the run's composition hands its families over
    stages.gateway.families.update(families)
    return stages


def test_tasks_file_with_a_reward_command(tokenizer: Any, tmp_path: Path) -> None:
    grader = tmp_path / "grade.py"
    grader.write_text(GRADER)
    config = _config(tmp_path, reward="command", reward_command=[sys.executable, str(grader)])
    recorded = config.tasks.options["usertasks"]
    assert Path(recorded["path"]).is_absolute() and len(recorded["sha256"]) == 64
    right = _rollout(_user_stages(tokenizer, tmp_path, config, "answer", "7"), "usertasks")
    wrong = _rollout(_user_stages(tokenizer, tmp_path, config, "answer", "6"), "usertasks")
    assert right.status is Status.OK and (right.reward, wrong.reward) == (1.0, 0.0)
    assert right.task_id == "usertasks-eval-t1" and len(right.turns) == 1

    # a grader that fails is the infrastructure's failure, never a reward
    grader.write_text("import sys; sys.exit(2)")
    with pytest.raises(RuntimeFailure, match="exited 2"):
        _rollout(_user_stages(tokenizer, tmp_path, config, "answer", "7"), "usertasks")
    grader.write_text("print('maybe')")
    with pytest.raises(RuntimeFailure, match="no number"):
        _rollout(_user_stages(tokenizer, tmp_path, config, "answer", "7"), "usertasks")


def test_tasks_file_rewarded_by_the_agent_and_bad_files_refused(
    tokenizer: Any, tmp_path: Path
) -> None:
    config = _config(tmp_path)  # reward: agent (the default)
    sent = _rollout(_user_stages(tokenizer, tmp_path, config, "reward", "0.25"), "usertasks")
    assert sent.status is Status.OK and sent.reward == 0.25
    crashed = _rollout(_user_stages(tokenizer, tmp_path, config, "crash"), "usertasks")
    assert crashed.status is Status.POLICY_ERROR and crashed.reward == 0.0

    with pytest.raises(ValueError, match="needs reward_command"):
        _config(tmp_path, reward="command")
    (tmp_path / "tasks.jsonl").write_text(
        '{"id": "t1", "prompt": "a"}\n{"id": "t1", "prompt": "b"}'
    )
    with pytest.raises(ValueError, match="appears twice"):
        ConveyorConfig.model_validate(
            {
                "tasks": {
                    "families": ["usertasks"],
                    "options": {"usertasks": {"path": str(tmp_path / "tasks.jsonl")}},
                }
            }
        )
    recorded = dict(config.tasks.options["usertasks"])  # the file changed since it was recorded
    with pytest.raises(ValueError, match="changed since"):
        ConveyorConfig.model_validate(
            {"tasks": {"families": ["usertasks"], "options": {"usertasks": recorded}}}
        )
