"""Who owns the outcome of an outside agent program (`ExternalAgentStages`): finishing is `ok`
and scored by the family, running out of time is `timeout`, a crash before finishing is
`policy_error`, and an engine failure behind the gateway is raised as an infra error.

The programs are tiny real processes speaking HTTP to the real gateway; only the engine's words
are scripted (a SimulatedEngine over the real tokenizer)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor.agent.chat import renderer_factory
from conveyor.config import AgentConfig, ConveyorConfig, HintsConfig, SamplingConfig
from conveyor.engines.base import EngineError, SampleRequest, SampleResult
from conveyor.engines.simulated import SimulatedEngine
from conveyor.gateway.external import ExternalAgentStages
from conveyor.tasks.family import build_families
from conveyor.types import EndReason, Status, Trajectory

PROGRAM = """
import json, os, sys, urllib.request
rollout = os.environ["CONVEYOR_ROLLOUT_URL"]
def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        return json.loads(urllib.request.urlopen(req, timeout=60).read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())
task = json.loads(urllib.request.urlopen(rollout + "/task", timeout=60).read())
mode = sys.argv[1]
reply = post(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
             {"messages": task["messages"], "tools": task["tools"], "max_tokens": 8})
if mode == "answer":
    print(post(rollout + "/tools/finish", {"answer": sys.argv[2]}))
    post(rollout + "/finish", {})
elif mode == "reward":
    post(rollout + "/finish", {"reward": float(sys.argv[2])})
elif mode == "sleep":
    import time; time.sleep(60)
elif mode == "crash":
    sys.exit(3)
