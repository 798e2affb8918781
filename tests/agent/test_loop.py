"""The agent loop on the real SmolLM2 tokenizer with a scripted engine.

The engine is simulated only in *what* it says (a script instead of a model, so each outcome can
be provoked on purpose); tokenization, rendering, parsing, tools and runtime are the real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from conveyor.agent.chat import ChatRenderer
from conveyor.agent.loop import AgentLoop, final_answer
from conveyor.agent.tools import ToolContext, ToolRegistry, finish, tool
from conveyor.config import AgentConfig, HintsConfig, SamplingConfig
from conveyor.engines.base import EngineError
from conveyor.engines.simulated import SimulatedEngine
from conveyor.tasks.family import get_family
from conveyor.types import Status, Task
from scripted_engine import call, scripted


@tool
async def boom(path: str) -> str:
    """Always fails.

    Args:
        path: Anything.
    """
    raise FileNotFoundError(path)


@tool
async def hang(seconds: float) -> str:
    """Never returns in time.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "late"


@tool
async def echo(text: str, ctx: ToolContext) -> str:
    """Echo text.

    Args:
        text: The text.
    """
    return text


TASK = Task(
    id="t-0",
    family="test",
    prompt=[{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Go."}],
)


def run(
    tokenizer: Any,
    texts: Sequence[str],
    *,
    agent: AgentConfig | None = None,
    eos: bool = True,
    timeout_s: float = 30.0,
    engine: SimulatedEngine | None = None,
) -> Any:
    tools = ToolRegistry([boom, hang, echo, finish])
    renderer = ChatRenderer(tokenizer, tools.schemas())
    loop = AgentLoop(
        renderer,
        engine or scripted(tokenizer, texts, eos=eos),
        tools,
        agent or AgentConfig(max_turns=4, tool_timeout_s=0.2),
        SamplingConfig(),
        rollout_timeout_s=timeout_s,
    )
    return asyncio.run(loop.run(TASK, 0, None))


def test_finish_ends_ok_and_records_the_answer(tokenizer: Any) -> None:
    t = run(tokenizer, [call("echo", text="x"), call("finish", answer="42")])
    assert t.status is Status.OK and t.stop_reason == "finish"
    assert final_answer(t) == "42"
    assert t.counters["tool_calls"] == 2 and len(t.turns) == 2


def test_turns_keep_the_prefix_property_and_masks(tokenizer: Any) -> None:
    t = run(
        tokenizer, [call("echo", text="a"), call("boom", path="/x"), call("finish", answer="1")]
    )
    for before, after in zip(t.turns, t.turns[1:], strict=False):
        assert after.prompt_ids[: len(before.prompt_ids) + len(before.completion_ids)] == (
            before.prompt_ids + before.completion_ids
        )
    (sample,) = t.samples()
    # Only sampled tokens carry loss; everything else (tool output, hints, glue) is 0.
    assert sum(sample.loss_mask) == sum(len(turn.completion_ids) for turn in t.turns)
    masked_text = tokenizer.decode(
        [i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m == 0]
    )
    assert "FileNotFoundError" in masked_text and "[hint]" in masked_text


def test_tool_that_raises_is_an_error_message_to_the_model(tokenizer: Any) -> None:
    t = run(tokenizer, [call("boom", path="/nope"), call("finish", answer="0")])
    assert t.status is Status.OK
    tool_messages = [m for m in t.messages if m["role"] == "tool"]
    assert "FileNotFoundError: /nope" in tool_messages[0]["content"]
    assert t.counters["tool_errors"] == 1 and t.counters["hint_tool_error"] == 1


def test_tool_that_hangs_times_out_as_the_policys_error(tokenizer: Any) -> None:
    t = run(tokenizer, [call("hang", seconds=60), call("finish", answer="0")])
    assert t.status is Status.OK
    assert "timed out after 0.2 s" in t.messages[3]["content"]
    assert t.counters["tool_timeout"] == 1


@pytest.mark.parametrize(
    ("texts", "trigger"),
    [
        (["I think the answer is 4."], "hint_no_tool_call"),
        (
            ['<tool_call>\n{"name": "echo", "arguments": {"text": }\n</tool_call>'],
            "hint_invalid_arguments",
        ),
        ([call("echo", text="same"), call("echo", text="same")], "hint_repeated_action"),
        ([call("boom", path="p")], "hint_tool_error"),
        (
            [call("echo", text="a"), call("echo", text="b"), call("echo", text="c")],
            "hint_steps_left",
        ),
    ],
)
def test_each_hint_trigger_fires_and_is_counted(
    tokenizer: Any, texts: list[str], trigger: str
) -> None:
    t = run(tokenizer, texts)
    assert t.counters.get(trigger, 0) >= 1, t.counters
    assert t.counters["hints"] >= t.counters[trigger]


def test_hints_off_and_no_tool_call_is_a_policy_error(tokenizer: Any) -> None:
    agent = AgentConfig(max_turns=4, hints=HintsConfig(enabled=False))
    t = run(tokenizer, ["The answer is 4."], agent=agent)
    assert t.status is Status.POLICY_ERROR and t.stop_reason == "no_tool_call"
    assert t.counters.get("hints", 0) == 0


def test_completion_budget_truncates(tokenizer: Any) -> None:
    agent = AgentConfig(max_turns=4, max_completion_tokens=5)
    t = run(tokenizer, ["word " * 50], agent=agent, eos=False)
    assert t.status is Status.TRUNCATED and t.stop_reason == "max_completion_tokens"
    assert len(t.turns[0].completion_ids) == 5


def test_context_budget_truncates(tokenizer: Any) -> None:
    agent = AgentConfig(
        max_turns=8, max_completion_tokens=64, max_context_tokens=400, max_prompt_tokens=4000
    )
    t = run(tokenizer, [call("echo", text="x" * 100)] * 8, agent=agent)
    assert t.status is Status.TRUNCATED
    assert t.stop_reason in ("max_context_tokens", "max_prompt_tokens")
    assert all(len(x.prompt_ids) + len(x.completion_ids) <= 400 for x in t.turns)


def test_turn_budget_truncates(tokenizer: Any) -> None:
    t = run(tokenizer, [call("echo", text="a"), call("echo", text="b")] * 4)
    assert t.status is Status.TRUNCATED and t.stop_reason == "max_turns" and len(t.turns) == 4


def test_rollout_wall_budget_is_a_timeout_with_turns_kept(tokenizer: Any) -> None:
    slow = scripted(tokenizer, [call("hang", seconds=0.15)])
    agent = AgentConfig(max_turns=50, tool_timeout_s=1.0)
    t = run(tokenizer, [], agent=agent, engine=slow, timeout_s=0.5)
    assert t.status is Status.TIMEOUT and t.stop_reason == "rollout_timeout"
    assert len(t.turns) >= 2


def test_waiting_for_a_slow_engine_is_not_the_policys_timeout(tokenizer: Any) -> None:
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    texts = [call("echo", text="a"), call("echo", text="b"), call("finish", answer="1")]

    def respond(_prompt: list[int]) -> list[int]:
        return tokenizer.encode(texts.pop(0), add_special_tokens=False) + end

    slow = SimulatedEngine(respond, eos_token_id=end[0], decode_s_per_token=0.01)
    t = run(tokenizer, [], engine=slow, timeout_s=0.3)
    assert t.status is Status.OK, t.stop_reason
    assert t.timings["engine_s"] > 0.3 > t.timings["policy_s"]


def test_engine_failure_propagates_as_infrastructure(tokenizer: Any) -> None:
    broken = SimulatedEngine(fail_probability=1.0)
    with pytest.raises(EngineError):
        run(tokenizer, [], engine=broken)


def test_oracle_of_each_builtin_family_scores_one(tokenizer: Any) -> None:
    for name in ("arithmetic", "filenav"):
        family = get_family(name)
        task = family.make_tasks(2, 0, "eval")[0]
        texts = [call(c.name, **c.arguments) for c in family.oracle_calls(task)]
        tools = family.tools()

        async def go(
            task: Task = task,
            texts: list[str] = texts,
            tools: ToolRegistry = tools,
            family: Any = family,
        ) -> tuple[Any, float]:
            runtime = await family.make_runtime(task)
            loop = AgentLoop(
                ChatRenderer(tokenizer, tools.schemas()),
                scripted(tokenizer, texts),
                tools,
                AgentConfig(max_turns=6),
                SamplingConfig(),
                rollout_timeout_s=30,
            )
            t = await loop.run(task, 0, runtime)
            return t, await family.score(task, final_answer(t), runtime)

        t, score = asyncio.run(go())
        assert t.status is Status.OK and score == 1.0, (name, t.messages)
        assert t.counters["tool_calls"] >= 3


def test_first_turn_sampled_before_the_runtime_continues_token_exact(tokenizer: Any) -> None:
    """`first_turn` samples turn 0 from the prompt alone (the dispatcher overlaps it with the
    runtime's set-up); `run(head=...)` continues from it: the same trajectory, token for token,
    as a loop that sampled every turn itself, with the engine asked once less by `run`."""
    texts = [call("echo", text="a"), call("finish", answer="7")]
    tools = ToolRegistry([boom, hang, echo, finish])
    renderer = ChatRenderer(tokenizer, tools.schemas())
    agent = AgentConfig(max_turns=4, tool_timeout_s=0.2)

    def loop_on(engine: SimulatedEngine) -> AgentLoop:
        return AgentLoop(renderer, engine, tools, agent, SamplingConfig(), rollout_timeout_s=30)

    plain = asyncio.run(loop_on(scripted(tokenizer, texts)).run(TASK, 0, None))
    engine = scripted(tokenizer, texts)
    loop = loop_on(engine)

    async def split() -> Any:
        head = await loop.first_turn(TASK, 0)
        assert head is not None and list(head.prompt_ids) == plain.turns[0].prompt_ids
        return await loop.run(TASK, 0, None, head)

    early = asyncio.run(split())
    assert early.status is Status.OK and final_answer(early) == "7"
    assert [(t.prompt_ids, t.completion_ids) for t in early.turns] == [
        (t.prompt_ids, t.completion_ids) for t in plain.turns
    ]
    assert "first_turn_engine_s" in early.timings and "first_turn_engine_s" not in plain.timings


def test_first_turn_is_none_when_the_prompt_alone_is_over_budget(tokenizer: Any) -> None:
    tools = ToolRegistry([echo, finish])
    loop = AgentLoop(
        ChatRenderer(tokenizer, tools.schemas()),
        scripted(tokenizer, [call("finish", answer="1")]),
        tools,
        AgentConfig(max_turns=2, max_prompt_tokens=8),
        SamplingConfig(),
        rollout_timeout_s=30,
    )
    assert asyncio.run(loop.first_turn(TASK, 0)) is None
    t = asyncio.run(loop.run(TASK, 0, None, None))
    assert t.status is Status.TRUNCATED and t.stop_reason == "max_prompt_tokens"
