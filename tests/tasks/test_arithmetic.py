"""Arithmetic word problems: the safe calculator, the scorer and the multi-step oracle."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext
from conveyor.tasks.arithmetic import (
    MAX_MAGNITUDE,
    ArithmeticFamily,
    evaluate,
    format_number,
    last_number,
)
from conveyor.types import Task, ToolCall

T = TypeVar("T")
FAMILY = ArithmeticFamily()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def calculate(expression: str) -> tuple[str, str]:
    """(outcome kind, output) of one calculator call made through the family's registry."""
    task = FAMILY.make_tasks(1, 0, "train")[0]
    call = ToolCall(name="calculator", arguments={"expression": expression})
    ctx = ToolContext(task=task, runtime=await FAMILY.make_runtime(task))
    outcome = await FAMILY.tools().execute(call, ctx, timeout_s=5.0, max_output_chars=1000)
    return outcome.kind, outcome.output


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("3 * 4", "12"),
        ("17 + 3 * 12 - 9", "44"),
        ("(2 + 3) * -4", "-20"),
        ("60 / 4", "15"),
        ("7 / 2", "3.5"),
        ("10 / 3", "3.333333333"),
        ("17 // 5", "3"),
        ("17 % 5", "2"),
        ("1.5 + 2.25", "3.75"),
        (" 6 × 7 ", "42"),
        ("84 ÷ 2", "42"),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, expected: str) -> None:
    assert run(calculate(expression)) == ("ok", expected)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os')", "function calls are not allowed"),
        ("__import__('os').system('true')", "function calls are not allowed"),
        ("x + 1", "names are not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("2 ** 10", r"powers \(\*\*\) are not supported"),
        ("9 ** 9 ** 9 ** 9", r"powers \(\*\*\) are not supported"),
        ("1 << 100", "only \\+ - \\* / // % are supported"),
        ("[1, 2]", "'List' is not allowed"),
        ("lambda: 1", "'Lambda' is not allowed"),
        ("1,000 + 5", "commas are not allowed"),
        ("3 +", "not a valid arithmetic expression"),
        ("", "empty expression"),
        ("1" + " + 1" * 100, "longer than 200 characters"),
        ("99999999 * 99999999 * 99999999", "number too large"),
        ("1e400", "number too large"),
    ],
)
def test_calculator_rejects_anything_but_arithmetic(expression: str, reason: str) -> None:
    kind, output = run(calculate(expression))
    assert kind == "raised"
    assert output.startswith("Error: ValueError: ")
    assert re.search(reason, output), output


def test_division_by_zero_is_a_tool_error() -> None:
    for expression in ("5 / 0", "5 // (2 - 2)", "5 % 0", "1.5 / 0.0"):
        kind, output = run(calculate(expression))
        assert kind == "raised"
        assert output.startswith("Error: ZeroDivisionError: "), output


def test_magnitude_limit_is_inclusive() -> None:
    assert evaluate(str(MAX_MAGNITUDE)) == MAX_MAGNITUDE
    with pytest.raises(ValueError, match="too large"):
        evaluate(f"{MAX_MAGNITUDE} + 1")


def test_format_number() -> None:
    assert [format_number(v) for v in (3, 3.0, -2.0, 0.1 + 0.2, 1e-7)] == [
        "3",
        "3",
        "-2",
        "0.3",
        "1e-07",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42.0),
        ("42.0", 42.0),
        ("The answer is 42", 42.0),
        ("3 bags give 36, so 44 apples.", 44.0),
        ("1,234", 1234.0),
        ("She has -3 left", -3.0),
        ("no number", None),
    ],
)
def test_last_number(text: str, expected: float | None) -> None:
    assert last_number(text) == expected


def test_score_reads_the_last_number() -> None:
    task = Task(id="t", family="arithmetic", prompt=[], data={"answer": 1234, "steps": []})

    async def score(answer: str | None) -> float:
        return await FAMILY.score(task, answer, await FAMILY.make_runtime(task))

    for right in ("1234", "1234.0", "1,234", "The answer is 1234.", "12 + 1222 = 1234"):
        assert run(score(right)) == 1.0, right
    for wrong in (None, "", "1235", "1234.5", "1234 apples after 3 days", "12 34"):
        assert run(score(wrong)) == 0.0, wrong


def test_most_problems_need_two_calculator_calls() -> None:
    tasks = FAMILY.make_tasks(200, 0, "train")
    counts = [sum(call.name == "calculator" for call in FAMILY.oracle_calls(t)) for t in tasks]
    assert sum(count >= 2 for count in counts) >= 0.8 * len(tasks)


def test_oracle_steps_chain_their_results() -> None:
    """Every intermediate result feeds a later step, and the last step gives the answer."""
    for task in FAMILY.make_tasks(50, 0, "eval"):
        steps = task.data["steps"]
        results = [format_number(evaluate(expression)) for expression in steps]
        for index, result in enumerate(results[:-1]):
            later = [re.findall(r"\d+", expression) for expression in steps[index + 1 :]]
            assert any(result in operands for operands in later), (steps, result)
        assert results[-1] == str(task.data["answer"])


def test_problems_are_small_nonnegative_integers() -> None:
    tasks = FAMILY.make_tasks(300, 1, "train")
    for task in tasks:
        assert isinstance(task.data["answer"], int)
        assert 0 <= task.data["answer"] < 2000
        assert len(task.prompt[1]["content"].split()) <= 40
    # Every template shows up.
    openings = {" ".join(t.prompt[1]["content"].split()[1:3]) for t in tasks}
    assert len(openings) >= 7
