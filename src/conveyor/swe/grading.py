"""The SWE reward: grade a patch against a task row's hidden tests, SWE-bench style.

`grade(row, patch)`:
1. takes the task's starting state (`environment.task_template`: the pristine sdist plus the
   row's `setup_patch`) and makes a fresh workspace of it;
2. applies the agent's patch minus every protected path (`guards.guard_patch`: tests,
   `conftest.py`, pytest/tox/setup.cfg/pyproject configuration, start-up hooks), so the agent's
   edits to tests and test configuration are reverted by construction;
3. applies the row's hidden `test_patch`;
4. runs FAIL_TO_PASS and PASS_TO_PASS with pytest in a bubblewrap sandbox (no network, the
   project's test venv mounted read-only), recording every test's outcome with our plugin
   (`outcomes_plugin.py`) under a per-test timeout;
5. resolved iff every F2P test and every P2P test passes (passed or xfailed, as SWE-bench
   counts). Optional partial credit: the share of F2P tests passing, if all P2P tests pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from conveyor.runtime.base import Runtime
from conveyor.runtime.bubblewrap import BubblewrapRuntime, bubblewrap_available
from conveyor.runtime.limits import SANDBOX_GID, SANDBOX_UID, SandboxLimits
from conveyor.runtime.local import LocalRuntime
from conveyor.runtime.workspace import make_workspace
from conveyor.swe.dataset import SweRow
from conveyor.swe.environment import PLUGIN_MODULE, TestEnvironment, swe_home, task_template
from conveyor.swe.environment import test_environment as build_test_environment
from conveyor.swe.guards import guard_patch
from conveyor.swe.patches import PatchError, apply_patch, diff_trees

GRADE_DIR = ".conveyor-grade"
PASSING = frozenset({"passed", "xfailed"})
_LOG_TAIL_BYTES = 4000


@dataclass(frozen=True)
class TestOutcome:
    """One test's result: outcome passed/failed/error/skipped/xfailed/xpassed/missing."""

    nodeid: str
    outcome: str
    phase: str = "call"
    exc_type: str | None = None
    message: str | None = None
    duration: float = 0.0

    __test__ = False

    @property
    def passed(self) -> bool:
        """Counts as passing under SWE-bench semantics."""
        return self.outcome in PASSING


@dataclass
class TestRun:
    """What one pytest run in the sandbox produced."""

    outcomes: dict[str, TestOutcome] = field(default_factory=dict)
    collect_errors: dict[str, str] = field(default_factory=dict)
    timed_out: bool = False
    exit_code: int = 0
    seconds: float = 0.0
    log_tail: str = ""

    __test__ = False

    def outcome(self, nodeid: str) -> TestOutcome:
        """The test's outcome; `missing` when it never ran (not collected, run killed)."""
        return self.outcomes.get(nodeid) or TestOutcome(nodeid, "missing", phase="collect")

    def passed(self) -> set[str]:
        """Node ids that passed."""
        return {n for n, o in self.outcomes.items() if o.passed}


class GradingOptions(BaseModel):
    """How tests are run for grading."""

    per_test_timeout_s: float = Field(30.0, gt=0, description="Per test (setup+call+teardown).")
    run_timeout_s: float = Field(900.0, gt=0, description="Whole pytest run.")
    partial_credit: bool = Field(False, description="Reward the share of F2P passing.")
    runtime: str = Field("auto", description="auto | bubblewrap | local")
    memory_bytes: int = Field(4 << 30, gt=0, description="Address space per process.")


class GradeReport(BaseModel):
    """The grade of one patch; `summary()` is the contract line of `conveyor tasks grade`."""

    instance_id: str
    resolved: bool
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    seconds: float
    reward: float = 0.0
    patch_applied: bool = True
    dropped_paths: dict[str, str] = Field(default_factory=dict)
    failing: list[str] = Field(default_factory=list)
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        """`{"instance_id","resolved","f2p_passed","f2p_total","p2p_passed","p2p_total",
        "seconds"}`."""
        keys = ("instance_id", "resolved", "f2p_passed", "f2p_total", "p2p_passed", "p2p_total")
        out: dict[str, Any] = {k: getattr(self, k) for k in keys}
        out["seconds"] = round(self.seconds, 3)
        return out


