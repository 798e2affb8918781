"""The SWE tools: the editor's SWE-agent semantics, confinement, and bash in real runtimes."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext, ToolOutcome, ToolRegistry
from conveyor.runtime.base import Runtime
from conveyor.runtime.bubblewrap import BubblewrapRuntime, bubblewrap_available
from conveyor.runtime.limits import SANDBOX_GID, SANDBOX_UID
from conveyor.runtime.local import LocalRuntime
from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.tasks.swe.tools import make_bash_tool, swe_tool_registry
from conveyor.types import Task, ToolCall

T = TypeVar("T")
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BWRAP_OK, BWRAP_REASON = bubblewrap_available()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def context(runtime: Runtime) -> ToolContext:
    task = Task(id="t", family="swe", prompt=[{"role": "user", "content": "fix it"}])
    return ToolContext(task=task, runtime=runtime)


async def simulated(files: dict[str, str] | None = None) -> ToolContext:
    runtime = SimulatedRuntime(files if files is not None else {"pkg/calc.py": CODE})
    await runtime.start()
    return context(runtime)


async def edit(ctx: ToolContext, registry: ToolRegistry | None = None, **args: Any) -> ToolOutcome:
    registry = registry or swe_tool_registry()
    call = ToolCall(name="str_replace_editor", arguments=args)
    return await registry.execute(call, ctx, timeout_s=30, max_output_chars=20000)


async def content(ctx: ToolContext, path: str = "pkg/calc.py") -> str:
    assert ctx.runtime is not None
    return await ctx.runtime.read_file(path)


def test_registry_and_schemas() -> None:
    registry = swe_tool_registry()
    assert registry.names == ["bash", "str_replace_editor", "finish"]
    editor = next(s for s in registry.schemas() if s["function"]["name"] == "str_replace_editor")
    params = editor["function"]["parameters"]
    assert params["required"] == ["command", "path"]
    assert params["properties"]["command"]["enum"] == [
        "view",
        "create",
        "str_replace",
        "insert",
        "undo_edit",
    ]
    assert "ctx" not in params["properties"]
    assert swe_tool_registry(bash_timeout_s=5).get("bash") is not registry.get("bash")


def test_view_numbers_lines_and_honours_ranges() -> None:
    async def scenario() -> None:
        ctx = await simulated()
        whole = await edit(ctx, command="view", path="/workspace/pkg/calc.py")
        assert whole.kind == "ok"
        assert "     1\tdef add(a, b):\n     2\t    return a + b\n" in whole.output
        assert whole.output.rstrip().endswith("     6\t    return a - b")
        part = await edit(ctx, command="view", path="pkg/calc.py", view_range=[5, -1])
        assert part.output.splitlines()[1:] == [
            "     5\tdef sub(a, b):",
            "     6\t    return a - b",
        ]
        clamped = await edit(ctx, command="view", path="pkg/calc.py", view_range=[6, 99])
        assert clamped.output.splitlines()[1:] == ["     6\t    return a - b"]
        for bad in ([0, 2], [7, 8], [4, 2], [1]):
            assert (await edit(ctx, command="view", path="pkg/calc.py", view_range=bad)).is_error

    run(scenario())


def test_view_of_a_folder_lists_two_levels_without_hidden_files() -> None:
    async def scenario() -> None:
        ctx = await simulated(
            {"a/b/c/deep.py": "", "a/top.py": "", ".git/config": "", "a/.hidden": "", "r.md": ""}
        )
        listing = await edit(ctx, command="view", path="/workspace")
        lines = listing.output.splitlines()[1:]
        assert lines == [
            "/workspace/a/",
            "/workspace/a/b/",
            "/workspace/a/top.py",
            "/workspace/r.md",
        ]

    run(scenario())


def test_create_refuses_an_existing_file() -> None:
    async def scenario() -> None:
        ctx = await simulated()
        made = await edit(ctx, command="create", path="/workspace/pkg/new.py", file_text="x = 1\n")
        assert made.kind == "ok" and await content(ctx, "pkg/new.py") == "x = 1\n"
        again = await edit(ctx, command="create", path="pkg/new.py", file_text="y = 2\n")
        assert again.is_error and "already exists" in again.output
        assert await content(ctx, "pkg/new.py") == "x = 1\n"
        assert (await edit(ctx, command="create", path="pkg/other.py")).is_error

    run(scenario())


def test_str_replace_needs_exactly_one_match() -> None:
    async def scenario() -> None:
        ctx = await simulated()
        none = await edit(
            ctx, command="str_replace", path="pkg/calc.py", old_str="a * b", new_str=""
        )
        assert none.is_error and "did not appear verbatim" in none.output
        several = await edit(ctx, command="str_replace", path="pkg/calc.py", old_str="(a, b):")
        assert several.is_error and "2 times" in several.output and "lines 1, 5" in several.output
        assert await content(ctx) == CODE
        done = await edit(
            ctx, command="str_replace", path="pkg/calc.py", old_str="a - b", new_str="b - a"
        )
        assert done.kind == "ok"
        assert "     6\t    return b - a" in done.output and "     2\t" in done.output
        assert await content(ctx) == CODE.replace("a - b", "b - a")

    run(scenario())


def test_insert_and_undo_restore_each_step() -> None:
    async def scenario() -> None:
        ctx = await simulated()
        top = await edit(
            ctx, command="insert", path="pkg/calc.py", insert_line=0, new_str="import os"
        )
        assert top.kind == "ok" and (await content(ctx)).startswith("import os\ndef add")
        end = await edit(
            ctx, command="insert", path="pkg/calc.py", insert_line=7, new_str="\n\nX = 1\n"
        )
        assert end.kind == "ok" and (await content(ctx)).endswith("return a - b\n\n\nX = 1\n")
        bad = await edit(ctx, command="insert", path="pkg/calc.py", insert_line=99, new_str="x")
        assert bad.is_error and "not within" in bad.output
        assert (await edit(ctx, command="undo_edit", path="pkg/calc.py")).kind == "ok"
        assert (await content(ctx)).startswith("import os\n")
        assert (await edit(ctx, command="undo_edit", path="/workspace/pkg/calc.py")).kind == "ok"
        assert await content(ctx) == CODE
        empty = await edit(ctx, command="undo_edit", path="pkg/calc.py")
        assert empty.is_error and "no edit history" in empty.output

    run(scenario())


def test_paths_outside_the_workspace_are_refused() -> None:
    async def scenario() -> None:
        ctx = await simulated()
        for path in ["/etc/passwd", "../outside.py", "/workspace/../etc/passwd"]:
            outcome = await edit(ctx, command="view", path=path)
            assert outcome.is_error and "outside the workspace" in outcome.output
            created = await edit(ctx, command="create", path=path, file_text="x")
            assert created.is_error
        assert (await edit(ctx, command="view", path="missing.py")).output.endswith(
            "does not exist"
        )

    run(scenario())


async def local_ctx(workspace: Path) -> ToolContext:
    runtime = LocalRuntime(workspace)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        await runtime.start()
    return context(runtime)


def test_symlinks_out_of_a_real_workspace_are_refused(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("secret\n")
    (workspace / "link.py").symlink_to(secret)
    (workspace / "dir_link").symlink_to(tmp_path)

    async def scenario() -> None:
        ctx = await local_ctx(workspace)
        for args in (
            {"command": "view", "path": "link.py"},
            {"command": "str_replace", "path": "link.py", "old_str": "secret", "new_str": "x"},
            {"command": "create", "path": "dir_link/new.py", "file_text": "x"},
            {"command": "insert", "path": "link.py", "insert_line": 0, "new_str": "x"},
        ):
            outcome = await edit(ctx, **args)
            assert outcome.is_error and "outside the workspace" in outcome.output, args
        assert secret.read_text() == "secret\n" and not (tmp_path / "new.py").exists()

    run(scenario())


def test_edits_keep_every_other_byte_of_the_file(tmp_path: Path) -> None:
    """A CRLF file stays CRLF where the agent writes "\n" (its view shows the file as it is),
    and form feeds, U+2028 and a missing last newline survive edits: a file is read and written
    byte-exact, never through newline translation."""
    crlf = "def add(a, b):\r\n    return a - b\r\n\r\n\r\ndef sub(a, b):\r\n    return a - b\r\n"
    odd = "x = 1\n\f\ny = '\u2028\x85\x1c'\nz = 3"
    (tmp_path / "crlf.py").write_bytes(crlf.encode())
    (tmp_path / "odd.py").write_bytes(odd.encode())

    async def scenario() -> None:
        ctx = await local_ctx(tmp_path)
        fix = "add(a, b):\n    return a - b"
        done = await edit(
            ctx, command="str_replace", path="crlf.py", old_str=fix, new_str=fix.replace("-", "+")
        )
        assert done.kind == "ok", done.output
        await edit(ctx, command="insert", path="crlf.py", insert_line=0, new_str="# added\n")
        await edit(ctx, command="str_replace", path="odd.py", old_str="z = 3", new_str="z = 4")

    run(scenario())
    expected = "# added\r\n" + crlf.replace("a - b", "a + b", 1)
    assert (tmp_path / "crlf.py").read_bytes() == expected.encode()
    assert (tmp_path / "odd.py").read_bytes() == odd.replace("z = 3", "z = 4").encode()


def test_bash_reports_output_exit_code_truncation_and_timeouts(tmp_path: Path) -> None:
    async def scenario() -> None:
        ctx = await local_ctx(tmp_path)
        registry = ToolRegistry([make_bash_tool(timeout_s=1.0, max_output_chars=2000)])

        async def bash(command: str) -> ToolOutcome:
            call = ToolCall(name="bash", arguments={"command": command})
            return await registry.execute(call, ctx, timeout_s=30, max_output_chars=100000)

        ok = await bash("echo out; echo err >&2; exit 3")
        assert ok.kind == "ok" and ok.output == "out\nerr\n[exit code: 3]"
        long = await bash("seq 1 100000")
        assert "characters truncated" in long.output and len(long.output) < 2200
        assert long.output.startswith("1\n2\n") and long.output.endswith("100000\n[exit code: 0]")
        hung = await bash("echo started; sleep 60")
        assert hung.kind == "raised" and hung.elapsed_s < 5
        assert "timed out after 1 s" in hung.output and "started" in hung.output

    run(scenario())


@pytest.mark.skipif(not BWRAP_OK, reason=f"bubblewrap unusable here: {BWRAP_REASON}")
def test_editor_and_bash_in_the_bubblewrap_sandbox(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "pkg").mkdir(parents=True)
    (workspace / "pkg/calc.py").write_text(CODE)
    for path in (workspace, workspace / "pkg", workspace / "pkg/calc.py"):
        os.chown(path, SANDBOX_UID, SANDBOX_GID)

    async def scenario() -> None:
        runtime = BubblewrapRuntime(workspace)
        await runtime.start()
        ctx = context(runtime)
        registry = swe_tool_registry()
        fixed = await edit(
            ctx,
            registry,
            command="str_replace",
            path="/workspace/pkg/calc.py",
            old_str="a - b",
            new_str="b - a",
        )
        assert fixed.kind == "ok"
        call = ToolCall(name="bash", arguments={"command": "grep -n 'b - a' pkg/calc.py"})
        shown = await registry.execute(call, ctx, timeout_s=30, max_output_chars=4000)
        assert shown.output == "6:    return b - a\n[exit code: 0]"
        escape = await edit(ctx, registry, command="view", path="/etc/passwd")
        assert escape.is_error
        await runtime.close()

    run(scenario())
