"""Tool-call parsing and formatting for the two conventions models are trained on.

- `hermes` (Hermes, Qwen2.5): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.
- `xml` (Qwen3-Coder, SkyRL-Agent): ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n``
  ``</parameter>\\n</function>\\n</tool_call>``, also accepted without the ``<tool_call>`` wrapper.

The parser never raises on model output: every problem becomes a short message addressed to the
model, and a call with a problem is left out of `ParseResult.calls`, so the agent loop can answer
with a hint instead of running half a call. All scanning moves forward through the text (memoised
`str.find`, anchored regexes without nested repetition), so long garbage costs linear time.

Known limit of the XML convention: a parameter value ends at the first ``</parameter>``, so a
value cannot contain that string (`format_tool_call` refuses such a call).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from conveyor.types import ToolCall

ToolFormat = Literal["hermes", "xml", "auto"]

_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"
_FUNC = "<function="
_FUNC_END = "</function>"
_PARAM = "<parameter="
_PARAM_END = "</parameter>"

_SPACE = re.compile(r"\s*")
_TAG_NAME = re.compile(r"[^<>\n]*")  # the NAME in <function=NAME> / <parameter=NAME>
_DECODER = json.JSONDecoder(strict=False)  # models often put raw newlines inside JSON strings
_HERMES_SHAPE = '{"name": "<tool name>", "arguments": {...}}'
_COERCED_TYPES = frozenset({"integer", "number", "boolean", "array", "object"})
_FAIL = object()


@dataclass(frozen=True)
class ParseResult:
    """What one model message holds.

    `calls` are the well-formed tool calls in order of appearance, with ids ``call_0``,
    ``call_1``, ...; `content` is the text outside any call attempt, stripped; `errors` describe
    each problem (a broken call, a stray closing tag, output cut off inside a tag) in words that
    can be shown to the model as a hint. A call with an error is not in `calls`.
    """

    calls: list[ToolCall]
    content: str
    errors: list[str]


def parse_tool_calls(
    text: str,
    fmt: ToolFormat = "auto",
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> ParseResult:
    """Parse the tool calls in a model's message; never raises on any text.

    `fmt="auto"` decides per call: a ``<tool_call>`` whose body starts with ``<function=`` and any
    bare ``<function=...>`` are XML, every other ``<tool_call>`` is Hermes JSON. `schemas` maps a
    tool name to its JSON-schema ``parameters`` object; XML parameter values (always text) are
    coerced to the declared integer/number/boolean/array/object type, and a value that does not
    fit is an error. Hermes arguments are returned as the model wrote them.
    """
    if fmt not in ("hermes", "xml", "auto"):
        raise ValueError(f"unknown tool-call format {fmt!r}; expected 'hermes', 'xml' or 'auto'")
    return _Parser(text, fmt, schemas or {}).run()


def format_tool_call(call: ToolCall, fmt: Literal["hermes", "xml"]) -> str:
    """The exact text a model should emit for `call`; `parse_tool_calls` inverts it.

    Hermes JSON is written as the Qwen2.5 chat template writes it (``ensure_ascii=False``, default
    separators). XML writes strings verbatim and other values as JSON, as Qwen3-Coder does, so
    they round-trip through the parser with a schema that declares their types. Raises
    `ValueError` for a call the XML convention cannot express (a name containing ``<``, ``>`` or a
    newline, or a value containing ``</parameter>``).
    """
    if fmt == "hermes":
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{_OPEN}\n{body}\n{_CLOSE}"
    if fmt != "xml":
        raise ValueError(f"unknown tool-call format {fmt!r}; expected 'hermes' or 'xml'")
    parts = [f"{_OPEN}\n{_FUNC}{_xml_name(call.name)}>\n"]
    for key, value in call.arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if _PARAM_END in text:
            raise ValueError(f"parameter {key!r} contains {_PARAM_END!r}, which XML cannot express")
        parts.append(f"{_PARAM}{_xml_name(key)}>\n{text}\n{_PARAM_END}\n")
    parts.append(f"{_FUNC_END}\n{_CLOSE}")
    return "".join(parts)


def _xml_name(name: str) -> str:
    if not name.strip() or any(c in name for c in "<>\n"):
        raise ValueError(f"name {name!r} cannot be written in the XML tool-call format")
    return name


class _Finder:
    """`str.find` over one text, memoised so that forward scans stay linear overall."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._last: dict[str, tuple[int, int]] = {}

    def find(self, needle: str, start: int) -> int:
        searched_from, found = self._last.get(needle, (len(self.text) + 1, -1))
        # No occurrence lies in [searched_from, found), so `found` still answers a later start.
        if searched_from <= start and (found == -1 or start <= found):
            return found
        found = self.text.find(needle, start)
        self._last[needle] = (start, found)
        return found


