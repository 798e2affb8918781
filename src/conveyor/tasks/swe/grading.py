"""The SWE reward: grade a patch against a task row's hidden tests, SWE-bench style.

`grade(row, patch)`:
1. takes the task's starting state (`environment.task_template`: the pristine sdist plus the
   row's `setup_patch`) and makes a fresh workspace of it;
2. applies the agent's whole patch with `git apply` (one that git refuses scores 0), then reads
   what it changed from the resulting tree against the starting state, never from the patch's
   text, and reverts every protected or untrusted change (`guards.restore_protected`: the
   task's declared tests, `conftest.py`, pytest/tox/setup.cfg/pyproject configuration,
   start-up hooks, modules shadowing the standard library or the test venv, the grader's
   folder, symlinks and other non-regular files, binary files), reported in `dropped_paths`;
3. applies the row's hidden `test_patch`; one that does not apply to the starting state is a
   broken task: `TaskDefect`, never a score;
4. runs FAIL_TO_PASS and PASS_TO_PASS with pytest in a bubblewrap sandbox (no network, the test
   venv mounted read-only, the project's own `.dist-info` beside the workspace), started by our
   bootstrap (`pytest_bootstrap.py`) under a per-test timeout, past collection errors of other
   modules; outcomes come back through a file descriptor opened outside the sandbox and are
   checked (`test_run.read_channel`); the row's canary tests (`canaries.py`: copies of its
   tests expecting a wrong value, validated once on the gold patch) run among them;
5. resolved iff the run is valid, every canary failed and every F2P and P2P test really passed
   (`strict`; the `swebench` semantics also count xfailed, as SWE-bench's report does); a
   canary that passed is `tampered`. Optional partial credit: the share of F2P tests passing,
   if all P2P tests pass.
The blocking copies, patches and diffs run on the `reward` CPU pool (`runtime.cpu_pools`). The
threat model behind these steps is in docs/sandbox.md.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from conveyor.config.sections import AUTO
from conveyor.registry import RUNTIMES
from conveyor.runtime.base import ExecResult, Runtime, RuntimeFailure
from conveyor.runtime.bubblewrap import BubblewrapRuntime, bubblewrap_available
from conveyor.runtime.cpu_pools import run_in_pool
from conveyor.runtime.docker import WRITABLE_DIRS, DockerRuntime
from conveyor.runtime.engine import Engine, engine_available, resolve_engine
from conveyor.runtime.images import ImageBuildError
from conveyor.runtime.limits import SANDBOX_GID, SANDBOX_UID, SandboxLimits
from conveyor.runtime.local import LocalRuntime
from conveyor.runtime.selection import started
from conveyor.runtime.workspace import make_workspace
from conveyor.tasks.swe import canaries, guards, test_run
from conveyor.tasks.swe.dataset import SweRow
from conveyor.tasks.swe.environment import (
    TestEnvironment,
    project_metadata,
    swe_home,
    task_template,
)
from conveyor.tasks.swe.environment import test_environment as build_test_environment
from conveyor.tasks.swe.guards import is_test_file
from conveyor.tasks.swe.images import (
    GRADER,
    METADATA,
    RUN_DIR,
    TESTBED,
    how_to_get,
    image_environment,
    image_present,
    row_image,
)
from conveyor.tasks.swe.options import GradingOptions
from conveyor.tasks.swe.patches import (
    PatchError,
    TreeDiff,
    apply_patch,
    iter_files,
    tree_diff,
)
from conveyor.tasks.swe.test_command import parse_test_command
from conveyor.tasks.swe.test_run import Semantics, TestOutcome, TestRun, read_channel
from conveyor.types import TaskDefect

__all__ = ["GradeReport", "GradingOptions", "TestOutcome", "TestRun", "grade", "run_tests"]

GRADE_DIR = ".conveyor-grade"
_LOG_TAIL_BYTES = 4000
_PYTEST_OPTIONS = "-p no:cacheprovider --continue-on-collection-errors -q"
UNSANDBOXED_WARNING = (
    "SWE GRADING RUNS UNSANDBOXED (grading runtime 'local', "
    "unsandboxed_grading_i_trust_the_policy: true): the graded tests run the policy's code on "
    "this host with your user's rights; it can read and change anything you can, the grader's "
    "verdict included. Use this only for a policy you trust."
)


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
    collect_errors: dict[str, str] = Field(
        default_factory=dict, description="Test modules that failed to collect, and why."
    )
    violations: list[str] = Field(
        default_factory=list,
        description="Broken rules of the outcome channel, tripped canaries (score 0).",
    )
    tampered: bool = Field(
        False, description="The test process forged its outcomes (a canary passed, tampering)."
    )
    canaries: int = Field(0, description="Canary tests that ran.")
    error: str | None = None
    outcomes: dict[str, str] = Field(
        default_factory=dict,
        description="Each F2P and P2P test's outcome (passed, failed, error, skipped, xfailed, "
        "xpassed, missing); empty when the patch did not apply.",
    )
    model_patch: str | None = Field(
        None, description="The graded patch, when graded from a rollout's workspace."
    )

    def summary(self) -> dict[str, Any]:
        """`{"instance_id","resolved","tampered","f2p_passed","f2p_total","p2p_passed",
        "p2p_total","seconds"}`."""
        keys = ("instance_id", "resolved", "tampered", "f2p_passed", "f2p_total")
        out: dict[str, Any] = {k: getattr(self, k) for k in (*keys, "p2p_passed", "p2p_total")}
        out["seconds"] = round(self.seconds, 3)
        return out


def make_test_runtime(
    workspace: Path,
    env: TestEnvironment,
    kind: str = AUTO,
    limits: SandboxLimits | None = None,
    extra_ro_binds: Sequence[Path] = (),
) -> BubblewrapRuntime | LocalRuntime:
    """A (not yet started) runtime over `workspace` with the test venv and the grader's folder
    (`env.plugin_dir`, mounted here and nowhere else): bubblewrap for `auto` and `bubblewrap`.

    Fails closed: `RuntimeFailure` (an infrastructure error of the rollout being graded, which
    the dispatcher retries and counts) when bubblewrap is not usable here, never a fallback to
    an unsandboxed run. `local` (no isolation) only when named; `GradingOptions` refuses it
    without its loud key. The kind is asked by its spec: one that `hides_paths` (a sandbox over
    a host workspace with host folders bound read-only) grades in bubblewrap, an
    `unsandboxed` one in plain processes."""
    if kind != AUTO and kind not in RUNTIMES:
        raise ValueError(f"unknown grading runtime {kind!r}; use auto, bubblewrap or local")
    spec = None if kind == AUTO else RUNTIMES.spec(kind)
    if spec is None or spec.hides_paths:
        ok, reason = bubblewrap_available()
        if not ok:
            raise RuntimeFailure(
                f"the grader's sandbox (bubblewrap) is not usable here: {reason}; grading "
                "never runs unsandboxed, so this rollout is an infrastructure error"
            )
        mounts = [env.plugin_dir, *extra_ro_binds]
        return BubblewrapRuntime(workspace, env_dir=env.path, limits=limits, extra_ro_binds=mounts)
    if spec.unsandboxed:
        return LocalRuntime(workspace, limits=limits)
    raise ValueError(f"unknown grading runtime {kind!r}; use auto, bubblewrap or local")


@dataclass(frozen=True)
class ContainerTarget:
    """Where the grader's tests run in a container: the engine and the row's image."""

    engine: Engine
    image: str


def container_test_runtime(
    target: ContainerTarget,
    workspace: Path,
    run_dir: Path,
    limits: SandboxLimits | None,
    variables: dict[str, str],
) -> DockerRuntime:
    """A (not yet started) container of the row's image over `workspace` at /testbed, run as
    the sandbox user with no network and the limits of `limits`; the grader's folder and this
    run's settings (`run_dir`) mounted read-only at container paths, nothing else of the host.
    The container's stdout carries the outcomes, so its capture is large."""
    from conveyor.tasks.swe.environment import grader_dir

    limits = limits if limits is not None else SandboxLimits()
    limits = limits.model_copy(update={"output_bytes": max(limits.output_bytes, 64 << 20)})
    return DockerRuntime(
        target.image,
        limits=limits,
        workdir=TESTBED,
        workspace=workspace,
        ro_binds={grader_dir(): GRADER, run_dir: RUN_DIR},
        user=f"{SANDBOX_UID}:{SANDBOX_GID}",
        env=variables,
        docker=target.engine,
        tmpfs=WRITABLE_DIRS,
    )


