"""Text side of code search: identifier splitting, search tokens and fuzzy name similarity.

Identifiers are split on `_` and case changes (`parseHTTPResponse_v2` -> parse, http, response,
v2) so a natural-language query meets code on shared words; tokens are lower-cased, lightly
stemmed (parses/parsed/parsing -> pars) and English and Python stop words are dropped.
"""

from __future__ import annotations

import difflib
import functools
import re

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
STOP_WORDS = frozenset(
    """a an and are as at be been but by can could do does for from has have how if in into is it
    its may must no not of on or should so such than that the their then there these this those to
    was we were what when where which while will with would you your i me my our us also any all
    each other only some same use used using get gets set via one two def return returns self cls
    none true false elif else try except finally raise pass lambda yield import class assert del
    global nonlocal await async break continue str int float bool dict list tuple args
    kwargs""".split()
)


@functools.lru_cache(maxsize=1 << 16)
def _split(name: str) -> tuple[str, ...]:
    """Lower-cased word parts of an identifier: `parse_HTTPResponse` -> (parse, http, response)."""
    return tuple(part.lower() for chunk in name.split("_") for part in _PARTS.findall(chunk))


def stem(word: str) -> str:
    """A light suffix stripper: enough that parse/parses/parsed/parsing share one token."""
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        word = word[:-1]
    if word.endswith("ing") and len(word) > 5:
        word = word[:-3]
    elif word.endswith("ed") and len(word) > 4:
        word = word[:-2]
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def search_tokens(text: str) -> list[str]:
    """BM25 tokens of code or prose: identifier parts, stemmed, plus whole compound identifiers."""
    tokens: list[str] = []
    for identifier in _IDENTIFIER.findall(text):
        tokens.extend(_identifier_tokens(identifier))
    return tokens


@functools.lru_cache(maxsize=1 << 16)
def _identifier_tokens(identifier: str) -> tuple[str, ...]:
    parts = _split(identifier)
    whole = (identifier.lower().strip("_"),) if len(parts) > 1 else ()
    return whole + tuple(stem(p) for p in parts if len(p) > 1 and p not in STOP_WORDS)


def normalize_name(name: str) -> str:
    """Case- and underscore-free form: `parse_String` and `parseString` both give `parsestring`."""
    return name.replace("_", "").lower()


def name_similarity(query: str, name: str, floor: float = 0.0) -> float:
    """How alike two identifiers are, 0..1: the best of edit similarity, word overlap, prefix.

    Scores at or below `floor` may be reported as `floor` (the edit similarity is skipped when its
    cheap upper bounds cannot beat it), which keeps a scan over thousands of names fast.
    """
    q, n = normalize_name(query), normalize_name(name)
    if not q or not n:
        return 0.0
    if q == n:
        return 1.0
    q_parts, n_parts = set(_split(query)), set(_split(name))
    overlap = len(q_parts & n_parts) / len(q_parts | n_parts) if q_parts and n_parts else 0.0
    # A partial name (`parse_str` for `parse_string`): the query starts the name or sits in it.
    partial = 0.0
    if len(q) >= 3 and q in n:
        partial = 0.6 + 0.35 * len(q) / len(n) + (0.05 if n.startswith(q) else 0.0)
    # Whole words of the name (`hypotenuse` for `compute_hypotenuse`).
    contained = 0.0
    if q_parts and q_parts <= n_parts:
        contained = 0.7 + 0.25 * len(q_parts) / len(n_parts)
    best = max(overlap * 0.95, partial, contained, floor)
    matcher = difflib.SequenceMatcher(None, q, n, autojunk=False)
    if matcher.real_quick_ratio() > best and matcher.quick_ratio() > best:
        best = max(best, matcher.ratio())
    return best