def make_test_runtime(
    workspace: Path, env: TestEnvironment, kind: str = "auto", limits: SandboxLimits | None = None
) -> BubblewrapRuntime | LocalRuntime:
    """A (not yet started) runtime over `workspace` with the test venv: bubblewrap where it
    works (`auto`), else the local runtime, which warns that it does not isolate."""
    if kind == "bubblewrap" or (kind == "auto" and bubblewrap_available()[0]):
        return BubblewrapRuntime(workspace, env_dir=env.path, limits=limits)
    if kind not in ("auto", "local"):
        raise ValueError(f"unknown runtime {kind!r}; use auto, bubblewrap or local")
    return LocalRuntime(workspace, limits=limits)


def test_env_vars(env: TestEnvironment, root: str, pythonpath: str) -> dict[str, str]:
    """Variables a test command needs: the venv first on PATH, the plugin and project importable.

    The venv's site-packages precede the workspace, so a file in the repository cannot shadow
    pytest or the test dependencies.
    """
    project = os.path.normpath(os.path.join(root, pythonpath))
    return {
        "PATH": f"{env.path / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(env.path),
        "PYTHONPATH": f"{env.plugin_dir}:{env.site_packages}:{project}",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


async def run_tests(
    workspace: Path,
    env: TestEnvironment,
    *,
    select: list[str] | None = None,
    paths: list[str] | None = None,
    pythonpath: str = ".",
    test_cmd: str = "python -m pytest",
    per_test_timeout_s: float = 30.0,
    run_timeout_s: float = 900.0,
    runtime_kind: str = "auto",
    limits: SandboxLimits | None = None,
) -> TestRun:
    """Run pytest in a sandbox over `workspace`: `select` (node ids), else `paths` (test files
    or folders), else the whole suite as the project configures it.

    `test_cmd` is the command prefix (e.g. `python -m coverage run ... -m pytest`); our plugin
    and options are appended, then the test files of `select`.
    """
    grade_dir = workspace / GRADE_DIR
    grade_dir.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        os.chown(grade_dir, SANDBOX_UID, SANDBOX_GID)
    runtime = make_test_runtime(workspace, env, runtime_kind, limits)
    root = str(getattr(runtime, "root", workspace))
    vars_ = test_env_vars(env, root, pythonpath)
    vars_["CONVEYOR_OUTCOMES"] = f"{root}/{GRADE_DIR}/outcomes.jsonl"
    vars_["CONVEYOR_TEST_TIMEOUT"] = f"{per_test_timeout_s:g}"
    args: list[str] = list(paths or [])
    if select is not None:
        (grade_dir / "select.json").write_text(json.dumps(sorted(set(select))))
        vars_["CONVEYOR_SELECT"] = f"{root}/{GRADE_DIR}/select.json"
        args = sorted({nodeid.split("::")[0] for nodeid in select})
        if not args:
            return TestRun()
    runtime.extra_env.update(vars_)
    plugin = f"-p {PLUGIN_MODULE} -p no:cacheprovider --rootdir={shlex.quote(root)}"
    files = " ".join(shlex.quote(a) for a in args)
    log = f"{root}/{GRADE_DIR}/pytest.log"
    command = f"{test_cmd} {plugin} -q {files} > {log} 2>&1"
    start = time.monotonic()
    await runtime.start()
    try:
        result = await runtime.exec(command, run_timeout_s)
    finally:
        await runtime.close()
    run = _read_run(grade_dir)
    run.timed_out, run.exit_code = result.timed_out, result.exit_code
    run.seconds = time.monotonic() - start
    return run


def _read_run(grade_dir: Path) -> TestRun:
    run = TestRun()
    outcomes = grade_dir / "outcomes.jsonl"
    if outcomes.exists():
        for line in outcomes.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == "collect_error":
                run.collect_errors[str(record["nodeid"])] = str(record.get("message") or "")
            elif record.get("kind") == "test":
                run.outcomes[str(record["nodeid"])] = TestOutcome(
                    nodeid=str(record["nodeid"]),
                    outcome=str(record["outcome"]),
                    phase=str(record.get("phase") or "call"),
                    exc_type=record.get("exc_type"),
                    message=record.get("message"),
                    duration=float(record.get("duration") or 0.0),
                )
    log = grade_dir / "pytest.log"
    if log.exists():
        with open(log, "rb") as handle:
            handle.seek(max(0, log.stat().st_size - _LOG_TAIL_BYTES))
            run.log_tail = handle.read().decode(errors="replace")
    return run


def score_run(
    row: SweRow, run: TestRun, *, partial_credit: bool = False
) -> tuple[bool, int, int, float, list[str]]:
    """(resolved, f2p passed, p2p passed, reward, failing node ids) of a run for a row."""
    f2p = sum(run.outcome(t).passed for t in row.FAIL_TO_PASS)
    p2p = sum(run.outcome(t).passed for t in row.PASS_TO_PASS)
    failing = [t for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS] if not run.outcome(t).passed]
    resolved = f2p == len(row.FAIL_TO_PASS) and p2p == len(row.PASS_TO_PASS)
    reward = 1.0 if resolved else 0.0
    if partial_credit and not resolved and p2p == len(row.PASS_TO_PASS) and row.FAIL_TO_PASS:
        reward = f2p / len(row.FAIL_TO_PASS)
    return resolved, f2p, p2p, reward, failing


