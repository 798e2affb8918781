"""A tiny `pypi:`-style project placed in the SWE cache, for fast grading tests."""

from __future__ import annotations

from pathlib import Path

from conveyor.tasks.swe.dataset import RowEnvironment, SweRow
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.patches import file_diff

NAME = "conveyor-tinycalc"
VERSION = "1.0"

CALC = '''"""Tiny calculator."""


def add(a, b):
    """Sum of a and b."""
    return a + b


def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def spin(n):
    """Counts down to zero."""
    while n > 0:
        n -= 1
    return n
'''

TESTS = """from tinycalc import add, clamp, spin


def test_add():
    assert add(2, 3) == 5


def test_clamp_low():
    assert clamp(-1, 0, 10) == 0


def test_clamp_mid():
    assert clamp(5, 0, 10) == 5


def test_spin():
    assert spin(3) == 0
"""

HIDDEN = """from tinycalc import add


def test_add_negative():
    assert add(-2, -3) == -5
"""

SETUP_CFG = "[tool:pytest]\ntestpaths = tests\n"


def write_source(name: str, version: str, files: dict[str, str]) -> Path:
    """A pristine project tree under the cache's `src/`, as `project_source` would unpack it
    (files rewritten only where they differ)."""
    root = swe_home() / "src" / f"{name}-{version}"
    for rel, text in files.items():
        path = root / rel
        data = text.encode()  # byte-exact: CRLF and other line ends are kept as written
        if not path.exists() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return root


def ensure_project() -> Path:
    """The pristine project tree under the cache's `src/` (written once)."""
    files = {
        "tinycalc/__init__.py": CALC,
        "tests/test_calc.py": TESTS,
        "setup.cfg": SETUP_CFG,
        "README.md": "tiny\n",
    }
    return write_source(NAME, VERSION, files)


def buggy_calc() -> str:
    """The module with its bug: add subtracts."""
    return CALC.replace("return a + b", "return a - b")


def tiny_row(instance_id: str = "tinycalc__add_bug") -> SweRow:
    """A row whose bug is in `add`; one visible and one hidden FAIL_TO_PASS test."""
    ensure_project()
    return SweRow(
        instance_id=instance_id,
        repo=f"pypi:{NAME}",
        version=VERSION,
        problem_statement="add() subtracts instead of adding.",
        patch=file_diff("tinycalc/__init__.py", buggy_calc(), CALC),
        test_patch=file_diff("tests/test_hidden.py", None, HIDDEN),
        FAIL_TO_PASS=["tests/test_calc.py::test_add", "tests/test_hidden.py::test_add_negative"],
        PASS_TO_PASS=[
            "tests/test_calc.py::test_clamp_low",
            "tests/test_calc.py::test_clamp_mid",
            "tests/test_calc.py::test_spin",
        ],
        environment=RowEnvironment(
            setup_patch=file_diff("tinycalc/__init__.py", CALC, buggy_calc())
        ),
    )
