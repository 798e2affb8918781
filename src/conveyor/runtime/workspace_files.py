"""File operations on a workspace folder from the host, confined to that folder.

Runtimes whose workspace is a host folder (bubblewrap, local) serve `read_file`, `write_file`
and `list_dir` here. A path is given as the runtime shows it to the agent (absolute under the
runtime's root, e.g. `/workspace/pkg/a.py`, or relative to it); it is mapped to the host folder and
resolved with symlinks followed, and anything that resolves outside the folder raises
`PermissionError`. Writes replace files atomically (write a new file, then rename), so a file
hard-linked from a template is never written through.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import tempfile
from pathlib import Path


class WorkspaceFiles:
    """Confined file access to `host_root`, which the agent sees as `view_root`.

    `owner` (uid, gid), when given, becomes the owner of files and folders written here, so the
    sandbox user can later change them in place.
    """

    def __init__(self, host_root: Path, view_root: str, *, owner: tuple[int, int] | None = None):
        self.host_root = Path(os.path.realpath(host_root))
        self.view_root = posixpath.normpath(view_root)
        self.owner = owner

    def resolve(self, path: str) -> Path:
        """The host path for `path`, symlinks resolved; `PermissionError` if it leaves the root."""
        if "\0" in path:
            raise PermissionError(f"path {path!r} contains a NUL byte")
        view = posixpath.normpath(posixpath.join(self.view_root, path))
        if view == self.view_root:
            relative = ""
        elif view.startswith(self.view_root.rstrip("/") + "/"):
            relative = view[len(self.view_root.rstrip("/")) + 1 :]
        else:
            raise PermissionError(f"path {path!r} is outside the workspace {self.view_root}")
        resolved = Path(os.path.realpath(self.host_root / relative))
        if resolved != self.host_root and self.host_root not in resolved.parents:
            raise PermissionError(f"path {path!r} resolves outside the workspace {self.view_root}")
        return resolved

    def read(self, path: str) -> str:
        """Text of a file (UTF-8, byte-exact: no newline translation, so a CRLF file reads as
        CRLF). `FileNotFoundError`/`IsADirectoryError` for a bad path."""
        target = self.resolve(path)
        if target.is_dir():
            raise IsADirectoryError(f"{path}: is a directory")
        if not target.exists():
            raise FileNotFoundError(f"{path}: no such file")
        return target.read_bytes().decode("utf-8")

    def write(self, path: str, content: str) -> None:
        """Replace or create a file atomically, creating its folders; keeps an existing mode."""
        target = self.resolve(path)
        if target.is_dir():
            raise IsADirectoryError(f"{path}: is a directory")
        self._make_parents(target.parent, path)
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
                handle.write(content)
                os.fchmod(handle.fileno(), mode)
                if self.owner is not None:
                    os.fchown(handle.fileno(), *self.owner)
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise

    def list(self, path: str) -> list[str]:
        """Sorted entries of a folder, folders with a trailing '/' (symlinks are not followed)."""
        target = self.resolve(path)
        if not target.exists():
            raise FileNotFoundError(f"{path}: no such directory")
        if not target.is_dir():
            raise NotADirectoryError(f"{path}: not a directory")
        with os.scandir(target) as entries:
            return sorted(e.name + ("/" * e.is_dir(follow_symlinks=False)) for e in entries)

    def _make_parents(self, folder: Path, path: str) -> None:
        missing: list[Path] = []
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        if not folder.is_dir():
            raise NotADirectoryError(f"{path}: a parent is not a directory")
        for new in reversed(missing):
            new.mkdir()
            if self.owner is not None:
                os.chown(new, *self.owner)


class HostWorkspaceRuntime:
    """File operations and lifecycle checks shared by runtimes whose workspace is a host folder.

    Subclasses set `files`, `_started`, `_closed` and `_kind` (named in errors) and implement
    `start`, `exec`, `close` and `_kill_leftovers`.
    """

    files: WorkspaceFiles
    _started: bool
    _closed: bool
    _kind: str = "runtime"

    async def read_file(self, path: str) -> str:
        """Read a workspace file; `PermissionError` for a path resolving outside the workspace."""
        self._check_usable()
        return self.files.read(path)

    async def write_file(self, path: str, content: str) -> None:
        """Atomically replace or create a workspace file."""
        self._check_usable()
        self.files.write(path, content)

    async def list_dir(self, path: str) -> list[str]:
        """Entries of a workspace folder, folders with a trailing '/'."""
        self._check_usable()
        return self.files.list(path)

    def alive(self) -> bool:
        """Started and not yet closed."""
        return self._started and not self._closed

    def _check_usable(self) -> None:
        from conveyor.runtime.base import RuntimeFailure

        if self._closed:
            raise RuntimeFailure(f"{self._kind} is closed")
        if not self._started:
            raise RuntimeFailure(f"{self._kind} was never started")
