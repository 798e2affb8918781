"""The task factory: SWE-bench rows made offline from PyPI sdists that ship their tests.

Procedural bugs (SWE-smith style), per project:
1. the sdist is unpacked and its test venv built once (`environment.py`);
2. the suite runs twice in the sandbox, once under coverage.py: tests passing both times are the
   baseline, the covered lines tell where mutations may go;
3. candidate mutants (`mutations.py`), round-robin over functions, run the baseline tests; a
   mutant is kept when some baseline tests now fail in their call phase, at least one by an
   assertion, none fails at collection or import, none times out (infinite loops are killed by
   the per-test alarm or the run deadline) and no baseline test disappears;
4. duplicates (same function, same failing tests, same messages) are dropped;
5. each kept task is graded twice from scratch with the real grader: the gold patch must resolve
   it and the empty patch must not, which also catches flaky tests.

The row's `setup_patch` puts the bug in and (by default) removes the test files holding
FAIL_TO_PASS tests; `test_patch` brings them back at grading; `patch` is the fix.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.runtime.workspace import make_workspace
from conveyor.tasks.swe.dataset import PYPI_PREFIX, RowEnvironment, SweRow
from conveyor.tasks.swe.environment import (
    TestEnvironment,
    project_metadata,
    project_source,
    safe_name,
    swe_home,
    test_environment,
)
from conveyor.tasks.swe.grading import (
    GRADE_DIR,
    GradingOptions,
    TestRun,
    grade,
    make_test_runtime,
    run_tests,
    test_env_vars,
)
from conveyor.tasks.swe.mutations import Mutation, mutations_of_file, pick
from conveyor.tasks.swe.patches import file_diff
from conveyor.tasks.swe.projects import BuildReport, ProjectLayout, ProjectSpec, detect_layout

log = logging.getLogger(__name__)

ASSERTION_TYPES = frozenset({"AssertionError", "Failed"})
NOT_A_BEHAVIOUR = frozenset({"ImportError", "ModuleNotFoundError", "SyntaxError", "NameError"})
MUTANT_TEST_TIMEOUT_S = 10.0
DEFAULT_MAX_KIND_SHARE = 0.3
SLOW_TEST_S = 1.0
TEST_BUDGET_S = 8.0
_MESSAGE_CHARS = 300
_STATEMENT_TESTS = 6


@dataclass
class Baseline:
    """The unmutated project: tests that pass twice, covered lines per file, suite wall time."""

    passed: list[str]
    covered: dict[str, set[int]] = field(default_factory=dict)
    seconds: float = 0.0
    slow: list[str] = field(default_factory=list)
    coverage_timed_out: bool = False
    collect_errors: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    """What a mutant did to the baseline tests."""

    keep: bool
    reason: str
    fail_to_pass: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)


@dataclass
class ProjectContext:
    """Everything the factory steps of one project share."""

    name: str
    version: str
    root: Path
    layout: ProjectLayout
    spec: ProjectSpec
    env: TestEnvironment
    metadata: Path | None = None

    @property
    def row_environment(self) -> RowEnvironment:
        """The `environment` field (without `setup_patch`) of this project's rows."""
        return RowEnvironment(
            pythonpath=self.layout.pythonpath, extra_test_deps=list(self.spec.extra_test_deps)
        )


def prepare_project(spec: ProjectSpec, version: str | None = None) -> ProjectContext:
    """Download and unpack the sdist, detect its layout, build its test venv (all cached)."""
    root, resolved = project_source(spec.name, version)
    return ProjectContext(
        name=spec.name,
        version=resolved,
        root=root,
        layout=detect_layout(root),
        spec=spec,
        env=test_environment(list(spec.extra_test_deps)),
        metadata=project_metadata(spec.name, resolved),
    )


def _ignored(nodeid: str, spec: ProjectSpec) -> bool:
    return any(
        nodeid == p or nodeid.startswith(p.rstrip("/") + "/") or nodeid.startswith(p + "::")
        for p in spec.ignore_tests
    )


async def measure_baseline(
    ctx: ProjectContext, slow_test_s: float = SLOW_TEST_S, budget_s: float = TEST_BUDGET_S
) -> Baseline:
    """Run the suite under coverage, then again plainly; keep tests passing both times, taking
    at most `slow_test_s` each and, slowest left out first, `budget_s` together (every mutant
    and every grade runs the baseline: slow tests would dominate the factory's time).

    The two runs are cached per project, version, test venv and test paths (`baselines/`)."""
    suite = await _suite_runs(ctx)
    both = set(suite["first_passed"]) & set(suite["second_passed"])
    durations: dict[str, float] = suite["durations"]
    slow = _slow_tests(both, durations, slow_test_s, budget_s)
    passed = sorted(t for t in both - slow if not _ignored(t, ctx.spec))
    if not passed:
        raise RuntimeError(
            f"no test of {ctx.name} {ctx.version} passes in the sandbox; log:\n{suite['log_tail']}"
        )
    covered = {path: set(lines) for path, lines in suite["covered"].items()}
    return Baseline(
        passed=passed,
        covered=covered,
        seconds=suite["seconds"],
        slow=sorted(slow),
        coverage_timed_out=suite.get("coverage_timed_out", False),
        collect_errors=list(suite.get("collect_errors", [])),
    )


