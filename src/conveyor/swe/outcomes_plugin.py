"""A pytest plugin recording one JSON line per test outcome; copied into each test environment.

Stand-alone (no conveyor imports): it is loaded inside the sandbox as `-p conveyor_outcomes`
from the environment's read-only plugin folder. Environment variables:

- `CONVEYOR_OUTCOMES`: the JSON-lines file to append to (flushed per test, so a run killed at
  its deadline still leaves the outcomes of the tests that finished);
- `CONVEYOR_SELECT`: optional JSON file with a list of node ids; other tests are deselected;
- `CONVEYOR_TEST_TIMEOUT`: seconds per test (setup + call + teardown); past it the test fails
  with `TestTimeout` raised by SIGALRM (an infinite loop in pure Python is interrupted).

Lines: `{"kind": "test", "nodeid", "outcome", "phase", "exc_type", "message", "duration"}` with
outcome passed / failed / error / skipped / xfailed / xpassed, and `{"kind": "collect_error",
"nodeid", "message"}` for modules that failed to import or collect.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

_MESSAGE_CHARS = 600
_records: dict[str, dict[str, Any]] = {}


class TestTimeout(Exception):
    """The test ran past CONVEYOR_TEST_TIMEOUT seconds."""

    __test__ = False


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get("CONVEYOR_OUTCOMES")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Keep only the selected node ids, if a selection was given."""
    select = os.environ.get("CONVEYOR_SELECT")
    if not select:
        return
    with open(select, encoding="utf-8") as handle:
        wanted = set(json.load(handle))
    kept = [item for item in items if item.nodeid in wanted]
    deselected = [item for item in items if item.nodeid not in wanted]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = kept


def pytest_collectreport(report: Any) -> None:
    """Record modules that failed to collect (import errors, syntax errors)."""
    if report.failed:
        message = str(report.longrepr)[-_MESSAGE_CHARS:]
        _write({"kind": "collect_error", "nodeid": report.nodeid, "message": message})


def _on_alarm(signum: int, frame: Any) -> None:
    raise TestTimeout(f"test exceeded {os.environ.get('CONVEYOR_TEST_TIMEOUT')} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    """Arm the per-test alarm around setup, call and teardown; write the test's record."""
    timeout = float(os.environ.get("CONVEYOR_TEST_TIMEOUT") or 0)
    if timeout > 0:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        if timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
        record = _records.pop(item.nodeid, None)
        if record is not None:
            _write(record)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """Record the phase's report as pytest will see it (outermost wrapper: after every other
    plugin had its say), with the exception type and message of a failure."""
    outcome = yield
    report = outcome.get_result()
    record = _records.setdefault(
        item.nodeid,
        {
            "kind": "test",
            "nodeid": item.nodeid,
            "outcome": "passed",
            "phase": "call",
            "exc_type": None,
            "message": None,
            "duration": 0.0,
        },
    )
    record["duration"] += float(getattr(report, "duration", 0.0))
    if report.skipped:
        if record["outcome"] == "passed":
            record["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
            record["phase"] = report.when
        return
    if report.passed and hasattr(report, "wasxfail") and report.when == "call":
        record["outcome"] = "xpassed"
        return
    if not report.failed or record["outcome"] in ("failed", "error"):
        return
    record["outcome"] = "failed" if report.when == "call" else "error"
    record["phase"] = report.when
    if call.excinfo is not None:
        record["exc_type"] = call.excinfo.type.__name__
        text = str(call.excinfo.value) or call.excinfo.typename
        record["message"] = text[:_MESSAGE_CHARS]
