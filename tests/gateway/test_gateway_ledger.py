"""The gateway's token accounting with the real tokenizer and renderer and a scripted engine
(only the model's words are scripted): OpenAI-shaped answers, raw text recorded, tool replies
named, ids reused on a resent history and a split for each edit or change of tools."""

from __future__ import annotations

import json
from typing import Any

import openai

from conveyor.agent.parsing import format_tool_call
from conveyor.engines.simulated import SimulatedEngine
from conveyor.types import ToolCall, Trajectory

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}},
                "required": ["word"],
            },
        },
    }
]
CALL = "Looking.\n" + format_tool_call(ToolCall(name="lookup", arguments={"word": "cat"}), "hermes")


def _engine(tokenizer: Any) -> SimulatedEngine:
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    text = tokenizer.encode(CALL, add_special_tokens=False)
    return SimulatedEngine(lambda _prompt: text + end, eos_token_id=end[0])


def _ask(client: openai.OpenAI, messages: list[dict[str, Any]], tools: Any = TOOLS) -> Any:
    return client.chat.completions.create(model="m", messages=messages, tools=tools)  # type: ignore[arg-type]


def test_resent_history_reuses_ids_and_edits_split(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    gateway = make_gw(_engine(tokenizer))
    with serve(gateway) as url:
        client = openai.OpenAI(base_url=f"{url}/rollouts/r1/v1", api_key="x", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Define cat."}]
        reply = _ask(client, messages)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Looking."
        call = choice.message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "lookup",
            {"word": "cat"},
        )
        assert reply.usage.completion_tokens == len(
            gateway.trajectory("r1").turns[0].completion_ids
        )
        for _ in range(2):
            messages.append(choice.message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "a small animal"})
            choice = _ask(client, messages).choices[0]
            call = choice.message.tool_calls[0]
        recorded = gateway.trajectory("r1")
        assert recorded.counters["splits"] == 0
        first, second, third = recorded.turns
        assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == (
            first.prompt_ids + first.completion_ids
        )
        assert third.prompt_ids[: len(second.prompt_ids) + len(second.completion_ids)] == (
            second.prompt_ids + second.completion_ids
        )
        # recorded as the native loop records: raw text with markup, tool replies by name
        assistant = [m for m in recorded.messages if m["role"] == "assistant"]
        assert assistant[0]["content"] == CALL
        tool = [m for m in recorded.messages if m["role"] == "tool"]
        assert tool[0] == {"role": "tool", "content": "a small animal", "name": "lookup"}
        recorded.samples()  # one sample, prefix property checked by the trainer's own rule

        # content "" instead of null is the same message: no split
        messages.append({**choice.message.model_dump(exclude_none=True), "content": "Looking."})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "a pet"})
        _ask(client, messages)
        assert gateway.trajectory("r1").counters["splits"] == 0

        # an edited earlier tool reply: a split, and a new sample
        edited = [dict(m) for m in messages]
        edited[2] = {**edited[2], "content": "a large animal"}
        _ask(client, edited)
        # other tools: a split too
        _ask(
            client,
            edited,
            tools=[{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "Other."}}],
        )
        final = Trajectory.model_validate(gateway.trajectory("r1").model_dump())
        assert final.counters["splits"] == 2
        assert [t.sample_index for t in final.turns] == [0, 0, 0, 0, 1, 2]
        assert len(final.samples()) == 3
