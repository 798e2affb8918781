"""`search_code`: the agent's AST search over the repository (definitions, uses, callers, text).

The tool reads the task instance's `CodeIndex` from `ctx.state["code_index"]` (the recipe's init
stage builds it once per instance) or builds one from the local folder in
`ctx.state["workspace_root"]` on first use. `rank_definitions` is the ranking the tool shows for
`auto`, `definition` and `text`; the search benchmark calls it directly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from conveyor.agent.tools import ToolContext, tool
from conveyor.runtime.cpu_pools import run_in_pool
from conveyor.tasks.swe.codesearch.index import CodeIndex, Definition, IndexCache, Match, Reference

SearchKind = Literal["auto", "definition", "references", "callers", "text"]
MAX_HITS = 20
NAME_MATCH_FLOOR = 0.6
NAMED_BONUS = 0.2
TEST_WEIGHT = 0.9
_DOC_WIDTH = 100
_RANKED = 100  # ranked per query, so the listing can say how many more there are
_WORD = re.compile(r"`+([A-Za-z_][\w.]*)(?:\(\))?`+|([A-Za-z_][\w.]*\w(?:\(\))?)")
_CAMEL = re.compile(r"[a-z0-9][A-Z]")

# Indexes built lazily from `workspace_root`, shared by the rollouts of one process.
LAZY_INDEXES = IndexCache(max_entries=4)


class CodeIndexUnavailable(LookupError):
    """Neither a prepared index nor a local workspace to build one from."""


def looks_like_prose(query: str) -> bool:
    """Whether a query is a description (several words) rather than a name."""
    return len(query.split()) >= 3 or (
        len(query.split()) == 2 and not any(c in query for c in "._()`")
    )


def mentioned_identifiers(text: str, limit: int = 8) -> list[str]:
    """Names a prose query mentions: `backticked`, snake_case, camelCase, dotted, or `call()`."""
    found: list[str] = []
    for match in _WORD.finditer(text):
        quoted, word = match.group(1), (match.group(2) or "").rstrip(".")
        candidate = (quoted or word).strip().removesuffix("()")
        code_like = bool(quoted) or word.endswith("()") or "_" in word.strip("_")
        code_like = code_like or "." in word or bool(_CAMEL.search(word))
        if code_like and candidate and candidate not in found:
            found.append(candidate)
    return found[:limit]


def rank_definitions(
    index: CodeIndex, query: str, kind: SearchKind = "auto", limit: int = MAX_HITS
) -> tuple[list[Match], str]:
    """Definitions for a query, best first, and how they were found (`name` or `text`).

    `definition`: fuzzy name matching. `text`: BM25 only. `auto`: for a name, name matches scoring
    at least `NAME_MATCH_FLOOR`, else BM25; for prose, BM25 fused with exact matches of the
    identifiers it mentions (see `_fuse`).
    """
    if kind == "definition":
        return index.find_definition(query, limit), "name"
    if kind == "text":
        return index.search_text(query, limit), "text"
    if not looks_like_prose(query):
        names = [m for m in index.find_definition(query, limit) if m.score >= NAME_MATCH_FLOOR]
        if names:
            return names, "name"
        return index.search_text(query, limit), "text"
    return _fuse(index, query, limit), "text"


def _fuse(index: CodeIndex, query: str, limit: int) -> list[Match]:
    """BM25 scores scaled to the best hit, plus `NAMED_BONUS` for definitions the prose names
    exactly; test code weighs `TEST_WEIGHT` (an issue is rarely about the tests)."""
    text = index.search_text(query, max(limit, 50))
    best = text[0].score if text else 1.0
    scores = {m.definition.qualname: m.score / best for m in text}
    found = {m.definition.qualname: m.definition for m in text}
    for identifier in mentioned_identifiers(query):
        for m in index.find_definition(identifier, 3, min_score=0.9):
            scores[m.definition.qualname] = scores.get(m.definition.qualname, 0.0) + NAMED_BONUS
            found[m.definition.qualname] = m.definition
    fused = [
        Match(d, round(scores[q] * (TEST_WEIGHT if d.is_test else 1.0), 4))
        for q, d in found.items()
    ]
    fused.sort(key=lambda m: -m.score)
    return fused[:limit]


def format_definition(definition: Definition) -> str:
    """`path:start-end  qualname(signature)  — docstring line`."""
    d = definition
    prefix = {"class": "class ", "module": "module "}.get(d.kind, "")
    doc = d.doc if len(d.doc) <= _DOC_WIDTH else d.doc[: _DOC_WIDTH - 3] + "..."
    text = f"{d.path}:{d.line}-{d.end_line}  {prefix}{d.qualname}{d.signature}"
    return f"{text}  — {doc}" if doc else text


def render_search(
    index: CodeIndex, query: str, kind: SearchKind = "auto", root: Path | None = None
) -> str:
    """The tool's answer as text; `root` is where source lines are read for references."""
    query = query.strip()
    if not query:
        raise ValueError("query is empty: give a name (e.g. parse_config) or a description")
    if kind in ("references", "callers"):
        return _render_uses(index, query, kind, root or index.root)
    matches, how = rank_definitions(index, query, kind, _RANKED)
    if not matches:
        return f"No definitions match {query!r}. Try kind='text' or other words."
    header = {
        "name": f"Definitions matching {query!r}:",
        "text": f"Text search (BM25) for {query!r}:",
    }[how]
    if kind == "auto" and how == "text" and not looks_like_prose(query):
        header = f"No definition is named like {query!r}; text search (BM25) instead:"
    return _listing(header, [format_definition(m.definition) for m in matches])


