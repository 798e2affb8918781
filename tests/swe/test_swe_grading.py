"""The SWE grader on a tiny project, in the real bubblewrap sandbox: semantics and guards."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tiny_project import CALC, TESTS, buggy_calc, tiny_row
from typer.testing import CliRunner

from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.runtime.workspace import make_workspace
from conveyor.tasks.swe.cli import tasks_app
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.grading import (
    GradeReport,
    GradingOptions,
    TestOutcome,
    TestRun,
    grade,
    row_environment,
    row_template,
    run_tests,
    score_run,
)
from conveyor.tasks.swe.patches import apply_patch, file_diff

AVAILABLE, WHY = bubblewrap_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=WHY)
FIX = file_diff("tinycalc/__init__.py", buggy_calc(), CALC)


def _grade(patch: str, **options: object) -> GradeReport:
    return asyncio.run(grade(tiny_row(), patch, GradingOptions(**options)))  # type: ignore[arg-type]


@needs_sandbox
def test_gold_resolves_and_empty_does_not() -> None:
    gold = _grade(FIX)
    assert gold.resolved and gold.reward == 1.0
    assert (gold.f2p_passed, gold.f2p_total, gold.p2p_passed, gold.p2p_total) == (2, 2, 3, 3)
    empty = _grade("")
    assert not empty.resolved and empty.reward == 0.0
    assert (empty.f2p_passed, empty.p2p_passed) == (0, 3)
    assert set(empty.summary()) == {
        "instance_id",
        "resolved",
        "tampered",
        "f2p_passed",
        "f2p_total",
        "p2p_passed",
        "p2p_total",
        "seconds",
    }


@needs_sandbox
def test_editing_a_failing_test_is_reverted() -> None:
    cheat = file_diff(
        "tests/test_calc.py", TESTS, TESTS.replace("assert add(2, 3) == 5", "assert True")
    )
    cheat += file_diff("tests/test_hidden.py", None, "def test_add_negative():\n    pass\n")
    report = _grade(cheat)
    assert not report.resolved and report.f2p_passed == 0
    assert set(report.dropped_paths) == {"tests/test_calc.py", "tests/test_hidden.py"}


FORCE_PASS = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
"""


@needs_sandbox
def test_conftest_forcing_passes_is_ignored() -> None:
    cheat = file_diff("conftest.py", None, FORCE_PASS)
    cheat += file_diff("tinycalc/conftest.py", None, FORCE_PASS)
    report = _grade(cheat)
    assert not report.resolved and report.f2p_passed == 0
    assert report.dropped_paths == {
        "conftest.py": "test configuration",
        "tinycalc/conftest.py": "test configuration",
    }
    # Without the guard the cheat would work: the adversary is real.
    row = tiny_row()
    with make_workspace(row_template(row), swe_home() / "workspaces") as ws:
        apply_patch(ws.path, cheat)
        run = asyncio.run(run_tests(ws.path, row_environment(row), select=row.FAIL_TO_PASS[:1]))
    assert run.outcome("tests/test_calc.py::test_add").passed


@needs_sandbox
def test_pytest_configuration_edits_are_ignored() -> None:
    # Deselecting the failing tests by configuration, and start-up hooks, must not count.
    config = "[tool:pytest]\ntestpaths = tests\naddopts = -k 'not add'\n"
    cheat = file_diff("setup.cfg", "[tool:pytest]\ntestpaths = tests\n", config)
    cheat += file_diff("pytest.ini", None, "[pytest]\naddopts = -p tinycalc.hack\n")
    cheat += file_diff("pyproject.toml", None, "[tool.pytest.ini_options]\naddopts = '-x'\n")
    cheat += file_diff("sitecustomize.py", None, "import os\n")
    cheat += file_diff("pytest.py", None, "raise SystemExit(0)\n")
    report = _grade(cheat + FIX)
    assert report.resolved, "the real fix still counts"
    assert set(report.dropped_paths) == {
        "setup.cfg",
        "pytest.ini",
        "pyproject.toml",
        "sitecustomize.py",
        "pytest.py",
    }
    assert not _grade(cheat).resolved


@needs_sandbox
def test_infinite_loop_is_killed_by_the_per_test_timeout() -> None:
    looping = CALC.replace("        n -= 1\n", "        n -= 0\n")
    patch = file_diff("tinycalc/__init__.py", buggy_calc(), looping.replace("a + b", "a + b"))
    report = _grade(patch, per_test_timeout_s=1.0)
    assert not report.resolved and report.f2p_passed == 2
    assert "tests/test_calc.py::test_spin" in report.failing
    assert report.seconds < 30


@needs_sandbox
def test_a_patch_that_does_not_apply_is_unresolved() -> None:
    report = _grade(file_diff("tinycalc/__init__.py", "something else\n", "x\n"))
    assert not report.resolved and not report.patch_applied
    assert "did not apply" in (report.error or "")


