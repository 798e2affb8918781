"""OpenAI's Responses API (`POST /v1/responses`) over the chat path: one request, one chat turn.

openai-agents' default model and `client.responses.create` speak this API. A request is turned
into the chat-completions request it stands for (`chat_body`), sampled and recorded by
`Gateway.chat` exactly as a chat completion is (same ledger, same token-exact turn, same
splits), and the chat answer is written back as a `response` object (`response_object`) or as
the Responses stream's events (`response_events`).

Input items understood: messages (`role` user/system/developer/assistant, text or
`input_text`/`output_text` parts), `function_call` and `function_call_output` items;
`reasoning` items are skipped (a model's reasoning is part of the raw text recorded for its
turn). `instructions` becomes the first system message. `previous_response_id` names an
earlier response of the same rollout: its conversation, output included, is put before
`input` (its `instructions` are not carried over, as OpenAI does). Function tools are the
flat Responses form (`{"type": "function", "name", "parameters"}`); hosted tools (web
search, file search, computer use...) are refused with a 400.
"""

from __future__ import annotations

import json
from typing import Any

from conveyor.gateway.errors import bad_request
from conveyor.types import Message

# Fields a client may send that change nothing the gateway does (stored state is per rollout,
# and the engine has no service tiers or caches to choose).
_IGNORED = {
    "model",
    "store",
    "include",
    "metadata",
    "parallel_tool_calls",
    "truncation",
    "reasoning",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "service_tier",
    "background",
    "context_management",
    "max_tool_calls",
    "stream_options",
}
_HANDLED = {
    "input",
    "instructions",
    "previous_response_id",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "text",
    "top_logprobs",
    "seed",
}


