"""`response_format` json_schema / json_object decoded under a grammar: the real SmolLM2 model on
HFEngine (float32, CPU, xgrammar masking its logits) behind the gateway and the real `openai`
SDK. Greedy and a few tokens, so the unconstrained reply shows what the mask changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Is the sky blue?"}]


def test_response_format_json_is_enforced_and_recorded_with_loss_mask_0(
    model_dir: Path, make_gw: Any, serve: Any
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
        free = ask("free", 6)
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
    text = free.choices[0].message.content or ""
    assert not text.lstrip().startswith("{"), text  # the model on its own answers in words
    # the constrained tokens are the policy's samples under a mask: kept out of the loss
    turn = gateway.trajectory("schema").turns[0]
    assert turn.loss_mask == [0] * len(turn.completion_ids)
    assert gateway.get("schema").counters["constrained_tokens"] == len(turn.completion_ids)
    assert set(gateway.trajectory("free").turns[0].loss_mask) == {1}
