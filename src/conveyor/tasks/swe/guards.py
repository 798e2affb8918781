"""Guards of the reward: which of an agent's changes may reach the grader.

The agent's workspace is never graded in place, and what its patch changes is never read from
the patch's text. The grader applies the whole patch with `git apply` to a fresh copy of the
task's starting state, then compares the resulting tree with the starting state
(`tree_changes`: `lstat`, bytes, permission bits) and reverts every changed path that is
protected or cannot be trusted (`restore_protected`): a new protected file is deleted, a
modified or deleted one is restored byte for byte with its mode, and so is whatever a symlink,
fifo or device, or a binary (not UTF-8) file, replaced. So git and the guard cannot disagree on
what a patch touched (quoted names, mixed git/plain sections, renames). The hidden test patch is
applied after that.

Protected: the tests the task declares (`DeclaredTests`: the hidden test patch's paths, the
F2P/P2P node ids' files and the folders holding them, top-level `test`/`tests`/`testing`
folders; not a name pattern, so a library module named `test_*.py` is the agent's to edit),
`conftest.py` anywhere and test configuration files, and files that would change how Python or
pytest start: `sitecustomize`/`usercustomize` modules or packages anywhere, `.pth` files,
package metadata with `pytest11` entry points, byte code, top-level modules shadowing the test
environment's own packages (`pytest.py`, `_pytest/`, ...), modules named like the standard
library (`signal.py`, `json/`) in any folder that is not a package (such a folder may be put on
`sys.path`: the project's root, `src/`, a test's rootdir), and the grader's own
`.conveyor-grade/` folder. The sdist workspace has no version-control history to mine.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.tasks.swe.patches import BINARY_FILE, PatchError, patch_paths, read_text
from conveyor.tasks.swe.tree_changes import TreeEntry, changed_paths, scan_tree

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
TEST_FILE = "test file"
_RUNNER_MODULES = frozenset({"pytest", "_pytest", "py", "pluggy", "conveyor_outcomes"})
STDLIB_MODULES = frozenset(sys.stdlib_module_names) - {"__future__"}
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")
_BYTECODE_SUFFIXES = (".pyc", ".pyo", ".pth")
_NOT_TEST_MODULES = frozenset({"__init__.py", "conftest.py"})


def is_test_file(path: str) -> bool:
    """Test code by its name: under a `test`/`tests`/`testing` folder, `test_*.py`,
    `*_test.py`. The factory's rule for telling a project's tests from its library when it
    makes tasks; the grader protects what a task declares instead (`DeclaredTests`)."""
    *folders, name = path.split("/")
    return (
        any(folder in TEST_DIRS for folder in folders)
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
        or name == "conftest.py"
    )


@dataclass(frozen=True)
class DeclaredTests:
    """The tests a task declares: test files and test folders (everything beneath them).
    Top-level `test`/`tests`/`testing` folders are test folders of every task."""

    files: frozenset[str] = frozenset()
    folders: frozenset[str] = frozenset()

    def holds(self, path: str) -> bool:
        """Whether `path` (repository-relative, normalised) is declared test code."""
        if path in self.files or path.split("/")[0] in TEST_DIRS:
            return True
        return any(path == folder or path.startswith(folder + "/") for folder in self.folders)


def declared_tests(
    template: Path, test_patch: str, test_ids: Iterable[str], import_root: str = "."
) -> DeclaredTests:
    """The tests of a task: the paths its hidden `test_patch` touches (as git reads them), the
    files of its node ids, and the folder of each such file where that folder is a test
    folder: named `test`/`tests`/`testing`, or holding (in the starting state `template`) no
    Python module but declared or test-named ones, `__init__.py` and `conftest.py`. The
    repository root, the import root and a top-level package of the library are never test
    folders (their test files are protected one by one)."""
    try:
        files = set(patch_paths(test_patch))
    except PatchError:  # a broken test patch is reported when it is applied
        files = set()
    # A node id's file is test code, unless it is a library module collected for its doctests
    # (`pkg/mod.py::pkg.mod.func`): that file is the agent's to edit.
    files |= {nodeid.split("::")[0] for nodeid in test_ids if not _doctest_of_library(nodeid)}
    files = {posixpath.normpath(f) for f in files if f}
    root = posixpath.normpath(import_root)
    folders = set()
    for file in files:
        folder = posixpath.dirname(file)
        if folder in ("", root) or _is_top_level_package(template, folder, root):
            continue
        if posixpath.basename(folder) in TEST_DIRS or _holds_only_tests(template, folder, files):
            folders.add(folder)
    return DeclaredTests(frozenset(files), frozenset(folders))


def _doctest_of_library(nodeid: str) -> bool:
    """A doctest item of a module that is not named like a test (`a/b.py::a.b.func`: the part
    after `::` is a dotted name, not a test function or class)."""
    path, _, rest = nodeid.partition("::")
    name = posixpath.basename(path)
    test_named = name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
    return not test_named and "." in rest.split("::")[0].split("[")[0]


def _is_top_level_package(template: Path, folder: str, root: str) -> bool:
    parent = posixpath.dirname(folder) or "."
    named_tests = posixpath.basename(folder) in TEST_DIRS
    return parent == root and not named_tests and (template / folder / "__init__.py").is_file()


def _holds_only_tests(template: Path, folder: str, declared: set[str]) -> bool:
    here = template / folder
    if not here.is_dir():
        return True  # a folder the hidden tests bring
    for module in here.glob("*.py"):
        name = module.name
        test_named = name.startswith("test_") or name.endswith("_test.py")
        if not (test_named or name in _NOT_TEST_MODULES or f"{folder}/{name}" in declared):
            return False
    return True


def protection_reason(
    path: str,
    shadowed: Iterable[str] = (),
    packages: Iterable[str] = (),
    tests: DeclaredTests | None = None,
) -> str | None:
    """Why the grader reverts an agent's change to `path` (repository-relative), or None.

    `shadowed` are the top-level module names of the test environment (pytest, pluggy, ...):
    a new file or folder of that name at the repository root would be imported instead.
    `packages` are the starting state's package folders (holding `__init__.py`); a module named
    like the standard library is allowed only inside one of them. `tests` are the task's
    declared tests (without them, only top-level test folders count as tests).
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
    if (tests or DeclaredTests()).holds("/".join(parts)):
        return TEST_FILE
    if name.endswith(_BYTECODE_SUFFIXES):
        return "interpreter start-up or byte code"
    if any(p.endswith(_METADATA_SUFFIXES) or p == "__pycache__" for p in parts):
        return "package metadata or cache"
    runner = set(shadowed) | _RUNNER_MODULES
    for index, stem in enumerate(stems):
        if stem in runner and (index == 0 or "/".join(parts[:index]) not in inside):
            return "shadows a module of the test environment"
    return None


