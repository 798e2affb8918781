"""SWE-bench's own semantics for a row, from the official `swebench` package (5.0.2).

`swebench` 5 keeps no per-repository spec tables any more (4.x's `MAP_REPO_VERSION_TO_SPECS`
is gone): each instance carries its harness `eval_script`, `log_parser` and `eval_type`, and
the harness runs the script in the instance's image, then reads the log between its start and
end markers with the named parser (`swebench.harness.log_parsers.PARSER_REGISTRY`). Here:

- `parser_name(row)`: the row's `log_parser`; else, for a row of a repository SWE-bench knows
  (`MAP_REPO_TO_PARSER_PY`: Django's `runtests.py`, sympy's `bin/test`, pytest for the rest),
  that repository's parser; else `parse_log_pytest` for our `pypi:` rows. `ValueError` for a
  name the package does not have.
- `row_test_command(row)`: the lines of the row's `eval_script` between the start and end markers
  (SWE-bench's test command with its test directives); for a row without one (our factory's),
  `python -m pytest -rA --continue-on-collection-errors` over the files of its F2P/P2P node
  ids, with the row's pytest flags.
- `eval_script(row)`: the harness script of a row without one (apply the test patch at
  `/testbed`, run `row_test_command` between the markers), so a factory row becomes an ordinary
  SWE-bench row (`swebench_record`).
- `verdict(row, log)`: per-test statuses and `resolved` as the harness decides them: its own
  `get_logs_eval` (the markers, its failure codes, the exit-status cross-check it records) and
  `get_eval_tests_report` / `get_resolution_status`.
- `uses_log_grading(row)`: whether the grader reads this row's verdict from the log through
  the parser (`log_grading`): every SWE-bench-format record (it carries its `eval_script`; an
  exported factory row too) and every row whose tests do not run under pytest; the factory's
  own `pypi:` pytest rows keep the pytest outcome channel (`grading`).

`swebench` is imported only here and only when used (the `swe` extra of pyproject).
"""

from __future__ import annotations

import json
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conveyor.tasks.swe.test_command import parse_test_command

if TYPE_CHECKING:
    from conveyor.tasks.swe.dataset import SweRow

START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
EXIT_CODE = ">>>>> Test Exit Code"
EXIT_VAR = "SWEBENCH_TEST_EXIT_CODE"
# Parsers that read pytest's `-rA` summary: a `pypi:` row with one of these is graded through
# our pytest outcome channel instead (see the module doc).
PYTEST_PARSERS = frozenset({"parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2"})
DEFAULT_IMAGE = "conveyor/sweb.eval.{instance_id}"
# The record field holding a row's full test names where the harness's differ (`harness_id`).
FULL_TESTS = "conveyor_tests"
_HEREDOC = "EOF_114329324912"
# Our statuses (`test_run.TestOutcome.outcome`) as SWE-bench names them.
STATUS_OF_OUTCOME = {
    "passed": "PASSED",
    "failed": "FAILED",
    "error": "ERROR",
    "skipped": "SKIPPED",
    "xfailed": "XFAIL",
    "xpassed": "PASSED",
}
OUTCOME_OF_STATUS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error"}
OUTCOME_OF_STATUS |= {"SKIPPED": "skipped", "XFAIL": "xfailed"}


def _swebench() -> Any:
    try:
        import swebench.harness.grading as grading
    except ImportError as exc:  # pragma: no cover - the swe extra is part of dev
        raise ImportError(
            "SWE-bench rows need the official swebench package: pip install 'conveyor[swe]'"
        ) from exc
    return grading


def parser_name(row: SweRow) -> str:
    """The name (a key of swebench's `PARSER_REGISTRY`) of the row's log parser. Our `pypi:`
    pytest rows are answered without importing swebench (its harness imports datasets, docker
    and modal: seconds), so their grading never pays for it."""
    if row.project is not None and (row.log_parser or "parse_log_pytest") in PYTEST_PARSERS:
        return row.log_parser or "parse_log_pytest"
    _swebench()
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY

    if row.log_parser:
        if row.log_parser not in PARSER_REGISTRY:
            raise ValueError(
                f"{row.instance_id}: log_parser {row.log_parser!r} is not one of swebench's "
                f"({len(PARSER_REGISTRY)} known, e.g. parse_log_pytest, parse_log_django)"
            )
        return row.log_parser
    if row.repo in MAP_REPO_TO_PARSER_PY:
        function = MAP_REPO_TO_PARSER_PY[row.repo]
        return next(name for name, f in PARSER_REGISTRY.items() if f is function)
    if row.project is not None:
        return "parse_log_pytest"
    raise ValueError(
        f"{row.instance_id}: no log parser for repo {row.repo!r}: the row names none "
        "(log_parser) and swebench knows no parser for that repository"
    )


