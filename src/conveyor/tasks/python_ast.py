"""Python's parser for families that read code (swe's index and mutations, arithmetic's
expressions): one lock for the whole process, so every caller must parse through here."""

from __future__ import annotations

import ast
import threading

__all__ = ["parse_expression", "parse_source"]

# CPython 3.11's AST validator keeps its recursion depth in interpreter-wide state: two threads
# parsing at once fail with "SystemError: AST constructor recursion depth mismatch" (seen when
# several rollouts built their code index in worker threads together). Parse one at a time.
_PARSE_LOCK = threading.Lock()


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse` of a module, serialised across threads (see `_PARSE_LOCK`)."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename)


def parse_expression(source: str) -> ast.Expression:
    """`ast.parse(mode="eval")`, serialised across threads (see `_PARSE_LOCK`)."""
    with _PARSE_LOCK:
        return ast.parse(source, mode="eval")
