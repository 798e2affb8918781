"""Issue 28: making canary tests (no sandbox).

A canary copies one of a row's hidden tests with one expected value made wrong. These tests make
candidates from real test modules' text (plain asserts, unittest equality, class methods,
parametrized tests, modules with odd formatting and line endings) and check that the rest of
each module stays byte for byte as it was; then how the grader reads a run's canaries beside
their real tests.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import pytest
from tiny_project import tiny_row

from conveyor.runtime.workspace import make_workspace
from conveyor.tasks.swe import canaries
from conveyor.tasks.swe.canary_candidates import (
    NAME_SUFFIXES,
    Canary,
    insert_text,
    make_candidate,
    names_in,
    source_lines,
)
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.grading import row_template
from conveyor.tasks.swe.patches import apply_patch, file_diff
from conveyor.tasks.swe.test_run import TestOutcome, TestRun


def _candidate(
    source: str, nodeid: str, taken: set[str] | None = None, swap: bool = False
) -> Canary | None:
    tree = ast.parse(source)
    names = names_in(tree) if taken is None else taken
    return make_candidate("t.py", source.encode(), tree, nodeid, names, "seed", swap)


def _copied_line(canary: Canary, needle: str) -> str:
    return next(line for line in canary.text.splitlines() if needle in line).strip()


def test_a_plain_assert_gets_one_wrong_expected_value_of_its_type() -> None:
    source = (
        "def test_x():\n    value = compute()\n    assert value == 5  # five\n"
        '    assert other() == "abc"\n'
    )
    canary = _candidate(source, "t.py::test_x")
    assert canary is not None and canary.original == "t.py::test_x"
    name = canary.nodeid.split("::")[1]
    assert name.startswith("test_x_") and "canary" not in name
    assert _copied_line(canary, "value ==") == "assert value == 6  # five"
    assert _copied_line(canary, "other()") == 'assert other() == "abc"'  # only ONE changed
    assert "!=" not in canary.text


@pytest.mark.parametrize(
    ("expected", "wrong"),
    [
        ("5", "6"),
        ("-5", "-4"),
        ("2.5", "3.5"),
        ('"abc"', '"abx"'),
        ("'x'", "'y'"),
        ('b"zz"', 'b"zx"'),
        ("True", "False"),
        ("(None, [1, 2])", "(None, [2, 2])"),
        ('{"k": 1}', '{"k": 2}'),
        ("[]", "[0]"),
    ],
)
def test_the_wrong_value_keeps_the_literal_type(expected: str, wrong: str) -> None:
    canary = _candidate(f"def test_x():\n    assert f() == {expected}\n", "t.py::test_x")
    assert canary is not None
    assert _copied_line(canary, "assert") == f"assert f() == {wrong}"


def test_unittest_equality_in_a_class_method() -> None:
    source = (
        "import unittest\n\n\nclass TestC(unittest.TestCase):\n"
        "    def test_m(self):\n        self.assertEqual(3, thing())\n\n"
        "    def test_n(self):\n        pass\n"
    )
    canary = _candidate(source, "t.py::TestC::test_m")
    assert canary is not None and canary.nodeid.startswith("t.py::TestC::test_m_")
    assert _copied_line(canary, "assertEqual") == "self.assertEqual(4, thing())"
    inserted = insert_text(source, [canary])
    tree = ast.parse(inserted)
    test_class = next(node for node in tree.body if isinstance(node, ast.ClassDef))
    methods = [node.name for node in test_class.body if isinstance(node, ast.FunctionDef)]
    assert methods == ["test_m", canary.nodeid.split("::")[-1], "test_n"]


def test_a_parametrized_test_keeps_its_decorators_and_one_parameter_id() -> None:
    source = (
        "import pytest\n\n\n@pytest.mark.parametrize('a', [1, 2])\n"
        "def test_p(a):\n    assert square(a) == a * a\n    assert half(4) == 2\n"
    )
    canary = _candidate(source, "t.py::test_p[2]")
    assert canary is not None
    name = canary.nodeid.split("::")[1]
    assert name.startswith("test_p_") and name.endswith("[2]")
    assert canary.text.lstrip("\n").startswith("@pytest.mark.parametrize('a', [1, 2])\n")
    assert _copied_line(canary, "half") == "assert half(4) == 3"


@pytest.mark.parametrize(
    "body",
    [
        "    assert f() is None\n",  # no equality
        "    assert f() != 3\n",
        "    assert f() == g()\n",  # no literal side
        "    assert 1 == 1\n",  # nothing under test
        "    assert f() == None\n",  # no other value of its type
        "    x = 1; assert f() == 3\n",  # shares its line
        "    def inner():\n        assert f() == 3\n",  # a nested function's
    ],
)
def test_no_candidate_without_a_literal_expectation(body: str) -> None:
    assert _candidate(f"def test_x():\n{body}", "t.py::test_x") is None


def test_a_nested_assertion_counts_after_the_top_level_ones() -> None:
    source = (
        "def test_x():\n    for i in range(3):\n        assert f(i) == 1\n    assert g() == 7\n"
    )
    canary = _candidate(source, "t.py::test_x")
    assert canary is not None
    assert _copied_line(canary, "g()") == "assert g() == 8"
    assert _copied_line(canary, "f(i)") == "assert f(i) == 1"


def test_the_name_never_meets_one_in_the_module() -> None:
    suffixes = NAME_SUFFIXES
    taken = {f"test_x{s}" for s in suffixes} | {"test_x"}
    canary = _candidate("def test_x():\n    assert f() == 1\n", "t.py::test_x", taken)
    assert canary is not None and canary.nodeid == "t.py::test_x_2"


def _without(text: str, canaries_in: Sequence[Canary], source: str) -> str:
    """`text` less the copies, and the originals that moved under their own names again."""
    for canary in canaries_in:
        text = text.replace(canary.text, "", 1)
        if canary.renamed_line:
            own = source_lines(source)[canary.renamed_line - 1]
            text = text.replace(canary.renamed_text, own, 1)
    return text


@pytest.mark.parametrize("swap", [False, True], ids=["copy_renamed", "original_renamed"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_insertion_leaves_every_other_byte_of_the_module(newline: str, swap: bool) -> None:
    source = (
        "# -*- coding: utf-8 -*-\nimport pytest   # trailing spaces   \n\n\n"
        "def test_a():\n    '''Docs \u2028 with a line separator \f and a form feed.'''\n"
        "    assert  add( 1,2 )  ==  3   # odd formatting\n\n\n"
        "# a comment between\n\n\nclass TestB:\n    def test_b(self):\n"
        '        assert name() == "b\u00e9"\n\n    # trailing comment\n\n\n'
        "def test_c():\n    assert f() == [1, 2]"  # no newline at the end
    ).replace("\n", newline)
    tree = ast.parse(source)
    taken = names_in(tree)
    made = [
        make_candidate("t.py", source.encode(), tree, nodeid, taken, "seed", swap)
        for nodeid in ("t.py::test_a", "t.py::TestB::test_b", "t.py::test_c")
    ]
    found = [canary for canary in made if canary is not None]
    assert len(found) == 3
    inserted = insert_text(source, found)
    ast.parse(inserted)
    # The file without the copies is the original, byte for byte (a newline ends the last
    # original line now that something follows it).
    assert _without(inserted, found, source) == source + newline
    assert all(bool(c.renamed_line) == swap for c in found)
    assert inserted.count("\n") == inserted.count(newline)  # the copies use the file's endings
    assert _copied_line(found[0], "add(") == "assert  add( 1,2 )  ==  4   # odd formatting"
    assert _copied_line(found[1], "name()") == 'assert name() == "bx"'


def test_candidates_come_only_from_the_hidden_test_modules() -> None:
    row = tiny_row()
    with make_workspace(row_template(row), swe_home() / "workspaces") as ws:
        apply_patch(ws.path, row.test_patch)
        before = (ws.path / "tests/test_hidden.py").read_bytes()
        found = canaries.candidates(row, ws.path, swap=False)
        # tests/test_calc.py::test_add is F2P but visible (not in the test patch): no copy of it
        assert [c.original for c in found] == ["tests/test_hidden.py::test_add_negative"]
        assert canaries.insert_canaries(ws.path, found) == found
        after = (ws.path / "tests/test_hidden.py").read_bytes()
        assert after.startswith(before) and b"== -4\n" in after[len(before) :]
        # a module that is not the one they were made for gets none
        assert canaries.insert_canaries(ws.path, found) == []


def test_a_swapped_copy_takes_the_name_and_the_original_moves() -> None:
    source = "def test_x():\n    assert f() == 1\n\n\ndef test_y():\n    pass\n"
    canary = _candidate(source, "t.py::test_x", swap=True)
    assert canary is not None and canary.nodeid == canary.original == "t.py::test_x"
    moved = canary.runs_as.split("::")[1]
    assert canary.real == canary.runs_as and moved.startswith("test_x_")
    inserted = insert_text(source, [canary])
    assert inserted == (
        f"def {moved}():\n    assert f() == 1\n\n\ndef test_x():\n    assert f() == 2\n"
        "\n\ndef test_y():\n    pass\n"
    )
    # over many rows (seeds), about half of the copies take the name
    tree = ast.parse(source)
    swapped = [
        make_candidate("t.py", source.encode(), tree, "t.py::test_x", set(), f"row{i}")
        for i in range(200)
    ]
    assert 60 < sum(bool(c and c.runs_as) for c in swapped) < 140


def test_a_test_listed_with_several_parameter_ids_never_moves(tmp_path: Path) -> None:
    source = "import pytest\n\n\n@pytest.mark.parametrize('a', [1, 2])\n"
    source += "def test_p(a):\n    assert f(a) == 1\n"
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_p.py").write_text(source)
    row = tiny_row().model_copy(
        update={
            "test_patch": file_diff("tests/test_p.py", None, source),
            "FAIL_TO_PASS": ["tests/test_p.py::test_p[1]", "tests/test_p.py::test_p[2]"],
            "PASS_TO_PASS": [],
        }
    )
    (only,) = canaries.candidates(row, tmp_path, swap=True)
    assert only.original == "tests/test_p.py::test_p[1]" and not only.runs_as
    alone = row.model_copy(update={"FAIL_TO_PASS": ["tests/test_p.py::test_p[2]"]})
    (moved,) = canaries.candidates(alone, tmp_path, swap=True)
    assert moved.nodeid == "tests/test_p.py::test_p[2]" and moved.runs_as.endswith("[2]")


def _outcomes(**outcomes: str) -> TestRun:
    """A run with these outcomes (node id `t.py::<name>`): only the grader's reading of it."""
    found = {f"t.py::{k}": TestOutcome(f"t.py::{k}", v) for k, v in outcomes.items()}
    return TestRun(outcomes=found, collected=list(found))


