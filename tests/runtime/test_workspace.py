"""Per-rollout workspaces: every method copies the template, none lets an edit reach it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from conveyor.agent.tools import ToolContext
from conveyor.runtime.bubblewrap import BubblewrapRuntime, bubblewrap_available
from conveyor.runtime.limits import SANDBOX_UID
from conveyor.runtime.workspace import (
    WorkspaceMethod,
    make_workspace,
    overlay_available,
    sweep_stale,
    time_methods,
)
from conveyor.tasks.swe.tools import str_replace_editor
from conveyor.types import Task
from crashed_workspace import orphan_workspace

BWRAP_OK, BWRAP_REASON = bubblewrap_available()
needs_bwrap = pytest.mark.skipif(not BWRAP_OK, reason=f"bubblewrap unusable here: {BWRAP_REASON}")
IS_ROOT = os.geteuid() == 0


def make_template(folder: Path, *, git: bool = False) -> Path:
    files = {
        "README.md": "# demo\n",
        "pkg/__init__.py": "",
        "pkg/core.py": "def add(a, b):\n    return a + b\n",
        "tests/test_core.py": "from pkg.core import add\n\n\ndef test_add():\n"
        "    assert add(1, 2) == 3\n",
    }
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    if git:
        subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
        subprocess.run(["git", "add", "-A"], cwd=folder, check=True)
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"],
            cwd=folder,
            check=True,
        )
    return folder


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(folder).parts
    }


def mounted(path: Path) -> bool:
    return any(
        line.split()[4] == str(path)
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


METHODS: list[WorkspaceMethod] = ["copy", "hardlink", "git-worktree"]
if IS_ROOT:
    METHODS.append("overlay")


@pytest.mark.parametrize("method", METHODS)
def test_each_method_reproduces_the_template_and_removes_cleanly(
    tmp_path: Path, method: WorkspaceMethod, request: pytest.FixtureRequest
) -> None:
    template = make_template(tmp_path / "template", git=method == "git-worktree")
    if method == "overlay" and not overlay_available(tmp_path / "root"):
        pytest.skip("overlayfs cannot be mounted here")
    before = digest(template)
    workspace = make_workspace(template, tmp_path / "root", method=method)
    request.addfinalizer(workspace.remove)
    assert workspace.method == method
    assert digest(workspace.path) == before
    assert workspace.marker.exists()
    if IS_ROOT:
        assert workspace.path.stat().st_uid == SANDBOX_UID
    assert mounted(workspace.path) == (method == "overlay")
    workspace.remove()
    workspace.remove()
    assert not workspace.path.exists() and not workspace.marker.exists()
    assert not mounted(workspace.path)
    assert list((tmp_path / "root").iterdir()) == []
    assert digest(template) == before
    if method == "git-worktree":
        listing = subprocess.run(
            ["git", "-C", str(template), "worktree", "list"], capture_output=True, text=True
        ).stdout
        assert len(listing.splitlines()) == 1


@needs_bwrap
@pytest.mark.skipif(not IS_ROOT, reason="the sandbox user must differ from the template's owner")
@pytest.mark.parametrize("method", ["auto", "copy", "hardlink"])
def test_sandboxed_edits_never_reach_the_template(tmp_path: Path, method: WorkspaceMethod) -> None:
    template = make_template(tmp_path / "template")
    before = digest(template)
    with make_workspace(template, tmp_path / "root", method=method) as workspace:
        edit_in_sandbox(workspace.path, method)
        assert digest(template) == before
    assert not workspace.path.exists()
    assert digest(template) == before


def edit_in_sandbox(path: Path, method: str) -> None:
    async def scenario() -> None:
        rt = BubblewrapRuntime(path)
        await rt.start()
        ctx = ToolContext(
            task=Task(id="t", family="swe", prompt=[{"role": "user", "content": "fix it"}]),
            runtime=rt,
        )
        edited = await str_replace_editor(
            command="str_replace",
            path="/workspace/pkg/core.py",
            old_str="a + b",
            new_str="a - b",
            ctx=ctx,
        )
        assert "a - b" in edited
        sed = await rt.exec("sed -i 's/demo/changed/' README.md && cat README.md", 10)
        assert sed.exit_code == 0 and sed.stdout == "# changed\n"
        append = await rt.exec("echo '# appended' >> tests/test_core.py", 10)
        if method == "hardlink":
            # Shared files belong to root: an in-place write is refused, not written through.
            assert append.exit_code != 0 and "Permission denied" in append.stderr
        else:
            assert append.exit_code == 0
            assert (path / "tests/test_core.py").read_text().endswith("# appended\n")
        await rt.close()

    asyncio.run(scenario())
    assert (path / "pkg/core.py").read_text() == "def add(a, b):\n    return a - b\n"


@pytest.mark.skipif(not IS_ROOT, reason="ownership checks need root")
def test_hardlinks_refuse_a_template_the_sandbox_user_could_write(tmp_path: Path) -> None:
    template = make_template(tmp_path / "template")
    os.chown(template / "pkg/core.py", SANDBOX_UID, SANDBOX_UID)
    with pytest.raises(PermissionError, match="write through to the template"):
        make_workspace(template, tmp_path / "root", method="hardlink")
    assert [p.name for p in (tmp_path / "root").iterdir()] == []


def test_sweep_removes_what_a_crashed_process_left(tmp_path: Path) -> None:
    template = make_template(tmp_path / "template")
    root = tmp_path / "root"
    orphan = orphan_workspace(template, root)
    mine = make_workspace(template, root)
    assert sweep_stale(root) == [orphan]
    assert not orphan.exists() and not mounted(orphan)
    assert mine.path.exists() and sweep_stale(root) == []
    mine.remove()
    assert list(root.iterdir()) == []


def test_unknown_method_and_missing_template_fail_loudly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown workspace method 'reflink'"):
        make_workspace(tmp_path, tmp_path / "root", method="reflink")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        make_workspace(tmp_path / "missing", tmp_path / "root")


def test_time_methods_measures_every_applicable_method(tmp_path: Path) -> None:
    template = make_template(tmp_path / "template", git=True)
    timings = time_methods(template, tmp_path / "root", repeats=1)
    expected = {"copy", "hardlink", "git-worktree"} | (
        {"overlay"} if overlay_available((tmp_path / "root").resolve()) else set()
    )
    assert set(timings) == expected
    assert all(0 < seconds < 10 for seconds in timings.values())
