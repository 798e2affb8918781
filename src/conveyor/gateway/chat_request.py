"""The OpenAI chat-completions request, checked, and the messages in it compared field-wise.

A client resends the whole conversation every turn. To reuse the ids we sampled, the gateway
compares what it recorded with what came back, in a normal form (`normal_message`) that keeps
only what the model sees: role, text content, tool calls (id, name, arguments as a JSON value)
and a tool reply's `tool_call_id`. `None` and `""` content are equal; so are arguments that
differ only in JSON spacing. Everything else a client library adds (`refusal`, `annotations`,
`type`) is ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from conveyor.engines.base import OutputFormat
from conveyor.gateway.errors import bad_request
from conveyor.types import Message

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The most choices one request may ask for (each is a sampled and recorded reply).
MAX_CHOICES = 8
_ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass(frozen=True)
class ChatRequest:
    """The fields of one request the gateway acts on."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    # Sent as SSE chunks (`streaming`); recorded exactly as a whole reply.
    stream: bool = False
    include_usage: bool = False
    # "auto", "none", "required" or the name of the one function to call.
    tool_choice: str = "auto"
    named_tool: bool = False
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    # The most likely tokens to report per position (engines that report them).
    top_logprobs: int = 0
    # Choices sampled for this request (each recorded; see `Gateway._sample`).
    n: int = 1
    # `response_format` json_object / json_schema (None: text), enforced by the engine.
    response_format: OutputFormat | None = None


def parse_chat_request(body: Any) -> ChatRequest:
    """Check a decoded request body; `GatewayError` (400) naming the field that is wrong."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request(f"stream must be a boolean, got {stream!r}", param="stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise bad_request(
                "stream_options is only allowed when stream is true", param="stream_options"
            )
        usage = options.get("include_usage") if isinstance(options, dict) else None
        if not isinstance(options, dict) or not isinstance(usage, bool | None):
            raise bad_request(
                f"stream_options must be {{'include_usage': bool}}, got {options!r}",
                param="stream_options",
            )
    n = body.get("n")
    n = 1 if n is None else n
    if not _is_int(n) or not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"n must be an integer in [1, {MAX_CHOICES}], got {n!r}", param="n")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", param="messages")
    for index, message in enumerate(messages):
        _check_message(index, message)
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list", param="tools")
    for index, schema in enumerate(tools):
        check_tool_schema(index, schema)
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise bad_request(f"tool names must be unique, got {names}", param="tools")
    tool_choice, named = _tool_choice(body.get("tool_choice"), names)
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad_request(f"logprobs must be a boolean, got {logprobs!r}", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= 20):
        raise bad_request(
            f"top_logprobs must be an integer in [0, 20], got {top!r}", param="top_logprobs"
        )
    if top and not logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    response_format = _response_format(body.get("response_format"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens <= 0):
        raise bad_request(
            f"max_tokens must be a positive integer, got {max_tokens!r}", param="max_tokens"
        )
    return ChatRequest(
        messages=messages,
        tools=tools,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", low=0.0),
        top_p=_number(body, "top_p", low=0.0, high=1.0),
        seed=_seed(body.get("seed")),
        stream=bool(stream),
        include_usage=bool((options or {}).get("include_usage")),
        tool_choice=tool_choice,
        named_tool=named,
        stop=_stop(body.get("stop")),
        logprobs=bool(logprobs),
        top_logprobs=int(top or 0),
        n=int(n),
        response_format=response_format,
    )


def _response_format(form: Any) -> OutputFormat | None:
    """`response_format`: `{"type": "text"}` (the default) is None; `json_object` and
    `json_schema` (`{"json_schema": {"name": ..., "schema": {...}}}`) become the format the
    engine decodes under (`Gateway._sample` refuses them for an engine that cannot)."""
    if form is None:
        return None
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat(type="json_object")
    if kind == "json_schema":
        spec = form.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise bad_request(
                "response_format json_schema needs 'json_schema': {'name': str, 'schema': {...}}",
                param="response_format",
            )
        if not isinstance(schema, dict):
            raise bad_request(
                f"response_format json_schema.schema must be an object, got {schema!r}",
                param="response_format",
            )
        return OutputFormat(type="json_schema", schema_text=json.dumps(schema, sort_keys=True))
    raise bad_request(
        f"response_format must be {{'type': 'text' | 'json_object' | 'json_schema'}}, got {form!r}",
        param="response_format",
    )


def _tool_choice(choice: Any, names: list[str]) -> tuple[str, bool]:
    """`tool_choice` as (mode or function name, whether it names a function)."""
    if choice is None:
        return "auto", False
    if choice in ("auto", "none", "required"):
        if choice == "required" and not names:
            raise bad_request(
                "tool_choice 'required' needs tools", param="tool_choice", code="invalid_value"
            )
        return choice, False
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not name:
        raise bad_request(
            "tool_choice must be 'auto', 'none', 'required' or "
            f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}",
            param="tool_choice",
        )
    if name not in names:
        raise bad_request(
            f"tool_choice names {name!r}, which is not one of the tools {names}",
            param="tool_choice",
            code="invalid_value",
        )
    return str(name), True


def _stop(stop: Any) -> tuple[str, ...]:
    """`stop`: a string or up to 4 strings, none empty."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > 4
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise bad_request(
            f"stop must be a non-empty string or a list of up to 4 of them, got {stop!r}",
            param="stop",
        )
    return tuple(stops)


