"""The software-engineering tools: `bash` and `str_replace_editor` (SWE-agent/OpenHands style).

Both act only through the rollout's `Runtime` (`exec`, `read_file`, `write_file`, `list_dir`), so
they work the same in every runtime. The editor shows paths as the runtime's agent sees them
(`/workspace/...` in a sandbox), refuses paths outside the workspace (the runtime resolves
symlinks and raises `PermissionError`), and keeps a per-file undo history in `ctx.state`.
Files are read and written byte-exact (no newline translation); in a file whose every line ends
in CRLF, the "\n" of the agent's `old_str`/`new_str` stands for the file's line end, so an
edit keeps the file's line ends.
Mistakes are the policy's: they raise ordinary exceptions, which the registry reports to the model.
"""

from __future__ import annotations

import posixpath
from typing import Literal

from conveyor.agent.tools import Tool, ToolContext, ToolRegistry, finish, tool, truncate_output
from conveyor.runtime.base import Runtime

DEFAULT_BASH_TIMEOUT_S = 120.0
DEFAULT_BASH_OUTPUT_CHARS = 16000
SNIPPET_LINES = 4
_HISTORY_KEY = "editor_history"
_VIEW_DEPTH = 2


class EditorError(ValueError):
    """An editor command that cannot be carried out as asked (the message says why)."""


class CommandTimedOut(RuntimeError):
    """A bash command ran past its time limit and was killed (the policy's doing)."""


def make_bash_tool(
    timeout_s: float = DEFAULT_BASH_TIMEOUT_S, max_output_chars: int = DEFAULT_BASH_OUTPUT_CHARS
) -> Tool:
    """A `bash` tool whose commands the runtime kills after `timeout_s` seconds."""

    @tool(name="bash")
    async def bash(command: str, ctx: ToolContext) -> str:
        """Run a bash command in the repository's sandbox and return its output and exit code.

        Each call starts a fresh shell in the workspace: `cd` and variables do not carry over, and
        background processes end with the command. No network. Long output is truncated.

        Args:
            command: The bash command to run, e.g. `grep -rn "def parse" src | head`.
        """
        result = await _runtime(ctx).exec(command, timeout_s)
        output = result.stdout
        if result.stderr:
            output += ("" if not output or output.endswith("\n") else "\n") + result.stderr
        output = truncate_output(output, max_output_chars)
        if result.timed_out:
            raise CommandTimedOut(
                f"the command timed out after {timeout_s:g} s and was killed; output so far:\n"
                f"{output}"
            )
        return f"{output}[exit code: {result.exit_code}]"

    return bash


bash = make_bash_tool()


@tool
async def str_replace_editor(
    command: Literal["view", "create", "str_replace", "insert", "undo_edit"],
    path: str,
    ctx: ToolContext,
    file_text: str | None = None,
    old_str: str | None = None,
    new_str: str | None = None,
    insert_line: int | None = None,
    view_range: list[int] | None = None,
) -> str:
    """View, create and edit files in the workspace.

    `view` shows a file with line numbers (or a folder two levels deep); `create` makes a new
    file; `str_replace` replaces `old_str`, which must occur exactly once, by `new_str`; `insert`
    puts `new_str` after line `insert_line`; `undo_edit` reverts the last edit of a file.

    Args:
        command: One of view, create, str_replace, insert, undo_edit.
        path: Absolute path of the file or folder, e.g. /workspace/pkg/module.py.
        file_text: The content of the new file (create).
        old_str: The exact text to replace, including whitespace (str_replace).
        new_str: The replacement text (str_replace, default empty) or the text to insert (insert).
        insert_line: Insert after this line number; 0 inserts at the top (insert).
        view_range: [start, end] lines to show, 1-based and inclusive; end -1 means to the end
            (view).
    """
    runtime = _runtime(ctx)
    shown = _display_path(runtime, path)
    if command == "view":
        return await _view(runtime, shown, view_range)
    if command == "create":
        return await _create(runtime, ctx, shown, file_text)
    if command == "str_replace":
        return await _str_replace(runtime, ctx, shown, old_str, new_str)
    if command == "insert":
        return await _insert(runtime, ctx, shown, insert_line, new_str)
    return await _undo(runtime, ctx, shown)


