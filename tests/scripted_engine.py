"""A scripted engine for loop tests: real tokenizer, a fixed script instead of a model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.agent.parsing import format_tool_call
from conveyor.engines.simulated import SimulatedEngine
from conveyor.types import ToolCall


def scripted(tokenizer: Any, texts: Sequence[str], *, eos: bool = True) -> SimulatedEngine:
    """An engine that answers turn k with texts[k] (then repeats the last)."""
    queue = list(texts)
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)

    def respond(_prompt: list[int]) -> list[int]:
        text = queue.pop(0) if len(queue) > 1 else queue[0]
        return tokenizer.encode(text, add_special_tokens=False) + (end if eos else [])

    return SimulatedEngine(respond, eos_token_id=end[0])


def call(name: str, **arguments: Any) -> str:
    return format_tool_call(ToolCall(name=name, arguments=arguments), "hermes")