def _render_uses(index: CodeIndex, query: str, kind: SearchKind, root: Path) -> str:
    target, definition, note = _target(index, query)
    where = f" ({definition.location})" if definition is not None else ""
    if kind == "callers":
        callers = index.find_callers(target)
        if not callers:
            return f"No calls to {target}{where} found.{note}"
        lines = []
        for caller in callers:
            sites = ", ".join(str(r.line) for r in caller.calls)
            lines.append(f"{format_definition(caller.definition)}  [calls at line {sites}]")
        return _listing(f"Callers of {target}{where}: {len(callers)}{note}", lines)
    refs = index.find_references(target)
    if not refs:
        return f"No references to {target}{where} found.{note}"
    lines = [_reference_line(ref, root) for ref in refs]
    return _listing(f"References to {target}{where}: {len(refs)}{note}", lines)


def _target(index: CodeIndex, query: str) -> tuple[str, Definition | None, str]:
    """The qualname a references/callers query means, its definition, and a note for the
    model when the name was ambiguous or only approximately matched."""
    exact = index.definition(query)
    if exact is not None:
        return exact.qualname, exact, ""
    matches = index.find_definition(query, limit=6)
    if not matches:
        return query, None, ""
    best = matches[0]
    note = ""
    same = [
        m.definition.qualname for m in matches[1:] if m.score >= best.score and best.score >= 0.9
    ]
    if same:
        note = f"\n(also named {query!r}: {', '.join(same)}; pass a full qualname to pick one)"
    elif best.score < 0.9:
        note = f"\n(no exact name {query!r}; using the closest, {best.definition.qualname})"
    return best.definition.qualname, best.definition, note


def _reference_line(ref: Reference, root: Path) -> str:
    text = f"{ref.path}:{ref.line}  in {ref.scope}"
    try:
        with open(root / ref.path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                if number == ref.line:
                    return f"{text}  | {line.strip()[:120]}"
    except OSError:
        pass
    return text


def _listing(header: str, lines: list[str]) -> str:
    shown = lines[:MAX_HITS]
    more = len(lines) - len(shown)
    footer = [f"... {more} more (narrow the query)"] if more > 0 else []
    return "\n".join([header, *shown, *footer])


async def code_index_for(ctx: ToolContext) -> CodeIndex:
    """The rollout's index: the prepared one, or one built from the local workspace once."""
    index = ctx.state.get("code_index")
    if isinstance(index, CodeIndex):
        return index
    root = ctx.state.get("workspace_root")
    if root is None or not Path(root).is_dir():
        raise CodeIndexUnavailable(
            "search_code is not available in this environment: no code index was prepared for "
            "the task and there is no local workspace to index. Use bash (grep -rn) instead."
        )
    # a CPU-heavy build: on the init stage's named pool, not the default to_thread pool
    built = await run_in_pool("init", LAZY_INDEXES.get, Path(root))
    ctx.state["code_index"] = built
    return built


@tool(timeout_s=120)
async def search_code(query: str, kind: SearchKind = "auto", *, ctx: ToolContext) -> str:
    """Search the Python code: definitions by name, their uses and callers, or code by description.

    Args:
        query: A name (parse_config, Parser.parse or pkg.mod.func; typos and partial names are
            fine) or a short description of the behaviour you are looking for.
        kind: auto (names, or a text search when the query is a description), definition,
            references (every use of a name across modules), callers (the functions that call
            it) or text (keyword search over names, docstrings and code).
    """
    index = await code_index_for(ctx)
    root = ctx.state.get("workspace_root")
    return render_search(index, query, kind, Path(root) if root is not None else None)