def check_tool_schema(index: int, schema: Any) -> None:
    """One OpenAI function tool; `GatewayError` saying which tool and why it is refused."""
    where = f"tools[{index}]"
    if not isinstance(schema, dict) or schema.get("type") != "function":
        raise bad_request(
            f"{where}: only {{'type': 'function', ...}} tools are supported", param=where
        )
    function = schema.get("function")
    if not isinstance(function, dict):
        raise bad_request(f"{where}: 'function' must be an object", param=where)
    name = function.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise bad_request(
            f"{where}: function name {name!r} must match {_TOOL_NAME.pattern}", param=where
        )
    where = f"{where} ({name})"
    if not isinstance(function.get("description", ""), str):
        raise bad_request(f"{where}: 'description' must be a string", param=f"tools[{index}]")
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise bad_request(
            f"{where}: 'parameters' must be a JSON schema of type 'object'", param=f"tools[{index}]"
        )
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(p, dict) for p in properties.values()
    ):
        raise bad_request(
            f"{where}: 'parameters.properties' must map names to schemas", param=f"tools[{index}]"
        )
    required = parameters.get("required", [])
    if not isinstance(required, list) or not set(required) <= set(properties):
        raise bad_request(
            f"{where}: 'parameters.required' lists names that are not properties: {required!r}",
            param=f"tools[{index}]",
        )


def _check_message(index: int, message: Any) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        raise bad_request(
            f"{where}: a message must be an object with a role in {sorted(_ROLES)}", param=where
        )
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise bad_request(f"{where}: 'content' must be a string or a list of parts", param=where)
    if isinstance(content, list) and not all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        raise bad_request(f"{where}: only text content parts are supported", param=where)
    if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise bad_request(f"{where}: a tool message needs its 'tool_call_id'", param=where)
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"{where}: malformed tool_calls entry {call!r}", param=where)


def text_of(content: Any) -> str:
    """A message's content as text (parts joined, None as empty)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return str(content)


def arguments_value(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value (a string that is not JSON stays a string)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments if arguments is not None else {}


def normal_message(message: Message) -> tuple[Any, ...]:
    """What of a message the model sees, hashable and comparable field-wise."""
    role = "system" if message["role"] == "developer" else message["role"]
    content = text_of(message.get("content"))
    if role == "assistant":
        calls = tuple(
            (
                call.get("id", ""),
                call["function"]["name"],
                json.dumps(arguments_value(call["function"].get("arguments")), sort_keys=True),
            )
            for call in message.get("tool_calls") or []
        )
        return (role, content, calls)
    if role == "tool":
        return (role, content, message["tool_call_id"])
    return (role, content)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(
    body: dict[str, Any], key: str, *, low: float, high: float | None = None
) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise bad_request(f"{key} must be a number {bound}, got {value!r}", param=key)
    return float(value)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value):
        raise bad_request(f"seed must be an integer, got {value!r}", param="seed")
    return int(value) & 0x7FFFFFFF
