"""Procedural bugs, SWE-smith style: one small mutation in one function, on covered lines.

Kinds (`MUTATION_KINDS`): `flip_comparison` (`<` to `>=`, `<` to `<=`, `==` to `!=`, `in` to
`not in` ...), `change_operator` (`+` to `-`, `and` to `or`, dropping a `not` ...),
`change_constant` (an integer off by one, `True`/`False` swapped), `drop_condition` (an operand
of `and`/`or` dropped, or an `if` without `else` made unconditional or removed), `drop_assignment`,
`drop_loop`, `invert_if` (the test of an `if` with an `else` negated) and `stub_body` (a short
function's body replaced by `pass`).

Edits are made on the source text, one line span at a time, so the diff of a mutation is as
small as the change; each mutant is re-parsed and must differ from the original's AST.
"""

from __future__ import annotations

import ast
import random
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from conveyor.tasks.python_ast import parse_source

MUTATION_KINDS = (
    "flip_comparison",
    "change_operator",
    "change_constant",
    "drop_condition",
    "drop_assignment",
    "drop_loop",
    "invert_if",
    "stub_body",
)
STUB_MAX_LINES = 12

_FLIPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], ...]] = {
    ast.Lt: (ast.GtE, ast.LtE),
    ast.LtE: (ast.Gt, ast.Lt),
    ast.Gt: (ast.LtE, ast.GtE),
    ast.GtE: (ast.Lt, ast.Gt),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
_BINOPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.BitXor: ast.BitOr,
}


@dataclass(frozen=True)
class Mutation:
    """One mutant of one file: where, what kind, and both texts of the file."""

    path: str
    kind: str
    function: str
    line: int
    description: str
    original: str
    mutated: str


# A line of Python source as the tokenizer (and so `ast`'s line numbers) counts it: ended by
# "\r\n", "\r" or "\n" only; form feeds, "\x1c" or U+2028 (str.splitlines's) end none.
_SOURCE_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def source_lines(text: str) -> list[str]:
    """`text`'s lines as Python numbers them, each with its line end (they join back to it)."""
    return _SOURCE_LINE.findall(text)


class _Source:
    """A file's lines with byte-offset aware replacement of single-line spans."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = source_lines(text)

    def replace_span(self, node: ast.AST, new: str) -> str | None:
        """The text with `node`'s span (on one line) replaced by `new`."""
        start, end = node.lineno, node.end_lineno  # type: ignore[attr-defined]
        if start != end:
            return None
        raw = self.lines[start - 1].encode()
        col, end_col = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        line = (raw[:col] + new.encode() + raw[end_col:]).decode()
        return "".join([*self.lines[: start - 1], line, *self.lines[start:]])

    def replace_lines(self, first: int, last: int, new: list[str]) -> str:
        """The text with lines `first..last` (1-based, inclusive) replaced by `new`."""
        return "".join(self.lines[: first - 1] + new + self.lines[last:])

    def indent(self, lineno: int) -> str:
        """Leading whitespace of a line."""
        line = self.lines[lineno - 1]
        return line[: len(line) - len(line.lstrip())]

    def owns_lines(self, stmt: ast.stmt) -> bool:
        """Whether a statement alone occupies its lines (no `a = 1; b = 2`, no comment tricks)."""
        first = self.lines[stmt.lineno - 1]
        last = self.lines[stmt.end_lineno - 1] if stmt.end_lineno else first
        before = first.encode()[: stmt.col_offset].decode(errors="replace")
        after = last.encode()[stmt.end_col_offset or 0 :].decode(errors="replace").strip()
        return not before.strip() and (not after or after.startswith("#"))