def test_env_vars(
    env: TestEnvironment, root: str, pythonpath: str, metadata: Path | None = None
) -> dict[str, str]:
    """Variables for commands of the agent's own shell: the venv first on PATH, the project (and
    its metadata) importable. The grader does not rely on them (`python -I` ignores them).

    The venv's site-packages precede the workspace, so a file in the repository cannot shadow
    pytest or the test dependencies.
    """
    project = os.path.normpath(os.path.join(root, pythonpath))
    path = [str(env.site_packages), project, *([str(metadata)] if metadata else [])]
    return {
        "PATH": f"{env.path / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(env.path),
        "PYTHONPATH": ":".join(path),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def pytest_command(test_cmd: str, env: TestEnvironment) -> str:
    """`test_cmd` (`python -m pytest`, or a wrapper such as `python -m coverage run ... -m
    pytest`) made to start our bootstrap under `python -I` instead of pytest; the row's pytest
    flags (`test_command.parse_test_command`) go after the bootstrap's run file."""
    return bootstrap_command(parse_test_command(test_cmd).wrapper, env)


def bootstrap_command(wrapper: Sequence[str], env: TestEnvironment) -> str:
    """`python -I [wrapper ...] conveyor_pytest.py` of the test venv `env`: how the grader
    starts pytest (its run file and pytest's arguments follow)."""
    return shlex.join([str(env.python), "-I", *wrapper, str(env.bootstrap)])


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
    runtime_kind: str = AUTO,
    limits: SandboxLimits | None = None,
    metadata: Path | None = None,
    test_files: Sequence[str] | None = None,
    container: ContainerTarget | None = None,
) -> TestRun:
    """Run pytest in a sandbox over `workspace`: `select` (node ids), else `paths` (test files
    or folders), else the whole suite as the project configures it. `metadata`: the project's
    `.dist-info` folder (`project_metadata`), put on `sys.path` after the project.
    `per_test_timeout_s` 0 arms no per-test alarm (the whole-run deadline still holds).
    `test_files`: the task's declared test files (relative), whose code the test process's audit
    hook trusts and protects (every `conftest.py` is added); by default every file named like
    a test. `container`: run in that image's container instead (`env` and `metadata` then
    are paths inside it: `images.image_environment`), see `container_test_runtime`.
    """
    args: list[str] = list(paths or [])
    if select is not None:
        args = sorted({nodeid.split("::")[0] for nodeid in select})
        if not args:
            return TestRun()
    files = " ".join(shlex.quote(a) for a in args)
    # The row's pytest flags, then ours: on a flag given twice, the grader's wins.
    row_flags = shlex.join(parse_test_command(test_cmd).pytest_flags)

    def command(run_json: str, root: str) -> str:
        return (
            f"{pytest_command(test_cmd, env)} {shlex.quote(run_json)} "
            f"{row_flags} {_PYTEST_OPTIONS} --rootdir={shlex.quote(root)} {files}"
        )

    run, result = await run_in_channel(
        workspace,
        env,
        command,
        select=select,
        pythonpath=pythonpath,
        per_test_timeout_s=per_test_timeout_s,
        run_timeout_s=run_timeout_s,
        runtime_kind=runtime_kind,
        limits=limits,
        metadata=metadata,
        test_files=test_files,
        container=container,
    )
    run.log_tail = (result.stdout + result.stderr)[-_LOG_TAIL_BYTES:]
    return run


