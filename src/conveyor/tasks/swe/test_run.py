"""What one sandboxed pytest run produced, read from the grader's outcome channel and checked.

The test process writes phase reports, collection errors, the collected node ids and a final
session record (see `outcomes_plugin.py`, `pytest_bootstrap.py`) to a file descriptor the grader
opened outside the sandbox. Library code runs in that process and could write to the channel
too, so nothing in it is believed alone (`read_channel`):
- every (test, phase) is reported at most once, the session record exactly once and last
  (subtest reports may be many: they can only turn their test into a failure);
- reports name only collected tests, and a run that exits 0 reported every collected test;
- the session's exit status equals the process's, and agrees with the outcomes: 0 iff no test
  failed or errored and nothing failed to collect;
- no `{"kind": "tamper", "what"}` record: the bootstrap's audit hook, snapshot and plugin check
  write one the moment they find the process tampering with the grader (`tampered`).
Nothing in the channel is signed: no secret survives code that runs in the same process. A run
breaking any of these has `violations` and scores 0 (the policy's result, not an infra error).
Outcome names: passed / failed / error / skipped / xfailed / xpassed / missing.

`HARDENING` holds the bootstrap's in-process defences the grader switches on (all, normally);
a test may switch one off to show what it stops.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Semantics = Literal["strict", "swebench"]
# SWE-bench's report counts an xfailed test as passing; for a reward only a real pass counts.
PASSING: dict[str, frozenset[str]] = {
    "strict": frozenset({"passed"}),
    "swebench": frozenset({"passed", "xfailed"}),
}
PHASES = ("setup", "call", "teardown")
_BAD = frozenset({"failed", "error"})
# The test process's in-process defences (pytest_bootstrap.py), written into its run.json:
# the audit hook, the plugin check, the snapshot of the runner and the reporter, the check of
# each test as it starts, and making the process non-dumpable.
HARDENING: dict[str, bool] = {
    "audit_hook": True,
    "plugin_check": True,
    "snapshot": True,
    "item_check": True,
    "undumpable": True,
}


@dataclass(frozen=True)
class TestOutcome:
    """One test's result (see the module doc for the outcome names)."""

    nodeid: str
    outcome: str
    phase: str = "call"
    exc_type: str | None = None
    message: str | None = None
    duration: float = 0.0

    __test__ = False

    @property
    def passed(self) -> bool:
        """Really passed (strict semantics)."""
        return self.outcome == "passed"

    def passes(self, semantics: Semantics = "strict") -> bool:
        """Counts as passing under `semantics`."""
        return self.outcome in PASSING[semantics]


@dataclass
class TestRun:
    """What one pytest run in the sandbox produced."""

    outcomes: dict[str, TestOutcome] = field(default_factory=dict)
    collect_errors: dict[str, str] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    tampered: bool = False
    timed_out: bool = False
    exit_code: int = 0
    seconds: float = 0.0
    log_tail: str = ""

    __test__ = False

    @property
    def valid(self) -> bool:
        """Finished within its deadline and kept every rule of the channel."""
        return not self.violations and not self.timed_out

    def outcome(self, nodeid: str) -> TestOutcome:
        """The test's outcome; `missing` when it never ran (not collected, run killed)."""
        return self.outcomes.get(nodeid) or TestOutcome(nodeid, "missing", phase="collect")

    def passed(self, semantics: Semantics = "strict") -> set[str]:
        """Node ids that passed (none when the run is not valid)."""
        if not self.valid:
            return set()
        return {n for n, o in self.outcomes.items() if o.passes(semantics)}