"""


class _DownEngine:
    """fake_engine_failure: an engine that always fails (a real outage cannot be provoked
    deterministically)."""

    in_flight = 0
    policy_version = 0

    async def sample(self, request: SampleRequest) -> SampleResult:
        raise EngineError("fake_engine_failure")

    async def close(self) -> None:
        return None


def _stages(
    tokenizer: Any, tmp_path: Path, engine: Any, mode: str, *args: str, timeout_s: float = 60
) -> ExternalAgentStages:
    program = tmp_path / "agent.py"
    program.write_text(PROGRAM)
    agent = AgentConfig(
        max_completion_tokens=16, rollout_timeout_s=timeout_s, hints=HintsConfig(enabled=False)
    )
    return ExternalAgentStages(
        [sys.executable, str(program), mode, *args],
        engine,
        renderer_factory(ConveyorConfig().model, tokenizer),
        agent,
        SamplingConfig(temperature=0.0),
        families=build_families(["arithmetic"]),
    )


def _engine(tokenizer: Any) -> SimulatedEngine:
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    words = tokenizer.encode("Let me think.", add_special_tokens=False)
    return SimulatedEngine(lambda _prompt: words + end, eos_token_id=end[0])


def _rollout(stages: ExternalAgentStages, family: str = "arithmetic") -> Trajectory:
    task = stages.family(family).make_tasks(1, 0, "eval")[0]

    async def main() -> Trajectory:
        runtime = await stages.init(task, 0, 0)
        try:
            trajectory = await stages.run(task, 0, runtime)
            return await stages.reward(task, trajectory, runtime)
        finally:
            await runtime.close()
            await stages.close()

    return asyncio.run(main())


def test_program_that_finishes_right_is_ok_and_scored_by_the_family(
    tokenizer: Any, tmp_path: Path
) -> None:
    stages = _stages(tokenizer, tmp_path, _engine(tokenizer), "answer", "ANSWER")
    task = stages.family("arithmetic").make_tasks(1, 0, "eval")[0]
    stages.command[-1] = str(task.data["answer"])
    trajectory = _rollout(stages)
    assert (trajectory.status, trajectory.stop_reason) == (Status.OK, EndReason.FINISH)
    assert trajectory.reward == 1.0 and len(trajectory.turns) == 1
    assert trajectory.counters["tool_calls"] == 1


def test_program_with_a_wrong_answer_is_ok_and_scored_zero(tokenizer: Any, tmp_path: Path) -> None:
    trajectory = _rollout(_stages(tokenizer, tmp_path, _engine(tokenizer), "answer", "-1.5"))
    assert trajectory.status is Status.OK and trajectory.reward == 0.0


def test_program_out_of_time_is_a_timeout_and_still_scored(tokenizer: Any, tmp_path: Path) -> None:
    stages = _stages(tokenizer, tmp_path, _engine(tokenizer), "sleep", timeout_s=3)
    trajectory = _rollout(stages)
    assert (trajectory.status, trajectory.stop_reason) == (
        Status.TIMEOUT,
        EndReason.ROLLOUT_TIMEOUT,
    )
    assert trajectory.reward == 0.0 and len(trajectory.turns) == 1


def test_program_that_crashes_before_finishing_is_a_policy_error(
    tokenizer: Any, tmp_path: Path
) -> None:
    trajectory = _rollout(_stages(tokenizer, tmp_path, _engine(tokenizer), "crash"))
    assert trajectory.status is Status.POLICY_ERROR
    assert trajectory.error is not None and "exited with 3" in trajectory.error


def test_fake_engine_failure_behind_the_gateway_is_raised_as_infra(
    tokenizer: Any, tmp_path: Path
) -> None:
    with pytest.raises(EngineError, match="fake_engine_failure"):
        _rollout(_stages(tokenizer, tmp_path, _DownEngine(), "answer", "1"))


def test_scripted_oracle_agent_is_identical_to_native_over_many_turns(
    tokenizer: Any, tmp_path: Path
) -> None:
    """Multi-turn identity without the model (which rarely calls tools greedily with hints
    off): an engine scripted to play each task's oracle calls, one per turn, drives both the
    native loop and examples/sdk_agent.py; every prompt (tool replies sent back through the
    SDK included) must be the same ids."""
    from conveyor.agent.parsing import format_tool_call
    from conveyor.rollout import AgentStages

    families = build_families(["filenav", "arithmetic"])
    tasks = [t for f in families.values() for t in f.make_tasks(2, 0, "eval")]
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    by_question = {t.prompt[-1]["content"]: families[t.family].oracle_calls(t) for t in tasks}

    def respond(prompt: list[int]) -> list[int]:
        text = tokenizer.decode(prompt)
        calls = next(c for q, c in by_question.items() if q in text)
        step = min(text.count("<tool_response>"), len(calls) - 1)
        return (
            tokenizer.encode(format_tool_call(calls[step], "hermes"), add_special_tokens=False)
            + end
        )

    engine = SimulatedEngine(respond, eos_token_id=end[0])
    agent = AgentConfig(max_completion_tokens=96, hints=HintsConfig(enabled=False))
    make_renderer = renderer_factory(ConveyorConfig().model, tokenizer)
    sampling = SamplingConfig(temperature=0.0)
    native = AgentStages(
        engine, make_renderer, agent, sampling, rollout_timeout_s=60, families=families
    )
    program = Path(__file__).resolve().parents[2] / "examples" / "sdk_agent.py"
    external = ExternalAgentStages(
        [sys.executable, str(program)], engine, make_renderer, agent, sampling, families=families
    )

    async def play(stages: Any) -> list[Trajectory]:
        out = []
        for task in tasks:
            runtime = await stages.init(task, 0, 0)
            try:
                out.append(await stages.reward(task, await stages.run(task, 0, runtime), runtime))
            finally:
                await runtime.close()
        return out

    async def main() -> tuple[list[Trajectory], list[Trajectory]]:
        try:
            return await play(native), await play(external)
        finally:
            await external.close()

    ours, theirs = asyncio.run(main())
    for a, b in zip(ours, theirs, strict=True):
        assert len(a.turns) >= 3 and a.solved and b.solved, a.task_id
        assert [t.prompt_ids for t in a.turns] == [t.prompt_ids for t in b.turns], a.task_id
        assert [t.completion_ids for t in a.turns] == [t.completion_ids for t in b.turns]
        assert [m for m in a.messages if m["role"] == "tool"] == [
            m for m in b.messages if m["role"] == "tool"
        ]
        assert b.counters["splits"] == 0 and b.status is Status.OK


def test_concurrent_rollouts_share_the_one_gateway_server(tokenizer: Any, tmp_path: Path) -> None:
    """Rollouts started together once raced the server's start: all but the first raised
    "serves one event loop" and were retried as infrastructure faults."""
    stages = _stages(tokenizer, tmp_path, _engine(tokenizer), "answer", "-1.5")
    tasks = stages.family("arithmetic").make_tasks(3, 0, "eval")

    async def one(task: Any) -> Trajectory:
        runtime = await stages.init(task, 0, 0)
        try:
            return await stages.reward(task, await stages.run(task, 0, runtime), runtime)
        finally:
            await runtime.close()

    async def main() -> list[Trajectory]:
        try:
            return list(await asyncio.gather(*(one(task) for task in tasks)))
        finally:
            await stages.close()

    trajectories = asyncio.run(main())
    assert [t.status for t in trajectories] == [Status.OK] * 3
    assert [t.task_id for t in trajectories] == [t.id for t in tasks]


def test_reward_the_program_sends_is_kept_but_the_family_grades(
    tokenizer: Any, tmp_path: Path
) -> None:
    """The program is the policy: on a family that grades, its `finish` reward is recorded
    (metric `agent_reward`) and never becomes the reward."""
    trajectory = _rollout(_stages(tokenizer, tmp_path, _engine(tokenizer), "reward", "1.0"))
    assert (trajectory.status, trajectory.stop_reason) == (Status.OK, EndReason.FINISH)
    assert trajectory.reward == 0.0  # no answer submitted: the family's score
    assert trajectory.metrics["agent_reward"] == 1.0


def test_family_declaring_reward_from_agent_takes_the_program_reward(
    tokenizer: Any, tmp_path: Path
) -> None:
    """stand_in_agent_rewarded_family: arithmetic with `reward_from_agent = True` (a user's
    own family would declare it; no built-in family does)."""

    def agent_rewarded(*argv: str) -> ExternalAgentStages:
        stages = _stages(tokenizer, tmp_path, _engine(tokenizer), *argv)
        graded = stages.family("arithmetic")

        class _AgentRewarded(type(graded)):  # type: ignore[misc]
            reward_from_agent = True

        stages._families["arithmetic"] = _AgentRewarded()
        return stages

    assert _rollout(agent_rewarded("reward", "0.75")).reward == 0.75
    crashed = _rollout(agent_rewarded("crash"))  # no reward sent: nothing earned
    assert crashed.status is Status.POLICY_ERROR and crashed.reward == 0.0
