"""What a run hands a family (options, side-model chat clients) and what a family may hand back
(a Grade with a breakdown and records), wired from config through the composition root."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from conveyor.agent.chat_client import ChatClient, RenderedChatClient
from conveyor.agent.tools import ToolRegistry, finish
from conveyor.app.compose import Composition
from conveyor.app.families import families_table
from conveyor.config import ConveyorConfig, load_config
from conveyor.config.base import ConfigError
from conveyor.engines.simulated import SimulatedEngine
from conveyor.registry import FAMILIES
from conveyor.rollout import AgentStages
from conveyor.runtime.base import Runtime
from conveyor.tasks.family import (
    CALLS,
    SAY,
    FamilyServices,
    Grade,
    Grading,
    family_info,
    family_options,
    family_spec,
    get_family,
)
from conveyor.trainer.sft import ORACLE_CALLS, ORACLE_SAY
from conveyor.types import Message, Status, Task, ToolCall, Trajectory


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: int = 1


class GradedFamily:
    """A family taking services and grading with a judge: built only for these tests."""

    name = "graded_test"
    source = "test fixture"
    version = "0.1"
    splits = ("eval",)

    def __init__(self, services: FamilyServices) -> None:
        self.options = family_options(self.name, _Options, services.options)
        self.services = services

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        return [Task(id=f"g-{i}", family=self.name, prompt=[], split=split) for i in range(n)]

    def tools(self) -> ToolRegistry:
        return ToolRegistry([finish])

    async def make_runtime(self, task: Task) -> Runtime:
        raise NotImplementedError

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        raise AssertionError("a Grading family is graded by grade(), never score()")

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        assert self.services.judge is not None
        prompt = [{"role": "user", "content": "Is it right?"}]
        verdict = await self.services.judge().reply(prompt)
        return Grade(
            reward=float(self.options.level),
            breakdown={"judge": 1.0},
            records=[
                {"role": "judge_prompt", "content": prompt[0]["content"]},
                {"role": "judge_verdict", "content": verdict},
            ],
        )

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        return [ToolCall(name="finish", arguments={"answer": "x"})]


@pytest.fixture
def graded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the test family for one test only (the real registry, restored after)."""
    monkeypatch.setitem(
        FAMILIES._parts, GradedFamily.name, family_spec(GradedFamily, options=_Options)
    )