@dataclass(frozen=True)
class ProtectionRules:
    """What `protection_reason` needs to judge a task's paths (see there)."""

    shadowed: frozenset[str] = frozenset()
    packages: frozenset[str] = frozenset()
    tests: DeclaredTests = field(default_factory=DeclaredTests)

    def reason(self, path: str) -> str | None:
        """Why a change to `path` is reverted, or None."""
        return protection_reason(path, self.shadowed, self.packages, self.tests)


def protection_rules(
    template: Path,
    *,
    pythonpath: str = ".",
    venv_modules: Iterable[str] = (),
    test_patch: str = "",
    test_ids: Iterable[str] = (),
) -> ProtectionRules:
    """The rules of a task whose starting state is `template`: `venv_modules` are the test
    environment's top-level modules (the project's own are not shadowed by itself)."""
    own = project_modules(template / pythonpath)
    return ProtectionRules(
        shadowed=frozenset(set(venv_modules) - own),
        packages=package_dirs(template),
        tests=declared_tests(template, test_patch, test_ids, pythonpath),
    )


def project_modules(root: Path) -> frozenset[str]:
    """Top-level module names a project folder (its import root) provides: they are the
    project's own even where the test venv holds a copy (attrs under hypothesis, say)."""
    if not root.is_dir():
        return frozenset()
    names = {p.stem for p in root.glob("*.py")}
    names |= {p.parent.name for p in root.glob("*/__init__.py")}
    return frozenset(names)


