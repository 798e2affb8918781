"""Grading from a test log with SWE-bench's own parser: rows whose tests do not run under our
pytest outcome channel (Django's `runtests.py`, sympy's `bin/test`, any `log_parser` that is not
pytest's), and the parity check's second grader for pytest rows.

`grade_log(row, patch)` keeps the steps and defences of `grading.grade` up to the test run: a
fresh workspace of the starting state, the whole patch with `git apply`, protected and untrusted
changes reverted from the tree (`guards.restore_protected`), the hidden test patch (one that does
not apply to the starting state is a `TaskDefect`), tests in the bubblewrap sandbox (no network,
the test venv read-only) or, under runtime 'container', in a container of the row's image (an
exported factory row's locally built one; the tree guard protects that image's venv modules);
a sandbox, engine or image that is missing is a `RuntimeFailure`, never an unsandboxed run.
Then it runs the row's test command (`swebench_spec.row_test_command`) between the harness's
markers, its exit status recorded after them, and hands the log to swebench's
`get_logs_eval` (which refuses a log without its markers, and one whose command exited non-zero
while reporting no failure: a patch printing its own "PASSED" lines) and its report functions.
A log whose harness markers appear more than once, or that reports a graded test (or canary)
with two different statuses (`swebench_spec.forged_report`: forged lines beside the real ones,
which swebench's parser would let win), is tampering: not resolved.
A pytest-parsed row also gets its canaries (inserted into its test modules, so they run with
the test files; one that passed is tampering), as in `grading`. When its test command is one
plain pytest run (`test_command.pytest_invocation`), that command is started through our
bootstrap (`grading.run_in_channel`): the row's arguments unchanged, the in-process defences
on (audit hook, plugin check, snapshot, item check; no `atexit` hook runs after pytest), and
the outcomes on the channel as well as in the log. A tamper record or a broken channel refuses
the verdict, and a graded test or canary the log claims passing that the channel reports
otherwise is a forged report (`channel_disagrees`). Other commands and parsers of other
runners have no bootstrap (nor, for other runners, canaries): their defences are the tree
guard, the sandbox, `forged_report` and the exit-status cross-check.

Under the `strict` semantics a test counts only with status PASSED (SWE-bench also counts XFAIL
for F2P and SKIPPED for P2P: the `swebench` semantics take its verdict as it is).
"""

from __future__ import annotations

import shlex
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from conveyor.runtime.base import Runtime
from conveyor.runtime.cpu_pools import run_in_pool
from conveyor.runtime.limits import SandboxLimits
from conveyor.runtime.selection import started
from conveyor.runtime.workspace import make_workspace
from conveyor.tasks.swe import canaries
from conveyor.tasks.swe.dataset import SweRow
from conveyor.tasks.swe.environment import TestEnvironment, swe_home
from conveyor.tasks.swe.images import TESTBED
from conveyor.tasks.swe.options import GradingOptions
from conveyor.tasks.swe.swebench_spec import (
    EXIT_CODE,
    EXIT_VAR,
    OUTCOME_OF_STATUS,
    PYTEST_PARSERS,
    STATUS_OF_OUTCOME,
    LogVerdict,
    decide,
    forged_report,
    parser_name,
    read_statuses,
    row_test_command,
    wrap_command,
)
from conveyor.tasks.swe.test_command import pytest_invocation
from conveyor.tasks.swe.test_run import TestOutcome, TestRun

_LOG_TAIL = 4000


