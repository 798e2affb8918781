"""Issue 28, point 1: the grader judges the tree git wrote, not the patch's text.

The agent's whole patch is applied with `git apply`; what it changed is read from the resulting
tree against the starting state, and protected changes are reverted from it
(`guards.restore_protected`). So a patch whose file names git reads differently than a regex
would (quoted names with octal escapes), one mixing `diff --git` sections with plain `---/+++`
sections, or one making a symlink cannot get a `conftest.py` into the graded tree. Unit tests on
real trees and real `git apply`; attacks through `grade(row, patch)` and `conveyor tasks grade
--patch` on the tiny project and (slow) on a factory-built inflection row.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from factory_sets import factory_rows
from tiny_project import CALC, buggy_calc, tiny_row
from typer.testing import CliRunner

from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.tasks.swe import guards
from conveyor.tasks.swe.cli import tasks_app
from conveyor.tasks.swe.dataset import SweRow
from conveyor.tasks.swe.grading import GradeReport, grade
from conveyor.tasks.swe.guards import protection_rules, restore_protected
from conveyor.tasks.swe.patches import apply_patch, file_diff, tree_diff

AVAILABLE, WHY = bubblewrap_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=WHY)
FIX = file_diff("tinycalc/__init__.py", buggy_calc(), CALC)


def forcing_conftest(nodeids: list[str]) -> str:
    """A conftest that turns the named tests' failures into passes (only those: a targeted
    forgery, as a policy that read the failing tests' names in the issue would write)."""
    return (
        "import pytest\n\n"
        f"FORCED = {sorted(nodeids)!r}\n\n\n"
        "@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n"
        "    if item.nodeid in FORCED:\n"
        "        report = outcome.get_result()\n"
        '        report.outcome = "passed"\n'
        "        report.longrepr = None\n"
    )


def _added(name: str, text: str) -> list[str]:
    body = [f"+{line}\n" for line in text.split("\n")[:-1]]
    return [f"@@ -0,0 +1,{len(body)} @@\n", *body]


def quoted_name_patch(text: str) -> str:
    """`conftest.py` named with an octal escape in git's quoted form: git creates
    `conftest.py`; a regex reading `a/(\\S+)` saw no such name."""
    head = 'diff --git "a/con\\146test.py" "b/con\\146test.py"\nnew file mode 100644\n'
    head += '--- /dev/null\n+++ "b/con\\146test.py"\n'
    return head + "".join(_added("conftest.py", text))


def mixed_sections_patch(text: str) -> str:
    """A `diff --git` section (a harmless new file), then a plain, svn-style `---/+++` section
    creating `conftest.py`: split at `diff --git` headers only, it hid inside the first
    section, while git applies both."""
    git = file_diff("NOTES.txt", None, "notes\n")
    plain = "Index: conftest.py\n" + "=" * 67 + "\n--- /dev/null\n+++ b/conftest.py\n"
    return git + plain + "".join(_added("conftest.py", text))


def symlink_patch(text: str) -> str:
    """A library file holding the forgery and `conftest.py` as a symlink to it."""
    link = (
        "diff --git a/conftest.py b/conftest.py\nnew file mode 120000\n--- /dev/null\n"
        "+++ b/conftest.py\n@@ -0,0 +1 @@\n+forged_hooks.py\n\\ No newline at end of file\n"
    )
    return file_diff("forged_hooks.py", None, text) + link


ATTACKS = {"quoted_name": quoted_name_patch, "mixed_sections": mixed_sections_patch}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode())
    return root


def _copy(template: Path, to: Path) -> Path:
    shutil.copytree(template, to, symlinks=True)
    return to


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_git_and_the_guard_agree_on_what_a_patch_creates(tmp_path: Path, attack: str) -> None:
    template = _tree(tmp_path / "template", {"pkg/__init__.py": "", "tests/test_a.py": "t\n"})
    workspace = _copy(template, tmp_path / "ws")
    apply_patch(workspace, ATTACKS[attack]("import os\n"))
    assert (workspace / "conftest.py").is_file(), "git created it"
    reverted = restore_protected(workspace, template, protection_rules(template))
    assert reverted == {"conftest.py": "test configuration"}
    assert not (workspace / "conftest.py").exists()


