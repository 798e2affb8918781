"""Procedural mutations: every kind appears, each mutant parses and differs, edits stay small."""

from __future__ import annotations

import ast
from collections import Counter

from conveyor.tasks.swe.mutations import MUTATION_KINDS, mutations_of_file, pick
from conveyor.tasks.swe.patches import file_diff, split_lines

SOURCE = '''"""Sample."""


def scan(items, limit=3):
    """Keep small items, count them."""
    out = []
    total = 0
    for item in items:
        if item < limit and item is not None:
            out.append(item * 2)
            total += 1
        else:
            total -= 1
    while total > 10:
        total = total - 1
    if not out:
        return None
    return out, total, True


class Box:
    def size(self):
        return len(self.items) + 1
'''


def test_every_kind_is_generated_and_each_mutant_parses() -> None:
    mutants = mutations_of_file("pkg/sample.py", SOURCE)
    kinds = Counter(m.kind for m in mutants)
    assert set(kinds) == set(MUTATION_KINDS)
    baseline = ast.dump(ast.parse(SOURCE))
    for mutant in mutants:
        assert ast.dump(ast.parse(mutant.mutated)) != baseline
        assert mutant.original == SOURCE and mutant.function in {"scan", "Box.size"}
    assert len({m.mutated for m in mutants}) == len(mutants), "no duplicate mutants"


def test_expression_mutants_change_one_line() -> None:
    for mutant in mutations_of_file("s.py", SOURCE):
        if mutant.kind in ("flip_comparison", "change_constant", "invert_if"):
            diff = file_diff("s.py", mutant.original, mutant.mutated)
            changed = [x for x in diff.splitlines()[4:] if x[:1] in "+-" and x[:3] not in "---+++"]
            assert len(changed) == 2, diff


def test_only_covered_lines_are_mutated() -> None:
    covered = {9}  # the `if item < limit and item is not None:` line
    mutants = mutations_of_file("s.py", SOURCE, covered)
    assert mutants and all(m.line == 9 for m in mutants)
    assert {m.kind for m in mutants} >= {"flip_comparison", "drop_condition", "invert_if"}


def test_pick_spreads_over_kinds_and_functions_and_is_deterministic() -> None:
    mutants = mutations_of_file("s.py", SOURCE)
    first = pick(mutants, seed=1)
    assert first == pick(mutants, seed=1) and sorted(map(id, first)) == sorted(map(id, mutants))
    kinds = len({m.kind for m in mutants})
    assert len({m.kind for m in first[:kinds]}) == kinds, "every kind before any repeats"
    ops = [m for m in first if m.kind == "change_operator"]
    assert {m.function for m in ops[:2]} == {"scan", "Box.size"}, "functions alternate"


def test_mutants_of_a_crlf_file_with_form_feeds_and_u2028_hit_the_covered_line() -> None:
    """Lines are numbered as Python numbers them (a form feed or U+2028 ends no line), and a
    mutant keeps the file's CRLF line ends: its diff is one line against the file's bytes."""
    odd = "'''Odd: \u2028 and \x1c.'''\n\f\n" + SOURCE.removeprefix('"""Sample."""\n')
    text = odd.replace("\n", "\r\n")
    covered = {10}  # the `if item < limit and item is not None:` line, one lower here
    mutants = mutations_of_file("s.py", text, covered)
    assert all(m.line == 10 for m in mutants)
    assert {m.kind for m in mutants} >= {"flip_comparison", "drop_condition", "invert_if"}
    for mutant in mutants:
        if mutant.kind in ("flip_comparison", "change_constant", "invert_if"):
            changed = [x for x in split_lines(file_diff("s.py", text, mutant.mutated))[4:]]
            changed = [x for x in changed if x[:1] in "+-"]
            assert len(changed) == 2 and "if " in changed[0], changed
            assert all(x.endswith("\r\n") for x in changed)