def uses_log_grading(row: SweRow) -> bool:
    """Whether the row is graded from its test log by its swebench parser (`log_grading`)
    rather than by the pytest outcome channel: every row but our factory's `pypi:` pytest rows
    as the factory writes them. A SWE-bench-format record (one carrying its harness
    `eval_script`, as `conveyor tasks export` writes our rows) is graded as the harness grades
    it: its test command, its parser."""
    if row.eval_script is not None or row.project is None:
        return True
    return parser_name(row) not in PYTEST_PARSERS


def row_test_files(row: SweRow) -> list[str]:
    """The test files of the row's F2P and P2P pytest node ids."""
    return sorted({t.split("::")[0] for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]})


def row_test_command(row: SweRow) -> str:
    """The row's test command (see the module doc); `ValueError` when its `eval_script` has no
    command between the markers."""
    if row.eval_script:
        lines = row.eval_script.splitlines()
        starts = [i for i, line in enumerate(lines) if START in line]
        ends = [i for i, line in enumerate(lines) if END in line]
        if not starts or not ends or ends[-1] <= starts[0] + 1:
            raise ValueError(
                f"{row.instance_id}: eval_script has no test command between {START!r} and {END!r}"
            )
        body = [line for line in lines[starts[0] + 1 : ends[-1]] if line.strip()]
        return "\n".join(body)
    if row.project is None:
        raise ValueError(
            f"{row.instance_id}: a row of {row.repo!r} needs its eval_script (swebench 5 keeps "
            "the test command in each instance, not per repository)"
        )
    flags = parse_test_command(row.env.test_cmd).pytest_flags
    words = [
        "python",
        "-m",
        "pytest",
        *flags,
        "-rA",
        "-p",
        "no:cacheprovider",
        # as our grader runs them: a module that fails to collect (markdown's `filterwarnings
        # = error` turns a collection warning into an error) would otherwise interrupt the
        # whole run, and every test of the row would be missing
        "--continue-on-collection-errors",
        *row_test_files(row),
    ]
    return shlex.join(words)


def eval_script(row: SweRow) -> str:
    """The row's harness script: its own, or (a factory row) one made like SWE-bench's."""
    if row.eval_script:
        return row.eval_script
    body = row.test_patch if row.test_patch.endswith("\n") else row.test_patch + "\n"
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "cd /testbed",
            *([f"git apply --verbose --reject - <<'{_HEREDOC}'", body + _HEREDOC] if body else []),
            f": '{START}'",
            row_test_command(row),
            f": '{END}'",
            "",
        ]
    )


def swebench_record(row: SweRow, image: str | None = None) -> dict[str, Any]:
    """`row` as a SWE-bench-format record (what the HF datasets and swebench 5's task repos
    hold): the test lists as JSON strings, `environment_setup_commit`, `image`, `eval_script`,
    `log_parser`, `eval_type`; a `pypi:` row keeps its `environment` (how to build its tree and
    venv) and names its release as `environment_setup_commit`. Test names go in as the
    harness's parser keys them (`harness_id`); where that differs, the full names go in
    `conveyor_tests` too, and `SweRow` takes them back from there. `image` is a template with
    `{instance_id}` (default: the row's own image name, else `DEFAULT_IMAGE`)."""
    record = row.model_dump(mode="json", exclude_none=True, by_alias=False)
    record.pop("image_name", None)
    template = image or row.image_name or DEFAULT_IMAGE
    f2p = [harness_id(row, t) for t in row.FAIL_TO_PASS]
    p2p = [harness_id(row, t) for t in row.PASS_TO_PASS]
    if (f2p, p2p) != (row.FAIL_TO_PASS, row.PASS_TO_PASS):
        # The harness knows these tests by their names up to a space; ours keep them whole.
        record[FULL_TESTS] = {"FAIL_TO_PASS": row.FAIL_TO_PASS, "PASS_TO_PASS": row.PASS_TO_PASS}
    record.update(
        FAIL_TO_PASS=json.dumps(f2p),
        PASS_TO_PASS=json.dumps(p2p),
        environment_setup_commit=row.environment_setup_commit or row.base_commit or row.version,
        image=template.format(instance_id=row.instance_id.lower()),
        eval_script=eval_script(row),
        log_parser=parser_name(row),
        eval_type=row.eval_type or "pass_and_fail",
    )
    return record


@dataclass
class LogVerdict:
    """What SWE-bench's harness decides from one test log."""

    statuses: dict[str, str] = field(default_factory=dict)
    valid: bool = False
    resolved: bool = False
    f2p_passed: list[str] = field(default_factory=list)
    p2p_passed: list[str] = field(default_factory=list)
    failing: list[str] = field(default_factory=list)

    def status(self, test: str) -> str:
        """The test's status as SWE-bench's parser read it; MISSING when absent."""
        return self.statuses.get(test, "MISSING")