async def run_in_channel(
    workspace: Path,
    env: TestEnvironment,
    command: Callable[[str, str], str],
    *,
    select: list[str] | None,
    pythonpath: str,
    per_test_timeout_s: float,
    run_timeout_s: float,
    runtime_kind: str,
    limits: SandboxLimits | None,
    metadata: Path | None,
    test_files: Sequence[str] | None,
    container: ContainerTarget | None,
) -> tuple[TestRun, ExecResult]:
    """Run `command(run_json, root)` (a shell command starting our bootstrap with that run
    file; `root`: the workspace as the sandbox sees it) over `workspace` in the grading sandbox
    (`run_tests`' settings), with the outcome channel set up; (the checked run, the process's
    result with the channel's lines taken out of it)."""
    # A scratch folder of the test command's own (coverage data, ...): nothing graded is read
    # from it.
    scratch = workspace / GRADE_DIR
    scratch.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        os.chown(scratch, SANDBOX_UID, SANDBOX_GID)
    home = swe_home() / "grades"
    home.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix="run-", dir=home))
    fd = -1
    declared = _declared_test_files(workspace, test_files)
    try:
        # The channel: a file only the grader can open (not mounted), handed over as an fd.
        fd = os.open(private / "outcomes.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        shared = private / "ro"
        shared.mkdir(mode=0o755)
        os.chmod(private, 0o755)
        runtime: Runtime
        if container is not None:
            # No fd crosses the engine's client: the channel is the container's stdout (fd 3
            # of the test process; its own stdout goes to stderr). As with an inherited fd,
            # a test can write there: the channel's rules and the canaries judge the lines.
            variables = test_env_vars(env, TESTBED, pythonpath, metadata)
            runtime = container_test_runtime(container, workspace, shared, limits, variables)
            run_json, channel_fd = f"{RUN_DIR}/run.json", 3
        else:
            mounts = [shared, *([metadata] if metadata is not None else [])]
            runtime = make_test_runtime(workspace, env, runtime_kind, limits, mounts)
            run_json, channel_fd = str(shared / "run.json"), fd
        root = str(runtime.root)
        config = {
            "outcomes_fd": channel_fd,
            "select": sorted(set(select)) if select is not None else None,
            "timeout_s": per_test_timeout_s,
            "paths": [os.path.normpath(os.path.join(root, pythonpath))]
            + ([str(metadata)] if metadata is not None else []),
            "plugin_dir": str(env.plugin_dir),
            "test_files": [os.path.normpath(os.path.join(root, p)) for p in declared],
            "hardening": dict(test_run.HARDENING),  # read now: a test may switch one off
        }
        (shared / "run.json").write_text(json.dumps(config))
        os.chmod(shared / "run.json", 0o644)
        if isinstance(runtime, (BubblewrapRuntime, LocalRuntime)):
            runtime.extra_env.update(test_env_vars(env, root, pythonpath, metadata))
        line = command(run_json, root)
        if container is not None:
            line = f"{{ {line}; }} 3>&1 1>&2"
        await started(runtime)  # waits for the run's start limits: not the tests' time
        start = time.monotonic()
        try:
            if container is not None:
                result: ExecResult = await runtime.exec(line, run_timeout_s)
            else:
                result = await runtime.exec(line, run_timeout_s, pass_fds=(fd,))  # type: ignore[call-arg]
        finally:
            await runtime.close()
        os.close(fd)
        fd = -1
        if container is not None:
            text, result = result.stdout, result.model_copy(update={"stdout": ""})
        else:
            text = (private / "outcomes.jsonl").read_text(encoding="utf-8", errors="replace")
    finally:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(private, ignore_errors=True)
    run = read_channel(text, exit_code=result.exit_code, timed_out=result.timed_out)
    run.seconds = time.monotonic() - start
    return run, result


def _declared_test_files(workspace: Path, test_files: Sequence[str] | None) -> list[str]:
    every = list(iter_files(workspace))
    named = set(test_files) if test_files is not None else {p for p in every if is_test_file(p)}
    return sorted(named | {p for p in every if p.rsplit("/", 1)[-1] == "conftest.py"})


async def run_row_tests(
    row: SweRow,
    workspace: Path,
    env: TestEnvironment,
    options: GradingOptions,
    select: list[str],
    metadata: Path | None,
    template: Path | None = None,
) -> TestRun:
    """`run_tests` of `select` over a row's workspace with the row's settings and `options`."""
    return await run_tests(
        workspace,
        env,
        select=select,
        pythonpath=row.env.pythonpath,
        test_cmd=row.env.test_cmd,
        per_test_timeout_s=options.per_test_timeout_s,
        run_timeout_s=options.run_timeout_s,
        runtime_kind=options.runtime,
        limits=SandboxLimits(memory_bytes=options.memory_bytes),
        metadata=metadata,
        test_files=declared_test_files(row, template),
        container=row_container(row, options) if options.runtime == "container" else None,
    )


def declared_test_files(row: SweRow, template: Path | None = None) -> list[str]:
    """The row's test files, as the tree guard declares them (`guards.declared_tests`): the
    hidden test patch's, those of its F2P/P2P node ids (not a library module's doctests) and
    every file of their test folders in the starting state."""
    template = template if template is not None else row_template(row)
    tests = guards.declared_tests(
        template, row.test_patch, [*row.FAIL_TO_PASS, *row.PASS_TO_PASS], row.env.pythonpath
    )
    return sorted(f for f in set(iter_files(template)) | tests.files if tests.holds(f))


def score_run(
    row: SweRow,
    run: TestRun,
    *,
    partial_credit: bool = False,
    semantics: Semantics = "strict",
) -> tuple[bool, int, int, float, list[str]]:
    """(resolved, f2p passed, p2p passed, reward, failing node ids) of a run for a row; an
    invalid run (violations, whole-run timeout) passes nothing."""
    passing = run.passed(semantics)
    f2p = sum(t in passing for t in row.FAIL_TO_PASS)
    p2p = sum(t in passing for t in row.PASS_TO_PASS)
    failing = [t for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS] if t not in passing]
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
            f"{row.instance_id}: repo {row.repo!r} is not a pypi: project; SWE-bench rows of git "
            "repositories run in their images (the repository at /testbed): the host grader has "
            "no checkout of them"
        )
    return task_template(project, row.version, row.env.setup_patch, row.instance_id)


