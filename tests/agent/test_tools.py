"""Tools: schemas from signatures, argument validation, and what `execute` makes of failures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

import pytest

from conveyor.agent.tools import (
    Tool,
    ToolContext,
    ToolOutcome,
    ToolRegistry,
    finish,
    tool,
    truncate_output,
)
from conveyor.engines.base import EngineError
from conveyor.runtime.base import RuntimeFailure
from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.types import Task, ToolCall

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def make_ctx(runtime: SimulatedRuntime | None = None) -> ToolContext:
    task = Task(id="t1", family="test", prompt=[{"role": "user", "content": "hi"}])
    return ToolContext(task=task, runtime=runtime)


@tool
async def read_file(path: str, ctx: ToolContext, max_lines: int = 100) -> str:
    """Read a text file from the workspace.

    More detail that is not part of the description.

    Args:
        path: Path of the file, relative to the workspace
            root or absolute inside it.
        max_lines: How many lines to return at most.

    Returns:
        The file content.
    """
    assert ctx.runtime is not None
    content = await ctx.runtime.read_file(path)
    return "\n".join(content.splitlines()[:max_lines])


@tool(name="calc", timeout_s=0.2)
async def calculator(
    op: Literal["add", "mul"],
    operands: list[float],
    labels: dict[str, int] | None = None,
    verbose: bool = False,
) -> float:
    """Apply an operation to numbers.

    Args:
        op: Which operation.
        operands (list[float]): The numbers.
    """
    if op == "add":
        return sum(operands)
    product = 1.0
    for x in operands:
        product *= x
    return product


@tool
async def hang(seconds: float = 100.0) -> str:
    """Sleep for a long time."""
    await asyncio.sleep(seconds)
    return "woke up"


@tool
async def boom(kind: str) -> str:
    """Raise the exception named by `kind`.

    Args:
        kind: One of file, runtime, engine, timeout.
    """
    if kind == "file":
        raise FileNotFoundError("no such file: /workspace/missing.txt")
    if kind == "runtime":
        raise RuntimeFailure("sandbox died")
    if kind == "engine":
        raise EngineError("engine down")
    if kind == "timeout":
        raise TimeoutError("upstream service timed out")
    return "fine"


@tool
async def structured(n: int) -> dict[str, Any]:
    """Return a dictionary.

    Args:
        n: A number.
    """
    return {"n": n, "items": [1, 2]}


@tool
async def big(n: int) -> str:
    """Return `n` characters.

    Args:
        n: How many.
    """
    return "".join(chr(ord("a") + i % 26) for i in range(n))


def registry() -> ToolRegistry:
    return ToolRegistry([read_file, calculator, hang, boom, structured, big, finish])


def execute(
    call: ToolCall,
    ctx: ToolContext | None = None,
    *,
    timeout_s: float = 5.0,
    max_output_chars: int = 10_000,
) -> ToolOutcome:
    return run(
        registry().execute(
            call, ctx or make_ctx(), timeout_s=timeout_s, max_output_chars=max_output_chars
        )
    )


# --- schemas ---------------------------------------------------------------------------------


def test_schema_of_read_file_injects_context_and_reads_docstring() -> None:
    assert read_file.schema == {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "Path of the file, relative to the workspace root or "
                        "absolute inside it.",
                    },
                    "max_lines": {
                        "type": "integer",
                        "description": "How many lines to return at most.",
                        "default": 100,
                    },
                },
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }


def test_schema_of_literal_list_dict_optional_and_name_override() -> None:
    assert calculator.name == "calc"
    assert calculator.timeout_s == 0.2
    function = calculator.schema["function"]
    assert function["name"] == "calc"
    assert function["description"] == "Apply an operation to numbers."
    params = function["parameters"]
    assert params["required"] == ["op", "operands"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["op"] == {
        "type": "string",
        "enum": ["add", "mul"],
        "description": "Which operation.",
    }
    assert props["operands"] == {
        "type": "array",
        "items": {"type": "number"},
        "description": "The numbers.",
    }
    assert props["labels"] == {
        "type": ["object", "null"],
        "additionalProperties": {"type": "integer"},
        "default": None,
    }
    assert props["verbose"] == {"type": "boolean", "default": False}


def test_schema_nested_and_mixed_literals() -> None:
    @tool
    async def nested(
        grid: list[list[int]], tags: dict[str, list[str]], level: Literal[1, 2, 3] | None = None
    ) -> str:
        """Nested types."""
        return ""

    props = nested.schema["function"]["parameters"]["properties"]
    assert props["grid"] == {
        "type": "array",
        "items": {"type": "array", "items": {"type": "integer"}},
    }
    assert props["tags"] == {
        "type": "object",
        "additionalProperties": {"type": "array", "items": {"type": "string"}},
    }
    assert props["level"] == {"type": ["integer", "null"], "enum": [1, 2, 3, None], "default": None}
    assert nested.schema["function"]["parameters"]["required"] == ["grid", "tags"]


def test_tool_without_parameters() -> None:
    @tool
    async def ping() -> str:
        """Answer pong."""
        return "pong"

    assert ping.schema["function"]["parameters"] == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    outcome = run(
        ToolRegistry([ping]).execute(
            ToolCall(name="ping"), make_ctx(), timeout_s=1, max_output_chars=100
        )
    )
    assert outcome == ToolOutcome(output="pong", kind="ok", elapsed_s=outcome.elapsed_s)


def test_decorated_tool_is_still_callable_directly() -> None:
    ctx = make_ctx()
    assert run(finish("42", ctx)) == "Answer submitted."
    assert ctx.state == {"finished": True, "answer": "42"}


# --- decoration errors -----------------------------------------------------------------------


def test_sync_function_is_rejected() -> None:
    def sync(x: int) -> int:
        """Sync."""
        return x

    with pytest.raises(TypeError, match="async def"):
        tool(sync)  # type: ignore[arg-type]


def test_missing_docstring_is_rejected() -> None:
    with pytest.raises(TypeError, match="docstring"):

        @tool
        async def undocumented(x: int) -> int:
            return x


@pytest.mark.parametrize(
    "annotation",
    ["tuple[int, int]", "set[str]", "dict[int, str]", "int | str", "bytes", "list", "object"],
)
def test_unsupported_annotation_is_rejected(annotation: str) -> None:
    namespace: dict[str, Any] = {}
    exec(
        f"async def f(x: {annotation}) -> str:\n    '''Doc.'''\n    return ''\n",
        namespace,
    )
    with pytest.raises(TypeError, match=r"parameter 'x'.*unsupported annotation"):
        tool(namespace["f"])


def test_missing_annotation_and_var_args_are_rejected() -> None:
    async def no_hint(x) -> str:  # type: ignore[no-untyped-def]
        """Doc."""
        return ""

    async def var_args(*xs: int) -> str:
        """Doc."""
        return ""

    with pytest.raises(TypeError, match="needs a type annotation"):
        tool(no_hint)
    with pytest.raises(TypeError, match=r"\*args"):
        tool(var_args)


def test_docstring_documenting_an_unknown_parameter_is_rejected() -> None:
    with pytest.raises(TypeError, match="unknown parameters"):

        @tool
        async def typo(path: str) -> str:
            """Doc.

            Args:
                pth: Misspelled.
            """
            return path


def test_bad_name_and_timeout_are_rejected() -> None:
    async def f() -> str:
        """Doc."""
        return ""

    with pytest.raises(ValueError, match="tool name"):
        tool(name="has space")(f)
    with pytest.raises(ValueError, match="timeout_s"):
        tool(timeout_s=0)(f)


# --- registry --------------------------------------------------------------------------------


def test_registry_names_schemas_subset_and_duplicates() -> None:
    reg = registry()
    assert reg.names == ["read_file", "calc", "hang", "boom", "structured", "big", "finish"]
    assert [s["function"]["name"] for s in reg.schemas()] == reg.names
    reg.schemas()[0]["function"]["name"] = "changed"
    assert reg.schemas()[0]["function"]["name"] == "read_file"
    sub = reg.subset(["finish", "calc"])
    assert sub.names == ["finish", "calc"]
    assert sub.get("calc") is calculator
    assert "calc" in sub and "hang" not in sub and len(sub) == 2
    with pytest.raises(ValueError, match="already registered"):
        reg.register(finish)
    with pytest.raises(KeyError, match="available"):
        reg.get("nope")
    with pytest.raises(KeyError):
        reg.subset(["nope"])
    with pytest.raises(TypeError, match="@tool"):
        reg.register(lambda: None)  # type: ignore[arg-type]


# --- execute ---------------------------------------------------------------------------------


def test_execute_ok_with_context_and_runtime() -> None:
    async def scenario() -> ToolOutcome:
        runtime = SimulatedRuntime({"notes/a.txt": "one\ntwo\nthree"})
        await runtime.start()
        ctx = make_ctx(runtime)
        call = ToolCall(name="read_file", arguments={"path": "notes/a.txt", "max_lines": 2})
        return await registry().execute(call, ctx, timeout_s=5, max_output_chars=1000)

    outcome = run(scenario())
    assert outcome.kind == "ok" and not outcome.is_error
    assert outcome.output == "one\ntwo"
    assert outcome.elapsed_s >= 0


def test_execute_converts_non_string_results() -> None:
    calc = execute(ToolCall(name="calc", arguments={"op": "mul", "operands": [2, "3.5"]}))
    assert (calc.kind, calc.output) == ("ok", "7.0")
    out = execute(ToolCall(name="structured", arguments={"n": 3}))
    assert (out.kind, out.output) == ("ok", '{"n": 3, "items": [1, 2]}')


def test_unknown_tool_lists_available_tools() -> None:
    outcome = execute(ToolCall(name="rm_rf", arguments={}))
    assert outcome.kind == "unknown_tool" and outcome.is_error
    assert "rm_rf" in outcome.output
    assert "read_file, calc, hang, boom, structured, big, finish" in outcome.output


def test_invalid_arguments_name_the_argument() -> None:
    missing = execute(ToolCall(name="read_file", arguments={"max_lines": 3}))
    assert missing.kind == "invalid_arguments"
    assert "missing required argument 'path'" in missing.output

    unknown = execute(ToolCall(name="read_file", arguments={"path": "a", "encoding": "utf8"}))
    assert unknown.kind == "invalid_arguments"
    assert "unknown argument 'encoding'" in unknown.output
    assert "expected: path, max_lines" in unknown.output

    wrong = execute(ToolCall(name="read_file", arguments={"path": "a", "max_lines": "many"}))
    assert wrong.kind == "invalid_arguments"
    assert "argument 'max_lines'" in wrong.output and "valid integer" in wrong.output

    literal = execute(ToolCall(name="calc", arguments={"op": "div", "operands": [1]}))
    assert literal.kind == "invalid_arguments"
    assert "argument 'op'" in literal.output and "'add' or 'mul'" in literal.output

    element = execute(ToolCall(name="calc", arguments={"op": "add", "operands": [1, "x"]}))
    assert "argument 'operands'" in element.output and "[1]" in element.output

    not_str = execute(ToolCall(name="read_file", arguments={"path": 7}))
    assert "argument 'path'" in not_str.output and "valid string" in not_str.output


def test_several_problems_are_reported_together() -> None:
    outcome = execute(ToolCall(name="calc", arguments={"operands": "x", "extra": 1}))
    assert outcome.kind == "invalid_arguments"
    for part in ("unknown argument 'extra'", "missing required argument 'op'", "'operands'"):
        assert part in outcome.output


def test_tool_that_raises_becomes_an_error_message() -> None:
    outcome = execute(ToolCall(name="boom", arguments={"kind": "file"}))
    assert outcome.kind == "raised" and outcome.is_error
    assert outcome.output == "Error: FileNotFoundError: no such file: /workspace/missing.txt"


def test_timeout_error_raised_by_the_tool_is_not_our_timeout() -> None:
    outcome = execute(ToolCall(name="boom", arguments={"kind": "timeout"}))
    assert outcome.kind == "raised"
    assert outcome.output == "Error: TimeoutError: upstream service timed out"


def test_infrastructure_failures_propagate() -> None:
    with pytest.raises(RuntimeFailure, match="sandbox died"):
        execute(ToolCall(name="boom", arguments={"kind": "runtime"}))
    with pytest.raises(EngineError, match="engine down"):
        execute(ToolCall(name="boom", arguments={"kind": "engine"}))


def test_runtime_used_after_close_propagates_as_runtime_failure() -> None:
    async def scenario() -> None:
        runtime = SimulatedRuntime({"a.txt": "x"})
        await runtime.start()
        await runtime.close()
        call = ToolCall(name="read_file", arguments={"path": "a.txt"})
        await registry().execute(call, make_ctx(runtime), timeout_s=5, max_output_chars=100)

    with pytest.raises(RuntimeFailure):
        run(scenario())


def test_hanging_tool_times_out_quickly() -> None:
    started = time.perf_counter()
    outcome = execute(ToolCall(name="hang", arguments={}), timeout_s=0.2)
    wall = time.perf_counter() - started
    assert outcome.kind == "timeout" and outcome.is_error
    assert outcome.output == "Error: tool 'hang' timed out after 0.2 s"
    assert 0.15 <= outcome.elapsed_s < 1.0
    assert wall < 2.0


def test_tool_timeout_overrides_the_default() -> None:
    @tool(timeout_s=0.1)
    async def slow() -> str:
        """Sleep a while."""
        await asyncio.sleep(100)
        return ""

    started = time.perf_counter()
    outcome = run(
        ToolRegistry([slow]).execute(
            ToolCall(name="slow"), make_ctx(), timeout_s=60, max_output_chars=100
        )
    )
    assert outcome.kind == "timeout"
    assert "timed out after 0.1 s" in outcome.output
    assert time.perf_counter() - started < 2.0


def test_several_calls_of_one_turn_run_concurrently() -> None:
    async def scenario() -> list[ToolOutcome]:
        reg = registry()
        ctx = make_ctx()
        calls = [ToolCall(name="hang", arguments={"seconds": 0.2}) for _ in range(5)]
        return await asyncio.gather(
            *(reg.execute(c, ctx, timeout_s=5, max_output_chars=100) for c in calls)
        )

    started = time.perf_counter()
    outcomes = run(scenario())
    assert [o.output for o in outcomes] == ["woke up"] * 5
    assert time.perf_counter() - started < 0.8


def test_long_output_is_truncated_with_a_marker() -> None:
    outcome = execute(ToolCall(name="big", arguments={"n": 12_345}), max_output_chars=1000)
    assert outcome.kind == "ok"
    marker = "\n[... 11345 characters truncated ...]\n"
    assert marker in outcome.output
    assert len(outcome.output) == 1000 + len(marker)
    full = "".join(chr(ord("a") + i % 26) for i in range(12_345))
    head, tail = outcome.output.split(marker)
    assert head == full[:500] and tail == full[-500:]


def test_truncate_output_edges() -> None:
    assert truncate_output("abc", 3) == "abc"
    assert truncate_output("abcd", 3) == "a\n[... 1 characters truncated ...]\ncd"
    assert truncate_output("x" * 10, 1) == "\n[... 9 characters truncated ...]\nx"


def test_error_messages_are_truncated_too() -> None:
    @tool
    async def loud() -> str:
        """Raise with a huge message."""
        raise ValueError("y" * 5000)

    outcome = run(
        ToolRegistry([loud]).execute(
            ToolCall(name="loud"), make_ctx(), timeout_s=1, max_output_chars=200
        )
    )
    assert outcome.kind == "raised"
    assert outcome.output.startswith("Error: ValueError: yyy")
    assert "characters truncated" in outcome.output
    assert len(outcome.output) < 300


def test_finish_records_the_answer_through_execute() -> None:
    ctx = make_ctx()
    outcome = execute(ToolCall(name="finish", arguments={"answer": "17"}), ctx)
    assert outcome.kind == "ok"
    assert ctx.state == {"finished": True, "answer": "17"}
    schema = finish.schema["function"]
    assert schema["parameters"]["required"] == ["answer"]
    assert list(schema["parameters"]["properties"]) == ["answer"]


def test_invalid_max_output_chars_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_output_chars"):
        execute(ToolCall(name="finish", arguments={"answer": "1"}), max_output_chars=0)


def test_tool_class_is_exported() -> None:
    assert isinstance(finish, Tool)
    assert repr(calculator) == "Tool(name='calc', timeout_s=0.2)"
