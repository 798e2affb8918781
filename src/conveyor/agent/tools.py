"""Tools: typed async functions the agent calls, their OpenAI schemas and a registry that runs them.

A tool is an `async def` with type hints and a Google-style docstring; `@tool` derives its OpenAI
function schema from the signature and the docstring. `ToolRegistry.execute` turns one parsed
`ToolCall` into a `ToolOutcome`: what the policy asked for going wrong (an unknown tool, bad
arguments, an exception, a hang) becomes an error message for the model, while an infrastructure
failure (`RuntimeFailure`, `EngineError`) propagates so the dispatcher can retry the rollout.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import re
import time
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import pydantic

from conveyor.engines.base import EngineError
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.types import Message, Task, ToolCall

ToolFunction = Callable[..., Awaitable[Any]]
OutcomeKind = Literal["ok", "unknown_tool", "invalid_arguments", "raised", "timeout"]

_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ARGS_HEADER = re.compile(r"^(Args|Arguments|Parameters):\s*$")
_SECTION_HEADER = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")
_ARG_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass
class ToolContext:
    """Per-rollout state a tool may use: the task, its runtime and a scratch dictionary.

    A parameter annotated `ToolContext` is filled in by the registry at call time and never appears
    in the schema the model sees.
    """

    task: Task
    runtime: Runtime | None = None
    state: dict[str, Any] = field(default_factory=dict)

    def reset_context(self, messages: list[Message]) -> None:
        """Ask the loop to start a fresh conversation from `messages` after this turn's tool
        calls: the history is dropped, and the next turns form a new training sample (counted
        as a `reset`, not a template `split`). A memory agent's `update_memory` uses it."""
        self.state[RESET_KEY] = list(messages)


# `ToolContext.state` key of a pending context reset (the loop pops it).
RESET_KEY = "reset_context"


@dataclass(frozen=True)
class ToolOutcome:
    """The result of one tool call as the model will see it.

    `kind` says who owns a failure: every kind here is the policy's (an infrastructure failure is
    raised, not returned). `elapsed_s` is the wall time of validation plus the call.
    """

    output: str
    kind: OutcomeKind
    elapsed_s: float

    @property
    def is_error(self) -> bool:
        """Whether the call failed (anything but `ok`)."""
        return self.kind != "ok"


class ToolArgumentsError(ValueError):
    """The arguments of a call do not fit the tool's signature; the message names each problem."""


@dataclass(frozen=True)
class _Parameter:
    name: str
    adapter: pydantic.TypeAdapter[Any]
    required: bool


