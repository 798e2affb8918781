"""Arithmetic word problems solved with a `calculator` tool, one operation per call.

Every problem takes two or three operations on small integers, so the oracle makes at least two
calculator calls before `finish`. The calculator parses its expression with `ast` and evaluates
only numbers, + - * / // %, unary signs and parentheses: no names, calls, attributes or powers.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import ToolRegistry, finish, tool
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import Runtime
from conveyor.runtime.selection import RuntimeRequest, start_runtime
from conveyor.tasks.family import (
    instance_task,
    opening,
    register_family,
    runtime_choice,
    sample_instances,
)
from conveyor.tasks.python_ast import parse_expression
from conveyor.types import Task, ToolCall

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**15

_BINARY_OPS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY_OPS: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_REJECTED: dict[type[ast.AST], str] = {
    ast.Pow: "powers (**) are not supported; multiply instead",
    ast.Name: "names are not allowed, only numbers",
    ast.Call: "function calls are not allowed",
    ast.Attribute: "attribute access is not allowed",
    ast.Tuple: "commas are not allowed; write 1000, not 1,000",
}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")

Number = int | float


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression; `ValueError` for anything but plain arithmetic.

    Division by zero raises `ZeroDivisionError`. Results beyond `MAX_MAGNITUDE` are refused, so
    no expression can build a huge number.
    """
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if not text:
        raise ValueError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = parse_expression(text)
    except SyntaxError:
        raise ValueError(f"not a valid arithmetic expression: {expression!r}") from None
    return _evaluate_node(tree.body)


def _evaluate_node(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"only numbers are allowed, got {value!r}")
        return _checked(value)
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY_OPS:
            raise ValueError(_REJECTED.get(type(node.op), "only + - * / // % are supported"))
        left, right = _evaluate_node(node.left), _evaluate_node(node.right)
        return _checked(_BINARY_OPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_evaluate_node(node.operand))
    reason = _REJECTED.get(type(node), f"'{type(node).__name__}' is not allowed")
    raise ValueError(f"{reason} (only numbers, + - * / // % and parentheses)")


def _checked(value: Number) -> Number:
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"number too large (the limit is {MAX_MAGNITUDE:.0e})")
    return value