def _slow_tests(
    tests: set[str], durations: dict[str, float], slow_test_s: float, budget_s: float
) -> set[str]:
    slow = {t for t in tests if durations.get(t, 0.0) > slow_test_s}
    rest = sorted(tests - slow, key=lambda t: (-durations.get(t, 0.0), t))
    total = sum(durations.get(t, 0.0) for t in rest)
    for test in rest:
        if total <= budget_s:
            break
        slow.add(test)
        total -= durations.get(test, 0.0)
    return slow


async def _suite_runs(ctx: ProjectContext) -> dict[str, Any]:
    paths = list(ctx.spec.test_paths) or None
    key = hashlib.sha256(json.dumps([ctx.env.path.name, paths]).encode()).hexdigest()[:10]
    cache = swe_home() / "baselines" / f"{safe_name(ctx.name)}-{safe_name(ctx.version)}-{key}.json"
    if cache.exists():
        cached: dict[str, Any] = json.loads(cache.read_text())
        return cached
    with make_workspace(ctx.root, swe_home() / "workspaces") as ws:
        (ws.path / GRADE_DIR).mkdir(exist_ok=True)
        rc = f"/workspace/{GRADE_DIR}/coveragerc"
        data = f"/workspace/{GRADE_DIR}/coverage.data"
        (ws.path / GRADE_DIR / "coveragerc").write_text("[run]\nbranch = False\n")
        source = f"/workspace/{ctx.layout.pythonpath}"
        cmd = f"python -m coverage run --rcfile={rc} --data-file={data} --source={source} -m pytest"
        # No per-test alarm under coverage: the pristine suite does not loop, and a SIGALRM
        # raised inside coverage's own locked sections left a lock held (more-itertools'
        # test_primes, thousands of subtests past 30 s traced: the run hung on a futex until
        # the whole-run deadline). The plain run below keeps the alarm and times every test.
        first = await run_tests(
            ws.path,
            ctx.env,
            paths=paths,
            pythonpath=ctx.layout.pythonpath,
            test_cmd=cmd,
            metadata=ctx.metadata,
            per_test_timeout_s=0,
        )
        report = f"/workspace/{GRADE_DIR}/coverage.json"
        runtime = make_test_runtime(ws.path, ctx.env)
        runtime.extra_env.update(test_env_vars(ctx.env, "/workspace", ctx.layout.pythonpath))
        await runtime.start()
        try:
            await runtime.exec(
                f"python -m coverage json --rcfile={rc} --data-file={data} -o {report} -q", 300
            )
        finally:
            await runtime.close()
        covered = _read_coverage(ws.path / GRADE_DIR / "coverage.json", ctx)
    with make_workspace(ctx.root, swe_home() / "workspaces") as ws:
        second = await run_tests(
            ws.path, ctx.env, paths=paths, pythonpath=ctx.layout.pythonpath, metadata=ctx.metadata
        )
    suite = {
        "first_passed": sorted(first.passed()),
        "second_passed": sorted(second.passed()),
        "durations": {n: o.duration for n, o in second.outcomes.items()},
        "covered": {path: sorted(lines) for path, lines in covered.items()},
        "seconds": second.seconds,
        "log_tail": second.log_tail,
        "coverage_timed_out": first.timed_out,
        # Modules the project itself cannot collect here (e.g. a collection warning its config
        # makes an error): the suite runs past them, and so do the mutants.
        "collect_errors": sorted(second.collect_errors),
    }
    if suite["second_passed"] and not first.timed_out and not second.timed_out:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(suite))
    return suite


def _read_coverage(path: Path, ctx: ProjectContext) -> dict[str, set[int]]:
    if not path.exists():
        return {}
    files = json.loads(path.read_text()).get("files", {})
    covered: dict[str, set[int]] = {}
    for name, info in files.items():
        rel = os.path.relpath(name, "/workspace") if os.path.isabs(name) else name
        covered[Path(rel).as_posix()] = set(info.get("executed_lines", []))
    return covered


