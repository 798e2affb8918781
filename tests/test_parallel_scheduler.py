"""The parallel scheduler of tests/conftest.py, run on a small suite of its own (pytester).

Real pytest-xdist workers; the suite's conftest is a copy of ours, so its hooks are the ones
`scripts/test.sh` runs the whole suite with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

OURS = Path(__file__).with_name("conftest.py")


def _suite(pytester: pytest.Pytester, durations: dict[str, float]) -> Path:
    pytester.makeconftest(OURS.read_text())
    (pytester.path / "durations.json").write_text(json.dumps(durations))
    order = pytester.path / "order.txt"
    body = (
        "from pathlib import Path\n\n"
        "def test_{n}():\n"
        f"    with Path({str(order)!r}).open('a') as f:\n"
        "        f.write('{name}\\n')\n"
    )
    # `many` has the most tests: xdist's own order would run it first.
    pytester.makepyfile(
        test_many="\n".join(body.format(n=i, name="many") for i in range(5)),
        test_one_slow=body.format(n=0, name="one_slow"),
        test_one_fast=body.format(n=0, name="one_fast"),
    )
    return order


def test_the_group_the_last_run_timed_longest_goes_first(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    order = _suite(pytester, {"test_one_slow.py": 600.0, "test_one_fast.py": 0.1})
    out = pytester.path / "measured.json"
    monkeypatch.setenv("CONVEYOR_TEST_DURATIONS_OUT", str(out))
    result = pytester.runpytest_subprocess(
        "-n", "1", "--dist", "loadgroup", "-p", "no:randomly", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=7)
    ran = order.read_text().split()
    # one_slow (600 s last time) first; many (5 tests, untimed: 5 s) before one_fast (0.1 s)
    assert ran == ["one_slow"] + ["many"] * 5 + ["one_fast"]
    # This run's seconds per group, for refreshing durations.json
    assert sorted(json.loads(out.read_text())) == [
        f"test_{n}.py" for n in ("many", "one_fast", "one_slow")
    ]


def test_without_a_durations_file_the_most_tests_go_first(pytester: pytest.Pytester) -> None:
    order = _suite(pytester, {})
    (pytester.path / "durations.json").unlink()
    result = pytester.runpytest_subprocess(
        "-n", "1", "--dist", "loadgroup", "-p", "no:randomly", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=7)
    assert order.read_text().split()[:5] == ["many"] * 5


def test_a_replacement_worker_that_collects_other_tests_still_gets_work(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker retires at each new file (limit 0 MB); its replacement collects one file
    differently (ids from the worker's name). xdist's own scheduler leaves such a worker
    without work, and with one worker the run never ends."""
    order = _suite(pytester, {"test_dynamic.py": 900.0})  # runs first, on the first worker
    pytester.makepyfile(
        test_dynamic=(
            "import os\nimport pytest\n\n"
            "@pytest.mark.parametrize('who', [os.environ.get('PYTEST_XDIST_WORKER')])\n"
            "def test_named(who):\n    pass\n"
        )
    )
    monkeypatch.setenv("CONVEYOR_TEST_WORKER_RETIRE_MB", "0")
    result = pytester.runpytest_subprocess(
        "-n", "1", "--dist", "loadgroup", "--max-worker-restart", "10",
        "-p", "no:randomly", "-p", "no:cacheprovider", timeout=120,
    )  # fmt: skip
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["*collected other tests than the run: 1 missing*"])
    assert sorted(order.read_text().split()) == sorted(["one_slow", "one_fast"] + ["many"] * 5)
