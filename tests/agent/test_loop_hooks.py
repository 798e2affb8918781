"""The loop's two hooks for families beyond one question: a user who answers text replies, and a
tool that resets the context (a new training sample, counted as a reset, not a split).

Real SmolLM2 tokenizer, rendering, parsing and tools; the engine is scripted in what it says.
"""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.agent.chat import ChatRenderer
from conveyor.agent.loop import CONTEXT_RESET_ROLE, AgentLoop, final_answer
from conveyor.agent.tools import ToolContext, ToolRegistry, finish, tool
from conveyor.config import AgentConfig, HintsConfig, SamplingConfig
from conveyor.runtime.base import Runtime
from conveyor.types import EndReason, Status, Task
from scripted_engine import call, scripted

TASK = Task(
    id="hooks-0",
    family="test",
    prompt=[{"role": "system", "content": "Help."}, {"role": "user", "content": "Question 1?"}],
)


@tool
async def note(text: str, ctx: ToolContext) -> str:
    """Keep a note and start over from it.

    Args:
        text: The note.
    """
    ctx.state.setdefault("notes", []).append(text)
    ctx.reset_context(
        [
            {"role": "system", "content": "Help."},
            {"role": "user", "content": f"Your note so far: {text}. Continue."},
        ]
    )
    return "noted"


def loop(
    tokenizer: Any, texts: list[str], max_turns: int = 8, max_contexts: int = 128, **kwargs: Any
) -> AgentLoop:
    tools = ToolRegistry([note, finish])
    return AgentLoop(
        ChatRenderer(tokenizer, tools.schemas()),
        scripted(tokenizer, texts),
        tools,
        AgentConfig(
            max_turns=max_turns, max_contexts=max_contexts, hints=HintsConfig(enabled=False)
        ),
        SamplingConfig(),
        rollout_timeout_s=30.0,
        **kwargs,
    )


class Questions:
    """A user with a fixed list of follow-up questions, recording what the agent said."""

    def __init__(self, follow_ups: list[str]) -> None:
        self.follow_ups = list(follow_ups)
        self.heard: list[str] = []

    async def __call__(self, task: Task, runtime: Runtime | None, reply: str) -> str | None:
        self.heard.append(reply)
        return self.follow_ups.pop(0) if self.follow_ups else None


def test_a_user_answers_each_text_reply_until_done(tokenizer: Any) -> None:
    user = Questions(["Question 2?"])
    t = asyncio.run(
        loop(tokenizer, ["Answer one.", "Answer two."], user_turn=user).run(TASK, 0, None)
    )
    assert t.status is Status.OK and t.stop_reason is EndReason.USER_DONE
    assert user.heard == ["Answer one.", "Answer two."]
    assert t.counters["user_turns"] == 1 and t.counters["splits"] == 0
    users = [m["content"] for m in t.messages if m["role"] == "user"]
    assert users == ["Question 1?", "Question 2?"]
    # one sample; the user's words are context (mask 0), both replies are trained on
    (sample,) = t.samples()
    pairs = zip(sample.input_ids, sample.loss_mask, strict=True)
    trained = tokenizer.decode([i for i, m in pairs if m])
    assert "Answer one." in trained and "Answer two." in trained
    assert "Question 2?" not in trained


def test_without_a_user_a_text_reply_is_the_policys_error(tokenizer: Any) -> None:
    t = asyncio.run(loop(tokenizer, ["Just text."]).run(TASK, 0, None))
    assert t.status is Status.POLICY_ERROR and t.stop_reason is EndReason.NO_TOOL_CALL


def test_tool_calls_between_user_turns_do_not_end_the_conversation(tokenizer: Any) -> None:
    user = Questions([])
    t = asyncio.run(
        loop(tokenizer, [call("finish", answer="x")], user_turn=user).run(TASK, 0, None)
    )
    # finish still ends a conversational rollout, and the user never spoke
    assert t.stop_reason is EndReason.FINISH and user.heard == []


def test_a_reset_starts_a_new_sample_counted_apart_from_splits(tokenizer: Any) -> None:
    t = asyncio.run(
        loop(
            tokenizer,
            [
                call("note", text="alpha"),
                call("note", text="alpha beta"),
                call("finish", answer="ab"),
            ],
        ).run(TASK, 0, None)
    )
    assert t.status is Status.OK and final_answer(t) == "ab"
    assert t.counters["resets"] == 2 and t.counters["splits"] == 0
    assert [turn.sample_index for turn in t.turns] == [0, 1, 2]
    samples = t.samples()
    assert len(samples) == 3
    # each context starts from its own opening; none carries the dropped history
    second = tokenizer.decode(samples[1].input_ids)
    assert "Your note so far: alpha. Continue." in second and "Question 1?" not in second
    third = tokenizer.decode(samples[2].input_ids)
    assert "alpha beta" in third and "Your note so far: alpha." not in third
    # every context stays in the messages, with a marker between contexts
    roles = [m["role"] for m in t.messages]
    assert roles.count(CONTEXT_RESET_ROLE) == 2
    first_marker = roles.index(CONTEXT_RESET_ROLE)
    assert roles[first_marker - 1] == "tool"  # the reply of the tool that reset is kept
    assert sum(len(s.input_ids) for s in samples) > len(samples[-1].input_ids)


def test_each_context_has_its_own_turn_budget(tokenizer: Any) -> None:
    # 2 turns a context: 5 turns over 3 contexts fit, none of the contexts uses more than 2.
    texts = [call("note", text="a"), call("note", text="b"), call("finish", answer="ab")]
    t = asyncio.run(loop(tokenizer, texts, max_turns=1).run(TASK, 0, None))
    assert t.status is Status.OK and len(t.turns) == 3 and t.counters["resets"] == 2


def test_a_reset_past_max_contexts_truncates(tokenizer: Any) -> None:
    texts = [call("note", text=str(i)) for i in range(5)]
    t = asyncio.run(loop(tokenizer, texts, max_turns=1, max_contexts=3).run(TASK, 0, None))
    assert t.status is Status.TRUNCATED and t.stop_reason is EndReason.MAX_TURNS
    assert t.counters["resets"] == 2 and len(t.turns) == 3
