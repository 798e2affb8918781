"""`stream: true` answered as OpenAI streams: the real `openai` SDK's streaming clients rebuild
the same message, finish reason and usage as a whole reply, and the turn is recorded with the
same ids. The engine's words are scripted (tokenizer, renderer, HTTP stack and SDK are real)."""

from __future__ import annotations

import json
from typing import Any

import openai
from openai.lib.streaming._deltas import accumulate_delta

from conveyor.agent.parsing import format_tool_call
from conveyor.config import AgentConfig, HintsConfig
from conveyor.engines.simulated import SimulatedEngine
from conveyor.types import ToolCall

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string"}},
            "required": ["word"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
CALLS = "Looking.\n" + "\n".join(
    format_tool_call(ToolCall(name="lookup", arguments={"word": w}), "hermes")
    for w in ("cat", "dog")
)
QUESTION = [{"role": "user", "content": "Define cat and dog."}]
ROOMY = AgentConfig(max_completion_tokens=128, hints=HintsConfig(enabled=False))


def _engine(tokenizer: Any) -> SimulatedEngine:
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    text = tokenizer.encode(CALLS, add_special_tokens=False)
    return SimulatedEngine(lambda _prompt: text + end, eos_token_id=end[0])


def _client(url: str, rollout: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/rollouts/{rollout}/v1", api_key="x", max_retries=0)


def test_streamed_reply_is_the_whole_reply_in_chunks_and_records_the_same_ids(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    gateway = make_gw(_engine(tokenizer), agent=ROOMY)
    with serve(gateway) as url:
        whole = _client(url, "whole").chat.completions.create(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            tools=[TOOL],  # type: ignore[list-item]
        )
        stream = _client(url, "streamed").chat.completions.create(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            tools=[TOOL],  # type: ignore[list-item]
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        message: dict[object, object] = {}
        finish = None
        for chunk in chunks[:-1]:
            assert chunk.usage is None and len(chunk.choices) == 1
            message = accumulate_delta(message, chunk.choices[0].delta.to_dict())
            finish = chunk.choices[0].finish_reason or finish
        last = chunks[-1]
        assert last.choices == [] and last.usage == whole.usage
        assert finish == whole.choices[0].finish_reason == "tool_calls"
        expected = whole.choices[0].message
        assert message["content"] == expected.content == "Looking."
        calls = message["tool_calls"]
        assert isinstance(calls, list)
        assert [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
        ] == [
            (c.id, c.function.name, json.loads(c.function.arguments))
            for c in expected.tool_calls or []
        ]
        assert [json.loads(c["function"]["arguments"])["word"] for c in calls] == ["cat", "dog"]

        # the SDK's own stream helper rebuilds the same completion
        with _client(url, "helper").chat.completions.stream(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            tools=[TOOL],  # type: ignore[list-item]
        ) as helper:
            final = helper.get_final_completion()
        assert final.choices[0].message.content == expected.content
        assert [c.function.arguments for c in final.choices[0].message.tool_calls or []] == [
            c.function.arguments for c in expected.tool_calls or []
        ]

        # the streamed reply resent with its tool replies continues the same sample
        follow = [
            *QUESTION,
            {"role": "assistant", **{k: v for k, v in message.items() if isinstance(k, str)}},
            *({"role": "tool", "tool_call_id": c["id"], "content": "an animal"} for c in calls),
        ]
        _client(url, "streamed").chat.completions.create(
            model="m",
            messages=follow,  # type: ignore[arg-type]
            tools=[TOOL],  # type: ignore[list-item]
            stream=True,
        ).close()

    ours, theirs = gateway.trajectory("whole"), gateway.trajectory("streamed")
    helped = gateway.trajectory("helper")
    for turn in (theirs.turns[0], helped.turns[0]):  # (logprobs are drawn per rollout)
        assert (turn.prompt_ids, turn.completion_ids, turn.loss_mask) == (
            ours.turns[0].prompt_ids,
            ours.turns[0].completion_ids,
            ours.turns[0].loss_mask,
        )
    assert theirs.counters["splits"] == 0 and len(theirs.turns) == 2
    assert theirs.counters["streamed_requests"] == 2 and "streamed_requests" not in ours.counters
    second = theirs.turns[1]
    first = theirs.turns[0]
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == (
        first.prompt_ids + first.completion_ids
    )


def test_streamed_text_reply_without_usage_ends_with_its_finish_reason(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    words = tokenizer.encode("A small animal.", add_special_tokens=False)
    gateway = make_gw(SimulatedEngine(lambda _prompt: words + end, eos_token_id=end[0]))
    with serve(gateway) as url:
        chunks = list(
            _client(url, "text").chat.completions.create(
                model="m",
                messages=QUESTION,  # type: ignore[arg-type]
                stream=True,
            )
        )
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "A small animal."
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert len(gateway.trajectory("text").turns) == 1
