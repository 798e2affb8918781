"""Guards of the reward: what of an agent's changes may reach the grader.

The agent's workspace is never graded in place. Its diff against the task's starting state is
taken, every file section touching a protected path is dropped, and what is left is applied to a
fresh copy of the starting state, to which the hidden test patch is then applied. So edits to
test files, `conftest.py` files and test configuration are reverted by construction (the fresh
copy holds the originals), and so are files that would change how Python or pytest start:
`sitecustomize`/`usercustomize` modules or packages anywhere, `.pth` files, package metadata
with `pytest11` entry points, byte code, top-level modules shadowing the test environment's own
packages (`pytest.py`, `_pytest/`, ...), modules named like the standard library (`signal.py`,
`json/`) in any folder that is not a package (such a folder may be put on `sys.path`: the
project's root, `src/`, a test's rootdir), and the grader's own `.conveyor-grade/` folder.
Symlinks never enter a diff. The sdist workspace has no version-control history to mine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.swe.patches import split_patch

TEST_DIRS = frozenset({"test", "tests", "testing"})
TEST_CONFIG_FILES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
    }
)
STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})
GRADER_DIR = ".conveyor-grade"
_RUNNER_MODULES = frozenset({"pytest", "_pytest", "py", "pluggy", "conveyor_outcomes"})
STDLIB_MODULES = frozenset(sys.stdlib_module_names) - {"__future__"}
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")
_BYTECODE_SUFFIXES = (".pyc", ".pyo", ".pth")


def is_test_file(path: str) -> bool:
    """Test code: under a `test`/`tests`/`testing` folder, `test_*.py`, `*_test.py`."""
    *folders, name = path.split("/")
    return (
        any(folder in TEST_DIRS for folder in folders)
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
        or name == "conftest.py"
    )


def protection_reason(
    path: str, shadowed: Iterable[str] = (), packages: Iterable[str] = ()
) -> str | None:
    """Why the grader ignores an agent's change to `path` (repository-relative), or None.

    `shadowed` are the top-level module names of the test environment (pytest, pluggy, ...):
    a new file or folder of that name at the repository root would be imported instead.
    `packages` are the starting state's package folders (holding `__init__.py`); a module named
    like the standard library is allowed only inside one of them.
    """
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return "path outside the repository"
    if parts[0] == GRADER_DIR:
        return "the grader's folder"
    name = parts[-1]
    stems = [p.removesuffix(".py") for p in parts]
    if any(stem in STARTUP_MODULES for stem in stems):
        return "interpreter start-up or byte code"
    inside = set(packages)
    for index, stem in enumerate(stems):
        if stem in STDLIB_MODULES and "/".join(parts[:index]) not in inside:
            return "shadows a standard-library module"
    if name in TEST_CONFIG_FILES:
        return "test configuration"
    if is_test_file(path):
        return "test file"
    if name.endswith(_BYTECODE_SUFFIXES):
        return "interpreter start-up or byte code"
    if any(p.endswith(_METADATA_SUFFIXES) or p == "__pycache__" for p in parts):
        return "package metadata or cache"
    runner = set(shadowed) | _RUNNER_MODULES
    for index, stem in enumerate(stems):
        if stem in runner and (index == 0 or "/".join(parts[:index]) not in inside):
            return "shadows a module of the test environment"
    return None


def project_modules(root: Path) -> frozenset[str]:
    """Top-level module names a project folder (its import root) provides: they are the
    project's own even where the test venv holds a copy (attrs under hypothesis, say)."""
    if not root.is_dir():
        return frozenset()
    names = {p.stem for p in root.glob("*.py")}
    names |= {p.parent.name for p in root.glob("*/__init__.py")}
    return frozenset(names)


@dataclass
class GuardedPatch:
    """An agent's patch split into what reaches the grader and what was dropped (and why)."""

    kept: str
    dropped: dict[str, str] = field(default_factory=dict)


def package_dirs(root: Path) -> frozenset[str]:
    """Folders of the tree at `root` (repository-relative) that hold an `__init__.py`."""
    found = set()
    for folder, _, files in os.walk(root):
        if "__init__.py" in files:
            found.add(Path(folder).relative_to(root).as_posix())
    return frozenset(found - {"."})


def guard_patch(
    patch: str, shadowed: Iterable[str] = (), packages: Iterable[str] = ()
) -> GuardedPatch:
    """Drop every file section of `patch` that touches a protected path (see the module doc)."""
    names, inside = list(shadowed), frozenset(packages)
    kept: list[str] = []
    dropped: dict[str, str] = {}
    for part in split_patch(patch):
        paths = {part.path, *_renamed_from(part.text)}
        reasons = [r for p in paths if (r := protection_reason(p, names, inside)) is not None]
        if reasons:
            dropped[part.path] = reasons[0]
        else:
            kept.append(part.text if part.text.endswith("\n") else part.text + "\n")
    return GuardedPatch("".join(kept), dropped)


def _renamed_from(text: str) -> list[str]:
    """Old paths a section also touches (renames, copies, and its `---` line)."""
    found = []
    for line in text.splitlines()[:8]:
        for prefix in ("rename from ", "copy from ", "--- a/"):
            if line.startswith(prefix):
                found.append(line[len(prefix) :].strip())
    return found
