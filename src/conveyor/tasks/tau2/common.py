"""What the airline and retail tools share: the per-rollout runtime that holds the database and
the conversation with the simulated user, a domain's tool set (`DomainTools`), the tools' error
type, record lookup, object-typed parameters, and the two domain-independent tools (`calculate`,
`transfer_to_human_agents`). A domain's module holds only its own rules and tools.

The database is the domain's db.json as loaded (plain dicts and lists), one private copy per
rollout; tools change it in place and the grader digests what changed (`data.state_digest`).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import operator
from collections.abc import Callable
from typing import Any

import pydantic

from conveyor.agent.tools import Tool, ToolContext, ToolRegistry, tool
from conveyor.runtime.base import RuntimeFailure
from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.types import Message


class ToolError(Exception):
    """A domain rule refused the call (unknown id, non-pending order, short balance, ...): the
    policy's error, shown to the model as the tool's output. The database is left as the
    original tools leave it (most refusals come before any change)."""


class Tau2Runtime(SimulatedRuntime):
    """One rollout's world: the domain database and the simulated user's side of the chat.

    `db` is written only by the domain tools; `heard` (the agent's text replies, as the user
    received them) and `user_messages` (the user model's conversation) only by the family's
    `user_turn`. The grader reads `db` and `heard`.
    """

    def __init__(self, domain: str, db: dict[str, Any]) -> None:
        super().__init__()
        self.domain = domain
        self.db = db
        self.heard: list[str] = []
        self.user_messages: list[Message] = []
        self.user_turns = 0


def world(ctx: ToolContext, domain: str) -> Tau2Runtime:
    """The rollout's runtime, which must be a `Tau2Runtime` of `domain`; `RuntimeFailure`
    otherwise (a wiring fault, not the policy's)."""
    runtime = ctx.runtime
    if not isinstance(runtime, Tau2Runtime) or runtime.domain != domain:
        raise RuntimeFailure(
            f"the tau2 {domain} tools need a tau2 {domain} runtime, got {runtime!r}"
        )
    return runtime


@dataclasses.dataclass(frozen=True)
class DomainTools:
    """A domain's tools over its database, and which of them change it (the others only read
    it: a task none of whose reference actions writes needs information to be verifiable)."""

    domain: str
    tools: tuple[Tool, ...]
    writes: frozenset[str]

    def registry(self) -> ToolRegistry:
        """A fresh registry of the domain's tools."""
        return ToolRegistry(self.tools)

    def db(self, ctx: ToolContext) -> dict[str, Any]:
        """The rollout's database (see `world`)."""
        return world(ctx, self.domain).db


def lookup(records: dict[str, Any], key: str, missing: str) -> dict[str, Any]:
    """`records[key]` (a user, an order, a flight's date ...); `ToolError(missing)` when there is
    none, in the original tool's words."""
    if key not in records:
        raise ToolError(missing)
    record: dict[str, Any] = records[key]
    return record


def dump(record: Any) -> str:
    """A record as the tools show it: compact JSON."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def object_parameters(item: Tool, **types: Any) -> Tool:
    """Give parameters of `item` a pydantic type (a list of models) that `@tool`'s annotations
    cannot spell: their arguments are validated as that type, and the schema the model sees
    describes the objects' fields. The function is declared with a plain placeholder annotation
    and receives the validated models.

    This reaches into `Tool` (its parameter table); a `@tool` that accepted pydantic models
    directly would make it unnecessary.
    """
    properties = item.schema["function"]["parameters"]["properties"]
    for name, annotation in types.items():
        adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(annotation)
        item._parameters[name] = dataclasses.replace(item._parameters[name], adapter=adapter)
        schema = _inline(adapter.json_schema())
        description = properties[name].get("description")
        properties[name] = {**schema, **({"description": description} if description else {})}
    return item


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its `$defs` references replaced by the definitions (and titles dropped)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                return walk(defs[ref.rsplit("/", 1)[-1]])
            return {k: walk(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    inlined: dict[str, Any] = walk(schema)
    return inlined


@tool
async def transfer_to_human_agents(summary: str) -> str:
    """Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the
    user explicitly asks for a human agent, or if, given the policy and the available tools, you
    cannot solve the user's issue.

    Args:
        summary: A summary of the user's issue.
    """
    return "Transfer successful"


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_EXPRESSION_CHARS = set("0123456789+-*/(). ")
_MAX_EXPRESSION_CHARS = 1000


def arithmetic(expression: str) -> float:
    """The value of an expression of numbers, + - * /, parentheses and spaces.

    Walks the syntax tree itself (never `eval`); `ToolError` for anything else, a division by
    zero or an expression longer than 1000 characters.
    """
    if not set(expression) <= _EXPRESSION_CHARS:
        raise ToolError("Invalid characters in expression")
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ToolError(f"Expression longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, RecursionError) as error:
        raise ToolError(f"Invalid expression: {error}") from None

    def value(node: ast.AST) -> float:
        constant = node.value if isinstance(node, ast.Constant) else None
        if isinstance(constant, int | float) and not isinstance(constant, bool):
            return float(constant)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        raise ToolError("Invalid expression: only numbers, + - * / and parentheses are allowed")

    try:
        return value(tree.body)
    except ZeroDivisionError:
        raise ToolError("Cannot evaluate expression: division by zero") from None
    except RecursionError:
        raise ToolError("Invalid expression: nested too deeply") from None


@tool
async def calculate(expression: str) -> str:
    """Calculate the result of a mathematical expression.

    Args:
        expression: The mathematical expression to calculate, such as '2 + 2'. The expression
            can contain numbers, operators (+, -, *, /), parentheses, and spaces.
    """
    return str(round(arithmetic(expression), 2))