async def run_logged(
    row: SweRow,
    workspace: Any,
    options: GradingOptions,
    template: Path | None = None,
    env: TestEnvironment | None = None,
) -> tuple[str, bool, TestRun | None]:
    """(the log, whether the run timed out, the outcome channel's run or None) of the row's
    test command over `workspace` (a host folder) in the grading sandbox, with the row's test
    venv and importable project: bubblewrap, or under runtime 'container' a container of the
    row's image with the workspace at /testbed (`grading.container_test_runtime`: no network,
    the sandbox user, the limits). A pytest-parsed row whose command is one plain pytest run
    (`test_command.pytest_invocation`) runs it through our bootstrap (`grading.run_in_channel`:
    its arguments unchanged, the in-process defences on, the outcomes also on the channel);
    any other command runs as written and has no channel. `env`: the row's test environment
    (`grading.row_environment`) where the caller already has it."""
    from conveyor.tasks.swe.grading import (
        bootstrap_command,
        container_test_runtime,
        declared_test_files,
        make_test_runtime,
        row_container,
        row_environment,
        row_metadata,
        run_in_channel,
        test_env_vars,
    )

    if env is None:
        env = await run_in_pool("reward", row_environment, row, options)
    metadata = await run_in_pool("reward", row_metadata, row, options)
    limits = SandboxLimits(memory_bytes=options.memory_bytes)
    command = row_test_command(row)
    invocation = pytest_invocation(command) if parser_name(row) in PYTEST_PARSERS else None
    if invocation is not None:
        wrapper, arguments = invocation
        start = bootstrap_command(wrapper, env)
        container = None
        if options.runtime == "container":
            container = await run_in_pool("reward", row_container, row, options)
        test_files = await run_in_pool("reward", declared_test_files, row, template)

        def hardened(run_json: str, root: str) -> str:
            body = f"{start} {shlex.quote(run_json)} {shlex.join(arguments)}"
            # the script's stderr joins its stdout (the log); it exits with the tests' status
            script = f"exec 2>&1\n{wrap_command(body)}\nexit ${EXIT_VAR}"
            return f"bash -c {shlex.quote(script)}"

        run, result = await run_in_channel(
            workspace,
            env,
            hardened,
            select=None,
            pythonpath=row.env.pythonpath,
            # as SWE-bench runs the command: no per-test alarm, the run's deadline holds
            per_test_timeout_s=0.0,
            run_timeout_s=options.run_timeout_s,
            runtime_kind=options.runtime,
            limits=limits,
            metadata=metadata,
            test_files=test_files,
            container=container,
        )
        return result.stdout + result.stderr, result.timed_out, run
    script = wrap_command(command)
    line = f"bash -c {shlex.quote(script)} 2>&1"
    runtime: Runtime
    with tempfile.TemporaryDirectory(prefix="log-run-", dir=_runs_dir()) as run_dir:
        if options.runtime == "container":
            # Fails closed: no engine or no image is a RuntimeFailure, never a score.
            target = await run_in_pool("reward", row_container, row, options)
            variables = test_env_vars(env, TESTBED, row.env.pythonpath, metadata)
            runtime = container_test_runtime(target, workspace, Path(run_dir), limits, variables)
        else:
            mounts = [metadata] if metadata is not None else []
            runtime = make_test_runtime(workspace, env, options.runtime, limits, mounts)
            runtime.extra_env.update(
                test_env_vars(env, str(runtime.root), row.env.pythonpath, metadata)
            )
        await started(runtime)
        try:
            result = await runtime.exec(line, options.run_timeout_s)
        finally:
            await runtime.close()
    return result.stdout + result.stderr, result.timed_out, None


def channel_disagrees(statuses: dict[str, str], run: TestRun) -> str | None:
    """Why the log's statuses cannot be the run's (a graded test or canary the log reports as
    passing, PASSED or, as SWE-bench counts them, XFAIL or SKIPPED, that the outcome channel
    reports otherwise: report lines forged in the test process), else None. Only a claimed
    pass is checked: a log reporting worse than the channel hurts no one but the policy."""
    for test, status in statuses.items():
        if status not in ("PASSED", "XFAIL", "SKIPPED"):
            continue
        outcome = run.outcome(test).outcome
        if STATUS_OF_OUTCOME.get(outcome) != status:
            return f"the log reports {test} {status}, the outcome channel {outcome}"
    return None


TIMED_OUT = "test run timed out"
CPU_LIMIT = "test run hit its CPU-time limit"
_CPU_KILLED = f"{EXIT_CODE}: {128 + signal.SIGXCPU}"


def void_run(log: str, timed_out: bool) -> str | None:
    """Why the log run ended void by a limit, else None: the whole-run deadline (`TIMED_OUT`),
    or the sandbox's CPU-time limit (`CPU_LIMIT`: the test command died of SIGXCPU, as a test
    the bug makes loop does when the machine is idle enough to spend its CPU seconds before the
    deadline). Either way the run reported no summary (scored as the policy's: not resolved);
    the parity check then compares verdicts only."""
    if timed_out:
        return TIMED_OUT
    if any(line.strip() == _CPU_KILLED for line in log.splitlines()):
        return f"{CPU_LIMIT} (exit {128 + signal.SIGXCPU}, SIGXCPU)"
    return None


def _runs_dir() -> Path:
    folder = swe_home() / "grades"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _as_run(statuses: dict[str, str]) -> TestRun:
    outcomes = {
        test: TestOutcome(test, OUTCOME_OF_STATUS.get(status, "error"))
        for test, status in statuses.items()
    }
    return TestRun(outcomes=outcomes)


