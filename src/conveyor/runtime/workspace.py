"""Per-rollout workspaces: fast private copies of a per-instance template folder.

Methods (measured in docs/sandbox.md; `auto` is `overlay` where it can mount, else `copy`):
- `overlay`: an overlayfs mount with the template as its read-only lower layer and an empty
  upper layer per workspace: constant time whatever the size of the repository, and safe with
  every runtime (any write, in place or not, by anyone, lands in the upper layer). Needs root
  (CAP_SYS_ADMIN). Overlayfs checks permissions against the template's owners, so the template's
  files are given to the sandbox user once (the template itself is never mounted writable).
- `copy`: `cp -a --reflink=auto` (a reflink where the file system has them, a real copy on ext4),
  then owned by the sandbox user. Safe with every runtime: nothing is shared with the template.
- `hardlink`: `cp -al`, folders new, files shared with the template. Safe only where commands run
  as a user that cannot write the template's files (`BubblewrapRuntime`): an in-place write
  (`echo >> f`, `open(f, "w")`) is refused, and tools must replace files (write new + rename,
  as `sed -i`, `patch` and the runtimes' `write_file` do), which breaks the link.
- `git-worktree`: `git worktree add` of a template that is a git repository. Its `.git` file
  points into the template's repository, which a sandbox does not mount: for host-side use only.

`size_bytes` gives a workspace a disk of its own (root only; `overlay` and `copy`): the writable
part lives on a tmpfs of that size (an overlay's layers, a copy's whole folder), so a command that
fills its workspace gets "No space left on device" there and fills nobody else's disk.

Each workspace `root/ws-<pid>-<id>` has a marker `root/ws-<pid>-<id>.owner` (the creating pid and
its start time) written before the folder, so `sweep_stale(root)` can unmount and remove what a
crashed process left behind. An overlay's layers live in `root/ws-<pid>-<id>.layers`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import shutil
import stat
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, get_args

from conveyor.runtime.limits import SANDBOX_GID, SANDBOX_UID

log = logging.getLogger(__name__)

WorkspaceMethod = Literal["auto", "overlay", "copy", "hardlink", "git-worktree"]
_MNT_DETACH = 2
_MARKER_SUFFIX = ".owner"
_PREFIX = "ws-"


def default_owner() -> tuple[int, int] | None:
    """The sandbox user as owner when we can change owners (root), else keep ours."""
    return (SANDBOX_UID, SANDBOX_GID) if os.geteuid() == 0 else None


@dataclass
class Workspace:
    """One rollout's folder, made from `template` by `method`; `remove()` is idempotent."""

    path: Path
    template: Path
    method: str
    marker: Path
    removed: bool = field(default=False, init=False)

    def remove(self) -> None:
        """Unmount (overlay) and delete the folder, its layers and its marker."""
        if self.removed:
            return
        _remove_tree(self.path, self.method, self.template)
        self.marker.unlink(missing_ok=True)
        self.removed = True

    def __enter__(self) -> Workspace:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


