"""A tiny `pypi:`-style project whose library files hold what naive text handling breaks.

`tinytext/crlf.py` has CRLF line ends, `tinytext/pages.py` a form feed and Unicode line
separators (U+2028, U+2029, NEL, \\x1c) next to its code, and `tinytext/test_tools.py` is a
library module named like a test (as markdown's `markdown/test_tools.py`). Each row puts a bug
in one of them; its visible and hidden tests check the fix.
"""

from __future__ import annotations

from typing import Literal

from tiny_project import write_source

from conveyor.tasks.swe.dataset import RowEnvironment, SweRow
from conveyor.tasks.swe.patches import file_diff

NAME = "conveyor-tinytext"
VERSION = "1.0"
Bug = Literal["crlf", "pages", "test_tools"]

CRLF = (
    '"""Upper-casing, written on Windows."""\r\n'
    "\r\n"
    "\r\n"
    "def shout(text):\r\n"
    '    """text in capitals, with an exclamation mark."""\r\n'
    '    return text.upper() + "!"\r\n'
)

PAGES = (
    '"""Page helpers: this file holds a form feed and Unicode line separators."""\n'
    "\n"
    'SEPARATORS = "\u2028\u2029\x85\x1c"\n'
    "\f\n"
    "def count_separators(text):\n"
    "    return sum(text.count(c) for c in SEPARATORS)\n"
)

TEST_TOOLS = '''"""Helpers for tests of code using tinytext (a library module, not a test)."""


def is_shout(text):
    """Whether text is a shout: capitals ending in an exclamation mark."""
    return text.isupper() and text.endswith("!")
'''

TESTS = """from tinytext.crlf import shout
from tinytext.pages import count_separators
from tinytext.test_tools import is_shout


def test_shout():
    assert shout("hi") == "HI!"


def test_count_separators():
    assert count_separators("a\\u2028b\\x85c") == 2


def test_is_shout():
    assert is_shout("HI!")
"""

HIDDEN = """from tinytext.crlf import shout
from tinytext.pages import count_separators
from tinytext.test_tools import is_shout


def test_shout_keeps_punctuation():
    assert shout("ok.") == "OK.!"


def test_every_separator_counts():
    assert count_separators("\\u2028\\u2029\\x85\\x1c") == 4


def test_a_question_is_no_shout():
    assert not is_shout("HI?")
"""

# (library file, its fixed text, its buggy text, visible F2P test, hidden F2P test)
BUGS: dict[str, tuple[str, str, str, str, str]] = {
    "crlf": (
        "tinytext/crlf.py",
        CRLF,
        CRLF.replace("upper()", "lower()"),
        "test_shout",
        "test_shout_keeps_punctuation",
    ),
    "pages": (
        "tinytext/pages.py",
        PAGES,
        PAGES.replace("in SEPARATORS)", "in SEPARATORS[1:])"),
        "test_count_separators",
        "test_every_separator_counts",
    ),
    "test_tools": (
        "tinytext/test_tools.py",
        TEST_TOOLS,
        TEST_TOOLS.replace('endswith("!")', 'endswith("?")'),
        "test_is_shout",
        "test_a_question_is_no_shout",
    ),
}
VISIBLE = ["test_shout", "test_count_separators", "test_is_shout"]
HIDDEN_TESTS = [
    "test_shout_keeps_punctuation",
    "test_every_separator_counts",
    "test_a_question_is_no_shout",
]


def ensure_text_project() -> None:
    """The pristine project tree under the cache's `src/` (written once, byte-exact)."""
    write_source(
        NAME,
        VERSION,
        {
            "tinytext/__init__.py": '"""Tiny text helpers."""\n',
            "tinytext/crlf.py": CRLF,
            "tinytext/pages.py": PAGES,
            "tinytext/test_tools.py": TEST_TOOLS,
            "tests/test_text.py": TESTS,
            "setup.cfg": "[tool:pytest]\ntestpaths = tests\n",
        },
    )


def text_fix(bug: Bug) -> str:
    """The gold patch of `bug`'s row."""
    path, fixed, buggy, _, _ = BUGS[bug]
    return file_diff(path, buggy, fixed)


def text_row(bug: Bug) -> SweRow:
    """The row whose bug is in `bug`'s library file (see the module doc)."""
    ensure_text_project()
    path, fixed, buggy, visible, hidden = BUGS[bug]
    f2p = [f"tests/test_text.py::{visible}", f"tests/test_hidden.py::{hidden}"]
    every = [f"tests/test_text.py::{t}" for t in VISIBLE]
    every += [f"tests/test_hidden.py::{t}" for t in HIDDEN_TESTS]
    return SweRow(
        instance_id=f"tinytext__{bug}",
        repo=f"pypi:{NAME}",
        version=VERSION,
        problem_statement=f"{visible} fails.",
        patch=file_diff(path, buggy, fixed),
        test_patch=file_diff("tests/test_hidden.py", None, HIDDEN),
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=[t for t in every if t not in f2p],
        environment=RowEnvironment(setup_patch=file_diff(path, fixed, buggy)),
    )
