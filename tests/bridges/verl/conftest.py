"""Fixtures of the VeRL bridge tests: the VeRL venv, and real rollouts written once per session."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor.bridges.verl import BUILD_HINT, venv_python
from conveyor.config import ConveyorConfig, load_config
from conveyor.rollout import AgentStages
from conveyor.tasks.family import build_families
from conveyor.trainer.sft import OracleEngine, oracle_rollouts
from conveyor.types import Task, Trajectory

CONFIG = Path(__file__).parents[3] / "configs" / "quickstart-eval.yaml"


def bridge_config(*overrides: str) -> ConveyorConfig:
    """The quickstart eval config, greedy, hints off, short turns: what these tests roll out."""
    return load_config(
        CONFIG,
        [
            "sampling.temperature=0",
            "agent.hints.enabled=false",
            "agent.max_turns=5",
            "agent.max_completion_tokens=48",
            *overrides,
        ],
    ).config


@pytest.fixture(scope="session")
def verl_config() -> ConveyorConfig:
    """What the bridge tests roll out (`bridge_config`)."""
    return bridge_config()


# scripts/test.sh builds the VeRL venv beside the tests: these name the file its build writes its
# exit status to when it ends, and its log.
BUILD_DONE = "CONVEYOR_VERL_BUILD_DONE"
BUILD_LOG = "CONVEYOR_VERL_BUILD_LOG"
BUILD_WAIT_S = 1200


def wait_for_the_venv_build() -> None:
    """Wait for scripts/test.sh's build of the venv, if one is under way, and fail if it did."""
    done = os.environ.get(BUILD_DONE)
    if not done:
        return
    deadline = time.monotonic() + BUILD_WAIT_S
    while not Path(done).is_file():
        if time.monotonic() > deadline:
            pytest.fail(f"scripts/venv-verl.sh did not end within {BUILD_WAIT_S} s")
        time.sleep(1)
    status = Path(done).read_text().strip()
    if status != "0":
        pytest.fail(f"scripts/venv-verl.sh failed (exit {status}): {os.environ.get(BUILD_LOG)}")


@pytest.fixture(scope="session")
def verl_python() -> Path:
    """The VeRL venv's interpreter; scripts/test.sh builds the venv, so its absence fails."""
    wait_for_the_venv_build()
    python = venv_python()
    if python is None:
        pytest.fail(f"no .venv-verl: {BUILD_HINT}")
    return python


def tasks_of(config: ConveyorConfig, n: int) -> list[Task]:
    """`n` eval instances of each configured family."""
    families = build_families(config.tasks.families, config.runtime)
    return [t for f in families.values() for t in f.make_tasks(n, config.tasks.task_seed, "eval")]


@pytest.fixture(scope="session")
def trajectories_file(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path, tokenizer: Any
) -> Path:
    """Real rollouts of the quickstart families (written once per session into tmp):
    oracle rollouts (the families' correct tool calls as the engine, reward 1, multi-turn with
    tool output) and greedy rollouts of the embedded model through HFEngine (real logprobs)."""
    from conveyor.engines.hf_local import HFEngine

    config = bridge_config()
    families = build_families(config.tasks.families, config.runtime)
    oracle_tasks = tasks_of(config, 2)
    oracle = OracleEngine(
        {t.id: families[t.family].oracle_calls(t) for t in oracle_tasks},
        lambda text: tokenizer.encode(text, add_special_tokens=False),
        tokenizer.eos_token_id,
        config.model.tool_format,
    )
    traces: list[Trajectory] = asyncio.run(
        oracle_rollouts(
            AgentStages.from_config(config, oracle, tokenizer, families=families), oracle_tasks
        )
    )
    engine = HFEngine(model_dir)
    sampled_tasks = tasks_of(config, 1)
    traces += asyncio.run(
        oracle_rollouts(
            AgentStages.from_config(config, engine, tokenizer, families=families), sampled_tasks
        )
    )
    out = tmp_path_factory.mktemp("verl") / "trajectories.jsonl"
    out.write_text("".join(t.to_json() + "\n" for t in traces))
    return out
