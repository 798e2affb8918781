"""The Responses API (`client.responses.create`, streamed and not, function tools, input items
and `previous_response_id`) through the real `openai` SDK: each request is recorded as the chat
turn it stands for, with the same ids as the same conversation sent as chat completions. The
engine's words are scripted (tokenizer, renderer, HTTP stack and SDK are real)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from gateway.scripted import CHAT_TOOLS, RESPONSE_TOOLS, ROOMY, two_tools_then_answer


def _client(url: str, rollout: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/rollouts/{rollout}/v1", api_key="x", max_retries=0)


def _outputs(name: str) -> str:
    return "FOUND: a feline." if name == "lookup" else "DEFINED: a pet."


def test_responses_items_and_previous_response_id_record_the_chat_turns(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    gateway = make_gw(two_tools_then_answer(tokenizer), agent=ROOMY)
    with serve(gateway) as url:
        # 1. input items resent whole each turn (as openai-agents does without server state)
        client = _client(url, "items")
        items: list[Any] = [{"role": "user", "content": "Define cat."}]
        for _ in range(3):
            response = client.responses.create(
                model="m",
                instructions="Be brief.",
                input=items,
                tools=RESPONSE_TOOLS,  # type: ignore[arg-type]
            )
            items += [item.model_dump(exclude_none=True) for item in response.output]
            items += [
                {"type": "function_call_output", "call_id": o.call_id, "output": _outputs(o.name)}
                for o in response.output
                if o.type == "function_call"
            ]
        assert response.status == "completed" and response.output_text == (
            "A cat is a small animal."
        )
        calls = [i for i in items if i.get("type") == "function_call"]
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
            ("lookup", {"word": "cat"}),
            ("define", {"word": "cat"}),
        ]
        assert items[1]["type"] == "message" and items[1]["content"][0]["text"] == "Let me look."

        # 2. the same conversation streamed, each turn sending only what is new
        client = _client(url, "chained")
        previous, new = None, [{"role": "user", "content": "Define cat."}]
        for _ in range(3):
            with client.responses.stream(
                model="m",
                instructions="Be brief.",
                input=new,  # type: ignore[arg-type]
                tools=RESPONSE_TOOLS,  # type: ignore[arg-type]
                previous_response_id=previous,  # type: ignore[arg-type]
            ) as stream:
                kinds = [event.type for event in stream]
                streamed = stream.get_final_response()
            previous = streamed.id
            new = [
                {"type": "function_call_output", "call_id": o.call_id, "output": _outputs(o.name)}
                for o in streamed.output
                if o.type == "function_call"
            ]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.output_text.delta" in kinds
        assert streamed.output_text == "A cat is a small animal."
        assert streamed.usage is not None and streamed.usage.output_tokens > 0

        # 3. the same conversation as chat completions
        chat = _client(url, "chat")
        messages: list[Any] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Define cat."},
        ]
        for _ in range(3):
            message = (
                chat.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)  # type: ignore[arg-type]
                .choices[0]
                .message
            )
            messages.append(message.model_dump(exclude_none=True))
            messages += [
                {"role": "tool", "tool_call_id": c.id, "content": _outputs(c.function.name)}
                for c in message.tool_calls or []
            ]

        with pytest.raises(openai.BadRequestError) as unknown:
            client.responses.create(model="m", input="Hi.", previous_response_id="resp_nope")
        assert unknown.value.code == "previous_response_not_found"
        with pytest.raises(openai.BadRequestError) as hosted:
            _client(url, "hosted").responses.create(
                model="m",
                input="Hi.",
                tools=[{"type": "web_search"}],  # type: ignore[list-item]
            )
        assert hosted.value.code == "unsupported_value"

    recorded = {rid: gateway.trajectory(rid) for rid in ("items", "chained", "chat")}
    for trajectory in recorded.values():
        assert trajectory.counters["splits"] == 0 and len(trajectory.turns) == 3
        assert len(trajectory.samples()) == 1
    assert [t.counters.get("responses_requests") for t in recorded.values()] == [3, 3, None]
    # the token-level record of a Responses rollout is the chat rollout's, id for id
    for a, b, c in zip(*(t.turns for t in recorded.values()), strict=True):
        assert a.prompt_ids == b.prompt_ids == c.prompt_ids
        assert a.completion_ids == b.completion_ids == c.completion_ids
    assert "DEFINED: a pet." in tokenizer.decode(recorded["chained"].turns[2].prompt_ids)


def test_responses_cut_reply_is_incomplete(tokenizer: Any, make_gw: Any, serve: Any) -> None:
    gateway = make_gw(two_tools_then_answer(tokenizer), agent=ROOMY)
    with serve(gateway) as url:
        response = _client(url, "cut").responses.create(
            model="m", input="Define cat.", max_output_tokens=3
        )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "Let me look"
    assert gateway.trajectory("cut").turns[0].stop_reason == "length"