async def grade_log(row: SweRow, patch: str, options: GradingOptions | None = None) -> Any:
    """Grade `patch` for `row` from its test log (see the module doc); a `GradeReport`."""
    from conveyor.tasks.swe.grading import (
        GradeReport,
        apply_patches,
        row_environment,
        row_template,
        task_protection_rules,
    )

    options = options or GradingOptions()
    start = time.monotonic()
    pytest_ids = parser_name(row) in PYTEST_PARSERS
    row_test_command(row)  # a row without a test command is refused before any work
    template = await run_in_pool("reward", row_template, row)
    env = await run_in_pool("reward", row_environment, row, options)
    rules = await run_in_pool("reward", task_protection_rules, row, template, env)
    base: dict[str, Any] = dict(instance_id=row.instance_id, f2p_total=len(row.FAIL_TO_PASS))
    base |= dict(p2p_total=len(row.PASS_TO_PASS), f2p_passed=0, p2p_passed=0)
    workspace = await run_in_pool("reward", make_workspace, template, swe_home() / "workspaces")
    try:
        refused = await apply_patches(row, patch, workspace.path, template, rules, base, start)
        if refused is not None:
            return refused
        found = await canaries.row_canaries(row, options) if pytest_ids else []
        found = await run_in_pool("reward", canaries.insert_canaries, workspace.path, found)
        log, timed_out, channel = await run_logged(row, workspace.path, options, template, env)
    finally:
        await run_in_pool("reward", workspace.remove)
    names = [n for c in found for n in (c.nodeid, c.real)]
    statuses, valid = read_statuses(row, log, names)
    forged = forged_report(row, log, names)
    if forged is None and channel is not None:
        graded = set([*row.FAIL_TO_PASS, *row.PASS_TO_PASS, *names])
        forged = channel_disagrees({t: s for t, s in statuses.items() if t in graded}, channel)
    valid = valid and not timed_out and forged is None
    run = _as_run(statuses)
    check = canaries.check(found, run, options.semantics)
    listed = canaries.as_listed(run, found)
    statuses = {t: STATUS_OF_OUTCOME[o.outcome] for t, o in listed.outcomes.items()}
    result: LogVerdict = decide(row, statuses, valid)
    resolved = result.resolved
    if options.semantics == "strict":
        resolved = resolved and all(
            statuses.get(t) == "PASSED" for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]
        )
    error = void_run(log, timed_out)
    if error is None and not valid:
        error = (
            "no valid test log (swebench's get_logs_eval refused it: markers missing, a "
            "failure code, or a non-zero exit status while the log reports no failure)"
        )
    tripped = [f"tampering: canary {n} passed (it must fail)" for n in check.tampered]
    # the in-process defences' records, or a channel the test process broke: the policy's
    broken = channel.violations[:20] if channel is not None else []
    if broken:
        valid = resolved = False
        if not (error or "").startswith(CPU_LIMIT):  # a run killed by its limit: said so
            error = f"the test process broke the grading rules: {broken[0]}"
    if forged is not None:
        tripped.insert(0, f"tampering: forged test report: {forged}")
        error = tripped[0]
    if not check.holds:
        resolved = False
        error = error or (tripped or [f"canary did not fail: {check.did_not_fail[0]}"])[0]
    tests = [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]
    outcomes = {t: OUTCOME_OF_STATUS.get(statuses.get(t, ""), "missing") for t in tests}
    if options.semantics == "strict":
        f2p = sum(outcomes[t] == "passed" for t in row.FAIL_TO_PASS)
        p2p = sum(outcomes[t] == "passed" for t in row.PASS_TO_PASS)
    else:
        f2p, p2p = len(result.f2p_passed), len(result.p2p_passed)
    reward = 1.0 if resolved else 0.0
    full_p2p = p2p == len(row.PASS_TO_PASS) and valid and check.holds
    if options.partial_credit and not resolved and full_p2p:
        reward = f2p / len(row.FAIL_TO_PASS)
    base.update(f2p_passed=f2p, p2p_passed=p2p)
    return GradeReport(
        **base,
        resolved=resolved,
        seconds=time.monotonic() - start,
        reward=reward,
        failing=[t for t in tests if outcomes[t] != "passed"][:50],
        violations=broken + tripped,
        tampered=bool(tripped)
        or (channel is not None and channel.tampered)
        or any(v.startswith("tampering") for v in broken),
        canaries=check.ran,
        error=error,
        outcomes=outcomes,
    )
