"""Tool-call parsing: a case for every error kind, and hypothesis fuzzing of both formats."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conveyor.agent.parsing import ParseResult, format_tool_call, parse_tool_calls
from conveyor.types import ToolCall

CALC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "flag": {"type": "boolean"},
        "items": {"type": "array"},
        "opts": {"type": "object"},
        "maybe": {"type": ["integer", "null"]},
        "s": {"type": "string"},
    },
}
SCHEMAS = {"calc": CALC_SCHEMA}


def hermes(name: str, arguments: Any, key: str = "arguments") -> str:
    return f"<tool_call>\n{json.dumps({'name': name, key: arguments})}\n</tool_call>"


def xml(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def only_error(result: ParseResult) -> str:
    assert result.calls == []
    assert len(result.errors) == 1, result.errors
    return result.errors[0]


# -- hermes ------------------------------------------------------------------------------------


def test_hermes_single_call() -> None:
    result = parse_tool_calls('<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>')
    assert result == ParseResult([ToolCall(name="calc", arguments={"x": 1}, id="call_0")], "", [])


def test_hermes_several_calls_and_text_around_them() -> None:
    text = f"Let me compute.\n{hermes('a', {'x': 1})}\nthen {hermes('b', {'y': [2]})}\nDone."
    result = parse_tool_calls(text, "hermes")
    assert [(c.id, c.name, c.arguments) for c in result.calls] == [
        ("call_0", "a", {"x": 1}),
        ("call_1", "b", {"y": [2]}),
    ]
    assert result.content == "Let me compute.\nthen\nDone."
    assert result.errors == []


def test_hermes_accepts_string_arguments_parameters_alias_and_no_arguments() -> None:
    text = (
        hermes("a", json.dumps({"x": 1}))
        + hermes("b", {"y": 2}, key="parameters")
        + '<tool_call>{"name": "c"}</tool_call>'
        + '<tool_call>{"name": "d", "arguments": null}</tool_call>'
    )
    result = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in result.calls] == [
        ("a", {"x": 1}),
        ("b", {"y": 2}),
        ("c", {}),
        ("d", {}),
    ]
    assert result.errors == []


def test_hermes_accepts_raw_newlines_inside_json_strings() -> None:
    result = parse_tool_calls('<tool_call>{"name": "w", "arguments": {"s": "a\nb"}}</tool_call>')
    assert result.calls[0].arguments == {"s": "a\nb"}


def test_malformed_json_says_where_and_later_calls_survive() -> None:
    text = '<tool_call>\n{"name": "calc", "arguments": {"x": 1,}}\n</tool_call>\n' + hermes(
        "ok", {}
    )
    result = parse_tool_calls(text)
    assert [(c.id, c.name) for c in result.calls] == [("call_0", "ok")]
    assert len(result.errors) == 1
    error = result.errors[0]
    assert error.startswith("Tool call 1: invalid JSON")
    assert "line 1, column 39" in error
    assert "near '}}" in error


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('{"arguments": {"x": 1}}', 'missing "name"'),
        ('{"name": 3, "arguments": {}}', '"name" must be a non-empty string'),
        ('{"name": " ", "arguments": {}}', '"name" must be a non-empty string'),
        ('{"name": "f", "arguments": [1, 2]}', "must be a JSON object, got an array"),
        ('{"name": "f", "arguments": 7}', "must be a JSON object, got a number"),
        ('{"name": "f", "arguments": "[1]"}', "must be a JSON object, got an array"),
        ('{"name": "f", "arguments": "{x"}', "is a string that is not valid JSON"),
        ('{"name": "f", "arguments": {}, "parameters": {}}', "not both"),
        ('[{"name": "f"}]', "got an array"),
        ('{"name": "f"} {"name": "g"}', "one call per block"),
        ("", "is empty"),
    ],
)
def test_hermes_call_errors(body: str, words: str) -> None:
    error = only_error(parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>", "hermes"))
    assert error.startswith("Tool call 1: ")
    assert words in error


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "calc", "arguments": {"x": 1}}',
        '<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_ca',
        '<tool_call>\n{"name": "calc", "argu',
        "<tool_call>\n",
    ],
)
def test_hermes_unclosed_call_is_reported_as_cut_off(text: str) -> None:
    assert "never closed with </tool_call> (was the output cut off?)" in only_error(
        parse_tool_calls(text)
    )


def test_closing_tag_without_opening_is_an_error_and_text_stays() -> None:
    result = parse_tool_calls(f"oops</tool_call> fine {hermes('a', {})}")
    assert [c.name for c in result.calls] == ["a"]
    assert result.content == "oops\nfine"
    assert result.errors == [
        "Found </tool_call> without a matching <tool_call> before it; "
        "open every call with <tool_call>."
    ]


@pytest.mark.parametrize("tail", ["<", "<tool", "<tool_call"])
def test_output_ending_inside_an_opening_tag_is_an_error(tail: str) -> None:
    result = parse_tool_calls("I will call it now " + tail, "hermes")
    assert result.calls == []
    assert result.errors == ["The output ends inside a <tool_call> tag (was it cut off?)."]


def test_deep_nesting_is_an_error_not_a_recursion_crash() -> None:
    for text in ["<tool_call>" + "[" * 100_000 + "</tool_call>", "<tool_call>" + "[" * 100_000]:
        assert only_error(parse_tool_calls(text))


# -- xml ---------------------------------------------------------------------------------------


def test_xml_wrapped_and_bare_calls_with_text_around() -> None:
    text = f"First {xml('read', path='a.py')} then <function=ls>\n</function> end"
    result = parse_tool_calls(text, "xml")
    assert result.calls == [
        ToolCall(name="read", arguments={"path": "a.py"}, id="call_0"),
        ToolCall(name="ls", arguments={}, id="call_1"),
    ]
    assert result.content == "First\nthen\nend"
    assert result.errors == []


def test_xml_values_strip_exactly_one_newline_each_side() -> None:
    text = (
        "<function=f><parameter=a>inline</parameter>"
        "<parameter=b>\n\n two \n\n</parameter><parameter=c>\n</parameter></function>"
    )
    assert parse_tool_calls(text).calls[0].arguments == {"a": "inline", "b": "\n two \n", "c": ""}


def test_xml_values_may_hold_other_tags() -> None:
    value = '<tool_call>\n<function=g>\n<parameter=q>\n</function>\n</tool_call>\n{"name": 1}'
    result = parse_tool_calls(xml("write", text=value) + "\n" + xml("ls"))
    assert [(c.name, c.arguments) for c in result.calls] == [("write", {"text": value}), ("ls", {})]
    assert result.errors == []


def test_xml_coerces_declared_types_and_leaves_the_rest_as_text() -> None:
    text = xml(
        "calc",
        n="42",
        x="2.5",
        flag="True",
        items='[1, "a"]',
        opts='{"k": null}',
        maybe="null",
        s="7",
        other="8",
    )
    expected = {
        "n": 42,
        "x": 2.5,
        "flag": True,
        "items": [1, "a"],
        "opts": {"k": None},
        "maybe": None,
        "s": "7",
        "other": "8",
    }
    assert parse_tool_calls(text, schemas=SCHEMAS).calls[0].arguments == expected
    assert parse_tool_calls(text).calls[0].arguments["n"] == "42"  # no schema, no coercion
    assert parse_tool_calls(text, schemas={"calc": {"type": "bogus"}}).calls[0].arguments[
        "flag"
    ] == ("True")


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("n", "4.5"),
        ("n", "true"),
        ("n", "1_000"),
        ("x", "NaN"),
        ("x", "abc"),
        ("flag", "yes"),
        ("items", '{"a": 1}'),
        ("items", "[1,"),
        ("opts", "[]"),
        ("maybe", "none at all"),
    ],
)
def test_xml_value_that_does_not_fit_its_type_is_an_error(param: str, value: str) -> None:
    error = only_error(parse_tool_calls(xml("calc", **{param: value}), schemas=SCHEMAS))
    assert error.startswith(f"Tool call 1: parameter {param!r} of calc must be of type")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n", "<function=f> is never"),
        ("<function=f>\n<parameter=a>\n1\n</parameter>\n</func", "<function=f> is never closed"),
        ("<function=f>\n<parameter=a>\n1\n</function>", "<parameter=a> is never closed"),
        ("<tool_call>\n<function=f>\n</function>\n", "<tool_call> is never closed"),
        ("<function=f", "ends inside a <function=...> tag"),
        ("<function=f>\n<parameter=a", "ends inside a <parameter=...> tag"),
        ("<function=f\nx>\n</function>", "malformed <function=...> tag"),
        ("<function=>\n</function>", "malformed <function=...> tag"),
        ("<function=f>\n<parameter=>1</parameter>\n</function>", "malformed <parameter=...> tag"),
        ("<function=f>\nhello\n</function>", "unexpected text inside <function=f>"),
        ("<function=f><parameter=a>1</parameter><parameter=a>2</parameter></function>", "twice"),
        ("<tool_call>\n<function=f>\n</function> x </tool_call>", "expected </tool_call>"),
        ('<tool_call>\n{"name": "f"}\n</tool_call>', "expected <function=NAME>"),
    ],
)
def test_xml_call_errors(text: str, words: str) -> None:
    error = only_error(parse_tool_calls(text, "xml"))
    assert error.startswith("Tool call 1: ")
    assert words in error


def test_xml_stray_closing_function_is_an_error() -> None:
    result = parse_tool_calls("a </function> b")
    assert result.content == "a\nb"
    assert result.errors == [
        "Found </function> without a matching <function=NAME> before it; "
        "open every call with <function=NAME>."
    ]


def test_xml_error_in_one_call_keeps_the_next() -> None:
    text = "<function=f>\nnoise\n</function>\n" + xml("g", a="1")
    result = parse_tool_calls(text)
    assert [(c.id, c.name) for c in result.calls] == [("call_0", "g")]
    assert len(result.errors) == 1


# -- format detection and formatting ----------------------------------------------------------


def test_auto_detects_the_format_of_each_call() -> None:
    text = hermes("h", {"s": "<function=x>"}) + xml("x", a="1") + "<function=b>\n</function>"
    result = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in result.calls] == [
        ("h", {"s": "<function=x>"}),
        ("x", {"a": "1"}),
        ("b", {}),
    ]
    assert result.errors == []


def test_hermes_mode_treats_bare_functions_as_text_and_xml_bodies_as_bad_json() -> None:
    bare = "<function=b>\n</function>"
    assert parse_tool_calls(bare, "hermes") == ParseResult([], bare, [])
    assert "invalid JSON" in only_error(parse_tool_calls(xml("x", a="1"), "hermes"))


def test_format_matches_the_chat_template_conventions() -> None:
    call = ToolCall(name="calc", arguments={"expr": "1 < 2\n", "n": 3, "ok": True, "l": [1, "é"]})
    assert format_tool_call(call, "hermes") == (
        '<tool_call>\n{"name": "calc", "arguments": '
        '{"expr": "1 < 2\\n", "n": 3, "ok": true, "l": [1, "é"]}}\n</tool_call>'
    )
    assert format_tool_call(call, "xml") == (
        "<tool_call>\n<function=calc>\n<parameter=expr>\n1 < 2\n\n</parameter>\n"
        "<parameter=n>\n3\n</parameter>\n<parameter=ok>\ntrue\n</parameter>\n"
        '<parameter=l>\n[1, "é"]\n</parameter>\n</function>\n</tool_call>'
    )


@pytest.mark.parametrize(
    "call",
    [
        ToolCall(name="a>b"),
        ToolCall(name=""),
        ToolCall(name="f", arguments={"a\nb": "x"}),
        ToolCall(name="f", arguments={"a": "x</parameter>y"}),
        ToolCall(name="f", arguments={"a": ["</parameter>"]}),
    ],
)
def test_xml_format_refuses_what_it_cannot_express(call: ToolCall) -> None:
    with pytest.raises(ValueError, match="XML"):
        format_tool_call(call, "xml")


def test_unknown_format_name_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown tool-call format"):
        parse_tool_calls("", "json")  # type: ignore[arg-type]


def test_adversarial_input_stays_fast() -> None:
    # A generous bound: quadratic scanning of these ~200k-character inputs takes minutes.
    texts = [
        "<tool_call>" * 20_000,
        "</tool_call>" * 20_000,
        '<tool_call>"' + "</tool_call><tool_call>" * 9_000,
        "<function=" * 20_000 + ">",
        "<function=f>" + "<parameter=a>" * 15_000,
        "<function=f>\n<parameter=a>\n" * 8_000 + "</parameter>",
        '<tool_call>{"name"' * 12_000,
    ]
    start = time.perf_counter()
    for text in texts:
        for fmt in ("hermes", "xml", "auto"):
            parse_tool_calls(text, fmt)  # type: ignore[arg-type]
    assert time.perf_counter() - start < 5.0


# -- property tests ----------------------------------------------------------------------------

TOP_TAGS = ("<tool_call>", "</tool_call>", "<function=", "</function>")
FRAGMENTS = [
    *TOP_TAGS,
    "<parameter=",
    "</parameter>",
    "<parameter=a>",
    "<function=f>",
    ">",
    "<",
    "\n",
    " ",
    "{",
    "}",
    "[",
    '"',
    "\\",
    ":",
    ",",
    '"name"',
    '"arguments"',
    '"parameters"',
    '"f"',
    "1",
    "null",
    "é",
    "\u2028",
]
fragment_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=30).map("".join)
any_text = st.text() | fragment_text
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
formats = st.sampled_from(["hermes", "xml", "auto"])
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
hermes_arguments = st.dictionaries(any_text, json_values, max_size=5)
xml_values = (
    any_text.filter(lambda s: "</parameter>" not in s)
    | st.integers()
    | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.lists(st.integers() | st.text(alphabet="ab<>\n"), max_size=3)
    | st.dictionaries(names, st.integers() | st.none(), max_size=3)
)
xml_arguments = st.dictionaries(names, xml_values, max_size=5)
# Prose around calls: anything that opens or closes no call and does not end inside an opening tag.
prose = any_text.filter(
    lambda s: (
        not any(tag in s for tag in TOP_TAGS)
        and not any(s.endswith(tag[:k]) for tag in TOP_TAGS[::2] for k in range(1, len(tag)))
    )
)

SCHEMA_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number"}


def schema_for(call: ToolCall) -> dict[str, dict[str, Any]]:
    types = {**SCHEMA_TYPES, list: "array", dict: "object"}
    properties = {k: {"type": types[type(v)]} for k, v in call.arguments.items()}
    return {call.name: {"type": "object", "properties": properties}}


def exactly(call: ToolCall) -> str:
    """A comparison key that tells 1, 1.0 and True apart at any depth."""
    return repr((call.id, call.name, call.arguments))


@settings(max_examples=200, deadline=None)
@given(
    name=names,
    arguments=hermes_arguments,
    prefix=prose,
    suffix=prose,
    fmt=st.sampled_from(["hermes", "auto"]),
)
def test_hermes_round_trip(
    name: str, arguments: dict[str, Any], prefix: str, suffix: str, fmt: str
) -> None:
    call = ToolCall(name=name, arguments=arguments, id="call_0")
    result = parse_tool_calls(prefix + format_tool_call(call, "hermes") + suffix, fmt)  # type: ignore[arg-type]
    assert result.errors == []
    assert [exactly(c) for c in result.calls] == [exactly(call)]
    assert result.content == "\n".join(p for p in (prefix.strip(), suffix.strip()) if p)


@settings(max_examples=200, deadline=None)
@given(name=names, arguments=xml_arguments, prefix=prose, suffix=prose, auto=st.booleans())
def test_xml_round_trip_with_schema(
    name: str, arguments: dict[str, Any], prefix: str, suffix: str, auto: bool
) -> None:
    call = ToolCall(name=name, arguments=arguments, id="call_0")
    try:
        text = prefix + format_tool_call(call, "xml") + suffix
    except ValueError:  # a list or dict holding "</parameter>" somewhere inside
        assume(False)
    result = parse_tool_calls(text, "auto" if auto else "xml", schemas=schema_for(call))
    assert result.errors == []
    assert [exactly(c) for c in result.calls] == [exactly(call)]
    assert result.content == "\n".join(p for p in (prefix.strip(), suffix.strip()) if p)


@settings(max_examples=200, deadline=None)
@given(
    name=names,
    arguments=st.dictionaries(names, any_text.filter(lambda s: "</parameter>" not in s)),
    fmt=st.sampled_from(["xml", "auto"]),
)
def test_xml_string_arguments_round_trip_without_schema(
    name: str, arguments: dict[str, str], fmt: str
) -> None:
    call = ToolCall(name=name, arguments=arguments, id="call_0")
    result = parse_tool_calls(format_tool_call(call, "xml"), fmt)  # type: ignore[arg-type]
    assert (result.calls, result.errors) == ([call], [])


@settings(max_examples=200, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["hermes", "xml"]), names, xml_arguments),
        min_size=1,
        max_size=4,
        unique_by=lambda t: t[1],  # one schema per tool name
    ),
    gaps=st.lists(prose, min_size=5, max_size=5),
)
def test_several_calls_of_mixed_formats_come_back_in_order(
    calls: list[tuple[str, str, dict[str, Any]]], gaps: list[str]
) -> None:
    expected = [
        ToolCall(name=name, arguments=args, id=f"call_{i}")
        for i, (_, name, args) in enumerate(calls)
    ]
    schemas: dict[str, dict[str, Any]] = {}
    text = gaps[-1]
    for (fmt, _, _), call, gap in zip(calls, expected, gaps, strict=False):
        schemas.update(schema_for(call))
        try:
            text += format_tool_call(call, fmt) + gap  # type: ignore[arg-type]
        except ValueError:
            assume(False)
    result = parse_tool_calls(text, schemas=schemas)
    assert result.errors == []
    assert [exactly(c) for c in result.calls] == [exactly(c) for c in expected]


@settings(max_examples=200, deadline=None)
@given(text=any_text, fmt=formats, with_schemas=st.booleans())
def test_arbitrary_text_never_raises(text: str, fmt: str, with_schemas: bool) -> None:
    schemas = {"f": CALC_SCHEMA, "a": {"properties": "nonsense"}} if with_schemas else None
    result = parse_tool_calls(text, fmt, schemas)  # type: ignore[arg-type]
    assert isinstance(result, ParseResult)
    assert [c.id for c in result.calls] == [f"call_{i}" for i in range(len(result.calls))]
    assert all(isinstance(c, ToolCall) for c in result.calls)
    assert result.content == result.content.strip()
    assert all(isinstance(e, str) and e for e in result.errors)


@settings(max_examples=200, deadline=None)
@given(
    style=st.sampled_from(["hermes", "xml"]),
    name=names,
    hermes_args=hermes_arguments,
    xml_args=xml_arguments,
    lead=st.text().filter(lambda s: "<" not in s),
    data=st.data(),
)
def test_truncated_call_yields_no_call_and_an_error(
    style: str,
    name: str,
    hermes_args: dict[str, Any],
    xml_args: dict[str, Any],
    lead: str,
    data: st.DataObject,
) -> None:
    call = ToolCall(name=name, arguments=hermes_args if style == "hermes" else xml_args)
    try:
        full = lead + format_tool_call(call, style)  # type: ignore[arg-type]
    except ValueError:
        assume(False)
    cut = data.draw(st.integers(min_value=0, max_value=len(full) - 1), label="cut")
    truncated = full[:cut]
    fmt = data.draw(st.sampled_from([style, "auto"]), label="fmt")
    schemas = schema_for(call) if style == "xml" else None
    result = parse_tool_calls(truncated, fmt, schemas)  # type: ignore[arg-type]
    assert result.calls == []
    if "<" in truncated:
        assert result.errors, truncated
    else:
        assert result.errors == []
