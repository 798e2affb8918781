"""An in-process runtime with an in-memory file system and a tiny shell.

It lets the dispatcher, the agent loop and the task families be built and tested before the real
sandboxes exist, and lets tests inject start delays, start failures and custom command behaviour.
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from collections.abc import Awaitable, Callable, Mapping

from conveyor.config import RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.runtime.base import ExecResult, RuntimeFailure
from conveyor.runtime.selection import RuntimeRequest

ExecHandler = Callable[[str, float], Awaitable[ExecResult]]


class SimulatedRuntime:
    """A `Runtime` whose files live in a dict (path -> content) under the root `/workspace`.

    Folders are implied by file paths. Paths may be relative to the root or absolute inside it;
    a path that leaves the root (`..`, `/etc`) raises `PermissionError`. `exec` understands
    `cat PATH...`, `ls [PATH]`, `echo TEXT`, `sleep SECONDS`, `true` and `false`; anything else
    exits 127. Pass `exec_handler` to replace the shell entirely.
    """

    root = "/workspace"

    def __init__(
        self,
        files: Mapping[str, str] | None = None,
        *,
        start_delay_s: float = 0.0,
        close_delay_s: float = 0.0,
        fail_on_start: bool = False,
        exec_handler: ExecHandler | None = None,
    ):
        self._files: dict[str, str] = {}
        self._start_delay_s = start_delay_s
        self._close_delay_s = close_delay_s
        self._fail_on_start = fail_on_start
        self._exec_handler = exec_handler
        self._started = False
        self._closed = False
        for path, content in (files or {}).items():
            self._put(path, content)

    @property
    def files(self) -> dict[str, str]:
        """A copy of the file system: absolute path -> content."""
        return {posixpath.join(self.root, rel): content for rel, content in self._files.items()}

    async def start(self) -> None:
        """Come up after `start_delay_s`; raises `RuntimeFailure` if `fail_on_start` or closed."""
        if self._closed:
            raise RuntimeFailure("simulated runtime is closed and cannot be started again")
        if self._started:
            return
        await asyncio.sleep(self._start_delay_s)
        if self._fail_on_start:
            raise RuntimeFailure("simulated runtime failed to start (fail_on_start=True)")
        self._started = True

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run one command of the tiny shell (or the `exec_handler`)."""
        self._check_usable()
        if self._exec_handler is not None:
            return await self._exec_handler(command, timeout_s)
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            return ExecResult(exit_code=2, stderr=f"sh: syntax error: {exc}\n")
        if not argv:
            return ExecResult(exit_code=0)
        name, args = argv[0], argv[1:]
        if name == "true":
            return ExecResult(exit_code=0)
        if name == "false":
            return ExecResult(exit_code=1)
        if name == "echo":
            return ExecResult(exit_code=0, stdout=" ".join(args) + "\n")
        if name == "sleep":
            return await self._sleep(args, timeout_s)
        if name == "cat":
            return self._cat(args)
        if name == "ls":
            return self._ls(args)
        return ExecResult(exit_code=127, stderr=f"sh: {name}: command not found\n")

    async def read_file(self, path: str) -> str:
        """Content of a file; `FileNotFoundError`/`IsADirectoryError` for a bad path."""
        self._check_usable()
        return self._read(path)

    async def write_file(self, path: str, content: str) -> None:
        """Create or replace a file; its folders are implied."""
        self._check_usable()
        self._put(path, content)

    async def list_dir(self, path: str) -> list[str]:
        """Sorted entries of a folder, folders with a trailing '/'."""
        self._check_usable()
        return self._list(path)

    def alive(self) -> bool:
        """Started and not yet closed."""
        return self._started and not self._closed

    async def close(self) -> None:
        """Shut down after `close_delay_s`; later calls return at once."""
        if self._closed:
            return
        self._closed = True
        await asyncio.sleep(self._close_delay_s)

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeFailure("simulated runtime is closed")
        if not self._started:
            raise RuntimeFailure("simulated runtime was never started")

    def _relative(self, path: str) -> str:
        """Normalise `path` to a key relative to the root ('' is the root itself)."""
        full = posixpath.normpath(posixpath.join(self.root, path))
        if full == self.root:
            return ""
        if not full.startswith(self.root + "/"):
            raise PermissionError(f"path {path!r} is outside {self.root}")
        return full[len(self.root) + 1 :]

    def _is_dir(self, rel: str) -> bool:
        return rel == "" or any(key.startswith(rel + "/") for key in self._files)

    def _read(self, path: str) -> str:
        rel = self._relative(path)
        if rel in self._files:
            return self._files[rel]
        if self._is_dir(rel):
            raise IsADirectoryError(f"{path}: is a directory")
        raise FileNotFoundError(f"{path}: no such file")

    def _put(self, path: str, content: str) -> None:
        rel = self._relative(path)
        if rel == "" or self._is_dir(rel):
            raise IsADirectoryError(f"{path}: is a directory")
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in self._files:
                raise NotADirectoryError(f"{path}: a parent is a file")
        self._files[rel] = content

    def _list(self, path: str) -> list[str]:
        rel = self._relative(path)
        if rel in self._files:
            raise NotADirectoryError(f"{path}: not a directory")
        if not self._is_dir(rel):
            raise FileNotFoundError(f"{path}: no such directory")
        prefix = rel + "/" if rel else ""
        entries: set[str] = set()
        for key in self._files:
            if key.startswith(prefix):
                head, sep, _ = key[len(prefix) :].partition("/")
                entries.add(head + sep)
        return sorted(entries)

    async def _sleep(self, args: list[str], timeout_s: float) -> ExecResult:
        try:
            seconds = float(args[0]) if len(args) == 1 else float("nan")
        except ValueError:
            seconds = float("nan")
        if not seconds >= 0:
            return ExecResult(exit_code=1, stderr=f"sleep: invalid time interval {args!r}\n")
        if seconds > timeout_s:
            await asyncio.sleep(max(timeout_s, 0.0))
            return ExecResult(exit_code=124, timed_out=True)
        await asyncio.sleep(seconds)
        return ExecResult(exit_code=0)

    def _cat(self, args: list[str]) -> ExecResult:
        out: list[str] = []
        errors: list[str] = []
        for path in args:
            try:
                out.append(self._read(path))
            except FileNotFoundError:
                errors.append(f"cat: {path}: No such file or directory\n")
            except IsADirectoryError:
                errors.append(f"cat: {path}: Is a directory\n")
            except PermissionError:
                errors.append(f"cat: {path}: Permission denied\n")
        return ExecResult(exit_code=1 if errors else 0, stdout="".join(out), stderr="".join(errors))

    def _ls(self, args: list[str]) -> ExecResult:
        if len(args) > 1:
            return ExecResult(exit_code=2, stderr="ls: only one path is supported here\n")
        path = args[0] if args else "."
        try:
            entries = self._list(path)
        except NotADirectoryError:
            return ExecResult(exit_code=0, stdout=path + "\n")
        except FileNotFoundError:
            return ExecResult(
                exit_code=2, stderr=f"ls: cannot access '{path}': No such file or directory\n"
            )
        except PermissionError:
            return ExecResult(exit_code=2, stderr=f"ls: cannot open '{path}': Permission denied\n")
        return ExecResult(exit_code=0, stdout="".join(entry + "\n" for entry in entries))


@RUNTIMES.register("simulated")
def build_simulated(request: RuntimeRequest, settings: RuntimeConfig) -> SimulatedRuntime:
    """`runtime.kind: simulated`: an in-memory runtime holding the request's files."""
    if request.files is None:
        raise ValueError("runtime kind 'simulated' holds an in-memory file tree, not a host folder")
    return SimulatedRuntime(request.files)
