"""Candidate canary tests: a copy of a hidden test with one expected value made wrong.

`make_candidate(path, data, tree, nodeid, ...)` finds the test a node id names in a module (a
function at module level or a method of a class; a parameter id `[...]` is kept for the copy's
node id), takes the first equality assertion whose expected side is a literal (`assert f(x) ==
5`, `5 == f(x)`, `self.assertEqual(f(x), 5)` and the other unittest equality forms, `assert x
is False`; one at the function's top level first, as it is the first to run), and returns the
function's source copied under a plausible new name with that one literal replaced by a wrong
value of the same type (`wrong_literal`; only the literal's own text changes, so the copy keeps
the original's formatting). For half of the tests (a coin from the row's hash, which covers the
gold patch the tested code never sees) the copy keeps the original's name and the original
takes the new one. `insert_text` puts copies right after their originals, by text: every other
byte of the module stays as it was (comments, formatting, line endings; a swapped original's
def line changes its name only).

Why a wrong value and never `==` -> `!=`: an object whose `__eq__` is always true (and `__ne__`
always false) passes the real test and would fail a `!=` copy; with a wrong value it passes the
copy as well, and that gives it away.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Suffixes real suites give a second variant of a test: the copy's name gives nothing away.
NAME_SUFFIXES = ("_again", "_more", "_other", "_variant", "_case2", "_extra", "_alt", "_second")
# unittest's equality assertions: (first, second) compared for equality.
EQUALITY_METHODS = frozenset(
    {
        "assertEqual",
        "assertEquals",
        "assertListEqual",
        "assertTupleEqual",
        "assertDictEqual",
        "assertSetEqual",
        "assertSequenceEqual",
        "assertMultiLineEqual",
        "assertCountEqual",
        "assertAlmostEqual",
        "assertAlmostEquals",
    }
)
# Python's own line breaks (what `ast` line numbers count); a form feed or U+2028 is not one.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Canary:
    """A test that must fail: a copy of the row's test `original` with one expected value made
    wrong, inserted into the test module `path` after line `after_line` (of the module whose
    bytes hash to `module_sha256`); it runs as `nodeid`.

    Half of the copies (a coin from the row's hash) take the original's name and the original
    moves to the new one (its def line `renamed_line` becomes `renamed_text`): the real test
    then runs as `runs_as`, and a forgery that passes the tests it knows by name (the problem
    statement names the failing ones) passes the canary instead."""

    path: str
    original: str
    nodeid: str
    after_line: int
    text: str
    module_sha256: str
    runs_as: str = ""
    renamed_line: int = 0
    renamed_text: str = ""

    @property
    def real(self) -> str:
        """The node id the real test runs as in the graded module."""
        return self.runs_as or self.original


def source_lines(text: str) -> list[str]:
    """`text` split at Python's line breaks, each line with its own ending."""
    return _LINE.findall(text)


def module_digest(data: bytes) -> str:
    """The hash a canary records of the module it was made for."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Replacement:
    """A literal (or the part of one) in a test's source, and the wrong value to put there."""

    node: ast.expr
    text: str


def wrong_literal(node: ast.expr, lines: Sequence[str]) -> Replacement | None:
    """Where to make the literal `node` (of a module split in `lines`) a different value of its
    type: a number, string, bytes or bool itself, else the first element of a tuple, list, set
    or dict value that can change (an empty one gets an element); None if `node` is not a
    literal, or is `None`/`...`, which have no other value of their type."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(node, ast.Constant) or (
        isinstance(node, ast.UnaryOp) and isinstance(value, int | float | complex)
    ):
        other = _other_scalar(value)
        if other is None:
            return None
        return Replacement(node, _literal_source(other, _segment(lines, node)))
    items: list[ast.expr] = []
    empty = ""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = list(node.elts)
        empty = {ast.Tuple: "(0,)", ast.List: "[0]"}.get(type(node), "")
    elif isinstance(node, ast.Dict):
        items = list(node.values)
        empty = "{0: 0}"
    for item in items:
        found = wrong_literal(item, lines)
        if found is not None:
            return found
    return Replacement(node, empty) if empty and not items else None


def _other_scalar(value: object) -> object | None:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        # Past 2**53, + 1 is lost to rounding.
        return value + 1.0 if abs(value) < 1e15 else value * 2
    if isinstance(value, complex):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + ("x" if value[-1:] != "x" else "y")
    if isinstance(value, bytes):
        return value[:-1] + (b"x" if value[-1:] != b"x" else b"y")
    return None


def _literal_source(value: object, original: str) -> str:
    """`value` as source, a string in the quotes the original used (where it can be)."""
    text = repr(value)
    if not isinstance(value, str | bytes):
        return text
    quote = text[-1]
    opening = text.index(quote)
    wanted = next((c for c in original if c in "'\""), quote)
    if wanted != quote and wanted not in text[opening + 1 : -1]:
        text = text[:opening] + wanted + text[opening + 1 : -1] + wanted
    return text


def _segment(lines: Sequence[str], node: ast.expr) -> str:
    """The source text of `node` (positions are UTF-8 byte offsets)."""
    end_line = node.end_lineno or node.lineno
    chunk = "".join(lines[node.lineno - 1 : end_line]).encode()
    tail = len(lines[end_line - 1].encode()) - (node.end_col_offset or 0)
    return chunk[node.col_offset : len(chunk) - tail].decode()


def wrong_expectation(statement: ast.stmt, lines: Sequence[str]) -> Replacement | None:
    """The change that makes `statement` expect a wrong value, if it is an equality assertion
    (`assert a == b`, `self.assertEqual(a, b)`, ...) with a literal on exactly one side."""
    if isinstance(statement, ast.Assert):
        test = statement.test
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
            return None
        if isinstance(test.ops[0], ast.Eq):
            return _wrong_side(test.left, test.comparators[0], lines)
        expected = test.comparators[0]
        if isinstance(test.ops[0], ast.Is) and isinstance(expected, ast.Constant):
            # `assert x is False` -> `is True`; `is None` has no other value
            if isinstance(expected.value, bool):
                return Replacement(expected, str(not expected.value))
    elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        call = statement.value
        if (
            isinstance(call.func, ast.Attribute)
            and call.func.attr in EQUALITY_METHODS
            and len(call.args) >= 2
            and not any(isinstance(a, ast.Starred) for a in call.args[:2])
        ):
            return _wrong_side(call.args[0], call.args[1], lines)
    return None


def _wrong_side(left: ast.expr, right: ast.expr, lines: Sequence[str]) -> Replacement | None:
    """The literal side made wrong, the right one preferred (`actual == expected`); None when
    neither or both sides are literals (nothing under test)."""
    wrong_left, wrong_right = wrong_literal(left, lines), wrong_literal(right, lines)
    if (wrong_left is None) == (wrong_right is None):
        return None
    return wrong_right or wrong_left


def find_test(tree: ast.Module, nodeid: str) -> _Function | None:
    """The function a node id names (`path::test_x`, `path::TestC::test_x`, `...[params]`):
    the last definition of that name in its scope, as Python keeps."""
    parts = nodeid.split("::")[1:]
    if not parts:
        return None
    *classes, name = parts
    name = name.split("[", 1)[0]
    body: list[ast.stmt] = tree.body
    for class_name in classes:
        found = [s for s in body if isinstance(s, ast.ClassDef) and s.name == class_name]
        if not found:
            return None
        body = found[-1].body
    functions = [s for s in body if isinstance(s, _Function) and s.name == name]
    return functions[-1] if functions else None


def _statements(function: _Function) -> Iterable[ast.stmt]:
    """The function's statements, its top-level ones first, then the nested ones in order
    (never those of nested functions or classes)."""
    yield from function.body
    pending: list[ast.AST] = [
        s for s in function.body if not isinstance(s, _Function | ast.ClassDef)
    ]
    while pending:
        statement = pending.pop(0)
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(statement, field, None) or []:
                if isinstance(child, _Function | ast.ClassDef):
                    continue
                if isinstance(child, ast.stmt):
                    yield child
                pending.append(child)


def _stands_alone(statement: ast.stmt, lines: Sequence[str]) -> bool:
    """Whether the statement has its lines to itself (only a comment may follow it)."""
    end = statement.end_lineno or statement.lineno
    before = lines[statement.lineno - 1].encode()[: statement.col_offset]
    after = lines[end - 1].encode()[statement.end_col_offset or 0 :].decode().strip()
    return not before.strip() and (not after or after.startswith("#"))


def canary_name(original: str, taken: set[str], seed: str) -> str:
    """A name for the copy of `original`: the original's plus a word suffix picked from
    `seed`'s hash, never one in `taken`."""
    start = int(hashlib.sha256(f"{seed}/{original}".encode()).hexdigest(), 16)
    for i in range(len(NAME_SUFFIXES)):
        name = original + NAME_SUFFIXES[(start + i) % len(NAME_SUFFIXES)]
        if name not in taken:
            return name
    n = 2
    while f"{original}_{n}" in taken:
        n += 1
    return f"{original}_{n}"


def names_in(tree: ast.AST) -> set[str]:
    """Every name defined or used in a module: a copy's name must not meet any of them."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, _Function | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            found.add(node.arg)
    return found


def make_candidate(
    path: str,
    data: bytes,
    tree: ast.Module,
    nodeid: str,
    taken: set[str],
    seed: str,
    swap: bool | None = None,
) -> Canary | None:
    """A canary copying the test `nodeid` of the module `path` (its bytes and parsed tree), or
    None if that test has no assertion to make wrong. The new name is added to `taken`. `swap`:
    whether the copy takes the original's name (default: a coin from `seed`)."""
    function = find_test(tree, nodeid)
    if function is None:
        return None
    text = data.decode("utf-8")
    lines = source_lines(text)
    for statement in _statements(function):
        change = wrong_expectation(statement, lines)
        if change is not None and _stands_alone(statement, lines):
            break
    else:
        return None
    name = canary_name(function.name, taken, seed)
    start = min([d.lineno for d in function.decorator_list] + [function.lineno])
    end = function.end_lineno or function.lineno
    newline = _ending(lines[function.lineno - 1]) or "\n"
    copied = _replaced(lines, change)[start - 1 : end - _spanned(change.node)]
    # The def line: only the name changes, in the copy or (swapped) in the original.
    def_line = lines[function.lineno - 1]
    renamed = re.sub(
        rf"^(\s*(?:async\s+)?def\s+){re.escape(function.name)}\b", rf"\g<1>{name}", def_line
    )
    if renamed == def_line:
        return None
    if swap is None:
        swap = int(hashlib.sha256(f"{seed}/{nodeid}/swap".encode()).hexdigest(), 16) % 2 == 1
    if not swap:
        copied[function.lineno - start] = renamed
    if not _ending(copied[-1]):
        copied[-1] += newline
    blank = newline * (2 if function.col_offset == 0 else 1)
    moved = "::".join([*nodeid.split("::")[:-1], name + _params(nodeid)])
    canary = Canary(
        path=path,
        original=nodeid,
        nodeid=nodeid if swap else moved,
        after_line=end,
        text=blank + "".join(copied),
        module_sha256=module_digest(data),
        runs_as=moved if swap else "",
        renamed_line=function.lineno if swap else 0,
        renamed_text=renamed if swap else "",
    )
    try:  # the copy must leave the module valid Python
        ast.parse(insert_text(text, [canary]))
    except SyntaxError:
        return None
    taken.add(name)
    return canary


def _replaced(lines: Sequence[str], change: Replacement) -> list[str]:
    """`lines` with the change made: the literal's lines become one (its first line's start,
    the new text, its last line's rest), so every line after it moves up by `_spanned`."""
    node = change.node
    end_line = node.end_lineno or node.lineno
    head = lines[node.lineno - 1].encode()[: node.col_offset]
    rest = lines[end_line - 1].encode()[node.end_col_offset or 0 :]
    joined = (head + change.text.encode() + rest).decode()
    return [*lines[: node.lineno - 1], joined, *lines[end_line:]]


def _spanned(node: ast.expr) -> int:
    return (node.end_lineno or node.lineno) - node.lineno


def _params(nodeid: str) -> str:
    last = nodeid.split("::")[-1]
    return last[last.index("[") :] if "[" in last else ""


def _ending(line: str) -> str:
    return line[len(line.rstrip("\r\n")) :]


def insert_text(text: str, canaries: Sequence[Canary]) -> str:
    """`text` (a module) with each canary inserted after its original (renamed where the copy
    took its name); nothing else changes but a missing newline at the end of an original that
    ended the file."""
    lines = source_lines(text)
    for canary in sorted(canaries, key=lambda c: c.after_line, reverse=True):
        if canary.renamed_line:
            lines[canary.renamed_line - 1] = canary.renamed_text
        at = canary.after_line
        if not _ending(lines[at - 1]):
            lines[at - 1] += _ending(source_lines(canary.text)[0])
        lines.insert(at, canary.text)
    return "".join(lines)