class _Segment:
    """A function's own lines, parsed alone (dedented): a mutant, which only edits lines of one
    function, is checked by re-parsing those lines instead of the whole (maybe huge) file."""

    def __init__(self, source: _Source, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        first = min([function.lineno, *(d.lineno for d in function.decorator_list)])
        self.first, self.last = first, function.end_lineno or function.lineno
        self.total = len(source.lines)
        self.dump = self._dump("".join(source.lines[first - 1 : self.last]))

    @staticmethod
    def _dump(text: str) -> str | None:
        try:
            return ast.dump(parse_source(textwrap.dedent(text)))
        except SyntaxError:
            return None

    def changed(self, mutated: str) -> bool | None:
        """Whether the mutant's AST differs (False: it does not parse), None: cannot tell."""
        if self.dump is None:
            return None
        lines = source_lines(mutated)
        last = self.last - (self.total - len(lines))
        dump = self._dump("".join(lines[self.first - 1 : last]))
        if dump is None:
            return None
        return dump != self.dump


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method with its dotted qualname (`Class.method`, `outer.inner`)."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, Any]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _own_nodes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """Nodes of a function's body, not descending into nested functions or classes."""
    stack: list[ast.AST] = list(reversed(function.body))
    while stack:
        node = stack.pop()
        yield node
        for child in reversed(list(ast.iter_child_nodes(node))):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                stack.append(child)


def _body_start(function: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.stmt | None:
    body = function.body
    has_doc = (
        body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    ) and isinstance(body[0].value.value, str)
    rest = body[1:] if has_doc else body
    return rest[0] if rest else None


def mutations_of_file(path: str, text: str, covered: set[int] | None = None) -> list[Mutation]:
    """Every candidate mutant of one file, on lines in `covered` (all lines if None)."""
    try:
        tree = parse_source(text)
    except SyntaxError:
        return []
    source = _Source(text)
    dumped: list[str] = []

    def baseline() -> str:
        if not dumped:
            dumped.append(ast.dump(tree))
        return dumped[0]

    found: list[Mutation] = []
    seen: set[str] = set()

    def on(line: int) -> bool:
        return covered is None or line in covered

    for qualname, function in functions(tree):
        segment = _Segment(source, function)
        for kind, node, mutated, what in _candidates(function, source, on):
            if mutated is None or mutated in seen:
                continue
            changed = segment.changed(mutated)
            if changed is None:  # the function alone does not parse: judge the whole file
                try:
                    changed = ast.dump(parse_source(mutated)) != baseline()
                except SyntaxError:
                    changed = False
            if not changed:
                continue
            seen.add(mutated)
            line = getattr(node, "lineno", function.lineno)
            found.append(Mutation(path, kind, qualname, line, what, text, mutated))
    return found


def _candidates(
    function: ast.FunctionDef | ast.AsyncFunctionDef, source: _Source, on: Callable[[int], bool]
) -> Iterator[tuple[str, ast.AST, str | None, str]]:
    first = _body_start(function)
    if first is not None and on(first.lineno):
        size = (function.end_lineno or first.lineno) - first.lineno + 1
        if size <= STUB_MAX_LINES and not _is_trivial(function):
            stub = [f"{source.indent(first.lineno)}pass\n"]
            end = function.end_lineno or first.lineno
            yield "stub_body", first, source.replace_lines(first.lineno, end, stub), "stub body"
    for node in _own_nodes(function):
        line = getattr(node, "lineno", None)
        if line is None or not on(line):
            continue
        yield from _expression_mutants(node, source)
        if isinstance(node, ast.stmt):
            yield from _statement_mutants(node, source)


def _is_trivial(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    first = _body_start(function)
    return first is None or (len(function.body) <= 2 and isinstance(first, ast.Pass | ast.Raise))


def _expression_mutants(node: ast.AST, source: _Source) -> Iterator[tuple[str, ast.AST, Any, str]]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        for flipped in _FLIPS.get(type(node.ops[0]), ()):
            new = ast.Compare(left=node.left, ops=[flipped()], comparators=node.comparators)
            what = f"{type(node.ops[0]).__name__} -> {flipped.__name__}"
            yield "flip_comparison", node, source.replace_span(node, ast.unparse(new)), what
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        swapped = _BINOPS[type(node.op)]
        new_bin = ast.BinOp(left=node.left, op=swapped(), right=node.right)
        what = f"{type(node.op).__name__} -> {swapped.__name__}"
        yield "change_operator", node, source.replace_span(node, f"({ast.unparse(new_bin)})"), what
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        new_bool = ast.BoolOp(op=other, values=node.values)
        yield (
            "change_operator",
            node,
            source.replace_span(node, f"({ast.unparse(new_bool)})"),
            (f"{type(node.op).__name__} -> {type(other).__name__}"),
        )
        for index in range(len(node.values)):
            rest = node.values[:index] + node.values[index + 1 :]
            kept = rest[0] if len(rest) == 1 else ast.BoolOp(op=node.op, values=rest)
            text = source.replace_span(node, f"({ast.unparse(kept)})")
            yield "drop_condition", node, text, f"operand {index + 1} of {type(node.op).__name__}"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield (
            "change_operator",
            node,
            source.replace_span(node, ast.unparse(node.operand)),
            ("drop not"),
        )
    elif isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        value = node.value
        if isinstance(value, bool):
            yield "change_constant", node, source.replace_span(node, repr(not value)), "bool"
        elif isinstance(value, int) and abs(value) < 10**6:
            new_value = value + 1 if value in (0, -1) else value - 1
            text = source.replace_span(node, repr(new_value))
            yield "change_constant", node, text, f"{value} -> {new_value}"


def _statement_mutants(node: ast.stmt, source: _Source) -> Iterator[tuple[str, ast.AST, Any, str]]:
    if not source.owns_lines(node):
        return
    end = node.end_lineno or node.lineno
    pass_line = [f"{source.indent(node.lineno)}pass\n"]
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) and not (
        isinstance(node, ast.AnnAssign) and node.value is None
    ):
        text = source.replace_lines(node.lineno, end, pass_line)
        yield "drop_assignment", node, text, "assignment removed"
        if isinstance(node, ast.AugAssign) and type(node.op) in _BINOPS:
            swapped = _BINOPS[type(node.op)]
            new = ast.AugAssign(target=node.target, op=swapped(), value=node.value)
            indent = source.indent(node.lineno)
            text = source.replace_lines(node.lineno, end, [f"{indent}{ast.unparse(new)}\n"])
            yield "change_operator", node, text, f"{type(node.op).__name__}= -> {swapped.__name__}="
    elif isinstance(node, ast.For | ast.While | ast.AsyncFor) and not node.orelse:
        yield "drop_loop", node, source.replace_lines(node.lineno, end, pass_line), "loop removed"
    elif isinstance(node, ast.If):
        test_line = node.test.lineno == node.test.end_lineno == node.lineno
        if node.orelse and test_line:
            negated = f"not ({ast.unparse(node.test)})"
            yield "invert_if", node, source.replace_span(node.test, negated), "if test negated"
        elif not node.orelse:
            yield (
                "drop_condition",
                node,
                source.replace_lines(node.lineno, end, pass_line),
                ("if block removed"),
            )
            if test_line:
                yield (
                    "drop_condition",
                    node,
                    source.replace_span(node.test, "True"),
                    ("if made unconditional"),
                )


def pick(mutations: list[Mutation], seed: int) -> list[Mutation]:
    """Mutants in trial order: shuffled, then round-robin over kinds and, within a kind,
    round-robin over functions, so that early picks spread over every kind (the common ones,
    `drop_assignment` and `drop_condition`, do not crowd out the rare ones) and many functions."""
    rng = random.Random(seed)
    by_kind: dict[str, list[Mutation]] = {}
    for mutation in mutations:
        by_kind.setdefault(mutation.kind, []).append(mutation)
    kinds = [_spread_over_functions(by_kind[kind], rng) for kind in sorted(by_kind)]
    rng.shuffle(kinds)
    return _round_robin(kinds)


def _spread_over_functions(mutations: list[Mutation], rng: random.Random) -> list[Mutation]:
    by_function: dict[tuple[str, str], list[Mutation]] = {}
    for mutation in mutations:
        by_function.setdefault((mutation.path, mutation.function), []).append(mutation)
    queues = list(by_function.values())
    for queue in queues:
        rng.shuffle(queue)
    rng.shuffle(queues)
    return _round_robin(queues)


def _round_robin(queues: list[list[Mutation]]) -> list[Mutation]:
    ordered: list[Mutation] = []
    heads = [list(reversed(q)) for q in queues]
    while heads:
        for queue in heads:
            ordered.append(queue.pop())
        heads = [q for q in heads if q]
    return ordered