class Says:
    """A scripted judge (a ChatClient that always answers the same): no judge model needed."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.asked: list[list[Message]] = []

    async def reply(self, messages: list[Message]) -> str:
        self.asked.append(messages)
        return self.text


def test_oracle_text_steps_mean_the_same_in_tasks_and_trainer() -> None:
    assert SAY == ORACLE_SAY
    assert CALLS == ORACLE_CALLS


def test_options_reach_the_family_and_bad_keys_are_refused(graded: None) -> None:
    family = get_family("graded_test", services=FamilyServices(options={"level": 3}))
    assert family.options.level == 3  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"tasks.options.graded_test: levle: Extra inputs"):
        get_family("graded_test", services=FamilyServices(options={"levle": 3}))


def test_options_for_a_family_that_takes_none_are_refused() -> None:
    with pytest.raises(ValueError, match=r"'filenav' takes no options.*depth"):
        get_family("filenav", services=FamilyServices(options={"depth": 2}))


def test_config_refuses_options_of_an_unlisted_family() -> None:
    with pytest.raises(ConfigError, match=r"options names families not in tasks\.families: rg"):
        load_config(None, ["tasks.families=[filenav]", "tasks.options={rg: {datasets: [x]}}"])


def test_config_refuses_an_unknown_side_engine() -> None:
    with pytest.raises(ConfigError, match=r"unknown engine kind 'vlm'.*did you mean 'vllm'"):
        load_config(None, ["tasks.user_engine.engine=vlm"])


def test_grade_breakdown_and_records_reach_the_trajectory(graded: None) -> None:
    judge = Says("yes")
    family = get_family(
        "graded_test", services=FamilyServices(options={"level": 1}, judge=lambda: judge)
    )
    stages = AgentStages(
        client=None,  # type: ignore[arg-type]  # the reward stage samples nothing
        make_renderer=lambda schemas: None,  # type: ignore[arg-type,return-value]
        agent=ConveyorConfig().agent,
        sampling=ConveyorConfig().sampling,
        rollout_timeout_s=5,
        families={"graded_test": family},
    )
    task = family.make_tasks(1, 0, "eval")[0]
    before = Trajectory(task_id=task.id, messages=[{"role": "user", "content": "q"}])
    after = asyncio.run(stages.reward(task, before, runtime=None))  # type: ignore[arg-type]
    assert after.reward == 1.0 and after.metrics["reward/judge"] == 1.0
    assert [m["role"] for m in after.messages] == ["user", "judge_prompt", "judge_verdict"]
    assert after.messages[-1] == {"role": "judge_verdict", "content": "yes", "_meta": True}
    assert judge.asked == [[{"role": "user", "content": "Is it right?"}]]
    # an infra error is never graded, so the judge is never asked
    broken = before.model_copy(update={"status": Status.INFRA_ERROR})
    assert asyncio.run(stages.reward(task, broken, runtime=None)).reward is None  # type: ignore[arg-type]
    assert isinstance(family, Grading)


def test_family_info_reads_the_class(graded: None) -> None:
    assert family_info("graded_test") == {
        "name": "graded_test",
        "splits": ["eval"],
        "source": "test fixture",
        "version": "0.1",
    }
    assert family_info("filenav")["source"] == "generated"


def test_the_families_table_lists_every_registered_family() -> None:
    names = [row["name"] for row in families_table()]
    assert names == FAMILIES.names()
    assert {"search", "memory", "math", "code", "rg", "bfcl", "tau2", "terminal"} <= set(names)
    for row in families_table():
        assert set(row) == {"name", "splits", "source", "version"} and row["splits"]


def test_the_rendered_chat_client_samples_with_the_models_template(tokenizer: Any) -> None:
    said = tokenizer.encode("Fine, thanks.", add_special_tokens=False)
    seen: list[list[int]] = []

    def respond(prompt: list[int]) -> list[int]:
        seen.append(prompt)
        return [*said, tokenizer.eos_token_id]

    client = RenderedChatClient(
        SimulatedEngine(respond, eos_token_id=tokenizer.eos_token_id), tokenizer
    )
    assert isinstance(client, ChatClient)
    reply = asyncio.run(client.reply([{"role": "user", "content": "How are you?"}]))
    assert reply == "Fine, thanks."
    rendered = tokenizer.decode(seen[0])
    assert rendered.endswith("<|im_start|>assistant\n") and "How are you?" in rendered


def test_a_side_model_from_config_is_built_once_per_role(tmp_path: Path, model_dir: Path) -> None:
    config = load_config(
        None,
        [
            "engine.kind=simulated",
            "tasks.user_engine.engine=simulated",
            "tasks.user_engine.max_tokens=8",
            "tasks.judge_engine={engine: run}",
        ],
    ).config
    parts = Composition(config)
    services = parts.family_services("filenav")
    assert services.user is not None and services.judge is not None
    user = services.user()
    assert user is services.user() and isinstance(user, RenderedChatClient)
    assert user.max_tokens == 8 and user.client is not parts.engine
    judge = services.judge()
    assert isinstance(judge, RenderedChatClient) and judge.client is parts.engine
    reply = asyncio.run(user.reply([{"role": "user", "content": "hi"}]))
    assert isinstance(reply, str)
    asyncio.run(parts.close())
    no_judge = Composition(load_config(None, []).config).family_services("filenav")
    assert no_judge.judge is None


def test_check_family_reports_a_wrong_oracle(
    monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    from conveyor.app.families import check_family
    from conveyor.tasks.filenav import FileNavFamily

    def wrong(self: FileNavFamily, task: Task) -> list[ToolCall]:
        return [ToolCall(name="finish", arguments={"answer": "not it"})]

    monkeypatch.setattr(FileNavFamily, "oracle_calls", wrong)
    config = load_config(None, ["tasks.families=[filenav]"]).config
    report = asyncio.run(check_family(config, "filenav", n=2, say=lambda _: None))
    assert report["ok"] is False and report["oracle_mean"] == 0.0
    assert [p["policy"] for p in report["problems"]] == ["oracle", "oracle"]
    assert report["empty_mean"] == 0.0


def test_check_family_checks_the_configs_own_turn_budget(model_dir: Path) -> None:
    from conveyor.app.families import check_family

    # filenav's oracle takes 3 calls: a 1-turn budget does not fit it, and the check says so
    # (it no longer raises the budget itself: a passing check means the shipped budget fits)
    config = load_config(None, ["tasks.families=[filenav]", "agent.max_turns=1"]).config
    lines: list[str] = []
    report = asyncio.run(check_family(config, "filenav", n=2, say=lines.append))
    assert report["ok"] is False and report["oracle_fits_budget"] == 0
    assert {p["status"] for p in report["problems"] if p["policy"] == "oracle"} == {"truncated"}
    assert any("fits the turn budgets on 0 of 2" in line for line in lines)


def test_check_config_gives_the_oracle_room_for_long_replies() -> None:
    from conveyor.app.families import CHECK_COMPLETION_TOKENS, CHECK_CONTEXT_TOKENS, check_config

    config = load_config(None, ["agent.max_completion_tokens=64"]).config
    agent = check_config(config, "filenav").agent
    assert agent.max_completion_tokens == CHECK_COMPLETION_TOKENS
    assert agent.max_context_tokens == CHECK_CONTEXT_TOKENS
    assert agent.max_prompt_tokens + agent.max_completion_tokens > CHECK_CONTEXT_TOKENS // 2
    assert agent.hints.enabled is False