def chat_body(body: Any, earlier: list[Message] | None) -> dict[str, Any]:
    """The chat-completions body a Responses request stands for; `earlier` is the conversation
    of its `previous_response_id` (None when it names none). A 400 for what cannot be served."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    unknown = sorted(set(body) - _HANDLED - _IGNORED)
    if unknown:
        raise bad_request(
            f"unsupported Responses fields {unknown}; supported: {sorted(_HANDLED)}",
            param=unknown[0],
            code="unsupported_parameter",
        )
    if not isinstance(body.get("stream", False), bool):
        raise bad_request(f"stream must be a boolean, got {body['stream']!r}", param="stream")
    messages: list[Message] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("instructions must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    messages += earlier or []
    messages += input_messages(body.get("input"))
    if not messages:
        raise bad_request("input must hold at least one item", param="input")
    chat: dict[str, Any] = {"messages": messages}
    tools = [_chat_tool(i, t) for i, t in enumerate(body.get("tools") or [])]
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        chat["tool_choice"] = choice
    for ours, theirs in [
        ("max_tokens", "max_output_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("seed", "seed"),
    ]:
        if body.get(theirs) is not None:
            chat[ours] = body[theirs]
    if body.get("top_logprobs"):
        chat["logprobs"], chat["top_logprobs"] = True, body["top_logprobs"]
    text = body.get("text")
    if text is not None:
        form = text.get("format") if isinstance(text, dict) else None
        if form is not None:
            if not isinstance(form, dict):
                raise bad_request("text.format must be an object", param="text.format")
            if form.get("type") == "json_schema":
                schema = {k: v for k, v in form.items() if k != "type"}
                form = {"type": "json_schema", "json_schema": schema}
            chat["response_format"] = form
    return chat


def input_messages(items: Any) -> list[Message]:
    """Responses `input` (a string or a list of items) as chat messages: consecutive
    `function_call` items (after an assistant message or not) become one assistant message
    with those `tool_calls`."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise bad_request("input must be a string or a list of items", param="input")
    messages: list[Message] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where}: an item must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}: unknown role {role!r}", param=where)
            messages.append({"role": role, "content": _text(where, item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": _string(where, item, "call_id"),
                "type": "function",
                "function": {
                    "name": _string(where, item, "name"),
                    "arguments": item.get("arguments") or "{}",
                },
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(where, item, "call_id"),
                    "content": output if isinstance(output, str) else _text(where, output),
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise bad_request(
                f"{where}: items of type {kind!r} are not supported (message, function_call, "
                "function_call_output, reasoning are)",
                param=where,
                code="unsupported_value",
            )
    return messages


def _text(where: str, content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text", "text") or not isinstance(
                part.get("text"), str
            ):
                raise bad_request(
                    f"{where}: only text content parts are supported, got {kind!r}",
                    param=where,
                    code="unsupported_value",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of parts", param=where)


def _string(where: str, item: dict[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where}: {key!r} must be a non-empty string", param=where)
    return value


def _chat_tool(index: int, tool: Any) -> dict[str, Any]:
    """A Responses function tool (flat) as a chat tool (nested under `function`)."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise bad_request(
            f"tools[{index}]: only function tools are supported, got {kind!r} (hosted tools "
            "such as web search run on OpenAI's servers, not here)",
            param=f"tools[{index}]",
            code="unsupported_value",
        )
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    if function.get("parameters") is None:
        function.pop("parameters", None)
    return {"type": "function", "function": function}


def response_object(answer: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The `response` object of a chat answer (`Gateway.chat`'s)."""
    response_id = "resp_" + answer["id"].removeprefix("chatcmpl-")
    choice = answer["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        logprobs = (choice.get("logprobs") or {}).get("content") or []
        output.append(
            {
                "type": "message",
                "id": f"msg_{response_id}",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {
                        "type": "output_text",
                        "text": message["content"],
                        "annotations": [],
                        "logprobs": [_response_logprob(t) for t in logprobs],
                    }
                ],
            }
        )
    for index, call in enumerate(message.get("tool_calls") or []):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{response_id}_{index}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    cut = choice["finish_reason"] == "length"
    usage = answer["usage"]
    return {
        "id": response_id,
        "object": "response",
        "created_at": answer["created"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": answer["model"],
        "output": output,
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def _response_logprob(token: dict[str, Any]) -> dict[str, Any]:
    return {
        "token": token["token"],
        "logprob": token["logprob"],
        "bytes": token["bytes"],
        "top_logprobs": token["top_logprobs"],
    }


def response_events(final: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    """The Responses stream of a whole `final` response: created, in_progress, each output
    item added, its text or arguments in one delta, done, then completed (or incomplete)."""
    pending = response_object_pending(final)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for at, item in enumerate(final["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            empty = {**part, "text": "", "logprobs": []}
            where = {"item_id": item["id"], "output_index": at, "content_index": 0}
            events += [
                {
                    "type": "response.output_item.added",
                    "output_index": at,
                    "item": {**item, "status": "in_progress", "content": []},
                },
                {"type": "response.content_part.added", **where, "part": empty},
                {
                    "type": "response.output_text.delta",
                    **where,
                    "delta": part["text"],
                    "logprobs": part["logprobs"],
                },
                {
                    "type": "response.output_text.done",
                    **where,
                    "text": part["text"],
                    "logprobs": part["logprobs"],
                },
                {"type": "response.content_part.done", **where, "part": part},
            ]
        else:
            events += [
                {
                    "type": "response.output_item.added",
                    "output_index": at,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                },
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": at,
                    "delta": item["arguments"],
                },
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": at,
                    "name": item["name"],
                    "arguments": item["arguments"],
                },
            ]
        events.append({"type": "response.output_item.done", "output_index": at, "item": item})
    done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append({"type": done, "response": final})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def response_object_pending(final: dict[str, Any]) -> dict[str, Any]:
    """`final` as it stands before any output: in progress, no output, no usage."""
    return {
        **final,
        "status": "in_progress",
        "incomplete_details": None,
        "output": [],
        "usage": None,
    }


def sse_response_events(events: list[dict[str, Any]]) -> list[bytes]:
    """Server-sent events named by their type (`event:` and `data:` lines), as OpenAI sends
    the Responses stream (no `[DONE]`)."""
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]
