"""Does our grader agree with SWE-bench's? `parity_report(rows)` grades each row's gold and empty
patch with our pytest outcome channel (`grading.grade`) and with swebench's own log parser over
a `pytest -rA` run of the same tests in the same sandbox (`log_grading.grade_log`), both under
the `swebench` semantics, and compares `resolved` and each F2P/P2P test's status (`conveyor
tasks swebench-parity`). Only rows whose tests run under pytest can be graded both ways."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from conveyor.tasks.swe.dataset import SweRow
from conveyor.tasks.swe.options import GradingOptions
from conveyor.tasks.swe.swebench_spec import PYTEST_PARSERS, STATUS_OF_OUTCOME, parser_name


def status(outcome: str) -> str:
    """Our outcome name as SWE-bench's status (MISSING for a test that never reported)."""
    return STATUS_OF_OUTCOME.get(outcome, "MISSING")


async def parity_case(row: SweRow, patch: str, options: GradingOptions) -> dict[str, Any]:
    """One row and patch graded both ways, and where they differ."""
    from conveyor.tasks.swe.grading import grade_pytest
    from conveyor.tasks.swe.log_grading import CPU_LIMIT, TIMED_OUT, grade_log

    ours = await grade_pytest(row, patch, options)
    theirs = await grade_log(row, patch, options)
    differ = {
        test: [status(ours.outcomes.get(test, "")), status(theirs.outcomes.get(test, ""))]
        for test in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]
        if status(ours.outcomes.get(test, "")) != status(theirs.outcomes.get(test, ""))
    }
    # A test that hangs fails in our grader at its per-test timeout; the harness has only a
    # whole-run timeout (as SWE-bench's) and the sandbox's CPU-time limit, so its run ends
    # void at one of them and names no test: then only the verdicts can be compared.
    hung = (theirs.error or "").startswith((TIMED_OUT, CPU_LIMIT))
    return {
        "instance_id": row.instance_id,
        "ours": ours.resolved,
        "theirs": theirs.resolved,
        "tests": len(row.FAIL_TO_PASS) + len(row.PASS_TO_PASS),
        "differ": {} if hung else differ,
        "log_run_timed_out": hung,
        "agree": ours.resolved == theirs.resolved and (hung or not differ),
        "seconds": [round(ours.seconds, 2), round(theirs.seconds, 2)],
    }


async def parity_report(
    rows: Sequence[SweRow],
    options: GradingOptions | None = None,
    say: Callable[[str], Any] = lambda _: None,
) -> dict[str, Any]:
    """Every row x {gold, empty}: `{"cases", "agree", "ok", "gold": {...}, "empty": {...},
    "ours_resolved", "theirs_resolved", "tests_compared", "log_runs_timed_out" (log runs void
    at the whole-run deadline or the sandbox's CPU-time limit: verdicts compared, not tests),
    "disagreements", "seconds"}`. `options` default: the `swebench` semantics and the grader's
    900 s whole-run limit (a test the bug makes hang holds the log run that long; 300 s
    timed a whole pyparsing run out on a loaded machine)."""
    options = options or GradingOptions(semantics="swebench")
    start = time.monotonic()
    cases: list[dict[str, Any]] = []
    for row in rows:
        if row.project is None or parser_name(row) not in PYTEST_PARSERS:
            raise ValueError(
                f"{row.instance_id}: parity needs a pypi: pytest row (ours grades only those "
                "through its outcome channel)"
            )
        for kind, patch in (("gold", row.patch), ("empty", "")):
            case = {"patch": kind, **await parity_case(row, patch, options)}
            cases.append(case)
            say(
                f"{row.instance_id} {kind}: ours {case['ours']}, swebench {case['theirs']}"
                + ("" if case["agree"] else f"  DIFFER {case['differ']}")
            )

    def tally(kind: str) -> dict[str, int]:
        mine = [c for c in cases if c["patch"] == kind]
        return {
            "cases": len(mine),
            "ours_resolved": sum(c["ours"] for c in mine),
            "theirs_resolved": sum(c["theirs"] for c in mine),
            "agree": sum(c["agree"] for c in mine),
        }

    agree = sum(c["agree"] for c in cases)
    return {
        "cases": len(cases),
        "agree": agree,
        "ok": agree == len(cases),
        "gold": tally("gold"),
        "empty": tally("empty"),
        "ours_resolved": sum(c["ours"] for c in cases),
        "theirs_resolved": sum(c["theirs"] for c in cases),
        "tests_compared": sum(c["tests"] for c in cases if not c["log_run_timed_out"]),
        "log_runs_timed_out": sum(c["log_run_timed_out"] for c in cases),
        "disagreements": [c for c in cases if not c["agree"]],
        "seconds": round(time.monotonic() - start, 1),
    }