def swe_tool_registry(
    *,
    bash_timeout_s: float = DEFAULT_BASH_TIMEOUT_S,
    bash_output_chars: int = DEFAULT_BASH_OUTPUT_CHARS,
) -> ToolRegistry:
    """`bash`, `str_replace_editor` and `finish`, in that order."""
    if bash_timeout_s == DEFAULT_BASH_TIMEOUT_S and bash_output_chars == DEFAULT_BASH_OUTPUT_CHARS:
        shell = bash
    else:
        shell = make_bash_tool(bash_timeout_s, bash_output_chars)
    return ToolRegistry([shell, str_replace_editor, finish])


def _runtime(ctx: ToolContext) -> Runtime:
    if ctx.runtime is None:
        raise EditorError("this task has no runtime: files and commands are unavailable")
    return ctx.runtime


def _root(runtime: Runtime) -> str:
    return str(getattr(runtime, "root", "/workspace"))


def _display_path(runtime: Runtime, path: str) -> str:
    """`path` normalised under the runtime's root; outside it is refused before any I/O."""
    root = _root(runtime)
    full = posixpath.normpath(posixpath.join(root, path.strip()))
    if full != root and not full.startswith(root.rstrip("/") + "/"):
        raise EditorError(f"the path {path} is outside the workspace {root}")
    return full


async def _read(runtime: Runtime, path: str) -> str:
    try:
        return await runtime.read_file(path)
    except FileNotFoundError:
        raise EditorError(f"the path {path} does not exist") from None
    except PermissionError:
        raise EditorError(f"the path {path} resolves outside the workspace") from None
    except UnicodeDecodeError:
        raise EditorError(f"{path} is not a UTF-8 text file") from None


async def _write(runtime: Runtime, path: str, content: str) -> None:
    try:
        await runtime.write_file(path, content)
    except PermissionError:
        raise EditorError(f"the path {path} resolves outside the workspace") from None


async def _exists(runtime: Runtime, path: str) -> bool:
    try:
        await runtime.read_file(path)
    except FileNotFoundError:
        return False
    except PermissionError:
        raise EditorError(f"the path {path} resolves outside the workspace") from None
    except (IsADirectoryError, UnicodeDecodeError):
        return True
    return True


def _crlf_file(text: str) -> bool:
    """Whether every line of `text` ends in CRLF (and it has one)."""
    return "\r\n" in text and text.count("\n") == text.count("\r\n")


def _crlf(text: str) -> str:
    """`text` with every line end a CRLF."""
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def _numbered(lines: list[str], first: int) -> str:
    return "".join(f"{first + i:6}\t{line}\n" for i, line in enumerate(lines))


def _snippet(text: str, first_changed: int, last_changed: int) -> str:
    """Numbered lines around the changed lines (1-based, inclusive)."""
    lines = _lines(text)
    start = max(1, first_changed - SNIPPET_LINES)
    end = min(len(lines), max(last_changed, first_changed) + SNIPPET_LINES)
    return _numbered(lines[start - 1 : end], start)


def _history(ctx: ToolContext) -> dict[str, list[str]]:
    history: dict[str, list[str]] = ctx.state.setdefault(_HISTORY_KEY, {})
    return history


async def _view(runtime: Runtime, path: str, view_range: list[int] | None) -> str:
    try:
        text = await runtime.read_file(path)
    except IsADirectoryError:
        if view_range is not None:
            raise EditorError("view_range only applies to files, not folders") from None
        entries = await _walk(runtime, path, _VIEW_DEPTH)
        listing = "".join(f"{entry}\n" for entry in entries)
        header = f"Files and folders in {path}, up to {_VIEW_DEPTH} levels deep, hidden excluded"
        return f"{header}:\n{listing}"
    except FileNotFoundError:
        raise EditorError(f"the path {path} does not exist") from None
    except PermissionError:
        raise EditorError(f"the path {path} resolves outside the workspace") from None
    except UnicodeDecodeError:
        raise EditorError(f"{path} is not a UTF-8 text file") from None
    lines = _lines(text)
    if view_range is None:
        return f"Here's the result of running `cat -n` on {path}:\n{_numbered(lines, 1)}"
    if len(view_range) != 2:
        raise EditorError(f"view_range must be [start, end], got {view_range}")
    start, end = view_range
    if not 1 <= start <= max(len(lines), 1):
        raise EditorError(f"view_range start {start} is not within the file's {len(lines)} lines")
    if end == -1 or end > len(lines):
        end = len(lines)
    if end < start:
        raise EditorError(f"view_range end {end} is before its start {start}")
    body = _numbered(lines[start - 1 : end], start)
    return f"Here's the result of running `cat -n` on {path} (lines {start}-{end}):\n{body}"


