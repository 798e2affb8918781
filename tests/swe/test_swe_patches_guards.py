"""Diffs of trees, their application, and the protection rules of paths (the tree guard's
reverts are in test_swe_tree_guard.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conveyor.tasks.swe.guards import (
    DeclaredTests,
    declared_tests,
    package_dirs,
    project_modules,
    protection_reason,
)
from conveyor.tasks.swe.patches import (
    PatchError,
    apply_patch,
    diff_trees,
    file_diff,
    patch_paths,
    split_lines,
    split_patch,
    tree_diff,
)


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


DECLARED = DeclaredTests(
    files=frozenset({"test_top.py", "pkg/tests/test_a.py", "pkg/mod_test.py"}),
    folders=frozenset({"pkg/tests"}),
)


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("pkg/mod.py", None),
        ("pkg/testing.py", None),
        ("tests/test_x.py", "test file"),
        ("testing/anything.txt", "test file"),
        ("pkg/tests/helpers.py", "test file"),
        ("test_top.py", "test file"),
        ("pkg/mod_test.py", "test file"),
        # Named like tests, declared by no task: library modules (markdown's test_tools.py).
        ("pkg/test_tools.py", None),
        ("pkg/other_test.py", None),
        ("pkg/sub/tests/helpers.py", None),
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
    # name; `src` and the root are not, and may be on sys.path. Tests are what the task
    # declares (plus top-level test folders), not what a name looks like.
    rules = dict(shadowed=["hypothesis"], packages=["pkg"], tests=DECLARED)
    assert protection_reason(path, **rules) == reason  # type: ignore[arg-type]


def test_package_dirs_are_the_folders_with_an_init(tmp_path: Path) -> None:
    for rel in ("src/pkg/__init__.py", "src/pkg/sub/__init__.py", "src/loose/m.py", "setup.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert package_dirs(tmp_path) == {"src/pkg", "src/pkg/sub"}
    assert project_modules(tmp_path / "src") == {"pkg"}
    assert project_modules(tmp_path) == {"setup"}


# Text no str.splitlines()/universal-newline reader keeps: every line separator Python knows.
ODD_TEXTS = {
    "crlf": "a = 1\r\nb = 2\r\nc = 3\r\n",
    "crlf_no_eol": "a = 1\r\nb = 2\r\nc = 3",
    "lone_cr": "a = 1\rb = 2\nc = 3\r",
    "mixed_ends": "a\r\nb\nc\rd\r\n",
    "form_feed": "def f():\n    pass\n\f\ndef g():\n    return 1\n",
    "separators": "x = '\x1c\x1d\x1e'\ny = '\x85'\nz = '\u2028\u2029'\n",
    "vertical_tab": "a\x0bb\nc\n",
    "no_eol": "one\ntwo",
    "only_newlines": "\n\n\n",
    "empty": "",
}


def _write_bytes(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode())
    return root


@pytest.mark.parametrize("name", sorted(ODD_TEXTS))
def test_diffs_round_trip_any_utf8_text_byte_for_byte(tmp_path: Path, name: str) -> None:
    """`git apply` of our diff reproduces the new tree exactly, whatever the line ends: an edit
    next to the odd characters, a created file and a deleted one."""
    text = ODD_TEXTS[name]
    edited = text.replace("2", "22").replace("c", "cc") + "tail\r\n"
    old = _write_bytes(tmp_path / "old", {"m.py": text, "gone.py": text})
    new = _write_bytes(tmp_path / "new", {"m.py": edited, "made.py": text + "\f\u2028"})
    diff = tree_diff(old, new)
    assert diff.refused == {}
    apply_patch(old, diff.patch)
    assert (old / "m.py").read_bytes() == edited.encode()
    assert (old / "made.py").read_bytes() == (text + "\f\u2028").encode()
    assert not (old / "gone.py").exists()
    assert tree_diff(old, new).patch == ""


def test_a_one_line_edit_of_a_crlf_file_is_a_one_line_diff() -> None:
    text = ODD_TEXTS["crlf"]
    patch = file_diff("m.py", text, text.replace("b = 2", "b = 3"))
    assert [
        line for line in split_lines(patch) if line[:1] in "+-" and line[:3] not in "+++---"
    ] == [
        "-b = 2\r\n",
        "+b = 3\r\n",
    ]


def test_lines_split_at_newline_only() -> None:
    assert split_lines("a\rb\fc\u2028d\r\ne") == ["a\rb\fc\u2028d\r\n", "e"]
    assert split_lines("a\n") == ["a\n"] and split_lines("") == []
    section = file_diff("f.py", "x\r\ny\u2028\n", "x\r\nz\u2028\n") + file_diff("g.py", None, "\f")
    parts = split_patch(section)
    assert [p.path for p in parts] == ["f.py", "g.py"]
    assert "".join(p.text for p in parts) == section


@pytest.mark.parametrize(
    "name", ["sp ace.py", "t\tab.py", 'q"uote.py', "back\\slash.py", "ünï.py", "new\nline.py"]
)
def test_file_names_are_quoted_as_git_quotes_them(tmp_path: Path, name: str) -> None:
    old = _write_bytes(tmp_path / "old", {f"d/{name}": "a\n", "keep.py": "k\n"})
    new = _write_bytes(tmp_path / "new", {f"d/{name}": "b\n", "keep.py": "k\n", f"{name}": "n"})
    patch = diff_trees(old, new)
    assert patch_paths(patch) == {f"d/{name}", name}
    apply_patch(old, patch)
    assert diff_trees(old, new) == ""


def test_binary_files_symlinks_and_fifos_are_refused_by_name(tmp_path: Path) -> None:
    old = _write_bytes(tmp_path / "old", {"m.py": "a\n", "was_text.dat": "t\n"})
    (old / "same.bin").write_bytes(b"\xff\x00 unchanged")
    (old / "changed.bin").write_bytes(b"\xff\xfe")
    new = _write_bytes(tmp_path / "new", {"m.py": "b\n"})
    (new / "same.bin").write_bytes(b"\xff\x00 unchanged")
    (new / "changed.bin").write_bytes(b"\xff\xfd")
    (new / "was_text.dat").write_bytes(b"\x89PNG\r\n")
    (new / "new.bin").write_bytes(b"\xc3\x28 not utf-8")
    (new / "nul.txt").write_bytes(b"text\0with a NUL\n")
    (new / "link.py").symlink_to("m.py")
    os.mkfifo(new / "pipe")
    diff = tree_diff(old, new)
    assert diff.refused == {
        "changed.bin": "binary file",
        "was_text.dat": "binary file",
        "new.bin": "binary file",
        "nul.txt": "binary file",
        "link.py": "symlink",
        "pipe": "not a regular file",
    }
    assert [p.path for p in split_patch(diff.patch)] == ["m.py"]


def test_mode_changes_are_part_of_the_diff(tmp_path: Path) -> None:
    old = _write_bytes(tmp_path / "old", {"run.sh": "echo 1\n", "tool.sh": "x\n"})
    new = _write_bytes(tmp_path / "new", {"run.sh": "echo 1\n", "tool.sh": "y\n", "new.sh": "z"})
    os.chmod(new / "run.sh", 0o755)
    os.chmod(new / "tool.sh", 0o755)
    os.chmod(new / "new.sh", 0o755)
    patch = diff_trees(old, new)
    assert "old mode 100644\nnew mode 100755\n" in patch and "new file mode 100755\n" in patch
    apply_patch(old, patch)
    assert all(os.access(old / name, os.X_OK) for name in ("run.sh", "tool.sh", "new.sh"))
    assert diff_trees(old, new) == ""


def test_patch_paths_are_read_by_git() -> None:
    quoted = (
        'diff --git "a/con\\146test.py" "b/con\\146test.py"\nnew file mode 100644\n'
        '--- /dev/null\n+++ "b/con\\146test.py"\n@@ -0,0 +1 @@\n+x = 1\n'
    )
    assert patch_paths(quoted) == {"conftest.py"}
    renamed = (
        "diff --git a/tests/test_a.py b/pkg/a.py\nsimilarity index 100%\n"
        "rename from tests/test_a.py\nrename to pkg/a.py\n"
    )
    assert patch_paths(renamed) == {"tests/test_a.py", "pkg/a.py"}
    assert patch_paths("") == set()
    with pytest.raises(PatchError):
        patch_paths("not a patch\n")


def test_declared_tests_are_the_tasks_not_a_name_pattern(tmp_path: Path) -> None:
    template = _write_bytes(
        tmp_path,
        {
            "lib/__init__.py": "",
            "lib/core.py": "",
            "lib/test_tools.py": "",  # a library module (markdown's markdown/test_tools.py)
            "lib/tests/__init__.py": "",
            "lib/tests/test_core.py": "",
            "lib/tests/helpers.py": "",
            "lib/checks/test_more.py": "",
            "lib/checks/test_other.py": "",
            "test_root.py": "",
        },
    )
    hidden = file_diff("lib/tests/test_new.py", None, "def test_x():\n    pass\n")
    ids = ["lib/tests/test_core.py::test_a", "test_root.py::test_b", "lib/checks/test_more.py::t"]
    tests = declared_tests(template, hidden, ids)
    assert tests.files == {
        "lib/tests/test_new.py",
        "lib/tests/test_core.py",
        "test_root.py",
        "lib/checks/test_more.py",
    }
    assert tests.folders == {"lib/tests", "lib/checks"}
    assert tests.holds("lib/tests/helpers.py") and tests.holds("lib/checks/new.py")
    assert not tests.holds("lib/test_tools.py") and not tests.holds("lib/core.py")
    assert not tests.holds("other_root.py") and tests.holds("tests/anything.py")
    # A folder with library code beside a declared test is not a test folder.
    mixed = declared_tests(template, "", ["lib/test_tools.py::test_it"])
    assert mixed.files == {"lib/test_tools.py"} and mixed.folders == frozenset()