def test_partial_credit_needs_every_pass_to_pass_test() -> None:
    row = tiny_row()
    passed = {t: TestOutcome(t, "passed") for t in row.PASS_TO_PASS}
    half = TestRun(
        outcomes={**passed, row.FAIL_TO_PASS[0]: TestOutcome(row.FAIL_TO_PASS[0], "passed")}
    )
    resolved, f2p, p2p, reward, failing = score_run(row, half, partial_credit=True)
    assert (resolved, f2p, p2p, reward) == (False, 1, 3, 0.5)
    assert failing == [row.FAIL_TO_PASS[1]]
    assert score_run(row, half)[3] == 0.0
    broken = TestRun(outcomes={row.FAIL_TO_PASS[0]: TestOutcome(row.FAIL_TO_PASS[0], "passed")})
    assert score_run(row, broken, partial_credit=True)[3] == 0.0
    xfail = TestRun(
        outcomes={t: TestOutcome(t, "xfailed") for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]}
    )
    assert not score_run(row, xfail)[0], "for a reward only a real pass counts"
    assert score_run(row, xfail, semantics="swebench")[0], "SWE-bench's report counts xfailed"
    every = {t: TestOutcome(t, "passed") for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]}
    assert score_run(row, TestRun(outcomes=every))[0]
    void = TestRun(outcomes=every, violations=["duplicate or unknown report: x (call)"])
    assert score_run(row, void)[:4] == (False, 0, 0, 0.0), "a void run passes nothing"


@needs_sandbox
def test_cli_grades_a_row_it_has_never_seen(tmp_path: Path) -> None:
    row = tiny_row("tinycalc__unseen_row")
    tasks = tmp_path / "rows.jsonl"
    tasks.write_text(
        json.dumps({**json.loads(row.to_json()), "FAIL_TO_PASS": json.dumps(row.FAIL_TO_PASS)})
        + "\n"
    )
    patch = tmp_path / "fix.diff"
    patch.write_text(FIX)
    args = ["grade", "--tasks", str(tasks), "--instance", row.instance_id, "--json"]
    result = CliRunner().invoke(tasks_app, [*args, "--patch", str(patch)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["resolved"] is True
    assert (summary["f2p_passed"], summary["f2p_total"]) == (2, 2)
    assert (summary["p2p_passed"], summary["p2p_total"]) == (3, 3)
    assert summary["instance_id"] == row.instance_id and summary["seconds"] > 0
    result = CliRunner().invoke(tasks_app, args)
    assert json.loads(result.output.strip().splitlines()[-1])["resolved"] is False


BROKEN_MODULE = "import pytest\n\n\nclass TestThing:\n    def __init__(self):\n        pass\n"


@needs_sandbox
def test_a_module_that_fails_to_collect_does_not_stop_the_others() -> None:
    """A collection warning the project's config turns into an error breaks one module; the
    other modules still run and the broken one is reported."""
    row = tiny_row()
    with make_workspace(row_template(row), swe_home() / "workspaces") as ws:
        apply_patch(ws.path, FIX)
        apply_patch(ws.path, file_diff("tests/test_noise.py", None, BROKEN_MODULE))
        cfg = ws.path / "setup.cfg"
        cfg.write_text(cfg.read_text() + "filterwarnings = error\n")
        run = asyncio.run(run_tests(ws.path, row_environment(row)))
    assert run.valid and list(run.collect_errors) == ["tests/test_noise.py::TestThing"]
    assert run.passed() == {
        "tests/test_calc.py::test_add",
        "tests/test_calc.py::test_clamp_low",
        "tests/test_calc.py::test_clamp_mid",
        "tests/test_calc.py::test_spin",
    }


XFAIL = file_diff(
    "tinycalc/__init__.py",
    buggy_calc(),
    buggy_calc().replace("    return a - b", "    import pytest\n\n    pytest.xfail('known')"),
)


@needs_sandbox
def test_cli_semantics_strict_by_default_swebench_on_request(tmp_path: Path) -> None:
    row = tiny_row("tinycalc__semantics")
    tasks = tmp_path / "rows.jsonl"
    tasks.write_text(row.to_json() + "\n")
    patch = tmp_path / "xfail.diff"
    patch.write_text(XFAIL)
    args = ["grade", "--tasks", str(tasks), "--instance", row.instance_id, "--json"]
    args += ["--patch", str(patch)]
    strict = CliRunner().invoke(tasks_app, args)
    assert json.loads(strict.output.strip().splitlines()[-1])["resolved"] is False
    swebench = CliRunner().invoke(tasks_app, [*args, "--semantics", "swebench"])
    assert json.loads(swebench.output.strip().splitlines()[-1])["resolved"] is True
    bad = CliRunner().invoke(tasks_app, [*args, "--semantics", "loose"])
    assert bad.exit_code == 2 and "strict or swebench" in bad.output


@needs_sandbox
def test_cli_names_a_broken_task(tmp_path: Path) -> None:
    row = tiny_row("tinycalc__cli_broken").model_copy(
        update={"test_patch": file_diff("tests/test_calc.py", "nothing like it\n", "x\n")}
    )
    tasks = tmp_path / "rows.jsonl"
    tasks.write_text(row.to_json() + "\n")
    result = CliRunner().invoke(
        tasks_app, ["grade", "--tasks", str(tasks), "--instance", row.instance_id]
    )
    assert result.exit_code == 2
    assert "tinycalc__cli_broken" in result.output and "does not apply" in result.output


@pytest.mark.filterwarnings("ignore:LocalRuntime does not isolate")
def test_the_local_runtime_grades_through_the_same_channel() -> None:
    """Unsandboxed grading, only when asked for with its loud key (trusted patches only): the
    outcome descriptor is handed over the same way."""
    trusted = {"runtime": "local", "unsandboxed_grading_i_trust_the_policy": True}
    gold = _grade(FIX, **trusted)
    assert gold.resolved and not gold.violations
    assert not _grade("", **trusted).resolved