def test_protected_changes_are_restored_byte_for_byte_with_their_mode(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "x = 1\n",
        "pkg/tests/test_b.py": "b\r\n",
        "tests/test_a.py": "a\r\n\f\u2028",
        "setup.cfg": "[tool:pytest]\n",
    }
    template = _tree(tmp_path / "template", files)
    os.chmod(template / "tests/test_a.py", 0o640)
    workspace = _copy(template, tmp_path / "ws")
    patch = file_diff("tests/test_a.py", files["tests/test_a.py"], "assert True\n")
    patch += file_diff("pkg/tests/test_b.py", files["pkg/tests/test_b.py"], None)
    patch += file_diff("setup.cfg", files["setup.cfg"], "[tool:pytest]\naddopts = -x\n")
    patch += file_diff("pkg/__init__.py", "x = 1\n", "x = 2\n")
    patch += file_diff("pkg/tests/test_new.py", None, "def test_x():\n    pass\n")
    apply_patch(workspace, patch)
    os.chmod(workspace / "setup.cfg", 0o755)
    rules = protection_rules(template, test_ids=["pkg/tests/test_b.py::test_b"])
    assert restore_protected(workspace, template, rules) == {
        "pkg/tests/test_b.py": "test file",
        "pkg/tests/test_new.py": "test file",
        "setup.cfg": "test configuration",
        "tests/test_a.py": "test file",
    }
    changed = tree_diff(template, workspace)
    assert changed.patch == file_diff("pkg/__init__.py", "x = 1\n", "x = 2\n")
    assert (workspace / "tests/test_a.py").stat().st_mode & 0o777 == 0o640
    assert (workspace / "setup.cfg").stat().st_mode & 0o777 == 0o644


def test_a_mode_change_alone_counts_as_a_change(tmp_path: Path) -> None:
    template = _tree(tmp_path / "template", {"conftest.py": "import os\n", "run.py": "x\n"})
    workspace = _copy(template, tmp_path / "ws")
    os.chmod(workspace / "conftest.py", 0o755)
    os.chmod(workspace / "run.py", 0o755)
    reverted = restore_protected(workspace, template, protection_rules(template))
    assert reverted == {"conftest.py": "test configuration"}
    assert not os.access(workspace / "conftest.py", os.X_OK) and os.access(
        workspace / "run.py", os.X_OK
    )


def test_symlinks_fifos_binary_files_and_protected_folders_are_reverted(tmp_path: Path) -> None:
    template = _tree(
        tmp_path / "template",
        {"pkg/__init__.py": "", "pkg/mod.py": "m\n", "tests/test_a.py": "a\n"},
    )
    workspace = _copy(template, tmp_path / "ws")
    apply_patch(workspace, symlink_patch("import os\n"))  # conftest.py -> forged_hooks.py
    shutil.rmtree(workspace / "tests")
    (workspace / "tests").symlink_to(tmp_path)  # a test folder replaced by a symlink
    (workspace / "pkg/mod.py").unlink()
    (workspace / "pkg/mod.py").symlink_to("/etc/passwd")
    os.mkfifo(workspace / "pkg/pipe")
    (workspace / "pkg/data.bin").write_bytes(b"\x7fELF\x00\xff")
    _tree(workspace, {"sitecustomize/__init__.py": "import os\n", "sitecustomize/x.py": ""})
    _tree(workspace, {"pkg/new.py": "fine = True\n"})
    reverted = restore_protected(workspace, template, protection_rules(template))
    assert reverted == {
        "conftest.py": "symlink",
        "pkg/data.bin": "binary file",
        "pkg/mod.py": "symlink",
        "pkg/pipe": "not a regular file",
        "sitecustomize/__init__.py": "interpreter start-up or byte code",
        "sitecustomize/x.py": "interpreter start-up or byte code",
        "tests": "symlink",
        "tests/test_a.py": "test file",  # what the symlink hid is restored
    }
    left = tree_diff(template, workspace)
    assert left.refused == {}
    assert sorted(left.patch.split("diff --git")[1:]) == sorted(
        file_diff(p, None, t).removeprefix("diff --git")
        for p, t in (("forged_hooks.py", "import os\n"), ("pkg/new.py", "fine = True\n"))
    )


