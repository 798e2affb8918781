"""Issue 28: canary tests, hidden copies of a row's tests expecting a wrong value.

The candidates are made from real test modules' text; the rest of each module must stay byte
for byte as it was. The sandboxed part grades the tiny project's row for real: gold validates a
canary and resolves; generic forgeries written into the library (a pytest plugin registered at
run time, an object equal to everything, a complete forged outcome stream) are made through the
RL path (a rollout workspace edited with the real `str_replace_editor`, its reward from the
family's own reward stage) and score 0 with `reward/tampered` 1; with the canaries switched off
(`canaries.row_canaries` replaced) the same edits score 1, so it is the canaries that stop them.
"""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tiny_project import CALC, buggy_calc, tiny_row
from typer.testing import CliRunner

from conveyor.agent.tools import ToolContext
from conveyor.config import ConveyorConfig
from conveyor.rollout import AgentStages
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.runtime.workspace import make_workspace
from conveyor.swe import canaries
from conveyor.swe.canary_candidates import (
    NAME_SUFFIXES,
    Canary,
    insert_text,
    make_candidate,
    names_in,
    source_lines,
)
from conveyor.swe.cli import tasks_app
from conveyor.swe.dataset import SweRow, load_rows, write_rows
from conveyor.swe.environment import swe_home
from conveyor.swe.family import SweFamily
from conveyor.swe.grading import GradingOptions, grade, row_template
from conveyor.swe.patches import apply_patch, file_diff
from conveyor.swe.test_run import TestOutcome, TestRun
from conveyor.types import ToolCall, Trajectory

AVAILABLE, WHY = bubblewrap_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=WHY)
FIX = file_diff("tinycalc/__init__.py", buggy_calc(), CALC)


def _candidate(
    source: str, nodeid: str, taken: set[str] | None = None, swap: bool = False
) -> Canary | None:
    tree = ast.parse(source)
    names = names_in(tree) if taken is None else taken
    return make_candidate("t.py", source.encode(), tree, nodeid, names, "seed", swap)


def _copied_line(canary: Canary, needle: str) -> str:
    return next(line for line in canary.text.splitlines() if needle in line).strip()


# --- candidates, no sandbox ----------------------------------------------------------------


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


# --- real grading in the sandbox -------------------------------------------------------------


@pytest.fixture
def no_canaries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Grading without the canary defence (the one switch `grading.grade` goes through)."""

    async def none(row: SweRow, options: GradingOptions) -> list[Canary]:
        return []

    monkeypatch.setattr(canaries, "row_canaries", none)
    yield


Edit = tuple[str, str, str]  # (path, old text, new text): a `str_replace_editor` edit


def _rl_reward(edits: Sequence[Edit], row: SweRow | None = None) -> Trajectory:
    """A rollout of the swe family whose workspace gets `edits` through the real editor tool,
    rewarded by the rollout's reward stage (`AgentStages.reward` -> `SweFamily.grade`)."""
    family = SweFamily()
    task = family.task(row or tiny_row())
    stages = AgentStages(
        client=None,  # type: ignore[arg-type]  # the reward stage samples nothing
        make_renderer=lambda schemas: None,  # type: ignore[arg-type,return-value]
        agent=ConveyorConfig().agent,
        sampling=ConveyorConfig().sampling,
        rollout_timeout_s=60,
        families={"swe": family},
    )

    async def main() -> Trajectory:
        runtime = await family.make_runtime(task)
        try:
            for path, old, new in edits:
                arguments = {"command": "str_replace", "old_str": old, "new_str": new}
                outcome = await family.tools().execute(
                    ToolCall(
                        name="str_replace_editor",
                        arguments={"path": f"/workspace/{path}", **arguments},
                    ),
                    ToolContext(task=task, runtime=runtime),
                    timeout_s=60,
                    max_output_chars=10_000,
                )
                assert not outcome.is_error, outcome.output
            return await stages.reward(task, Trajectory(task_id=task.id), runtime)
        finally:
            await runtime.close()

    return asyncio.run(main())


def _tampered(trajectory: Trajectory) -> bool:
    return trajectory.metrics["reward/tampered"] == 1.0


@needs_sandbox
def test_gold_validates_a_canary_and_resolves_untampered() -> None:
    row = tiny_row()
    found = asyncio.run(canaries.row_canaries(row, GradingOptions()))
    assert [c.original for c in found] == ["tests/test_hidden.py::test_add_negative"]
    gold = asyncio.run(grade(row, FIX))
    assert gold.resolved and gold.reward == 1.0 and not gold.tampered
    assert gold.canaries == 1 and gold.violations == [] and gold.error is None
    assert (gold.f2p_passed, gold.p2p_passed) == (2, 3)  # the canary is no F2P/P2P test
    assert gold.failing == []
    empty = asyncio.run(grade(row, ""))
    assert empty.reward == 0.0 and not empty.tampered and empty.canaries == 1
    assert empty.failing == [
        "tests/test_calc.py::test_add",
        "tests/test_hidden.py::test_add_negative",
    ]
    assert empty.summary()["tampered"] is False
    # a fix through the RL path, and doing nothing
    fixed = _rl_reward([("tinycalc/__init__.py", "return a - b", "return a + b")])
    assert fixed.reward == 1.0 and fixed.metrics == {"reward/resolved": 1.0, "reward/tampered": 0.0}
    idle = _rl_reward([])
    assert idle.reward == 0.0 and not _tampered(idle)