def row_environment(row: SweRow, options: GradingOptions | None = None) -> TestEnvironment:
    """The test venv of a row (cached per dependency list); under runtime 'container', the
    one inside the row's image (`RuntimeFailure` when the image is missing)."""
    if options is not None and options.runtime == "container":
        target = row_container(row, options)
        try:
            return image_environment(target.engine, target.image)
        except ImageBuildError as exc:
            raise RuntimeFailure(f"{row.instance_id}: {exc}") from exc
    return build_test_environment(row.env.extra_test_deps)


def row_metadata(row: SweRow, options: GradingOptions | None = None) -> Path | None:
    """The project's `.dist-info` folder of a `pypi:` row (cached per release); under runtime
    'container', its place inside the row's image."""
    if options is not None and options.runtime == "container":
        return Path(METADATA) if row.project else None
    return project_metadata(row.project, row.version) if row.project else None


def row_container(row: SweRow, options: GradingOptions) -> ContainerTarget:
    """The engine and image the row's tests run in under runtime 'container'. Fails closed:
    `RuntimeFailure` (an infrastructure error, never a score) when the engine does not answer
    or the image is missing."""
    settings = options.container_settings
    engine = resolve_engine(settings.engine)
    ok, why = engine_available(engine)
    if not ok:
        raise RuntimeFailure(f"the grader's container engine is not usable here: {why}")
    image = row_image(row, settings)
    if not image_present(engine, image):
        raise RuntimeFailure(
            f"{row.instance_id}: its image {image} is missing; {how_to_get(settings)}"
        )
    return ContainerTarget(engine, image)