async def _walk(runtime: Runtime, path: str, depth: int) -> list[str]:
    found: list[str] = []
    for entry in await runtime.list_dir(path):
        if entry.startswith("."):
            continue
        child = posixpath.join(path, entry)
        found.append(child)
        if entry.endswith("/") and depth > 1:
            found += await _walk(runtime, child.rstrip("/"), depth - 1)
    return found


async def _create(runtime: Runtime, ctx: ToolContext, path: str, file_text: str | None) -> str:
    if file_text is None:
        raise EditorError("create needs `file_text`, the content of the new file")
    if await _exists(runtime, path):
        raise EditorError(
            f"{path} already exists; create refuses to overwrite it (use str_replace to edit)"
        )
    await _write(runtime, path, file_text)
    _history(ctx).setdefault(path, [])
    return f"File created successfully at: {path}"


async def _str_replace(
    runtime: Runtime, ctx: ToolContext, path: str, old_str: str | None, new_str: str | None
) -> str:
    if old_str is None or old_str == "":
        raise EditorError("str_replace needs a non-empty `old_str`")
    text = await _read(runtime, path)
    if _crlf_file(text):
        old_str, new_str = _crlf(old_str), _crlf(new_str or "")
    count = text.count(old_str)
    if count == 0:
        raise EditorError(
            f"no replacement was performed: old_str did not appear verbatim in {path}"
        )
    if count > 1:
        starts, at = [], text.find(old_str)
        while at != -1:
            starts.append(text.count("\n", 0, at) + 1)
            at = text.find(old_str, at + 1)
        lines = ", ".join(str(n) for n in starts)
        raise EditorError(
            f"no replacement was performed: old_str occurs {count} times in {path}, at lines "
            f"{lines}; include more context to make it unique"
        )
    replacement = new_str or ""
    at = text.index(old_str)
    updated = text[:at] + replacement + text[at + len(old_str) :]
    await _write(runtime, path, updated)
    _history(ctx).setdefault(path, []).append(text)
    first = text.count("\n", 0, at) + 1
    last = first + replacement.count("\n")
    return (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of "
        f"{path}:\n{_snippet(updated, first, last)}"
        "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )


async def _insert(
    runtime: Runtime, ctx: ToolContext, path: str, insert_line: int | None, new_str: str | None
) -> str:
    if insert_line is None or new_str is None:
        raise EditorError("insert needs `insert_line` and `new_str`")
    text = await _read(runtime, path)
    lines = text.split("\n")
    count = len(_lines(text))
    if not 0 <= insert_line <= count:
        raise EditorError(f"insert_line {insert_line} is not within the file's 0..{count} lines")
    inserted = new_str.split("\n")
    if new_str.endswith("\n"):
        inserted = inserted[:-1]
    if _crlf_file(text):
        inserted = [line.removesuffix("\r") + "\r" for line in inserted]
    updated = "\n".join(lines[:insert_line] + inserted + lines[insert_line:])
    if not text:
        updated = new_str if new_str.endswith("\n") else new_str + "\n"
    await _write(runtime, path, updated)
    _history(ctx).setdefault(path, []).append(text)
    first, last = insert_line + 1, insert_line + max(len(inserted), 1)
    return (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of "
        f"the edited file:\n{_snippet(updated, first, last)}"
        "Review the changes and make sure they are as expected (correct indentation, no "
        "duplicate lines). Edit the file again if necessary."
    )


async def _undo(runtime: Runtime, ctx: ToolContext, path: str) -> str:
    edits = _history(ctx).get(path)
    if not edits:
        raise EditorError(f"no edit history for {path}")
    previous = edits.pop()
    await _write(runtime, path, previous)
    return f"Last edit to {path} undone successfully. The file now starts:\n" + _numbered(
        _lines(previous)[: 2 * SNIPPET_LINES + 1], 1
    )