def package_dirs(root: Path) -> frozenset[str]:
    """Folders of the tree at `root` (repository-relative) that hold an `__init__.py`."""
    found = set()
    for folder, _, files in os.walk(root):
        if "__init__.py" in files:
            found.add(Path(folder).relative_to(root).as_posix())
    return frozenset(found - {"."})


def restore_protected(workspace: Path, template: Path, rules: ProtectionRules) -> dict[str, str]:
    """Revert, in `workspace`, every change from `template` the grader does not accept, and
    name each reverted path with why.

    Changes are read from the two trees (`tree_changes.changed_paths`), never from a patch. A
    change is reverted when the new entry is a symlink, fifo or device, when its path is
    protected (`rules`), or when it is a binary (not UTF-8) file. Reverting deletes what is
    there now and puts back the starting state's entry, bytes and mode, if it had one; a new
    folder whose path is protected goes with all it holds (each file it held is named). A
    symlink or file standing where a protected path needs its folder is removed too."""
    before, after = scan_tree(template), scan_tree(workspace)
    reverted: dict[str, str] = {}
    removed_folders: list[str] = []
    for path in changed_paths(template, workspace, before, after):
        if any(path.startswith(folder + "/") for folder in removed_folders):
            continue
        new = after.get(path)
        reason = _refusal(path, workspace, new, rules)
        if reason is None:
            continue
        _revert(path, workspace, template, before.get(path), reverted)
        if new is not None and new.kind == "dir":  # named by the files it held
            removed_folders.append(path)
            held = [p for p, e in after.items() if p.startswith(path + "/") and e.kind != "dir"]
            reverted |= dict.fromkeys(held or [path], reason)
        else:
            reverted[path] = reason
    return reverted


def _refusal(
    path: str, workspace: Path, new: TreeEntry | None, rules: ProtectionRules
) -> str | None:
    """Why the change at `path` (now `new`, None if deleted) is reverted, or None."""
    if new is not None and new.kind == "symlink":
        return "symlink"
    if new is not None and new.kind == "other":
        return "not a regular file"
    if reason := rules.reason(path):
        return reason
    if new is not None and new.kind == "file" and read_text(workspace / path) is None:
        return BINARY_FILE
    return None


def _revert(
    path: str, workspace: Path, template: Path, old: TreeEntry | None, reverted: dict[str, str]
) -> None:
    target = workspace / path
    _remove(target)
    if old is None or old.kind == "other":
        return
    _make_folders(workspace, template, path, reverted)
    source = template / path
    if old.kind == "dir":
        target.mkdir()
        os.chmod(target, old.mode)
    elif old.kind == "symlink":
        os.symlink(old.target or "", target)
    else:
        shutil.copyfile(source, target, follow_symlinks=False)
        os.chmod(target, old.mode)
    _own_like(source, target)


def _remove(target: Path) -> None:
    if stat.S_ISDIR(_lstat_mode(target)):
        shutil.rmtree(target)
    elif os.path.lexists(target):
        target.unlink()


def _lstat_mode(target: Path) -> int:
    try:
        return target.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return 0


def _make_folders(workspace: Path, template: Path, path: str, reverted: dict[str, str]) -> None:
    """Make `path`'s folders in `workspace` real folders again (as in `template`)."""
    parts = path.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        folder = "/".join(parts[:depth])
        here = workspace / folder
        if stat.S_ISDIR(_lstat_mode(here)):
            continue
        if os.path.lexists(here):
            here.unlink()
            reverted[folder] = "in the way of a protected path"
        here.mkdir()
        source = template / folder
        if stat.S_ISDIR(_lstat_mode(source)):
            os.chmod(here, stat.S_IMODE(source.lstat().st_mode))
            _own_like(source, here)


def _own_like(source: Path, target: Path) -> None:
    """Give `target` the owner of `source` (the sandbox user may write its own files)."""
    if os.geteuid() == 0 and os.path.lexists(source):
        info = source.lstat()
        os.lchown(target, info.st_uid, info.st_gid)