# A parsed call (name, arguments) or the reason it is not one.
_Outcome = tuple[str, dict[str, Any]] | str


class _Parser:
    """One pass over one message."""

    def __init__(self, text: str, fmt: ToolFormat, schemas: Mapping[str, Mapping[str, Any]]):
        self.text = text
        self.end = len(text)
        self.fmt = fmt
        self.schemas = schemas
        self.finder = _Finder(text)
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self.attempts = 0  # call attempts so far; errors number them from 1
        self.openers = [_OPEN] if fmt == "hermes" else [_OPEN, _FUNC]
        self.closers = [_CLOSE] if fmt == "hermes" else [_CLOSE, _FUNC_END]

    def run(self) -> ParseResult:
        content: list[str] = []
        pos = 0
        while pos < self.end:
            hits = [(self.finder.find(tag, pos), tag) for tag in self.openers + self.closers]
            found = [hit for hit in hits if hit[0] >= 0]
            if not found:
                content.append(self.text[pos:])
                self._check_cut_opening(pos)
                break
            at, tag = min(found)
            content.append(self.text[pos:at])
            if tag in self.closers:
                opener = _OPEN if tag == _CLOSE else f"{_FUNC}NAME>"
                self.errors.append(
                    f"Found {tag} without a matching {opener} before it; "
                    f"open every call with {opener}."
                )
                pos = at + len(tag)
                continue
            self.attempts += 1
            if tag == _OPEN:
                outcome, pos = self._tool_call(at + len(_OPEN))
            else:
                outcome, pos = self._function(at)
            if isinstance(outcome, str):
                self.errors.append(f"Tool call {self.attempts}: {outcome}")
            else:
                name, arguments = outcome
                self.calls.append(
                    ToolCall(name=name, arguments=arguments, id=f"call_{len(self.calls)}")
                )
        pieces = [piece.strip() for piece in content]
        return ParseResult(
            calls=self.calls, content="\n".join(p for p in pieces if p), errors=self.errors
        )

    # -- helpers -------------------------------------------------------------------------------

    def _skip_space(self, pos: int) -> int:
        match = _SPACE.match(self.text, pos)
        return match.end() if match else pos

    def _cut_inside(self, pos: int, tags: list[str]) -> str | None:
        """The tag that the text's tail from `pos` begins but does not finish, if any."""
        rest = self.text[pos : pos + max(len(tag) for tag in tags)]
        if not rest or pos + len(rest) != self.end:
            return None
        return next((tag for tag in tags if len(rest) < len(tag) and tag.startswith(rest)), None)

    def _check_cut_opening(self, pos: int) -> None:
        for start in range(max(pos, self.end - len(_OPEN) + 1), self.end):
            tag = self._cut_inside(start, self.openers)
            if tag is not None:
                shown = tag if tag == _OPEN else f"{_FUNC}NAME>"
                self.errors.append(f"The output ends inside a {shown} tag (was it cut off?).")
                return

    def _after(self, needle: str, pos: int, outcome: str) -> tuple[str, int]:
        """Give up on this call: resume after the next `needle`, or at the end of the text."""
        at = self.finder.find(needle, pos)
        return outcome, (self.end if at == -1 else at + len(needle))

    # -- <tool_call> ... </tool_call> ----------------------------------------------------------

    def _tool_call(self, start: int) -> tuple[_Outcome, int]:
        unclosed = f"{_OPEN} is never closed with {_CLOSE} (was the output cut off?)."
        body = self._skip_space(start)
        if body == self.end or self._cut_inside(body, [_CLOSE]):
            return unclosed, self.end
        if self.text.startswith(_CLOSE, body):
            return f"the {_OPEN} ... {_CLOSE} block is empty.", body + len(_CLOSE)
        is_xml = self.text.startswith(_FUNC, body)
        if self.fmt == "xml" and not is_xml:
            return self._after(_CLOSE, body, f"expected {_FUNC}NAME> right after {_OPEN}.")
        if self.fmt == "hermes" or not is_xml:
            return self._hermes(body, unclosed)
        outcome, end = self._function(body)
        if end == self.end and isinstance(outcome, str):
            return outcome, end
        after = self._skip_space(end)
        if self.text.startswith(_CLOSE, after):
            return outcome, after + len(_CLOSE)
        if isinstance(outcome, str):
            return self._after(_CLOSE, end, outcome)
        if self.finder.find(_CLOSE, end) == -1:
            return unclosed, self.end
        return self._after(_CLOSE, end, f"expected {_CLOSE} right after {_FUNC_END}.")

    def _hermes(self, body: int, unclosed: str) -> tuple[_Outcome, int]:
        try:
            value, end = _DECODER.raw_decode(self.text, body)
        except json.JSONDecodeError as exc:
            if self.finder.find(_CLOSE, body) == -1:
                return unclosed, self.end
            return self._after(_CLOSE, body, self._json_error(body, exc))
        except RecursionError:
            return self._after(_CLOSE, body, "invalid JSON: it is nested too deeply.")
        after = self._skip_space(end)
        if self.text.startswith(_CLOSE, after):
            return _from_json(value), after + len(_CLOSE)
        if self.finder.find(_CLOSE, end) == -1:
            return unclosed, self.end
        return self._after(
            _CLOSE, end, f"expected {_CLOSE} right after the JSON object; put one call per block."
        )

    def _json_error(self, body: int, exc: json.JSONDecodeError) -> str:
        before = self.text[body : exc.pos]
        line = before.count("\n") + 1
        column = exc.pos - body - (before.rfind("\n") + 1) + 1
        near = self.text[exc.pos : exc.pos + 20]
        return (
            f"invalid JSON ({exc.msg} at line {line}, column {column} of the call, "
            f"near {near!r}); write one JSON object {_HERMES_SHAPE}."
        )

    # -- <function=NAME> <parameter=P>VALUE</parameter> ... </function> ------------------------

    def _tag_name(self, start: int, kind: str) -> tuple[str | None, int, str]:
        """Read NAME> after `<function=` or `<parameter=`: (name or None, position after, error)."""
        match = _TAG_NAME.match(self.text, start)
        stop = match.end() if match else start
        if stop == self.end:
            return None, stop, f"the output ends inside a <{kind}=...> tag (was it cut off?)."
        name = self.text[start:stop].strip()
        if self.text[stop] != ">" or not name:
            return None, stop, f"malformed <{kind}=...> tag; write <{kind}=NAME> on one line."
        return name, stop + 1, ""

    def _function(self, at: int) -> tuple[_Outcome, int]:
        name, pos, problem = self._tag_name(at + len(_FUNC), "function")
        if name is None:
            return (problem, self.end) if pos == self.end else self._after(_FUNC_END, pos, problem)
        properties = _properties(self.schemas.get(name))
        arguments: dict[str, Any] = {}
        first_problem: str | None = None
        while True:
            pos = self._skip_space(pos)
            if self.text.startswith(_FUNC_END, pos):
                end = pos + len(_FUNC_END)
                return (first_problem, end) if first_problem else ((name, arguments), end)
            if pos == self.end or self._cut_inside(pos, [_FUNC_END, _PARAM]):
                return (
                    f"{_FUNC}{name}> is never closed with {_FUNC_END} (was the output cut off?).",
                    self.end,
                )
            if not self.text.startswith(_PARAM, pos):
                return self._after(
                    _FUNC_END,
                    pos,
                    f"unexpected text inside {_FUNC}{name}>; only {_PARAM}NAME>...{_PARAM_END} "
                    f"blocks may appear before {_FUNC_END}.",
                )
            key, start, problem = self._tag_name(pos + len(_PARAM), "parameter")
            if key is None:
                if start == self.end:
                    return problem, self.end
                return self._after(_FUNC_END, start, problem)
            close = self.finder.find(_PARAM_END, start)
            if close == -1:
                return (
                    f"{_PARAM}{key}> is never closed with {_PARAM_END} (was the output cut off?).",
                    self.end,
                )
            pos = close + len(_PARAM_END)
            raw = self.text[start:close]
            raw = raw.removeprefix("\n").removesuffix("\n")
            if first_problem:
                continue
            if key in arguments:
                first_problem = f"parameter {key!r} of {name} is given twice."
                continue
            value = _coerce(raw, _declared_types(properties.get(key)))
            if value is _FAIL:
                kinds = " or ".join(_declared_types(properties.get(key)))
                first_problem = (
                    f"parameter {key!r} of {name} must be of type {kinds}, got {raw[:40]!r}."
                )
                continue
            arguments[key] = value


