"""Our `conveyor` agent loop inside VeRL, GPU-less: VeRL's RLHFDataset reads our exported parquet,
VeRL's instantiation path builds the loop, and its `run` samples through a fake server manager
(there is no VeRL rollout server without a GPU) that forwards to our real HFEngine on the
embedded model, or to the families' oracle (reward 1). verl_side.py runs in .venv-verl."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conveyor.config import ConveyorConfig
from conveyor.types import Task

SIDE = Path(__file__).parent / "verl_side.py"
SRC = Path(__file__).parents[3] / "src"


@pytest.fixture(scope="module")
def side(
    verl_python: Path,
    model_dir: Path,
    verl_config: ConveyorConfig,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("verl-side")
    config = verl_config
    (work / "config.json").write_text(config.model_dump_json())
    done = subprocess.run(
        [str(verl_python), str(SIDE), str(work), str(model_dir), str(work / "config.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["config"] = config
    return result


def assert_output_matches_calls(output: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    """The one sequence holds every generation at the place its prompt ends, mask 1 and the
    engine's logprobs there, and mask 0 / logprob 0 on everything between (tool output)."""
    prompt, response = output["prompt_ids"], output["response_ids"]
    mask, logprobs = output["response_mask"], output["response_logprobs"]
    assert len(response) == len(mask) == len(logprobs)
    assert calls and prompt == calls[0]["prompt_ids"]
    covered: set[int] = set()
    full = prompt + response
    for call in calls:
        start = len(call["prompt_ids"]) - len(prompt)
        assert full[: len(call["prompt_ids"])] == call["prompt_ids"]
        end = start + len(call["token_ids"])
        assert response[start:end] == call["token_ids"]
        assert mask[start:end] == [1] * len(call["token_ids"])
        assert logprobs[start:end] == call["log_probs"]
        covered.update(range(start, end))
    assert end == len(response)  # the last generation ends the sequence
    for i in set(range(len(response))) - covered:
        assert mask[i] == 0 and logprobs[i] == 0.0


@pytest.mark.slow
def test_verl_dataset_class_reads_the_exported_parquet(side: dict[str, Any]) -> None:
    config: ConveyorConfig = side["config"]
    assert side["written"] == len(side["rows"]) == len(config.tasks.families)
    for i, row in enumerate(side["rows"]):
        task = Task.model_validate_json(row["task"])
        assert row["agent_name"] == "conveyor" and row["index"] == i
        assert row["data_source"] == f"conveyor/{task.family}"
        assert row["raw_prompt"] == [
            {"role": m["role"], "content": m["content"]} for m in task.prompt
        ]


@pytest.mark.slow
def test_agent_loop_run_with_fake_server_manager_over_hf_engine(side: dict[str, Any]) -> None:
    config: ConveyorConfig = side["config"]
    for rollout in side["sampled"]:
        output, calls = rollout["output"], rollout["calls"]
        assert_output_matches_calls(output, calls)
        assert output["reward_score"] in (0.0, 1.0)
        assert output["num_turns"] >= len(calls) + 1  # system/user, then assistant and tool turns
        assert output["extra_fields"]["conveyor_dropped_samples"] == 0
        assert output["extra_fields"]["conveyor_task_id"] == rollout["task"]
        # one request id per rollout (VeRL's sticky routing); VeRL's params with our budget
        assert len({c["request_id"] for c in calls}) == 1
        for call in calls:
            params = call["sampling_params"]
            assert params["temperature"] == 0.0 and params["top_k"] == -1
            assert params["logprobs"] is True
            assert params["max_tokens"] == config.agent.max_completion_tokens
        # real sampled logprobs, not placeholders
        assert any(lp < 0 for call in calls for lp in call["log_probs"])


@pytest.mark.slow
def test_agent_loop_run_with_fake_server_manager_over_the_oracle_scores_it(
    side: dict[str, Any],
) -> None:
    solved = {r["task"]: r for r in side["oracle"]}
    filenav = next(r for task, r in solved.items() if task.startswith("filenav"))
    assert filenav["output"]["reward_score"] == 1.0
    assert len(filenav["calls"]) >= 3  # list, read, finish: tool output between generations
    assert 0 in filenav["output"]["response_mask"]
    for rollout in side["oracle"]:
        assert_output_matches_calls(rollout["output"], rollout["calls"])


@pytest.mark.slow
def test_sampling_client_maps_verl_stop_reasons_and_refuses_missing_logprobs(
    side: dict[str, Any],
) -> None:
    answers = side["answers"]
    assert answers["short"] == "stop"
    assert answers["full"] == "length"  # all of max_tokens used: VeRL does not say why it stopped
    assert answers["aborted"] == "abort"
    for name in ("no_logprobs", "short_logprobs"):
        assert (
            answers[name].startswith("EngineError")
            and "one logprob per sampled token" in answers[name]
        )