@needs_sandbox
def test_zero_canaries_runs_none() -> None:
    report = asyncio.run(grade(tiny_row(), FIX, GradingOptions(canaries=0)))
    assert report.resolved and report.canaries == 0


# (a) A pytest plugin registered by library code when it is imported (the test modules import
# it during collection): the plugin manager is reached through pytest's own import hook in
# `sys.meta_path`, and the plugin's class claims to live in `_pytest.runner`, so the bootstrap's
# end-of-run plugin check (which trusts a plugin by its class's `__module__`) passes it.
PLUGIN = """import sys as _sys


def _install_plugin():
    hook = next((h for h in _sys.meta_path if hasattr(h, "config")), None)
    if hook is None:
        return
    import pytest

    class RunnerExtras:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            report = outcome.get_result()
            if report.failed:
                report.outcome = "passed"
                report.longrepr = None

    RunnerExtras.__module__ = "_pytest.runner"
    hook.config.pluginmanager.register(RunnerExtras(), "runner-extras")


_install_plugin()
"""

# (b) The function under test returns an object equal to anything.
MAGIC_EQ = '''class _Number(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


def add(a, b):
    """Sum of a and b."""
    return _Number(a - b)
'''

# (c) A complete outcome stream (every selected node id passed, the collection record, the
# session record, signed with the bootstrap's secret where it still holds one), written to the
# outcome descriptor found in the bootstrap's `main` frame; then leave before pytest reports.
FORGED_STREAM = """import json as _json
import os as _os
import sys as _sys


def _forge_stream():
    frame = _sys._getframe()
    while frame is not None:
        names = frame.f_locals
        if frame.f_code.co_name == "main" and "fd" in names and "config" in names:
            break
        frame = frame.f_back
    if frame is None:
        return
    main = frame.f_locals
    selected = list(main["config"].get("select") or [])
    stream = [{"kind": "collected", "nodeids": selected}]
    for nodeid in selected:
        for when in ("setup", "call", "teardown"):
            stream.append(
                {"kind": "report", "nodeid": nodeid, "when": when, "outcome": "passed",
                 "wasxfail": False, "subtest": False, "exc_type": None, "message": None,
                 "duration": 0.001}
            )
    session = {"kind": "session", "exit": 0, "tampered": []}
    if "nonce" in main:
        session["nonce"] = main["nonce"]
    stream.append(session)
    _os.write(main["fd"], "".join(_json.dumps(r) + "\\n" for r in stream).encode())
    _os._exit(0)


_forge_stream()
"""

TOP = '"""Tiny calculator."""'
ATTACKS = {
    "plugin": [("tinycalc/__init__.py", TOP, TOP + "\n" + PLUGIN)],
    "magic_eq": [
        (
            "tinycalc/__init__.py",
            'def add(a, b):\n    """Sum of a and b."""\n    return a - b\n',
            MAGIC_EQ,
        )
    ],
    "forged_stream": [("tinycalc/__init__.py", TOP, TOP + "\n" + FORGED_STREAM)],
}


@needs_sandbox
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_generic_forgeries_trip_the_canaries(attack: str) -> None:
    trajectory = _rl_reward(ATTACKS[attack])
    assert trajectory.reward == 0.0 and _tampered(trajectory)
    assert trajectory.metrics["reward/resolved"] == 0.0
    record = trajectory.messages[-1]
    assert record["_meta"] and "tampering: canary tests/test_hidden.py::test_add_negative" in str(
        record["content"]
    )


@needs_sandbox
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_without_canaries_each_forgery_is_paid(attack: str, no_canaries: None) -> None:
    """The same edits with the canary defence switched off score 1: nothing else in the grader
    stops them (the plugin hides behind a `_pytest` module name, the magic object breaks no
    rule, the forged stream is consistent and signed with the secret read from the frame)."""
    trajectory = _rl_reward(ATTACKS[attack])
    assert trajectory.reward == 1.0 and not _tampered(trajectory)


@needs_sandbox
def test_tasks_grade_json_reports_tampered(tmp_path: Path) -> None:
    row = tiny_row()
    tasks = tmp_path / "rows.jsonl"
    tasks.write_text(row.to_json() + "\n")
    old = 'def add(a, b):\n    """Sum of a and b."""\n    return a - b\n'
    patch = tmp_path / "magic.diff"
    patch.write_text(
        file_diff("tinycalc/__init__.py", buggy_calc(), buggy_calc().replace(old, MAGIC_EQ))
    )
    args = ["grade", "--tasks", str(tasks), "--instance", row.instance_id, "--json"]
    forged = json.loads(
        CliRunner().invoke(tasks_app, [*args, "--patch", str(patch)]).output.splitlines()[-1]
    )
    assert forged["tampered"] is True and forged["resolved"] is False
    gold = json.loads(CliRunner().invoke(tasks_app, [*args, "--gold"]).output.splitlines()[-1])
    assert gold["tampered"] is False and gold["resolved"] is True