def _check_test_patch(row: SweRow, template: Path) -> None:
    """`TaskDefect` unless the row's test patch applies to its own starting state."""
    with make_workspace(template, swe_home() / "workspaces") as scratch:
        try:
            apply_patch(scratch.path, row.test_patch)
        except PatchError as exc:
            raise TaskDefect(
                f"{row.instance_id}: the hidden test patch does not apply to the task's "
                f"starting state: {exc}"
            ) from exc


async def apply_patches(
    row: SweRow,
    patch: str,
    workspace: Path,
    template: Path,
    rules: Any,
    base: dict[str, Any],
    start: float,
) -> GradeReport | None:
    """Apply `patch`, restore what the task protects (`base["dropped_paths"]` says what was
    dropped), then the hidden test patch, in `workspace`: None when both applied, else the
    unresolved report that says which did not (shared by both graders)."""
    failed = {"f2p_passed": 0, "p2p_passed": 0, **base, "resolved": False}
    try:
        await run_in_pool("reward", apply_patch, workspace, patch)
    except PatchError as exc:
        return GradeReport(
            **failed,
            seconds=time.monotonic() - start,
            patch_applied=False,
            error=f"patch did not apply: {exc}",
        )
    # What the patch did is read from the tree git wrote, so git and the guard agree.
    base["dropped_paths"] = await run_in_pool(
        "reward", guards.restore_protected, workspace, template, rules
    )
    try:
        await run_in_pool("reward", apply_patch, workspace, row.test_patch)
    except PatchError:
        # Broken task, or (for a test patch touching library files) the policy's edit: the
        # pristine starting state tells which.
        await run_in_pool("reward", _check_test_patch, row, template)
        return GradeReport(
            **{**failed, "dropped_paths": base["dropped_paths"]},
            seconds=time.monotonic() - start,
            error="the hidden test patch does not apply over this patch",
        )
    return None