def candidate_mutations(ctx: ProjectContext, baseline: Baseline, seed: int) -> list[Mutation]:
    """Every mutant on covered lines of the library files, in trial order."""
    found: list[Mutation] = []
    for rel in ctx.layout.source_files:
        covered = baseline.covered.get(rel)
        if not covered:
            continue
        text = (ctx.root / rel).read_bytes().decode("utf-8")  # byte-exact: CRLF kept
        found += mutations_of_file(rel, text, covered)
    return pick(found, seed)


def _why_no_candidates(baseline: Baseline) -> str:
    if baseline.coverage_timed_out:
        return (
            "the baseline's run under coverage passed the whole-run limit (coverage tracing "
            "slows some suites many times over), so no line counts as covered; try an older "
            "--version or a project whose suite runs faster"
        )
    if not baseline.covered:
        return "coverage recorded no line of the library (is the package importable?)"
    return "no mutation operator applies to the covered lines"


async def evaluate_mutant(ctx: ProjectContext, baseline: Baseline, mutant: Mutation) -> Verdict:
    """Run the baseline tests against one mutant and judge it (see the module doc)."""
    with make_workspace(ctx.root, swe_home() / "workspaces") as ws:
        target = ws.path / mutant.path
        target.write_text(mutant.mutated, encoding="utf-8")
        run = await run_tests(
            ws.path,
            ctx.env,
            select=baseline.passed,
            pythonpath=ctx.layout.pythonpath,
            per_test_timeout_s=MUTANT_TEST_TIMEOUT_S,
            run_timeout_s=60 + 4 * baseline.seconds,
            metadata=ctx.metadata,
        )
    return judge(baseline, run)


def judge(baseline: Baseline, run: TestRun) -> Verdict:
    """Keep/reject a mutant from its test run."""
    if run.timed_out:
        return Verdict(False, "timeout")
    if run.violations:
        return Verdict(False, "invalid_run")
    if set(run.collect_errors) - set(baseline.collect_errors):
        return Verdict(False, "collection_error")
    outcomes = [run.outcome(t) for t in baseline.passed]
    if any(o.outcome == "missing" for o in outcomes):
        return Verdict(False, "test_disappeared")
    failing = [o for o in outcomes if not o.passed and o.outcome != "skipped"]
    if not failing:
        return Verdict(False, "survived")
    if any(o.exc_type == "TestTimeout" for o in failing):
        return Verdict(False, "timeout")
    if any(o.outcome != "failed" or o.exc_type in NOT_A_BEHAVIOUR for o in failing):
        return Verdict(False, "error_not_assertion")
    if not any(o.exc_type in ASSERTION_TYPES for o in failing):
        return Verdict(False, "no_assertion_failure")
    failures = {o.nodeid: f"{o.exc_type}: {(o.message or '').strip()}" for o in failing}
    return Verdict(True, "kept", sorted(failures), failures)


def problem_statement(project: str, failures: dict[str, str], hidden: bool) -> str:
    """An issue text from the failing tests' names and messages."""
    lines = [f"Some behaviour of `{project}` is broken: these tests fail.", ""]
    for nodeid in sorted(failures)[:_STATEMENT_TESTS]:
        message = " ".join(failures[nodeid].split())[:_MESSAGE_CHARS]
        lines.append(f"- `{nodeid}` fails with: {message}")
    if len(failures) > _STATEMENT_TESTS:
        lines.append(f"- ... and {len(failures) - _STATEMENT_TESTS} more tests")
    lines.append("")
    if hidden:
        lines.append("These tests are not in the repository; other tests must keep passing.")
    lines.append("Find the bug in the library code and fix it. Do not change the tests.")
    return "\n".join(lines)


def mutation_row(
    ctx: ProjectContext, baseline: Baseline, mutant: Mutation, verdict: Verdict, hide: bool
) -> SweRow:
    """The SWE-bench row of a kept mutant."""
    digest = hashlib.sha256(f"{mutant.path}\n{mutant.mutated}".encode()).hexdigest()[:8]
    instance_id = f"{ctx.name}-{ctx.version}__{mutant.kind}__{digest}"
    hidden = sorted({t.split("::")[0] for t in verdict.fail_to_pass}) if hide else []
    setup = file_diff(mutant.path, mutant.original, mutant.mutated)
    tests = ""
    for rel in hidden:
        text = (ctx.root / rel).read_bytes().decode("utf-8")  # byte-exact: CRLF kept
        setup += file_diff(rel, text, None)
        tests += file_diff(rel, None, text)
    env = ctx.row_environment.model_copy(update={"setup_patch": setup})
    f2p = set(verdict.fail_to_pass)
    return SweRow(
        instance_id=instance_id,
        repo=f"{PYPI_PREFIX}{ctx.name}",
        version=ctx.version,
        problem_statement=problem_statement(ctx.name, verdict.failures, bool(hidden)),
        patch=file_diff(mutant.path, mutant.mutated, mutant.original),
        test_patch=tests,
        FAIL_TO_PASS=sorted(f2p),
        PASS_TO_PASS=[t for t in baseline.passed if t not in f2p],
        environment=env,
        conveyor={
            "source": "mutation",
            "kind": mutant.kind,
            "file": mutant.path,
            "function": mutant.function,
            "line": mutant.line,
            "mutation": mutant.description,
        },
    )


