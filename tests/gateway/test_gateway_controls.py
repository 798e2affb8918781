"""`tool_choice`, `stop` and `logprobs` change the reply as OpenAI documents, and the recorded
turn stays true to what the policy sampled (forced tokens masked out, nothing past a stop).
The engine's words are scripted (tokenizer, renderer, HTTP stack and `openai` SDK are real):
a scripted model that would not call a tool on its own shows what tool_choice changes."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from conveyor.engines.simulated import SimulatedEngine


def _tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }


TOOLS = [_tool("lookup"), _tool("define")]
QUESTION = [{"role": "user", "content": "Define cat."}]


def _scripted(tokenizer: Any, reply: Any) -> SimulatedEngine:
    """An engine whose model writes `reply(prompt text)`, then ends its turn."""
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)

    def respond(prompt: list[int]) -> list[int]:
        return tokenizer.encode(reply(tokenizer.decode(prompt)), add_special_tokens=False) + end

    return SimulatedEngine(respond, eos_token_id=end[0])


def _continue_a_call(text: str) -> str:
    """A model that calls no tool unless its reply was opened as a call, then finishes it."""
    if text.endswith('"arguments": '):
        return '{"word": "dog"}}\n</tool_call>'
    if text.endswith("<tool_call>\n"):
        return '{"name": "lookup", "arguments": {"word": "cat"}}\n</tool_call>'
    return "No tool needed."


def _client(url: str, rollout: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/rollouts/{rollout}/v1", api_key="x", max_retries=0)


def test_tool_choice_required_and_named_open_a_call_the_trainer_does_not_learn(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    gateway = make_gw(_scripted(tokenizer, _continue_a_call))
    with serve(gateway) as url:

        def ask(rollout: str, choice: Any) -> Any:
            return (
                _client(url, rollout)
                .chat.completions.create(
                    model="m",
                    messages=QUESTION,  # type: ignore[arg-type]
                    tools=TOOLS,  # type: ignore[arg-type]
                    tool_choice=choice,
                )
                .choices[0]
            )

        auto = ask("auto", "auto")
        assert auto.message.content == "No tool needed." and not auto.message.tool_calls
        required = ask("required", "required")
        named = ask("named", {"type": "function", "function": {"name": "define"}})
    assert required.finish_reason == named.finish_reason == "tool_calls"
    calls = [
        (c.function.name, json.loads(c.function.arguments)) for c in required.message.tool_calls
    ]
    assert calls == [("lookup", {"word": "cat"})]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in named.message.tool_calls]
    assert calls == [("define", {"word": "dog"})]
    for rollout, opening in [
        ("required", "<tool_call>\n"),
        ("named", '<tool_call>\n{"name": "define", "arguments": '),
    ]:
        recorded = gateway.trajectory(rollout)
        turn = recorded.turns[0]
        forced = tokenizer.encode(opening, add_special_tokens=False)
        assert turn.completion_ids[: len(forced)] == forced
        assert turn.loss_mask == [0] * len(forced) + [1] * (len(turn.completion_ids) - len(forced))
        assert turn.completion_logprobs[: len(forced)] == [0.0] * len(forced)
        assert recorded.counters["forced_tokens"] == len(forced)
        # recorded as the model's whole reply, the forced opening included
        assistant = [m["content"] for m in recorded.messages if m["role"] == "assistant"]
        assert assistant[0].startswith(opening)
        recorded.samples()  # trains as one sample


CALLING = (
    'Looking it up.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "cat"}}\n</tool_call>'
)


def test_tool_choice_none_ends_the_reply_before_a_call(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    gateway = make_gw(_scripted(tokenizer, lambda _text: CALLING))
    with serve(gateway) as url:
        choice = (
            _client(url, "none")
            .chat.completions.create(
                model="m",
                messages=QUESTION,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                tool_choice="none",
            )
            .choices[0]
        )
    assert choice.message.content == "Looking it up." and not choice.message.tool_calls
    assert choice.finish_reason == "stop"
    turn = gateway.trajectory("none").turns[0]
    text = tokenizer.decode(turn.completion_ids)
    assert "<tool_call>" not in text and text.strip() == "Looking it up."
    assert turn.loss_mask == [1] * len(turn.completion_ids)


def test_stop_cuts_the_reply_and_the_record_before_the_stop_string(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    gateway = make_gw(_scripted(tokenizer, lambda _text: "One. Two. Three."))
    with serve(gateway) as url:
        client = _client(url, "stop")
        choice = client.chat.completions.create(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            stop=["Three", "Two"],
        ).choices[0]
        assert (choice.message.content, choice.finish_reason) == ("One.", "stop")
        # the reply resent continues the same sample: what was recorded is what was returned
        client.chat.completions.create(
            model="m",
            messages=[*QUESTION, {"role": "assistant", "content": "One."}],  # type: ignore[list-item]
        )
    recorded = gateway.trajectory("stop")
    assert tokenizer.decode(recorded.turns[0].completion_ids) == "One."
    assert recorded.turns[0].stop_reason == "stop"
    assert recorded.counters["splits"] == 0


def test_logprobs_are_the_sampled_tokens_and_top_logprobs_refused_without_engine_support(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    gateway = make_gw(_scripted(tokenizer, lambda _text: "A small animal."))
    with serve(gateway) as url:
        client = _client(url, "lp")
        plain = client.chat.completions.create(model="m", messages=QUESTION)  # type: ignore[arg-type]
        assert plain.choices[0].logprobs is None
        scored = client.chat.completions.create(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            logprobs=True,
            top_logprobs=0,
        )
        # the scripted engine reports no alternatives: more is refused, nothing sampled
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="m",
                messages=QUESTION,  # type: ignore[arg-type]
                logprobs=True,
                top_logprobs=2,
            )
        assert caught.value.body["param"] == "top_logprobs"  # type: ignore[index]
        assert caught.value.code == "unsupported_value"
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model="m",
                messages=QUESTION,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                tool_choice={"type": "function", "function": {"name": "nope"}},
            )
    content = scored.choices[0].logprobs.content
    assert "".join(t.token for t in content) == "A small animal."
    turn = gateway.trajectory("lp").turns[1]
    assert [t.logprob for t in content] == turn.completion_logprobs[:-1]  # the end token left out
    assert all(bytes(t.bytes) == t.token.encode() and t.top_logprobs == [] for t in content)


def test_response_format_json_is_refused_by_an_engine_without_constrained_decoding(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    """The scripted engine is no `StructuredOutput` (cannot decode under a grammar): a JSON
    format is refused (400, param response_format) in both APIs rather than answered with text
    that may break it; text is served. (Enforced formats: test_gateway_response_format.py.)"""
    gateway = make_gw(_scripted(tokenizer, lambda _text: "Plain words."))
    schema = {"name": "word", "schema": {"type": "object"}}
    with serve(gateway) as url:
        client = _client(url, "rf")
        text = client.chat.completions.create(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            response_format={"type": "text"},
        )
        assert text.choices[0].message.content == "Plain words."
        refused = []
        for form in ({"type": "json_object"}, {"type": "json_schema", "json_schema": schema}):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(
                    model="m",
                    messages=QUESTION,  # type: ignore[arg-type]
                    response_format=form,  # type: ignore[arg-type]
                )
            refused.append((caught.value.code, caught.value.param))
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(
                model="m",
                input="Define cat.",
                text={"format": {"type": "json_schema", **schema}},  # type: ignore[typeddict-item]
            )
        refused.append((caught.value.code, caught.value.param))
    assert refused == [("unsupported_value", "response_format")] * 3
    assert len(gateway.trajectory("rf").turns) == 1  # a refusal samples nothing


def test_n_choices_are_each_recorded_and_the_one_continued_keeps_its_sample(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    """n=2: two replies, each a recorded turn; the client goes on from the second, which
    extends that choice's own sample (no split); the first stays a sample of its own."""
    replies = iter(["Choice A.", "Choice B.", "Went on from B."])
    gateway = make_gw(_scripted(tokenizer, lambda _text: next(replies)))
    with serve(gateway) as url:
        client = _client(url, "n2")
        both = client.chat.completions.create(model="m", messages=QUESTION, n=2)  # type: ignore[arg-type]
        assert [c.message.content for c in both.choices] == ["Choice A.", "Choice B."]
        assert [c.index for c in both.choices] == [0, 1]
        picked = both.choices[1].message.model_dump(exclude_none=True)
        client.chat.completions.create(
            model="m",
            messages=[*QUESTION, picked, {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
        )
    recorded = gateway.trajectory("n2")
    assert recorded.counters["splits"] == 0 and recorded.counters["extra_choices"] == 1
    assert [t.sample_index for t in recorded.turns] == [0, 1, 1]
    first, second = recorded.samples()
    assert tokenizer.decode(first.input_ids).endswith("Choice A.<|im_end|>")
    text = tokenizer.decode(second.input_ids)
    assert "Choice B." in text and "Choice A." not in text and text.endswith("B.<|im_end|>")
    # the continued sample's prompt is choice B's ids, never re-tokenized
    b, go_on = recorded.turns[1], recorded.turns[2]
    assert go_on.prompt_ids[: len(b.prompt_ids) + len(b.completion_ids)] == (
        b.prompt_ids + b.completion_ids
    )


def test_n_choices_stream_by_index(tokenizer: Any, make_gw: Any, serve: Any) -> None:
    replies = iter(["First.", "Second."])
    gateway = make_gw(_scripted(tokenizer, lambda _text: next(replies)))
    with serve(gateway) as url:
        stream = _client(url, "n2s").chat.completions.create(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            n=2,
            stream=True,
        )
        texts: dict[int, str] = {}
        finished: dict[int, str] = {}
        for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
                if choice.finish_reason:
                    finished[choice.index] = choice.finish_reason
    assert texts == {0: "First.", 1: "Second."} and finished == {0: "stop", 1: "stop"}