def _from_json(value: Any) -> _Outcome:
    """Check a decoded Hermes call object."""
    if not isinstance(value, dict):
        return f"the call must be a JSON object {_HERMES_SHAPE}, got {_json_kind(value)}."
    name = value.get("name")
    if name is None:
        return f'missing "name"; write {_HERMES_SHAPE}.'
    if not isinstance(name, str) or not name.strip():
        return f'"name" must be a non-empty string, got {_json_kind(name)}.'
    if "arguments" in value and "parameters" in value:
        return f'give "arguments" or "parameters", not both, in the call to {name}.'
    arguments = value.get("arguments", value.get("parameters"))
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = _DECODER.decode(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return f'"arguments" of {name} is a string that is not valid JSON; give a JSON object.'
    if not isinstance(arguments, dict):
        return f'"arguments" of {name} must be a JSON object, got {_json_kind(arguments)}.'
    return name, arguments


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    kinds = {str: "a string", list: "an array", dict: "an object", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _properties(schema: Mapping[str, Any] | None) -> Mapping[str, Any]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    return properties if isinstance(properties, Mapping) else {}


def _declared_types(schema: Any) -> list[str]:
    declared = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [t for t in declared if isinstance(t, str)]
    return []


def _coerce(raw: str, types: list[str]) -> Any:
    """`raw` as the first declared type it fits, `raw` itself when no coerced type is declared."""
    if not _COERCED_TYPES.intersection(types):
        return raw
    text = raw.strip()
    if "null" in types and text in ("null", "None"):
        return None
    for kind in types:
        if kind == "string":
            return raw
        value = _coerce_one(text, kind)
        if value is not _FAIL:
            return value
    return _FAIL


def _coerce_one(text: str, kind: str) -> Any:
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.lower(), _FAIL)
    if kind not in _COERCED_TYPES:
        return _FAIL
    try:
        value = _DECODER.decode(text)
    except (ValueError, RecursionError):  # JSONDecodeError, or an int too long to convert
        return _FAIL
    if kind == "array":
        return value if isinstance(value, list) else _FAIL
    if kind == "object":
        return value if isinstance(value, dict) else _FAIL
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _FAIL
    if isinstance(value, float) and not math.isfinite(value):
        return _FAIL
    if kind == "integer":
        if isinstance(value, float):
            return int(value) if value.is_integer() else _FAIL
        return value
    return value