async def verify_row(
    row: SweRow,
    report: BuildReport | None = None,
    per_test_timeout_s: float = MUTANT_TEST_TIMEOUT_S,
) -> str | None:
    """Grade gold and empty from scratch; None if gold resolves and empty does not, else why."""
    options = GradingOptions(per_test_timeout_s=per_test_timeout_s, run_timeout_s=600)
    gold = await grade(row, row.patch, options)
    empty = await grade(row, "", options)
    if report is not None:
        report.grade_seconds += [gold.seconds, empty.seconds]
    if not gold.resolved:
        return "gold_not_resolved"
    if empty.resolved:
        return "empty_resolved"
    return None


def kind_cap(count: int, max_kind_share: float | None) -> int:
    """The most kept tasks of one mutation kind among `count` (no cap: `count`)."""
    if max_kind_share is None or max_kind_share >= 1:
        return count
    return max(1, math.ceil(count * max_kind_share))


async def build_mutation_tasks(
    ctx: ProjectContext,
    count: int,
    *,
    seed: int = 0,
    workers: int = 2,
    hide_tests: bool = True,
    max_trials: int | None = None,
    max_kind_share: float | None = DEFAULT_MAX_KIND_SHARE,
    report: BuildReport | None = None,
    say: Callable[[str], None] = log.info,
) -> list[SweRow]:
    """Up to `count` verified mutation tasks of one project, at most `max_kind_share` of them
    of one mutation kind (candidates of a kind that reached its cap are passed over)."""
    report = report or BuildReport(ctx.name, ctx.version)
    baseline = await measure_baseline(ctx)
    report.baseline_tests, report.baseline_seconds = len(baseline.passed), baseline.seconds
    report.slow_tests = len(baseline.slow)
    candidates = candidate_mutations(ctx, baseline, seed)
    report.candidates = len(candidates)
    say(
        f"{ctx.name} {ctx.version}: {len(baseline.passed)} baseline tests "
        f"({baseline.seconds:.1f} s; {len(baseline.slow)} slow tests left out), "
        f"{len(candidates)} candidate mutants"
    )
    if not candidates:
        say(f"{ctx.name} {ctx.version}: no candidate mutants: {_why_no_candidates(baseline)}")
    limit = max_trials if max_trials is not None else max(count * 8, 40)
    cap = kind_cap(count, max_kind_share)
    queue = iter(candidates)
    rows: list[SweRow] = []
    kept_kinds: dict[str, int] = {}
    signatures: set[str] = set()
    lock = asyncio.Lock()

    def next_mutant() -> Mutation | None:
        for mutant in queue:
            if kept_kinds.get(mutant.kind, 0) < cap:
                return mutant
        return None

    async def worker() -> None:
        while len(rows) < count:
            async with lock:
                mutant = next_mutant() if report.tried < limit else None
                if mutant is None:
                    return
                report.tried += 1
            verdict = await evaluate_mutant(ctx, baseline, mutant)
            if not verdict.keep:
                report.reject(verdict.reason)
                continue
            signature = json.dumps([mutant.path, mutant.function, verdict.failures])
            if signature in signatures:
                report.reject("duplicate")
                continue
            signatures.add(signature)
            row = mutation_row(ctx, baseline, mutant, verdict, hide_tests)
            problem = await verify_row(row, report)
            if problem is not None:
                report.reject(problem)
                continue
            if kept_kinds.get(mutant.kind, 0) >= cap:
                report.reject("kind_cap")
                continue
            if len(rows) < count:
                rows.append(row)
                kept_kinds[mutant.kind] = kept_kinds.get(mutant.kind, 0) + 1
                report.kept += 1
                report.kinds[mutant.kind] = report.kinds.get(mutant.kind, 0) + 1
                say(
                    f"  kept {row.instance_id} ({len(row.FAIL_TO_PASS)} F2P) "
                    f"[{len(rows)}/{count}, tried {report.tried}]"
                )

    await asyncio.gather(*(worker() for _ in range(max(1, workers))))
    return sorted(rows, key=lambda r: r.instance_id)