def row_template(row: SweRow) -> Path:
    """The starting state of a `pypi:` row (cached)."""
    project = row.project
    if project is None:
        raise ValueError(
            f"{row.instance_id}: repo {row.repo!r} is not a pypi: project; SWE-bench-style rows "
            "of git repositories need their docker images (DockerRuntime)"
        )
    return task_template(project, row.version, row.env.setup_patch, row.instance_id)


def row_environment(row: SweRow) -> TestEnvironment:
    """The test venv of a row (cached per dependency list)."""
    return build_test_environment(row.env.extra_test_deps)


async def grade(row: SweRow, patch: str, options: GradingOptions | None = None) -> GradeReport:
    """Grade `patch` (a diff against the row's starting state) from scratch; see module doc."""
    options = options or GradingOptions()
    start = time.monotonic()
    template = await asyncio.to_thread(row_template, row)
    env = await asyncio.to_thread(row_environment, row)
    guarded = guard_patch(patch, env.top_level_modules)
    base = dict(instance_id=row.instance_id, f2p_total=len(row.FAIL_TO_PASS))
    base |= dict(p2p_total=len(row.PASS_TO_PASS), dropped_paths=guarded.dropped)
    workspace = await asyncio.to_thread(make_workspace, template, swe_home() / "workspaces")
    try:
        try:
            await asyncio.to_thread(apply_patch, workspace.path, guarded.kept)
        except PatchError as exc:
            return GradeReport(
                **base,
                resolved=False,
                f2p_passed=0,
                p2p_passed=0,
                seconds=time.monotonic() - start,
                patch_applied=False,
                error=f"patch did not apply: {exc}",
            )
        await asyncio.to_thread(apply_patch, workspace.path, row.test_patch)
        run = await run_tests(
            workspace.path,
            env,
            select=[*row.FAIL_TO_PASS, *row.PASS_TO_PASS],
            pythonpath=row.env.pythonpath,
            test_cmd=row.env.test_cmd,
            per_test_timeout_s=options.per_test_timeout_s,
            run_timeout_s=options.run_timeout_s,
            runtime_kind=options.runtime,
            limits=SandboxLimits(memory_bytes=options.memory_bytes),
        )
    finally:
        await asyncio.to_thread(workspace.remove)
    resolved, f2p, p2p, reward, failing = score_run(row, run, partial_credit=options.partial_credit)
    error = "test run timed out" if run.timed_out else None
    return GradeReport(
        **base,
        resolved=resolved,
        f2p_passed=f2p,
        p2p_passed=p2p,
        seconds=time.monotonic() - start,
        reward=reward,
        failing=failing[:50],
        error=error,
    )


def workspace_patch(row: SweRow, workspace: Path) -> str:
    """The agent's patch: the workspace's diff against the row's starting state."""
    return diff_trees(row_template(row), workspace)


async def grade_runtime(
    row: SweRow, runtime: Runtime, options: GradingOptions | None = None
) -> GradeReport:
    """Grade what a rollout left in its runtime's host workspace (`runtime.workspace`)."""
    workspace = getattr(runtime, "workspace", None)
    if not isinstance(workspace, Path):
        raise TypeError("grading needs a runtime over a host workspace folder (`.workspace`)")
    patch = await asyncio.to_thread(workspace_patch, row, workspace)
    return await grade(row, patch, options)