class Tool:
    """A typed async function with an OpenAI function schema; build one with `@tool`.

    Calling the tool object calls the wrapped function unchanged; `invoke` validates JSON arguments
    against the signature and injects the `ToolContext`.
    """

    def __init__(
        self, fn: ToolFunction, *, name: str | None = None, timeout_s: float | None = None
    ):
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@tool needs an `async def` function; {_qualname(fn)} is not async")
        self.name = name if name is not None else fn.__name__
        if not _NAME_PATTERN.match(self.name):
            raise ValueError(f"tool name {self.name!r} must match {_NAME_PATTERN.pattern}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"tool {self.name!r}: timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.fn = fn
        self.description, arg_docs = _parse_docstring(fn)
        self._context_param, self._parameters, properties = _inspect_signature(fn, arg_docs)
        self.schema: dict[str, Any] = {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": [p.name for p in self._parameters.values() if p.required],
                    "additionalProperties": False,
                },
            },
        }

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly (no validation, no context injection)."""
        return await self.fn(*args, **kwargs)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check and coerce JSON arguments; raise `ToolArgumentsError` naming every bad argument."""
        problems: list[str] = []
        values: dict[str, Any] = {}
        for key in arguments:
            if key not in self._parameters:
                expected = ", ".join(self._parameters) or "none"
                problems.append(f"unknown argument '{key}' (expected: {expected})")
        for name, param in self._parameters.items():
            if name not in arguments:
                if param.required:
                    problems.append(f"missing required argument '{name}'")
                continue
            try:
                values[name] = param.adapter.validate_python(arguments[name])
            except pydantic.ValidationError as exc:
                problems.append(_describe_validation_error(name, arguments[name], exc))
        if problems:
            raise ToolArgumentsError(
                f"Error: invalid arguments for tool '{self.name}': " + "; ".join(problems)
            )
        return values

    async def invoke(self, arguments: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Validate `arguments`, inject `ctx` and await the function; returns its raw result."""
        return await self._run(self.validate(arguments), ctx)

    async def _run(self, values: dict[str, Any], ctx: ToolContext) -> Any:
        if self._context_param is not None:
            values = {**values, self._context_param: ctx}
        return await self.fn(**values)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r}, timeout_s={self.timeout_s!r})"


@overload
def tool(fn: ToolFunction, /) -> Tool: ...


@overload
def tool(
    *, name: str | None = None, timeout_s: float | None = None
) -> Callable[[ToolFunction], Tool]: ...


def tool(
    fn: ToolFunction | None = None, /, *, name: str | None = None, timeout_s: float | None = None
) -> Tool | Callable[[ToolFunction], Tool]:
    """Turn a typed, documented `async def` into a `Tool`; use as `@tool` or `@tool(name=...)`.

    Supported parameter types: str, int, float, bool, list[X], dict[str, X], Literal[...],
    X | None; parameters with defaults are optional. Raises `TypeError` at decoration time for a
    sync function, a missing docstring or an unsupported annotation.
    """
    if fn is not None:
        return Tool(fn, name=name, timeout_s=timeout_s)

    def decorate(inner: ToolFunction) -> Tool:
        return Tool(inner, name=name, timeout_s=timeout_s)

    return decorate


class ToolRegistry:
    """The tools one agent may call, by name, in registration order."""

    def __init__(self, tools: Iterable[Tool] = ()):
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.register(item)

    def register(self, item: Tool) -> Tool:
        """Add a tool; a second tool with the same name is an error. Returns the tool."""
        if not isinstance(item, Tool):
            raise TypeError(f"only Tool objects can be registered (decorate with @tool): {item!r}")
        if item.name in self._tools:
            raise ValueError(f"a tool named '{item.name}' is already registered")
        self._tools[item.name] = item
        return item

    def get(self, name: str) -> Tool:
        """The tool called `name`; `KeyError` naming the available tools if there is none."""
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"unknown tool '{name}'; available: {', '.join(self._tools)}") from None

    @property
    def names(self) -> list[str]:
        """Registered tool names, in registration order."""
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of every tool (copies: callers may change them freely)."""
        return [copy.deepcopy(t.schema) for t in self._tools.values()]

    def subset(self, names: Iterable[str]) -> ToolRegistry:
        """A new registry with only the named tools, in the given order."""
        return ToolRegistry(self.get(name) for name in names)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    async def execute(
        self, call: ToolCall, ctx: ToolContext, *, timeout_s: float, max_output_chars: int
    ) -> ToolOutcome:
        """Run one call and describe the result for the model.

        The tool's own `timeout_s`, if set, replaces the `timeout_s` given here. Output longer than
        `max_output_chars` keeps its head and tail around a truncation marker. `RuntimeFailure` and
        `EngineError` propagate: they are infrastructure failures, not the policy's.
        """
        if max_output_chars <= 0:
            raise ValueError(f"max_output_chars must be positive, got {max_output_chars}")
        start = time.perf_counter()

        def outcome(output: str, kind: OutcomeKind) -> ToolOutcome:
            text = truncate_output(output, max_output_chars)
            return ToolOutcome(output=text, kind=kind, elapsed_s=time.perf_counter() - start)

        item = self._tools.get(call.name)
        if item is None:
            available = ", ".join(self._tools) or "none"
            return outcome(
                f"Error: unknown tool '{call.name}'. Available tools: {available}", "unknown_tool"
            )
        try:
            values = item.validate(call.arguments)
        except ToolArgumentsError as exc:
            return outcome(str(exc), "invalid_arguments")
        limit = item.timeout_s if item.timeout_s is not None else timeout_s
        try:
            # asyncio.timeout (not wait_for) tells our deadline apart from a TimeoutError the
            # tool raised itself.
            async with asyncio.timeout(limit) as deadline:
                result = await item._run(values, ctx)
        except (RuntimeFailure, EngineError):
            raise
        except TimeoutError as exc:
            if deadline.expired():
                return outcome(
                    f"Error: tool '{item.name}' timed out after {float(limit)} s", "timeout"
                )
            return outcome(_describe_exception(exc), "raised")
        except Exception as exc:
            return outcome(_describe_exception(exc), "raised")
        return outcome(render_output(result), "ok")


def render_output(result: Any) -> str:
    """What the model sees for a tool's return value: str as is, JSON for containers."""
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    if isinstance(result, dict | list | tuple):
        return json.dumps(result, ensure_ascii=False, default=str)
    return str(result)


def truncate_output(text: str, max_chars: int) -> str:
    """Keep the first and last characters of `text` within `max_chars`, with a marker between."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    dropped = len(text) - max_chars
    ending = text[len(text) - tail :] if tail else ""
    return f"{text[:head]}\n[... {dropped} characters truncated ...]\n{ending}"


def _qualname(fn: object) -> str:
    return getattr(fn, "__qualname__", repr(fn))


def _describe_exception(exc: BaseException) -> str:
    message = str(exc)
    return f"Error: {type(exc).__name__}: {message}" if message else f"Error: {type(exc).__name__}"


def _describe_validation_error(name: str, value: Any, exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = "".join(f"[{loc!r}]" for loc in error["loc"])
        parts.append(f"{error['msg']}{' at ' + where if where else ''}")
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"argument '{name}': {', '.join(parts)} (got {shown})"


def _parse_docstring(fn: ToolFunction) -> tuple[str, dict[str, str]]:
    """The first paragraph as the description, and per-parameter text from an `Args:` section."""
    doc = inspect.getdoc(fn)
    if not doc or not doc.strip():
        raise TypeError(f"tool {_qualname(fn)} needs a docstring: it becomes the tool description")
    lines = doc.strip().splitlines()
    paragraph: list[str] = []
    for line in lines:
        if not line.strip() or _ARGS_HEADER.match(line.strip()):
            break
        paragraph.append(line.strip())
    description = " ".join(paragraph)
    if not description:
        raise TypeError(f"tool {_qualname(fn)}: the docstring's first paragraph must describe it")

    arg_docs: dict[str, str] = {}
    in_args = False
    indent: int | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        if not in_args:
            in_args = bool(_ARGS_HEADER.match(line))
            continue
        if not stripped:
            continue
        this_indent = len(line) - len(line.lstrip())
        if this_indent == 0 and _SECTION_HEADER.match(line):
            break
        if indent is None:
            indent = this_indent
        entry = _ARG_ENTRY.match(stripped)
        if this_indent <= indent and entry:
            current = entry.group(1)
            arg_docs[current] = entry.group(2).strip()
        elif current is not None and this_indent > indent:
            arg_docs[current] = f"{arg_docs[current]} {stripped}".strip()
        else:
            raise TypeError(f"tool {_qualname(fn)}: cannot read the Args line {stripped!r}")
    return description, arg_docs


def _inspect_signature(
    fn: ToolFunction, arg_docs: dict[str, str]
) -> tuple[str | None, dict[str, _Parameter], dict[str, Any]]:
    """The context parameter's name, the validated parameters, and their JSON schema properties."""
    where = _qualname(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise TypeError(f"tool {where}: cannot resolve its type hints: {exc}") from exc
    context_param: str | None = None
    parameters: dict[str, _Parameter] = {}
    properties: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {where}: *args/**kwargs are not supported ('{name}')")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {where}: positional-only parameter '{name}' is not supported")
        if name not in hints:
            raise TypeError(f"tool {where}: parameter '{name}' needs a type annotation")
        annotation = hints[name]
        if annotation is ToolContext:
            if context_param is not None:
                raise TypeError(f"tool {where}: more than one ToolContext parameter")
            context_param = name
            continue
        try:
            prop = _json_schema(annotation)
        except TypeError as exc:
            raise TypeError(f"tool {where}: parameter '{name}': {exc}") from None
        if name in arg_docs:
            prop["description"] = arg_docs[name]
        required = param.default is inspect.Parameter.empty
        if not required and _is_json_value(param.default):
            prop["default"] = param.default
        properties[name] = prop
        parameters[name] = _Parameter(name, pydantic.TypeAdapter(annotation), required)
    unknown = sorted(set(arg_docs) - set(parameters) - {context_param})
    if unknown:
        raise TypeError(f"tool {where}: the docstring documents unknown parameters {unknown}")
    return context_param, parameters, properties


def _json_schema(annotation: Any) -> dict[str, Any]:
    """JSON schema of one supported annotation; `TypeError` for anything else."""
    if isinstance(annotation, type) and annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list and len(args) == 1:
        return {"type": "array", "items": _json_schema(args[0])}
    if origin is dict and len(args) == 2 and args[0] is str:
        return {"type": "object", "additionalProperties": _json_schema(args[1])}
    if origin is Literal:
        if not args or not all(type(a) in _SCALARS for a in args):
            raise TypeError(f"Literal values must be str, int, float or bool: {annotation!r}")
        kinds = sorted({_SCALARS[type(a)] for a in args})
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            inner = _json_schema(rest[0])
            kind = inner["type"]
            inner["type"] = [*kind, "null"] if isinstance(kind, list) else [kind, "null"]
            if "enum" in inner:
                inner["enum"] = [*inner["enum"], None]
            return inner
    raise TypeError(
        f"unsupported annotation {annotation!r}; use str, int, float, bool, list[X], "
        "dict[str, X], Literal[...] or X | None"
    )


def _is_json_value(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


# Defined last: the decorator needs the helpers above at import time.
@tool
async def finish(answer: str, ctx: ToolContext) -> str:
    """Submit the final answer and end the task. Call this once, when you are done.

    Args:
        answer: The final answer to the task.
    """
    ctx.state["finished"] = True
    ctx.state["answer"] = answer
    return "Answer submitted."
