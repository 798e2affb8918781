"""Diffs of trees, their application, and the guards that drop protected paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.swe.guards import guard_patch, package_dirs, project_modules, protection_reason
from conveyor.swe.patches import PatchError, apply_patch, diff_trees, file_diff, split_patch


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_diff_of_trees_applies_back_exactly(tmp_path: Path) -> None:
    old = _tree(tmp_path / "old", {"a.py": "x = 1\ny = 2\n", "gone.py": "z\n", "b/c.py": "no eol"})
    new = _tree(tmp_path / "new", {"a.py": "x = 1\ny = 3\n", "b/c.py": "still no eol", "n.py": "n"})
    (new / "__pycache__").mkdir()
    (new / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0junk")
    patch = diff_trees(old, new)
    assert [p.path for p in split_patch(patch)] == ["a.py", "b/c.py", "gone.py", "n.py"]
    assert "\\ No newline at end of file" in patch
    apply_patch(old, patch)
    assert diff_trees(old, new) == ""
    assert not (old / "gone.py").exists() and (old / "n.py").read_text() == "n"


def test_a_patch_that_does_not_fit_raises(tmp_path: Path) -> None:
    root = _tree(tmp_path / "r", {"a.py": "x = 1\n"})
    with pytest.raises(PatchError):
        apply_patch(root, file_diff("a.py", "something else\n", "y\n"))


def test_split_patch_keeps_removed_lines_that_look_like_headers() -> None:
    text = "-- a\n++ b\n"
    patch = file_diff("f.txt", text, "x\n") + file_diff("g.py", None, "g\n")
    assert [p.path for p in split_patch(patch)] == ["f.txt", "g.py"]


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("pkg/mod.py", None),
        ("pkg/testing.py", None),
        ("tests/test_x.py", "test file"),
        ("pkg/tests/helpers.py", "test file"),
        ("test_top.py", "test file"),
        ("pkg/mod_test.py", "test file"),
        ("conftest.py", "test configuration"),
        ("pkg/sub/conftest.py", "test configuration"),
        ("pytest.ini", "test configuration"),
        ("tox.ini", "test configuration"),
        ("setup.cfg", "test configuration"),
        ("pyproject.toml", "test configuration"),
        ("sitecustomize.py", "interpreter start-up or byte code"),
        ("sitecustomize/__init__.py", "interpreter start-up or byte code"),
        ("src/usercustomize.py", "interpreter start-up or byte code"),
        ("pkg/sitecustomize.py", "interpreter start-up or byte code"),
        ("signal.py", "shadows a standard-library module"),
        ("json/__init__.py", "shadows a standard-library module"),
        ("src/json.py", "shadows a standard-library module"),
        ("pkg/json.py", None),
        ("src/hypothesis/__init__.py", "shadows a module of the test environment"),
        ("pkg/hypothesis.py", None),
        (".conveyor-grade/outcomes.jsonl", "the grader's folder"),
        ("pkg/evil.pth", "interpreter start-up or byte code"),
        ("pkg/__pycache__/mod.cpython-311.pyc", "interpreter start-up or byte code"),
        ("x.dist-info/entry_points.txt", "package metadata or cache"),
        ("pytest.py", "shadows a module of the test environment"),
        ("_pytest/runner.py", "shadows a module of the test environment"),
        ("hypothesis/__init__.py", "shadows a module of the test environment"),
        ("../escape.py", "path outside the repository"),
    ],
)
def test_protection_reasons(path: str, reason: str | None) -> None:
    # `pkg` is a package of the starting state: a module in it is never imported by its bare
    # name; `src` and the root are not, and may be on sys.path.
    assert protection_reason(path, shadowed=["hypothesis"], packages=["pkg"]) == reason


def test_package_dirs_are_the_folders_with_an_init(tmp_path: Path) -> None:
    for rel in ("src/pkg/__init__.py", "src/pkg/sub/__init__.py", "src/loose/m.py", "setup.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert package_dirs(tmp_path) == {"src/pkg", "src/pkg/sub"}
    assert project_modules(tmp_path / "src") == {"pkg"}
    assert project_modules(tmp_path) == {"setup"}


def test_guard_patch_keeps_only_library_changes() -> None:
    patch = (
        file_diff("pkg/mod.py", "a\n", "b\n")
        + file_diff("tests/test_mod.py", "assert f()\n", "assert True\n")
        + file_diff("conftest.py", None, "import pytest\n")
    )
    guarded = guard_patch(patch)
    assert [p.path for p in split_patch(guarded.kept)] == ["pkg/mod.py"]
    assert guarded.dropped == {
        "tests/test_mod.py": "test file",
        "conftest.py": "test configuration",
    }


def test_a_rename_out_of_a_test_file_is_dropped() -> None:
    patch = (
        "diff --git a/tests/test_a.py b/pkg/a.py\nsimilarity index 100%\n"
        "rename from tests/test_a.py\nrename to pkg/a.py\n"
    )
    assert guard_patch(patch).dropped == {"pkg/a.py": "test file"}