def wrap_command(command: str) -> str:
    """`command` between the harness's markers, its exit status recorded after the end marker
    (as swebench's `record_test_exit_code` makes the eval script do)."""
    return "\n".join(
        [
            f"echo {shlex.quote(START)}",
            command,
            f"{EXIT_VAR}=$?",
            f"echo {shlex.quote(END)}",
            f'echo "{EXIT_CODE}: ${EXIT_VAR}"',
        ]
    )


def _spec(row: SweRow) -> Any:
    from swebench.types import TestSpec

    return TestSpec(
        instance_id=row.instance_id,
        image="",
        eval_script_list=[],
        repo=row.repo,
        version=row.version,
        FAIL_TO_PASS=list(row.FAIL_TO_PASS),
        PASS_TO_PASS=list(row.PASS_TO_PASS),
        log_parser=parser_name(row),
        eval_type=row.eval_type or "pass_and_fail",
    )


def harness_id(row: SweRow, test: str) -> str:
    """`test` as swebench's parser keys it: pytest's parsers split each summary line on
    whitespace, so a node id with a space (`test_x[a b]`) is known by its text up to the first
    space, as SWE-bench's datasets store such ids; other parsers key the whole name."""
    if parser_name(row) in PYTEST_PARSERS and test.split():
        return test.split()[0]
    return test


def read_statuses(row: SweRow, log: str, also: Sequence[str] = ()) -> tuple[dict[str, str], bool]:
    """(test -> SWE-bench status, whether the log is a valid run) as swebench's harness reads
    `log` (a run of `wrap_command`): `get_logs_eval` with the row's parser. The row's F2P/P2P
    tests and `also` (canaries) are keyed by their full names (`harness_id` reads them)."""
    grading = _swebench()
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as handle:
        handle.write(log)
        handle.flush()
        statuses, found = grading.get_logs_eval(_spec(row), handle.name)
    statuses = dict(statuses)
    for test in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS, *also]:
        key = harness_id(row, test)
        if key != test and key in statuses:
            statuses[test] = statuses[key]
    return statuses, bool(found)


def forged_report(row: SweRow, log: str, also: Sequence[str] = ()) -> str | None:
    """Why `log` (a run of `wrap_command`) cannot be the report of the run, else None: a
    harness marker printed more than once (the tested code printed its own start, end or exit
    status line: swebench reads the first end marker and the first exit status), or, for a
    pytest-parsed row, one of its F2P/P2P tests or `also` (canaries) reported with two
    different statuses (forged lines beside the real ones; swebench keeps the last). A test
    that pytest reports both as ERROR (in teardown) and PASSED counts as forged too: the
    verdict fails closed."""
    for marker in (START, END, EXIT_CODE):
        count = sum(line.startswith(marker) for line in log.splitlines())
        if count > 1:
            return f"the log has {count} {marker!r} lines: the tested code printed its own"
    if parser_name(row) not in PYTEST_PARSERS:
        return None
    from swebench.harness.log_parsers import PARSER_REGISTRY

    parse, spec = PARSER_REGISTRY[parser_name(row)], _spec(row)
    graded = {harness_id(row, t) for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS, *also]}
    seen: dict[str, str] = {}
    for line in log.splitlines():
        for test, status in parse(line, spec).items():
            if test in graded and seen.setdefault(test, status) != status:
                return f"{test} is reported both {seen[test]} and {status}"
    return None


def decide(row: SweRow, statuses: dict[str, str], valid: bool) -> LogVerdict:
    """SWE-bench's verdict for `row` on the statuses of a run (`get_eval_tests_report`,
    `get_resolution_status`); an invalid run resolves nothing."""
    grading = _swebench()
    from swebench.harness.constants import EvalType, ResolvedStatus

    result = LogVerdict(statuses=dict(statuses), valid=valid)
    if not valid:
        result.failing = [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]
        return result
    reference = {"FAIL_TO_PASS": list(row.FAIL_TO_PASS), "PASS_TO_PASS": list(row.PASS_TO_PASS)}
    eval_type = EvalType(row.eval_type or "pass_and_fail")
    report = grading.get_eval_tests_report(statuses, reference, eval_type=eval_type)
    result.resolved = grading.get_resolution_status(report) == ResolvedStatus.FULL.value
    result.f2p_passed = list(report["FAIL_TO_PASS"]["success"])
    result.p2p_passed = list(report["PASS_TO_PASS"]["success"])
    passed = set(result.f2p_passed) | set(result.p2p_passed)
    result.failing = [t for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS] if t not in passed]
    return result


def verdict(row: SweRow, log: str) -> LogVerdict:
    """SWE-bench's verdict on `log` (a run of `wrap_command`) for `row`."""
    return decide(row, *read_statuses(row, log))
