"""A scripted two-tool model shared by the Responses and openai-agents tests: the engine's
words are scripted, everything else (tokenizer, renderer, HTTP, SDKs) is real."""

from __future__ import annotations

from typing import Any

from conveyor.config import AgentConfig, HintsConfig
from conveyor.engines.simulated import SimulatedEngine

ROOMY = AgentConfig(max_completion_tokens=96, hints=HintsConfig(enabled=False))
PARAMS = {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}
RESPONSE_TOOLS = [
    {"type": "function", "name": "lookup", "description": "Look up.", "parameters": PARAMS},
    {"type": "function", "name": "define", "description": "Define.", "parameters": PARAMS},
]
CHAT_TOOLS = [
    {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
    for t in RESPONSE_TOOLS
]


def two_tools_then_answer(tokenizer: Any) -> SimulatedEngine:
    """A model that calls `lookup`, then `define` once lookup answered, then answers."""
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)

    def reply(prompt: list[int]) -> list[int]:
        text = tokenizer.decode(prompt)
        if "DEFINED" in text:
            words = "A cat is a small animal."
        elif "FOUND" in text:
            words = '<tool_call>\n{"name": "define", "arguments": {"word": "cat"}}\n</tool_call>'
        else:
            words = (
                'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "cat"}}\n'
                "</tool_call>"
            )
        return tokenizer.encode(words, add_special_tokens=False) + end

    return SimulatedEngine(reply, eos_token_id=end[0])
