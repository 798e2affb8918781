"""A resent conversation against the recorded one: reuse the sampled ids, or split.

The client resends the whole history each turn. When it equals what was recorded (compared in
normal form, `chat_request.normal_message`) plus new tool/user/system messages, the ledger
extends the previous prompt + completion ids with only the tokenized delta; otherwise the
conversation is rendered in full and a new training sample starts, counted as a split.
"""

from __future__ import annotations

import json
from typing import Any

from conveyor.agent.chat import ChatRenderer, TokenLedger
from conveyor.agent.parsing import format_tool_call
from conveyor.gateway.chat_request import ChatRequest, arguments_value, normal_message, text_of
from conveyor.gateway.errors import bad_request
from conveyor.gateway.recording import RolloutRecord
from conveyor.types import Message, ToolCall


def internal_messages(
    record: RolloutRecord, messages: list[Message], renderer: ChatRenderer
) -> tuple[list[Message], list[tuple[Any, ...]]]:
    """OpenAI messages -> our rendering form, and their normal forms for comparison.

    A tool reply is named after the call its `tool_call_id` answers; an assistant message we
    sampled is its raw text (found by where it stands, `ReplyIndex`, never by how it looks),
    one we did not is written in the model's tool-call format.
    """
    names = dict(record.call_names)
    internal: list[Message] = []
    normal = [normal_message(message) for message in messages]
    sampled = record.replies.resolve(normal)
    for index, (message, form) in enumerate(zip(messages, normal, strict=True)):
        role, content = form[0], form[1]
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                names[call.get("id", "")] = call["function"]["name"]
            reply = sampled.get(index)
            internal.append(
                {
                    "role": "assistant",
                    "content": reply.raw
                    if reply is not None
                    else assistant_text(index, message, renderer),
                }
            )
        elif role == "tool":
            name = message.get("name") or names.get(message["tool_call_id"])
            if not name:
                raise bad_request(
                    f"messages[{index}]: tool_call_id {message['tool_call_id']!r} answers no "
                    "tool call of an earlier assistant message",
                    param=f"messages[{index}]",
                )
            internal.append({"role": "tool", "content": content, "name": name})
        else:
            internal.append({"role": role, "content": content})
    return internal, normal


def advance(
    record: RolloutRecord,
    request: ChatRequest,
    renderer: ChatRenderer,
    internal: list[Message],
    normal: list[tuple[Any, ...]],
) -> list[int]:
    """The next prompt ids: extending the recorded ones, or a counted split."""
    tools_key = json.dumps(request.tools, sort_keys=True)
    record.split_now = None
    for fork in record.forks:  # the client goes on from another choice of an `n` > 1 request
        seen = len(fork.history)
        if normal[:seen] == fork.history and all(f[0] != "assistant" for f in normal[seen:]):
            record.ledger, record.history, record.last = fork.ledger, fork.history, fork.last
            break
    record.forks = []
    ledger = record.ledger
    seen = len(record.history)
    if (
        ledger is not None
        and tools_key == record.tools_key
        and normal[:seen] == record.history
        and all(form[0] != "assistant" for form in normal[seen:])
    ):
        index, fresh_index = ledger.sample_index, record.new_sample_index()
        prompt = ledger.next_prompt(internal[seen:])
        if ledger.sample_index != index:  # the template re-rendered a turn: a fresh index
            ledger.sample_index = fresh_index
            record.split_now = ledger.split_reasons[-1]
        return prompt
    if ledger is None:
        fresh = TokenLedger(renderer)
    else:
        reason = (
            "the tools changed"
            if tools_key != record.tools_key
            else f"the resent history differs from the recorded one within its first "
            f"{seen} messages"
        )
        fresh = TokenLedger(
            renderer,
            sample_index=record.new_sample_index(),
            splits=ledger.splits + 1,
            split_reasons=[*ledger.split_reasons, reason],
        )
    record.ledger, record.tools_key = fresh, tools_key
    record.split_now = fresh.split_reasons[-1] if ledger is not None else None
    return fresh.start(internal)


def assistant_text(index: int, message: Message, renderer: ChatRenderer) -> str:
    """An assistant message the gateway did not sample, written as the model would write it."""
    parts = [text_of(message.get("content"))] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        arguments = arguments_value(call["function"].get("arguments"))
        if not isinstance(arguments, dict):
            raise bad_request(
                f"messages[{index}]: tool call arguments must be a JSON object",
                param=f"messages[{index}]",
            )
        parts.append(
            format_tool_call(
                ToolCall(name=call["function"]["name"], arguments=arguments), renderer.tool_format
            )
        )
    return "\n".join(parts)