def format_number(value: Number) -> str:
    """How the calculator shows a value: integers without a decimal point, others to 10 digits."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return str(value)
    return format(value, ".10g")


@tool
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % and parentheses.

    Args:
        expression: The expression to evaluate, for example "17 + 3 * 12".
    """
    return format_number(evaluate(expression))


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands commas allowed), or None if there is none."""
    numbers = _NUMBER.findall(_THOUSANDS.sub("", text))
    return float(numbers[-1]) if numbers else None


@dataclass(frozen=True)
class _Problem:
    question: str
    steps: list[str]
    answer: int


# (name, pronoun) pairs; the pronoun is capitalised where a sentence starts with it.
_PEOPLE = [
    ("Ann", "she"),
    ("Ben", "he"),
    ("Cara", "she"),
    ("Dan", "he"),
    ("Eva", "she"),
    ("Finn", "he"),
    ("Gia", "she"),
    ("Hugo", "he"),
    ("Ivy", "she"),
    ("Jack", "he"),
]
_ITEMS = ["apples", "pears", "stickers", "marbles", "cards", "shells"]


def _chain(first: int, *ops: tuple[str, int]) -> tuple[list[str], int]:
    """Apply `ops` left to right, one calculator step each; returns the steps and the result."""
    steps: list[str] = []
    value = first
    for symbol, operand in ops:
        expression = f"{value} {symbol} {operand}"
        result = evaluate(expression)
        steps.append(expression)
        value = int(result)
    return steps, value


def _bags(rng: random.Random) -> _Problem:
    name, she = rng.choice(_PEOPLE)
    item = rng.choice(_ITEMS)
    a, b, c = rng.randint(5, 30), rng.randint(2, 6), rng.randint(4, 12)
    d = rng.randint(1, min(20, a + b * c - 1))
    bought_steps, bought = _chain(b, ("*", c))
    rest, answer = _chain(a, ("+", bought), ("-", d))
    question = (
        f"{name} has {a} {item} and buys {b} bags of {c}. {she.capitalize()} gives away {d}. "
        f"How many {item} does {she} have now?"
    )
    return _Problem(question, bought_steps + rest, answer)


def _cookies(rng: random.Random) -> _Problem:
    name, she = rng.choice(_PEOPLE)
    trays, per_tray, friends = rng.randint(2, 6), rng.randint(4, 12), rng.randint(2, 5)
    total = trays * per_tray
    # Eat enough that the rest splits evenly, and at least one cookie.
    eaten = total % friends + friends * rng.randint(0 if total % friends else 1, 2)
    if eaten >= total:
        eaten = total % friends or friends
    steps, answer = _chain(trays, ("*", per_tray), ("-", eaten), ("/", friends))
    question = (
        f"{name} bakes {trays} trays of {per_tray} cookies and eats {eaten}. "
        f"{she.capitalize()} shares the rest equally among {friends} friends. "
        "How many cookies does each friend get?"
    )
    return _Problem(question, steps, answer)


def _shopping(rng: random.Random) -> _Problem:
    name, she = rng.choice(_PEOPLE)
    pen, book = rng.randint(2, 9), rng.randint(3, 15)
    pens, books = rng.randint(2, 9), rng.randint(2, 6)
    pen_steps, pen_cost = _chain(pens, ("*", pen))
    book_steps, book_cost = _chain(books, ("*", book))
    total_steps, answer = _chain(pen_cost, ("+", book_cost))
    question = (
        f"A pen costs {pen} dollars and a notebook costs {book} dollars. {name} buys {pens} "
        f"pens and {books} notebooks. How many dollars does {she} spend?"
    )
    return _Problem(question, pen_steps + book_steps + total_steps, answer)


def _train(rng: random.Random) -> _Problem:
    speed1, speed2 = 5 * rng.randint(4, 18), 5 * rng.randint(4, 18)
    hours1, hours2 = rng.randint(2, 5), rng.randint(2, 5)
    first_steps, first = _chain(speed1, ("*", hours1))
    second_steps, second = _chain(speed2, ("*", hours2))
    total_steps, answer = _chain(first, ("+", second))
    question = (
        f"A train goes {speed1} km per hour for {hours1} hours, then {speed2} km per hour for "
        f"{hours2} hours. How many km does it go in total?"
    )
    return _Problem(question, first_steps + second_steps + total_steps, answer)


def _savings(rng: random.Random) -> _Problem:
    name, she = rng.choice(_PEOPLE)
    weekly, weeks = rng.randint(3, 25), rng.randint(2, 10)
    spent = rng.randint(1, min(60, weekly * weeks - 1))
    steps, answer = _chain(weekly, ("*", weeks), ("-", spent))
    question = (
        f"{name} saves {weekly} dollars a week for {weeks} weeks and then spends {spent} "
        f"dollars on a game. How many dollars does {she} have left?"
    )
    return _Problem(question, steps, answer)


def _orchard(rng: random.Random) -> _Problem:
    rows, per_row = rng.randint(3, 12), rng.randint(4, 15)
    lost = rng.randint(1, min(20, rows * per_row - 1))
    planted = rng.randint(2, 20)
    steps, answer = _chain(rows, ("*", per_row), ("-", lost), ("+", planted))
    question = (
        f"A farm has {rows} rows of {per_row} trees. A storm knocks down {lost} trees and the "
        f"farmer plants {planted} new ones. How many trees are there now?"
    )
    return _Problem(question, steps, answer)


def _reading(rng: random.Random) -> _Problem:
    name, she = rng.choice(_PEOPLE)
    per_day, days = rng.randint(5, 30), rng.randint(2, 9)
    pages = per_day * days + rng.randint(5, 120)
    read_steps, read = _chain(per_day, ("*", days))
    left_steps, answer = _chain(pages, ("-", read))
    question = (
        f"{name} reads {per_day} pages a day for {days} days. The book has {pages} pages. "
        f"How many pages does {she} still have to read?"
    )
    return _Problem(question, read_steps + left_steps, answer)


_TEMPLATES: list[Callable[[random.Random], _Problem]] = [
    _bags,
    _cookies,
    _shopping,
    _train,
    _savings,
    _orchard,
    _reading,
]


def _system_prompt() -> str:
    example = format_tool_call(
        ToolCall(name="calculator", arguments={"expression": "3 * 4"}), "hermes"
    )
    done = format_tool_call(ToolCall(name="finish", arguments={"answer": "12"}), "hermes")
    return (
        "You solve math word problems with tools. Do one operation per calculator call, "
        "one call per message, and wait for the result. Call a tool exactly like this:\n"
        f"{example}\n"
        "When you have the final number, submit it:\n"
        f"{done}"
    )


SYSTEM_PROMPT = _system_prompt()


@register_family
class ArithmeticFamily:
    """Word problems on small integers; tools: `calculator` and `finish`.

    `Task.data` holds `answer` (int) and `steps`, the calculator expressions of the oracle.
    """

    name = "arithmetic"
    runtimes: tuple[str, ...] = ("simulated",)

    def __init__(self, runtime: RuntimeConfig | None = None) -> None:
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct problems of `split`, deterministic in (n, seed, split)."""

        def draw(rng: random.Random) -> tuple[str, _Problem]:
            problem = rng.choice(_TEMPLATES)(rng)
            return problem.question, problem

        problems = sample_instances(self.name, n, seed, split, draw)
        return [
            instance_task(
                self.name,
                split,
                index,
                opening(SYSTEM_PROMPT, problem.question),
                {"answer": problem.answer, "steps": problem.steps},
            )
            for index, problem in enumerate(problems)
        ]

    def tools(self) -> ToolRegistry:
        """`calculator` and `finish`."""
        return ToolRegistry([calculator, finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """An empty started runtime: the calculator needs no environment."""
        request = RuntimeRequest(files={})
        return await start_runtime(self.runtime_kind, request, self.runtime)

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """1.0 if the last number in `answer` equals the expected integer."""
        value = last_number(answer) if answer is not None else None
        return 1.0 if value is not None and value == task.data["answer"] else 0.0

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """One calculator call per step, then `finish` with the answer."""
        calls = [
            ToolCall(name="calculator", arguments={"expression": s}) for s in task.data["steps"]
        ]
        return [*calls, ToolCall(name="finish", arguments={"answer": str(task.data["answer"])})]