SWAPPED = Canary("t.py", "t.py::test_x", "t.py::test_x", 1, "", "", runs_as="t.py::test_x_more")
PLAIN = Canary("t.py", "t.py::test_y", "t.py::test_y_again", 1, "", "")


@pytest.mark.parametrize(
    ("outcomes", "tampered", "did_not_fail"),
    [
        (
            {
                "test_x_more": "passed",
                "test_x": "failed",
                "test_y": "passed",
                "test_y_again": "failed",
            },
            [],
            [],
        ),
        (
            {
                "test_x_more": "passed",
                "test_x": "passed",
                "test_y": "passed",
                "test_y_again": "xpassed",
            },
            ["t.py::test_x", "t.py::test_y_again"],
            [],
        ),
        # the real test failed: a canary passing says nothing (the row is not resolved anyway)
        (
            {
                "test_x_more": "failed",
                "test_x": "passed",
                "test_y": "failed",
                "test_y_again": "passed",
            },
            [],
            [],
        ),
        (
            {"test_x_more": "passed", "test_y": "passed", "test_y_again": "skipped"},
            [],
            ["t.py::test_x (missing)", "t.py::test_y_again (skipped)"],
        ),
        (
            {
                "test_x_more": "passed",
                "test_x": "xfailed",
                "test_y": "passed",
                "test_y_again": "error",
            },
            [],
            ["t.py::test_y_again (error)"],
        ),
    ],
)
def test_the_check_reads_each_canary_beside_its_real_test(
    outcomes: dict[str, str], tampered: list[str], did_not_fail: list[str]
) -> None:
    verdict = canaries.check([SWAPPED, PLAIN], _outcomes(**outcomes))
    assert verdict.tampered == tampered and verdict.did_not_fail == did_not_fail
    assert verdict.holds == (not tampered and not did_not_fail)


def test_the_run_as_the_row_lists_it() -> None:
    run = _outcomes(test_x_more="passed", test_x="failed", test_y="failed", test_y_again="failed")
    listed = canaries.as_listed(run, [SWAPPED, PLAIN])
    assert {k: v.outcome for k, v in listed.outcomes.items()} == {
        "t.py::test_x": "passed",
        "t.py::test_y": "failed",
    }
    assert sorted(listed.collected) == ["t.py::test_x", "t.py::test_y"]
    row = tiny_row().model_copy(
        update={"FAIL_TO_PASS": ["t.py::test_x"], "PASS_TO_PASS": ["t.py::test_y"]}
    )
    assert canaries.selection(row, [SWAPPED, PLAIN]) == [
        "t.py::test_x",
        "t.py::test_x_more",
        "t.py::test_y",
        "t.py::test_y_again",
    ]
