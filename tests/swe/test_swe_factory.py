"""Factory control flow without a sandbox: the per-kind cap, the slow-test cut, the verdicts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from conveyor.tasks.swe import factory
from conveyor.tasks.swe.dataset import SweRow
from conveyor.tasks.swe.factory import Baseline, ProjectContext, Verdict, judge, kind_cap
from conveyor.tasks.swe.grading import TestOutcome, TestRun
from conveyor.tasks.swe.mutations import Mutation
from conveyor.tasks.swe.projects import BuildReport, ProjectLayout, ProjectSpec


def _ctx(tmp_path: Path) -> ProjectContext:
    env: Any = type("Env", (), {"path": tmp_path / "env"})()
    return ProjectContext("demo", "1.0", tmp_path, ProjectLayout("."), ProjectSpec("demo"), env)


def _mutant(kind: str, index: int) -> Mutation:
    return Mutation("demo/m.py", kind, f"f{index}", 1, kind, "x = 1\n", f"x = {index + 2}\n")


def test_kind_cap() -> None:
    assert kind_cap(20, 0.3) == 6 and kind_cap(50, 0.3) == 15
    assert kind_cap(5, None) == 5 and kind_cap(5, 1.0) == 5 and kind_cap(3, 0.01) == 1


def test_no_kind_exceeds_its_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # stub_body mutants come first and always pass: without the cap they would fill the set
    candidates = [_mutant("stub_body", i) for i in range(30)]
    candidates += [_mutant(k, 100 + i) for i, k in enumerate(["flip_comparison", "drop_loop"] * 10)]

    async def baseline(ctx: ProjectContext, slow_test_s: float = 1.0) -> Baseline:
        return Baseline(passed=["t.py::a"])

    async def evaluate(ctx: ProjectContext, b: Baseline, m: Mutation) -> Verdict:
        return Verdict(True, "kept", ["t.py::a"], {"t.py::a": f"AssertionError: {m.mutated}"})

    async def verify(row: SweRow, report: BuildReport | None = None) -> str | None:
        return None

    monkeypatch.setattr(factory, "measure_baseline", baseline)
    monkeypatch.setattr(factory, "candidate_mutations", lambda ctx, b, seed: candidates)
    monkeypatch.setattr(factory, "evaluate_mutant", evaluate)
    monkeypatch.setattr(factory, "verify_row", verify)
    report = BuildReport("demo", "1.0")
    rows = asyncio.run(
        factory.build_mutation_tasks(
            _ctx(tmp_path), 10, max_kind_share=0.4, hide_tests=False, report=report
        )
    )
    assert len(rows) == 10 and report.kinds["stub_body"] == 4
    assert report.kinds == {"stub_body": 4, "flip_comparison": 3, "drop_loop": 3}
    # capped candidates are passed over, not tried
    assert report.tried == 10


def test_slow_tests_leave_the_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = {
        "first_passed": ["t.py::fast", "t.py::slow", "t.py::flaky"],
        "second_passed": ["t.py::fast", "t.py::slow"],
        "durations": {"t.py::fast": 0.01, "t.py::slow": 3.0, "t.py::flaky": 0.01},
        "covered": {"demo/m.py": [1, 2]},
        "seconds": 3.5,
        "log_tail": "",
    }

    async def runs(ctx: ProjectContext) -> dict[str, Any]:
        return suite

    monkeypatch.setattr(factory, "_suite_runs", runs)
    baseline = asyncio.run(factory.measure_baseline(_ctx(tmp_path), slow_test_s=1.0))
    assert baseline.passed == ["t.py::fast"] and baseline.slow == ["t.py::slow"]
    assert baseline.covered == {"demo/m.py": {1, 2}}


def _run(**outcomes: tuple[str, str | None]) -> TestRun:
    run = TestRun()
    for name, (outcome, exc) in outcomes.items():
        run.outcomes[f"t.py::{name}"] = TestOutcome(f"t.py::{name}", outcome, exc_type=exc)
    return run


def test_judge_keeps_assertion_failures_only() -> None:
    base = Baseline(passed=["t.py::a", "t.py::b"])
    kept = judge(base, _run(a=("failed", "AssertionError"), b=("passed", None)))
    assert kept.keep and kept.fail_to_pass == ["t.py::a"]
    assert judge(base, _run(a=("passed", None), b=("passed", None))).reason == "survived"
    assert judge(base, _run(a=("failed", "NameError"), b=("passed", None))).reason == (
        "error_not_assertion"
    )
    assert judge(base, _run(a=("failed", "AssertionError"))).reason == "test_disappeared"
    assert judge(base, _run(a=("failed", "TypeError"), b=("passed", None))).reason == (
        "no_assertion_failure"
    )
    # a module the project itself cannot collect does not reject every mutant; a new one does
    known = Baseline(passed=["t.py::a", "t.py::b"], collect_errors=["t.py::Broken"])
    run = _run(a=("failed", "AssertionError"), b=("passed", None))
    run.collect_errors["t.py::Broken"] = "PytestCollectionWarning"
    assert judge(known, run).keep and judge(base, run).reason == "collection_error"
    run.collect_errors["u.py"] = "ImportError"
    assert judge(known, run).reason == "collection_error"


def test_the_slowest_tests_leave_until_the_budget_holds() -> None:
    durations = {"a": 0.5, "b": 0.4, "c": 0.3, "d": 0.1, "e": 2.0}
    assert factory._slow_tests(set(durations), durations, 1.0, 0.5) == {"e", "a", "b"}
    assert factory._slow_tests(set(durations), durations, 5.0, 10.0) == set()


def test_a_coverage_run_past_its_limit_is_named_not_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """more-itertools 11.2.1 here: its suite under coverage passed the 900 s limit, no line
    counted as covered, and the build wrote 0 tasks saying only "0 candidate mutants"."""
    suite = {
        "first_passed": ["t.py::a"],
        "second_passed": ["t.py::a"],
        "durations": {"t.py::a": 0.01},
        "covered": {},
        "seconds": 0.5,
        "log_tail": "",
        "coverage_timed_out": True,
    }

    async def runs(ctx: ProjectContext) -> dict[str, Any]:
        return suite

    monkeypatch.setattr(factory, "_suite_runs", runs)
    said: list[str] = []
    rows = asyncio.run(factory.build_mutation_tasks(_ctx(tmp_path), 5, say=said.append))
    assert rows == []
    assert "0 candidate mutants" in said[0]
    assert "passed the whole-run limit" in said[1] and "no line counts as covered" in said[1]