async def grade(row: SweRow, patch: str, options: GradingOptions | None = None) -> GradeReport:
    """Grade `patch` (a diff against the row's starting state) from scratch: a SWE-bench-format
    row (`swebench_spec.uses_log_grading`) from its test log (`log_grading.grade_log`), a
    factory row through the pytest outcome channel (`grade_pytest`, the module doc). Either
    runs its tests in bubblewrap or, under runtime 'container', in the row's image."""
    options = options or GradingOptions()
    from conveyor.tasks.swe.swebench_spec import uses_log_grading

    if uses_log_grading(row):
        from conveyor.tasks.swe.log_grading import grade_log

        return await grade_log(row, patch, options)
    return await grade_pytest(row, patch, options)


async def grade_pytest(
    row: SweRow, patch: str, options: GradingOptions | None = None
) -> GradeReport:
    """Grade `patch` for a `pypi:` pytest row through the pytest outcome channel (the module
    doc), whatever grader the row's format would pick (the parity check's 'ours')."""
    options = options or GradingOptions()
    start = time.monotonic()
    template = await run_in_pool("reward", row_template, row)
    env = await run_in_pool("reward", row_environment, row, options)
    metadata = await run_in_pool("reward", row_metadata, row, options)
    rules = await run_in_pool("reward", task_protection_rules, row, template, env)
    base: dict[str, Any] = dict(instance_id=row.instance_id, f2p_total=len(row.FAIL_TO_PASS))
    base |= dict(p2p_total=len(row.PASS_TO_PASS))
    workspace = await run_in_pool("reward", make_workspace, template, swe_home() / "workspaces")
    try:
        refused = await apply_patches(row, patch, workspace.path, template, rules, base, start)
        if refused is not None:
            return refused
        found = await canaries.row_canaries(row, options)
        await run_in_pool("reward", canaries.insert_canaries, workspace.path, found)
        run = await run_row_tests(
            row, workspace.path, env, options, canaries.selection(row, found), metadata, template
        )
    finally:
        await run_in_pool("reward", workspace.remove)
    verdict = canaries.check(found, run, options.semantics)
    run = canaries.as_listed(run, found)
    resolved, f2p, p2p, reward, failing = score_run(
        row, run, partial_credit=options.partial_credit, semantics=options.semantics
    )
    error = "test run timed out" if run.timed_out else None
    if run.violations:
        error = f"the test process broke the grading rules: {run.violations[0]}"
    tripped = [f"tampering: canary {n} passed (it must fail)" for n in verdict.tampered]
    if not verdict.holds:
        resolved, reward = False, 0.0
        error = error or (tripped or [f"canary did not fail: {verdict.did_not_fail[0]}"])[0]
    return GradeReport(
        **base,
        resolved=resolved,
        f2p_passed=f2p,
        p2p_passed=p2p,
        seconds=time.monotonic() - start,
        reward=reward,
        failing=failing[:50],
        collect_errors={k: v[-300:] for k, v in list(run.collect_errors.items())[:20]},
        violations=run.violations[:20] + tripped,
        tampered=bool(tripped)
        or run.tampered
        or any(v.startswith("tampering") for v in run.violations),
        canaries=verdict.ran,
        error=error,
        outcomes={t: run.outcome(t).outcome for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]},
    )


def task_protection_rules(
    row: SweRow, template: Path, env: TestEnvironment
) -> guards.ProtectionRules:
    """What `guards.restore_protected` protects for `row` (its declared tests, ...)."""
    return guards.protection_rules(
        template,
        pythonpath=row.env.pythonpath,
        venv_modules=env.top_level_modules,
        test_patch=row.test_patch,
        test_ids=[*row.FAIL_TO_PASS, *row.PASS_TO_PASS],
    )


def workspace_diff(row: SweRow, workspace: Path) -> TreeDiff:
    """The agent's patch (the workspace's diff against the row's starting state) and the
    changed paths it cannot carry (binary files, symlinks)."""
    return tree_diff(row_template(row), workspace)


def workspace_patch(row: SweRow, workspace: Path) -> str:
    """The agent's patch: the workspace's diff against the row's starting state."""
    return workspace_diff(row, workspace).patch


async def grade_runtime(
    row: SweRow, runtime: Runtime, options: GradingOptions | None = None
) -> GradeReport:
    """Grade what a rollout left in its runtime's host workspace (`runtime.workspace`)."""
    workspace = getattr(runtime, "workspace", None)
    if not isinstance(workspace, Path):
        raise TypeError("grading needs a runtime over a host workspace folder (`.workspace`)")
    diff = await run_in_pool("reward", workspace_diff, row, workspace)
    report = await grade(row, diff.patch, options)
    report.dropped_paths = {**diff.refused, **report.dropped_paths}
    report.model_patch = diff.patch
    return report