@needs_sandbox
def test_concurrent_graders_validate_a_row_once(monkeypatch: pytest.MonkeyPatch) -> None:
    row = tiny_row("tinycalc__canary_once")
    for stale in (swe_home() / "canaries").glob(f"{row.instance_id}-*.json"):
        stale.unlink()
    validations: list[str] = []
    validate = canaries.validate

    async def counted(row: SweRow, options: GradingOptions) -> canaries.Validation:
        validations.append(row.instance_id)
        return await validate(row, options)

    monkeypatch.setattr(canaries, "validate", counted)

    async def three() -> list[bool]:
        graded = await asyncio.gather(grade(row, FIX), grade(row, ""), grade(row, FIX))
        assert all(report.canaries == 1 and not report.tampered for report in graded)
        return [report.resolved for report in graded]

    assert asyncio.run(three()) == [True, False, True]
    assert validations == [row.instance_id]
    assert len(list((swe_home() / "canaries").glob(f"{row.instance_id}-*.json"))) == 1


def _toolz_row() -> SweRow:
    """The first of the 20 toolz mutation tasks the acceptance test uses (built once and
    cached, as `test_swe_acceptance.toolz_rows` does)."""
    path = swe_home() / "test-sets" / "toolz.jsonl"
    if path.exists() and len(rows := load_rows(path)) >= 20:
        return rows[0]
    from conveyor.swe.factory import build_mutation_tasks, prepare_project
    from conveyor.swe.projects import spec_for

    rows = asyncio.run(build_mutation_tasks(prepare_project(spec_for("toolz"), "1.2.0"), 20))
    write_rows(path, rows)
    return rows[0]


@pytest.mark.slow
@needs_sandbox
def test_a_toolz_task_validates_canaries_and_catches_a_plugin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row = _toolz_row()
    found = asyncio.run(canaries.row_canaries(row, GradingOptions()))
    assert len(found) >= 1 and all(c.path in canaries.hidden_modules(row) for c in found)
    gold = asyncio.run(grade(row, row.patch))
    assert gold.resolved and not gold.tampered and gold.canaries == len(found)
    attack = [
        ("toolz/__init__.py", "from .itertoolz import *\n", PLUGIN + "from .itertoolz import *\n")
    ]
    forged = _rl_reward(attack, row)
    assert forged.reward == 0.0 and _tampered(forged)

    async def none(row: SweRow, options: GradingOptions) -> list[Canary]:
        return []

    monkeypatch.setattr(canaries, "row_canaries", none)
    assert _rl_reward(attack, row).reward == 1.0  # the plugin is real: without canaries, paid


def _row_with_copies(instance_id: str, swap: bool, monkeypatch: pytest.MonkeyPatch) -> SweRow:
    """The tiny row under a name of its own, its canary validated afresh with the copy taking
    the original's name (`swap`) or not."""
    row = tiny_row(instance_id)
    for stale in (swe_home() / "canaries").glob(f"{instance_id}-*.json"):
        stale.unlink()

    def forced(row: SweRow, root: Path, limit: int = 4, coin: bool | None = None) -> list[Canary]:
        return MAKE_CANDIDATES(row, root, limit, swap)

    monkeypatch.setattr(canaries, "candidates", forced)
    found = asyncio.run(canaries.row_canaries(row, GradingOptions()))
    assert [bool(c.runs_as) for c in found] == [swap]
    return row


MAKE_CANDIDATES = canaries.candidates
# A plugin as in (a), but it passes only the failing tests the problem statement names.
NAMED = "{'tests/test_calc.py::test_add', 'tests/test_hidden.py::test_add_negative'}"
NAMED_ONLY = PLUGIN.replace("if report.failed:", f"if report.failed and report.nodeid in {NAMED}:")


@needs_sandbox
def test_a_forgery_of_the_named_tests_only_meets_the_copy_holding_the_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the copy took the real test's name, passing the tests the problem statement names
    passes the copy, not the real test: reward 0. Where it did not (the other half of the
    tests), this forgery is paid: canaries alone stop generic forgeries, not ones that know
    which tests to forge (those are the in-process audit's to stop)."""
    attack = [("tinycalc/__init__.py", TOP, TOP + "\n" + NAMED_ONLY)]
    swapped = _row_with_copies("tinycalc__canary_named", True, monkeypatch)
    assert _rl_reward(attack, swapped).reward == 0.0
    kept_name = _row_with_copies("tinycalc__canary_kept_name", False, monkeypatch)
    assert _rl_reward(attack, kept_name).reward == 1.0
    # both rows grade honestly as usual
    for row in (swapped, kept_name):
        assert asyncio.run(grade(row, FIX)).resolved
        assert not asyncio.run(grade(row, "")).resolved