def test_a_file_in_the_way_of_a_protected_folder_is_removed(tmp_path: Path) -> None:
    template = _tree(tmp_path / "template", {"pkg/__init__.py": "", "pkg/conftest.py": "c\n"})
    workspace = _copy(template, tmp_path / "ws")
    shutil.rmtree(workspace / "pkg")
    (workspace / "pkg").write_text("not a folder\n")
    reverted = restore_protected(workspace, template, protection_rules(template))
    assert reverted == {
        "pkg": "in the way of a protected path",
        "pkg/conftest.py": "test configuration",
    }
    assert (workspace / "pkg/conftest.py").read_text() == "c\n"
    assert not (workspace / "pkg/__init__.py").exists(), "the agent's own deletion stands"


def _grade(row: SweRow, patch: str) -> GradeReport:
    return asyncio.run(grade(row, patch))


@needs_sandbox
@pytest.mark.parametrize("attack", [*sorted(ATTACKS), "symlink"])
def test_patch_parsing_attacks_score_zero_through_grade(
    attack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = tiny_row()
    make = {**ATTACKS, "symlink": symlink_patch}[attack]
    cheat = make(forcing_conftest(row.FAIL_TO_PASS))
    report = _grade(row, cheat)
    assert report.patch_applied and not report.resolved and report.f2p_passed == 0
    assert report.dropped_paths["conftest.py"] in ("test configuration", "symlink")
    with_fix = _grade(row, cheat + FIX)
    assert with_fix.resolved, "the guard reverts the cheat, not the fix"
    if attack in ATTACKS:  # (a symlinked conftest is also caught by the bootstrap)
        # The adversary is real: with the tree guard off, git writes the conftest and it wins.
        monkeypatch.setattr(guards, "restore_protected", lambda *args: {})
        assert _grade(row, cheat).resolved


def _cli_grade(tmp_path: Path, row: SweRow, patch: str) -> dict[str, object]:
    tasks = tmp_path / "rows.jsonl"
    tasks.write_text(row.to_json() + "\n")
    patch_file = tmp_path / "attack.diff"
    patch_file.write_bytes(patch.encode())
    args = ["grade", "--tasks", str(tasks), "--instance", row.instance_id, "--json"]
    result = CliRunner().invoke(tasks_app, [*args, "--patch", str(patch_file)])
    assert result.exit_code == 0, result.output
    summary: dict[str, object] = json.loads(result.output.strip().splitlines()[-1])
    assert "conftest.py" in result.output, "the CLI names the reverted file"
    return summary


@needs_sandbox
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_patch_parsing_attacks_score_zero_through_the_cli(tmp_path: Path, attack: str) -> None:
    row = tiny_row(f"tinycalc__cli_{attack}")
    summary = _cli_grade(tmp_path, row, ATTACKS[attack](forcing_conftest(row.FAIL_TO_PASS)))
    assert summary["resolved"] is False and summary["f2p_passed"] == 0


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_patch_parsing_attacks_score_zero_on_a_factory_project(
    tmp_path: Path, attack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inflection: its tests are one root-level module (hidden in mutation tasks), so the
    conftest sits beside them."""
    row = factory_rows("inflection", "0.5.1")[0]
    cheat = ATTACKS[attack](forcing_conftest(row.FAIL_TO_PASS))
    assert _grade(row, row.patch).resolved
    report = _grade(row, cheat)
    assert not report.resolved and report.f2p_passed == 0
    assert report.dropped_paths == {"conftest.py": "test configuration"}
    summary = _cli_grade(tmp_path, row, cheat)
    assert summary["resolved"] is False and summary["f2p_passed"] == 0
    monkeypatch.setattr(guards, "restore_protected", lambda *args: {})
    assert _grade(row, cheat).resolved, "the adversary is real"


def test_git_apply_ignores_the_hosts_line_end_conversion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`core.autocrlf` in the host's git configuration (which `git apply` honours even outside
    a repository) must not rewrite what a patch writes."""
    home = tmp_path / "home"
    home.mkdir()
    config = ["git", "config", "--file", str(home / ".gitconfig"), "core.autocrlf", "true"]
    subprocess.run(config, check=True)
    monkeypatch.setenv("HOME", str(home))
    root = _tree(tmp_path / "r", {"a.py": "x\r\n"})
    apply_patch(root, file_diff("a.py", "x\r\n", "y\r\n") + file_diff("b.py", None, "z\n"))
    assert (root / "a.py").read_bytes() == b"y\r\n" and (root / "b.py").read_bytes() == b"z\n"
