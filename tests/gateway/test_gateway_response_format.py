"""`response_format` json_schema / json_object decoded under a grammar: the real SmolLM2 model on
HFEngine (float32, CPU, xgrammar masking its logits) behind the gateway and the real `openai`
SDK. Greedy and a few tokens, so the unconstrained reply shows what the mask changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {"name": "look", "parameters": {"type": "object", "properties": {}}},
}
ASK = [{"role": "user", "content": "Is the sky blue?"}]


def test_response_format_json_is_enforced_and_recorded_with_loss_mask_0(
    model_dir: Path, tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    from conveyor.engines.hf_local import HFEngine

    gateway = make_gw(HFEngine(model_dir))
    with serve(gateway) as url:

        def ask(rollout: str, max_tokens: int, **extra: Any) -> Any:
            client = openai.OpenAI(base_url=f"{url}/rollouts/{rollout}/v1", api_key="x")
            return client.chat.completions.create(
                model="m",
                messages=ASK,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=0,
                **extra,
            )

        schema_form = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
        shaped = ask("schema", 12, response_format=schema_form)
        anything = ask("object", 12, response_format={"type": "json_object"})
        # tools offered (auto): the grammar also lets the reply open a call, as this one does
        calling = ask("call", 6, response_format={"type": "json_object"}, tools=[TOOL])
        free = ask("free", 6)
        with pytest.raises(openai.BadRequestError) as caught:  # the client's fault, no infra error
            bad = {"name": "b", "schema": {"type": "nonsense"}}
            ask("bad", 4, response_format={"type": "json_schema", "json_schema": bad})
        assert (caught.value.code, caught.value.param) == ("invalid_value", "response_format")
        assert "nonsense" in caught.value.message
        responses = openai.OpenAI(base_url=f"{url}/rollouts/resp/v1", api_key="x")
        answer = responses.responses.create(
            model="m",
            input="Is the sky blue?",
            max_output_tokens=12,
            temperature=0,
            text={"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}},  # type: ignore[typeddict-item]
        )
    assert set(json.loads(answer.output_text)) == {"ok"}  # the Responses API's text.format
    value = json.loads(shaped.choices[0].message.content or "")
    assert isinstance(value, dict) and set(value) == {"ok"} and isinstance(value["ok"], bool)
    assert shaped.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(anything.choices[0].message.content or ""), dict)
    assert calling.choices[0].finish_reason == "length"
    raw = gateway.trajectory("call").turns[0].completion_ids
    assert tokenizer.decode(raw).startswith("<tool_call>")
    text = free.choices[0].message.content or ""
    assert not text.lstrip().startswith("{"), text  # the model on its own answers in words
    # the constrained tokens are the policy's samples under a mask: kept out of the loss
    turn = gateway.trajectory("schema").turns[0]
    assert turn.loss_mask == [0] * len(turn.completion_ids)
    assert gateway.get("schema").counters["constrained_tokens"] == len(turn.completion_ids)
    assert set(gateway.trajectory("free").turns[0].loss_mask) == {1}


def test_the_format_grammar_takes_json_or_an_opened_tool_call(tokenizer: Any) -> None:
    """`OutputFormat.grammar` (what both engines decode under), matched by xgrammar itself."""
    import xgrammar

    from conveyor.engines.base import OutputFormat

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
    compiler = xgrammar.GrammarCompiler(info)

    def takes(form: OutputFormat, text: str) -> bool:
        matcher = xgrammar.GrammarMatcher(compiler.compile_grammar(form.grammar()))
        return bool(matcher.accept_string(text)) and matcher.is_completed()

    shaped = OutputFormat(type="json_schema", schema_text=json.dumps(SCHEMA))
    assert takes(shaped, '{"ok": true}')
    assert not takes(shaped, '{"ok": 1}') and not takes(shaped, '{"ok": true, "x": 1}')
    assert not takes(shaped, '<tool_call>\n{"name": "look"}')  # no tools offered: JSON only
    with_tools = shaped.model_copy(update={"tool_call_open": "<tool_call>"})
    assert takes(with_tools, '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>')
    assert takes(with_tools, '{"ok": false}') and not takes(with_tools, "Yes, it is.")
    assert takes(OutputFormat(type="json_object"), '{"any": [1, "two"]}')
    assert not takes(OutputFormat(type="json_object"), "[1]")
