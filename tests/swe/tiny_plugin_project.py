"""A tiny installable project whose tests read its metadata and load its entry points.

Its `pyproject.toml` declares an entry point group of its own (`tinyplug.ops`) and a `pytest11`
plugin in library code (`tinyplug/plugin.py`), so it checks both halves of issue 14's install
rule: the project's metadata and entry points work in the grader, and its own pytest plugin
(code the policy may edit) is never loaded.
"""

from __future__ import annotations

from pathlib import Path

from tiny_project import write_source

from conveyor.tasks.swe.dataset import RowEnvironment, SweRow
from conveyor.tasks.swe.patches import file_diff

NAME = "conveyor-tinyplug"
VERSION = "1.0"

PYPROJECT = f"""[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{NAME}"
version = "{VERSION}"

[project.entry-points.pytest11]
tinyplug = "tinyplug.plugin"

[project.entry-points."tinyplug.ops"]
add = "tinyplug:add"

[tool.setuptools]
packages = ["tinyplug"]
"""

LIBRARY = '''"""Tiny library."""


def add(a, b):
    """Sum of a and b."""
    return a + b
'''

PLUGIN = '"""The project\'s pytest plugin (loaded only where the project is installed)."""\n'

TESTS = """from importlib.metadata import entry_points, version

from tinyplug import add


def test_version():
    assert version("conveyor-tinyplug") == "1.0"


def test_entry_point():
    (op,) = entry_points(group="tinyplug.ops")
    assert op.load()(2, 3) == 5


def test_add():
    assert add(2, 3) == 5
"""


def buggy_library() -> str:
    """The library with its bug: add subtracts."""
    return LIBRARY.replace("return a + b", "return a - b")


def ensure_project() -> Path:
    """The pristine project tree under the cache's `src/` (written once)."""
    files = {
        "pyproject.toml": PYPROJECT,
        "tinyplug/__init__.py": LIBRARY,
        "tinyplug/plugin.py": PLUGIN,
        "tests/test_plug.py": TESTS,
    }
    return write_source(NAME, VERSION, files)


def plugin_row() -> SweRow:
    """A row whose bug is in `add`; the metadata test must keep passing."""
    ensure_project()
    return SweRow(
        instance_id="tinyplug__add_bug",
        repo=f"pypi:{NAME}",
        version=VERSION,
        problem_statement="add() subtracts instead of adding.",
        patch=file_diff("tinyplug/__init__.py", buggy_library(), LIBRARY),
        FAIL_TO_PASS=["tests/test_plug.py::test_add", "tests/test_plug.py::test_entry_point"],
        PASS_TO_PASS=["tests/test_plug.py::test_version"],
        environment=RowEnvironment(
            setup_patch=file_diff("tinyplug/__init__.py", LIBRARY, buggy_library())
        ),
    )