def make_workspace(
    template: Path,
    root: Path,
    *,
    method: WorkspaceMethod = "auto",
    owner: tuple[int, int] | Literal["default"] | None = "default",
    size_bytes: int | None = None,
) -> Workspace:
    """Make a private workspace under `root` from `template`.

    `owner` (uid, gid) is the user the sandbox runs as; what it may write is given to it:
    everything for `copy` and `git-worktree`, the folders for `hardlink` (whose shared files must
    not be writable by that user: checked, `PermissionError` otherwise), the template's files for
    `overlay`. The default is the sandbox user when running as root. `size_bytes` bounds what
    may be written in the workspace (see the module doc).
    """
    if method not in get_args(WorkspaceMethod):
        known = ", ".join(get_args(WorkspaceMethod))
        raise ValueError(f"unknown workspace method {method!r}; use one of: {known}")
    if size_bytes is not None:
        if size_bytes <= 0:
            raise ValueError(f"size_bytes must be > 0, got {size_bytes}")
        if method not in ("auto", "overlay", "copy"):
            raise ValueError(
                f"size_bytes needs method overlay or copy (a disk of its own), not {method!r}"
            )
        if os.geteuid() != 0:
            raise PermissionError("size_bytes needs root: each workspace mounts its own tmpfs")
    template = Path(template).resolve()
    if not template.is_dir():
        raise FileNotFoundError(f"workspace template {template} is not a folder")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    who = default_owner() if owner == "default" else owner
    chosen = method
    if method == "auto":
        chosen = "overlay" if overlay_available(root) else "copy"
    if chosen == "hardlink" and who is not None:
        _check_protected(template, who)
    name = f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:10]}"
    path, marker = root / name, root / (name + _MARKER_SUFFIX)
    record: dict[str, object] = {"pid": os.getpid(), "start_time": _start_time(os.getpid())}
    record |= {"template": str(template), "method": chosen}
    try:
        marker.write_text(json.dumps(record))
    except BaseException:
        marker.unlink(missing_ok=True)  # a full disk leaves the file made but empty
        raise
    workspace = Workspace(path=path, template=template, method=chosen, marker=marker)
    try:
        if size_bytes is not None:
            # The writable part: an overlay's layers, or the whole copied folder.
            _mount_tmpfs(_layers(path) if chosen == "overlay" else path, size_bytes)
        _populate(chosen, template, path, who)
    except BaseException:
        workspace.remove()
        raise
    return workspace


def _populate(method: str, template: Path, path: Path, who: tuple[int, int] | None) -> None:
    if method == "overlay":
        if who is not None and template.stat().st_uid != who[0]:
            log.info("giving template %s to uid %d for overlay workspaces", template, who[0])
            _run(["chown", "-R", f"{who[0]}:{who[1]}", str(template)])
        _mount_overlay(template, path, who)
        return
    if method == "copy":
        _run(["cp", "-a", "--reflink=auto", f"{template}/.", str(path)], mkdir=path)
    elif method == "hardlink":
        _run(["cp", "-al", f"{template}/.", str(path)], mkdir=path)
    else:
        _run([*_git(template), "worktree", "add", "--detach", "-q", str(path)])
    if who is None:
        return
    if method == "hardlink":
        for folder, _, _ in os.walk(path):
            os.chown(folder, *who)
    else:
        _run(["chown", "-R", f"{who[0]}:{who[1]}", str(path)])


