"""The grader's reading of the outcome channel: folding phases, and the rules a run must keep.

These feed `read_channel` the lines a test process writes; the sandboxed runs that produce them
for real are in test_swe_reward_attacks.py and test_swe_grading.py.
"""

from __future__ import annotations

import json
from typing import Any

from conveyor.tasks.swe.test_run import read_channel


def _report(nodeid: str, when: str, outcome: str = "passed", **extra: Any) -> dict[str, Any]:
    return {"kind": "report", "nodeid": nodeid, "when": when, "outcome": outcome, **extra}


def _test(nodeid: str, call: str = "passed", **extra: Any) -> list[dict[str, Any]]:
    return [
        _report(nodeid, "setup"),
        _report(nodeid, "call", call, **extra),
        _report(nodeid, "teardown"),
    ]


def _lines(*records: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _session(exit_code: int) -> dict[str, Any]:
    return {"kind": "session", "exit": exit_code}


COLLECTED = {"kind": "collected", "nodeids": ["t.py::a", "t.py::b"]}


def test_a_clean_run_folds_phases_into_outcomes() -> None:
    text = _lines(COLLECTED, *_test("t.py::a"), *_test("t.py::b", "failed"), _session(1))
    run = read_channel(text, exit_code=1, timed_out=False)
    assert run.valid and run.violations == []
    assert {n: o.outcome for n, o in run.outcomes.items()} == {
        "t.py::a": "passed",
        "t.py::b": "failed",
    }
    assert run.passed() == {"t.py::a"}


def test_xfail_skip_and_xpass_are_not_passes_under_strict() -> None:
    text = _lines(
        {"kind": "collected", "nodeids": ["t.py::x", "t.py::s", "t.py::p"]},
        *_test("t.py::x", "skipped", wasxfail=True),
        *_test("t.py::s", "skipped"),
        *_test("t.py::p", "passed", wasxfail=True),
        _session(0),
    )
    run = read_channel(text, exit_code=0, timed_out=False)
    assert [run.outcome(n).outcome for n in ("t.py::x", "t.py::s", "t.py::p")] == [
        "xfailed",
        "skipped",
        "xpassed",
    ]
    assert run.passed() == set() and run.passed("swebench") == {"t.py::x"}


def test_a_forged_duplicate_voids_the_run() -> None:
    text = _lines(
        COLLECTED,
        *_test("t.py::a", "failed"),
        _report("t.py::a", "call"),
        *_test("t.py::b"),
        _session(1),
    )
    run = read_channel(text, exit_code=1, timed_out=False)
    assert not run.valid and "duplicate" in run.violations[0] and run.passed() == set()


def test_records_after_the_session_void_the_run() -> None:
    text = _lines(
        COLLECTED, *_test("t.py::a"), *_test("t.py::b"), _session(0), _report("t.py::c", "call")
    )
    assert "after the session" in read_channel(text, exit_code=0, timed_out=False).violations[0]


def test_the_exit_status_must_agree() -> None:
    passing = _lines(COLLECTED, *_test("t.py::a"), *_test("t.py::b"))
    # forged passes while pytest itself saw a failure (exit 1)
    assert read_channel(passing + _lines(_session(1)), exit_code=1, timed_out=False).violations
    # the session claims 0, the process ended otherwise
    assert read_channel(passing + _lines(_session(0)), exit_code=1, timed_out=False).violations
    # a process that left early (os._exit) has no session record
    assert "session record" in read_channel(passing, exit_code=0, timed_out=False).violations[0]
    failing = _lines(COLLECTED, *_test("t.py::a", "failed"), *_test("t.py::b"), _session(0))
    assert read_channel(failing, exit_code=0, timed_out=False).violations


def test_reports_must_name_collected_tests_and_cover_them() -> None:
    stray = _lines(COLLECTED, *_test("t.py::a"), *_test("t.py::b"), *_test("t.py::c"), _session(0))
    assert "never collected" in read_channel(stray, exit_code=0, timed_out=False).violations[0]
    short = _lines(COLLECTED, *_test("t.py::a"), _session(0))
    assert read_channel(short, exit_code=0, timed_out=False).violations


def test_a_tamper_record_voids_the_run_and_marks_it_tampered() -> None:
    tamper = {"kind": "tamper", "what": "changed: _pytest.x.f"}
    text = _lines(COLLECTED, *_test("t.py::a"), tamper, *_test("t.py::b"), _session(0))
    run = read_channel(text, exit_code=0, timed_out=False)
    assert run.violations == ["tampering: changed: _pytest.x.f"]
    assert run.tampered and run.passed() == set()
    clean = read_channel(
        _lines(COLLECTED, *_test("t.py::a"), *_test("t.py::b"), _session(0)),
        exit_code=0,
        timed_out=False,
    )
    assert clean.valid and not clean.tampered


def test_subtests_may_repeat_and_only_fail_their_test() -> None:
    sub = _report("t.py::a", "call", "passed", subtest=True)
    bad = _report("t.py::b", "call", "failed", subtest=True)
    text = _lines(COLLECTED, sub, sub, *_test("t.py::a"), bad, *_test("t.py::b"), _session(1))
    run = read_channel(text, exit_code=1, timed_out=False)
    assert run.valid and run.passed() == {"t.py::a"} and run.outcome("t.py::b").outcome == "failed"


def test_a_timed_out_run_passes_nothing() -> None:
    text = _lines(COLLECTED, *_test("t.py::a"))
    run = read_channel(text, exit_code=124, timed_out=True)
    assert run.outcome("t.py::a").outcome == "passed" and run.passed() == set()
