"""A pytest plugin recording every test phase's report as one JSON line; copied into each test env.

Stand-alone (no conveyor imports). The grader's bootstrap (`pytest_bootstrap.py`, run as
`conveyor_pytest.py`) imports it before any project code, calls `configure(...)` and hands it
to `pytest.main`. Nothing is read from the environment, so the test process cannot redirect it.

Lines written to the outcome channel (a file descriptor the grader opened outside the sandbox):
- `{"kind": "report", "nodeid", "when", "outcome", "wasxfail", "subtest", "exc_type",
  "message", "duration"}`: one per phase (setup, call, teardown) as pytest finally saw it, plus
  one per subtest (`subtest: true`: reports made while the test function runs, e.g. unittest's
  `subTest`), which can only fail their test;
- `{"kind": "collect_error", "nodeid", "message"}`: a module that failed to import or collect;
- `{"kind": "collected", "nodeids"}`: the items left after the selection, once.
The grader folds the phases into one outcome per test and rejects duplicates.

A test runs at most `timeout_s` (setup + call + teardown); past it the test fails with
`TestTimeout` raised by SIGALRM (an infinite loop in pure Python is interrupted).

The settings are module globals set once by `configure` (the writer, the selection as a
frozenset, the timeout) and the JSON encoder is bound at import, before any project code runs:
the bootstrap's snapshot holds every global of this module except `_in_call` by identity, so
code that replaced the writer or the encoder (here, or `json.dumps` itself) is reported as
tampering after the test (`pytest_bootstrap.py`).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

import pytest

_MESSAGE_CHARS = 600
_dumps = json.dumps
_write_line: Callable[[str], None] | None = None
_select: frozenset[str] | None = None
_timeout_s = 0.0
_in_call: str | None = None  # the test whose function runs now (changes; not guarded)
MUTABLE = frozenset({"_in_call"})


class TestTimeout(Exception):
    """The test ran past its per-test timeout."""

    __test__ = False


def configure(write: Callable[[str], None], select: list[str] | None, timeout_s: float) -> None:
    """Where records go (`write` takes one line), which node ids run, and the per-test alarm;
    called once, before any project code runs."""
    global _write_line, _select, _timeout_s
    _write_line = write
    _select = frozenset(select) if select is not None else None
    _timeout_s = float(timeout_s)


def _write(record: dict[str, Any]) -> None:
    if _write_line is not None:
        _write_line(_dumps(record) + "\n")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Keep only the selected node ids, if a selection was given."""
    wanted = _select
    if wanted is None:
        return
    kept = [item for item in items if item.nodeid in wanted]
    deselected = [item for item in items if item.nodeid not in wanted]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = kept


def pytest_collection_finish(session: Any) -> None:
    """Record what will run, so the grader can check every item reported exactly once."""
    _write({"kind": "collected", "nodeids": [item.nodeid for item in session.items]})


def pytest_collectreport(report: Any) -> None:
    """Record modules that failed to collect (import errors, syntax errors)."""
    if report.failed:
        message = str(report.longrepr)[-_MESSAGE_CHARS:]
        _write({"kind": "collect_error", "nodeid": report.nodeid, "message": message})


def _on_alarm(signum: int, frame: Any) -> None:
    raise TestTimeout(f"test exceeded {_timeout_s:g} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    """Arm the per-test alarm around setup, call and teardown."""
    timeout = _timeout_s
    if timeout > 0:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        if timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    """Mark the test function's run: reports made meanwhile are its subtests'."""
    global _in_call
    _in_call = item.nodeid
    try:
        yield
    finally:
        _in_call = None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """Write the phase's report as pytest will see it (outermost wrapper: after every other
    plugin had its say), at once, so a record already written cannot be changed in memory."""
    outcome = yield
    report = outcome.get_result()
    record: dict[str, Any] = {
        "kind": "report",
        "nodeid": item.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "wasxfail": hasattr(report, "wasxfail"),
        "subtest": report.when == "call" and _in_call == item.nodeid,
        "exc_type": None,
        "message": None,
        "duration": float(getattr(report, "duration", 0.0)),
    }
    if report.failed and call.excinfo is not None:
        record["exc_type"] = call.excinfo.type.__name__
        text = str(call.excinfo.value) or call.excinfo.typename
        record["message"] = text[:_MESSAGE_CHARS]
    _write(record)