def sweep_stale(root: Path) -> list[Path]:
    """Remove workspaces under `root` whose creating process is gone; returns their paths."""
    removed: list[Path] = []
    root = Path(root)
    if not root.is_dir():
        return removed
    for marker in sorted(root.glob(f"{_PREFIX}*{_MARKER_SUFFIX}")):
        try:
            record = json.loads(marker.read_text())
            pid, started = int(record["pid"]), record.get("start_time")
            method, template = str(record["method"]), Path(record["template"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written right now, or not ours
        alive = _start_time(pid)
        if alive is not None and alive == started:
            continue
        path = marker.with_name(marker.name[: -len(_MARKER_SUFFIX)])
        _remove_tree(path, method, template)
        marker.unlink(missing_ok=True)
        removed.append(path)
    return removed


@functools.cache
def overlay_available(root: Path) -> bool:
    """Whether overlayfs mounts work under `root` (root privileges and kernel support)."""
    if os.geteuid() != 0:
        return False
    probe = Path(root) / f".overlay-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        (probe / "lower").mkdir(parents=True)
        _mount_overlay(probe / "lower", probe / "merged")
        return True
    except OSError as exc:
        log.info("overlay workspaces unavailable under %s: %s", root, exc)
        return False
    finally:
        _remove_tree(probe / "merged", "overlay", probe / "lower")
        shutil.rmtree(probe, ignore_errors=True)


def time_methods(template: Path, root: Path, *, repeats: int = 5) -> dict[str, float]:
    """Median seconds to make (not remove) one workspace, per method that applies to `template`.

    `hardlink` is left out when the template is writable by the sandbox user (e.g. after it
    served overlays); `overlay` is measured after its one-time hand-over of the template.
    """
    methods: list[WorkspaceMethod] = ["copy", "hardlink"]
    if (Path(template) / ".git").exists():
        methods.append("git-worktree")
    if overlay_available(Path(root).resolve()):
        methods.append("overlay")
    timings: dict[str, float] = {}
    for method in methods:
        if method == "overlay":
            make_workspace(template, root, method="overlay").remove()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            try:
                workspace = make_workspace(template, root, method=method)
            except PermissionError:
                break
            samples.append(time.perf_counter() - start)
            workspace.remove()
        if samples:
            timings[method] = sorted(samples)[len(samples) // 2]
    return timings


def _run(argv: list[str], *, mkdir: Path | None = None) -> None:
    if mkdir is not None:
        mkdir.mkdir(exist_ok=True)  # exists when it is a workspace's own tmpfs
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv[:3])} ... failed: {done.stderr.strip()}")


def _git(template: Path) -> list[str]:
    # The template may belong to the sandbox user (see overlay); git refuses such repos unless
    # told they are trusted.
    return ["git", "-c", f"safe.directory={template}", "-C", str(template)]


def _layers(path: Path) -> Path:
    return path.with_name(path.name + ".layers")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount_overlay(lower: Path, merged: Path, owner: tuple[int, int] | None = None) -> None:
    """Mount `lower` + a fresh upper layer at `merged`; the merged root takes the upper's owner."""
    layers = _layers(merged)
    for part in (lower, layers):
        if any(ch in str(part) for ch in ",:\\"):
            raise OSError(f"overlay paths may not contain ',', ':' or '\\': {part}")
    (layers / "upper").mkdir(parents=True)
    (layers / "work").mkdir()
    merged.mkdir()
    if owner is not None:
        os.chown(layers / "upper", *owner)
    options = f"lowerdir={lower},upperdir={layers / 'upper'},workdir={layers / 'work'}"
    if _libc().mount(b"overlay", os.fsencode(merged), b"overlay", 0, options.encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mounting an overlay at {merged} failed: {os.strerror(errno)}")


def _mount_tmpfs(target: Path, size_bytes: int) -> None:
    """A tmpfs of `size_bytes` at `target` (made here): a workspace's own disk."""
    target.mkdir()
    options = f"size={size_bytes},mode=0755".encode()
    if _libc().mount(b"tmpfs", os.fsencode(target), b"tmpfs", 0, options) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mounting a tmpfs at {target} failed: {os.strerror(errno)}")


def _check_protected(template: Path, owner: tuple[int, int]) -> None:
    """Hard links are only safe if `owner` cannot write the template's files in place."""
    uid, gid = owner
    for folder, _, files in os.walk(template):
        for name in files:
            info = os.lstat(os.path.join(folder, name))
            if stat.S_ISLNK(info.st_mode):
                continue
            writable = (
                info.st_uid == uid
                or info.st_mode & stat.S_IWOTH
                or (info.st_gid == gid and info.st_mode & stat.S_IWGRP)
            )
            if writable:
                raise PermissionError(
                    f"{os.path.join(folder, name)} is writable by uid {uid}: a hard-linked "
                    "workspace would write through to the template; use method='copy'"
                )


def _remove_tree(path: Path, method: str, template: Path) -> None:
    if os.path.ismount(path):
        # Lazy: a process still inside cannot keep the mount (or the removal) from happening.
        _libc().umount2(os.fsencode(path), _MNT_DETACH)
    if method == "git-worktree":
        subprocess.run(
            [*_git(template), "worktree", "remove", "--force", str(path)],
            capture_output=True,
            check=False,
        )
    if os.path.ismount(_layers(path)):  # an overlay's own tmpfs (`size_bytes`), under it
        _libc().umount2(os.fsencode(_layers(path)), _MNT_DETACH)
    for tree in (path, _layers(path)):
        if tree.exists() or tree.is_symlink():
            shutil.rmtree(tree, ignore_errors=True)
    if method == "git-worktree":
        subprocess.run([*_git(template), "worktree", "prune"], capture_output=True, check=False)


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart), or None."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[19])
    return None