def read_channel(text: str, *, exit_code: int, timed_out: bool) -> TestRun:
    """The run described by the channel's lines, checked against the process's exit status."""
    run = TestRun(timed_out=timed_out, exit_code=exit_code)
    phases: dict[str, dict[str, dict[str, Any]]] = {}
    failed_subtests: set[str] = set()
    session: dict[str, Any] | None = None
    collected: list[str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if session is not None:
            run.violations.append(f"record after the session record (line {number})")
            break
        try:
            record = json.loads(line)
            kind = record["kind"]
        except (ValueError, KeyError, TypeError):
            run.violations.append(f"line {number} of the channel is not a record")
            continue
        if kind == "report" and record.get("subtest"):
            if record.get("outcome") == "failed":
                failed_subtests.add(str(record.get("nodeid")))
        elif kind == "report":
            nodeid, when = str(record.get("nodeid")), str(record.get("when"))
            seen = phases.setdefault(nodeid, {})
            if when not in PHASES or when in seen:
                run.violations.append(f"duplicate or unknown report: {nodeid} ({when})")
                continue
            seen[when] = record
        elif kind == "collect_error":
            # May repeat (one path, two collectors: a module and its doctests); only ever bad.
            nodeid = str(record.get("nodeid"))
            run.collect_errors[nodeid] = str(record.get("message") or "")
        elif kind == "collected" and collected is None:
            collected = [str(n) for n in record.get("nodeids") or []]
        elif kind == "session":
            session = record
        elif kind == "tamper":
            run.tampered = True
            run.violations.append(f"tampering: {str(record.get('what'))[:300]}")
        else:
            run.violations.append(f"unexpected record kind {kind!r} (line {number})")
    run.outcomes = {nodeid: fold(nodeid, seen) for nodeid, seen in phases.items()}
    for nodeid in failed_subtests & set(run.outcomes):
        if run.outcomes[nodeid].outcome in ("passed", "xpassed"):
            run.outcomes[nodeid] = TestOutcome(nodeid, "failed", "call", "subtest failed")
    run.collected = collected or []
    if not timed_out:
        run.violations += _cross_check(run, phases, session, collected)
    return run


def _cross_check(
    run: TestRun,
    phases: dict[str, dict[str, dict[str, Any]]],
    session: dict[str, Any] | None,
    collected: list[str] | None,
) -> list[str]:
    found: list[str] = []
    if session is None:
        return [f"the test process ended without its session record (exit {run.exit_code})"]
    if session.get("exit") != run.exit_code:
        found.append(f"session exit {session.get('exit')} != process exit {run.exit_code}")
    if collected is None:
        if phases:
            found.append("reports without a collection record")
        return found
    strays = sorted(set(phases) - set(collected))
    if strays:
        found.append(f"reports of tests never collected: {strays[:5]}")
    if len(set(collected)) != len(collected):
        found.append("the collection record names a test twice")
    unreported = sorted(set(collected) - set(phases))
    bad = any(o.outcome in _BAD for o in run.outcomes.values()) or bool(run.collect_errors)
    if run.exit_code == 0 and (bad or unreported):
        found.append("exit status 0 although tests failed, errored or were not reported")
    if run.exit_code == 1 and not bad:
        found.append("exit status 1 (tests failed) although every reported test passed")
    return found


def fold(nodeid: str, seen: dict[str, dict[str, Any]]) -> TestOutcome:
    """One test's outcome from its phase reports (a phase never reported counts as an error)."""
    duration = sum(float(r.get("duration") or 0.0) for r in seen.values())

    def make(outcome: str, phase: str) -> TestOutcome:
        record = seen.get(phase) or {}
        exc, message = record.get("exc_type"), record.get("message")
        return TestOutcome(nodeid, outcome, phase, exc, message, duration)

    setup, call, teardown = (seen.get(p) for p in PHASES)
    if setup is None or setup.get("outcome") == "failed":
        return make("error", "setup")
    if setup.get("outcome") == "skipped":
        result = make("xfailed" if setup.get("wasxfail") else "skipped", "setup")
    elif call is None:
        return make("error", "call")
    elif call.get("outcome") == "failed":
        return make("failed", "call")
    elif call.get("outcome") == "skipped":
        result = make("xfailed" if call.get("wasxfail") else "skipped", "call")
    elif call.get("outcome") == "passed":
        result = make("xpassed" if call.get("wasxfail") else "passed", "call")
    else:
        return make("error", "call")
    if teardown is None or teardown.get("outcome") == "failed":
        return make("error", "teardown")
    return result
