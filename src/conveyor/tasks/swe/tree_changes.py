"""What differs between two folder trees, read from the trees themselves (never from a patch).

Both trees are walked with `lstat` (no symlink is followed): every entry is a regular file, a
folder, a symlink or something else (a fifo, a socket, a device). A path has changed when it
exists in one tree only, when its kind differs, when a regular file's bytes or permission bits
differ, or when a symlink points elsewhere; a folder present in both trees has not changed
itself (its entries are judged one by one).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

EntryKind = Literal["file", "dir", "symlink", "other"]
_CHUNK = 1 << 20


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a tree as `lstat` sees it; `target` is a symlink's target."""

    kind: EntryKind
    mode: int
    size: int
    target: str | None = None


def _kind(mode: int) -> EntryKind:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def scan_tree(root: Path, skipped: Collection[str] = ()) -> dict[str, TreeEntry]:
    """Every entry under `root` by its `/`-separated relative path (not `root` itself); a
    folder named in `skipped` is left out with all it holds, and so is any entry so named."""
    found: dict[str, TreeEntry] = {}
    pending = [(Path(root), "")]
    while pending:
        folder, prefix = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name in skipped:
                    continue
                rel = prefix + entry.name
                info = entry.stat(follow_symlinks=False)
                kind = _kind(info.st_mode)
                target = os.readlink(entry.path) if kind == "symlink" else None
                found[rel] = TreeEntry(kind, stat.S_IMODE(info.st_mode), info.st_size, target)
                if kind == "dir":
                    pending.append((Path(entry.path), rel + "/"))
    return found


def same_bytes(a: Path, b: Path) -> bool:
    """Whether two regular files hold the same bytes."""
    if a.stat().st_size != b.stat().st_size:
        return False
    with a.open("rb") as left, b.open("rb") as right:
        while True:
            chunk = left.read(_CHUNK)
            if chunk != right.read(_CHUNK):
                return False
            if not chunk:
                return True


def entry_changed(
    path: str, old_root: Path, new_root: Path, old: TreeEntry | None, new: TreeEntry | None
) -> bool:
    """Whether `path` differs between the trees (see the module doc)."""
    if old is None or new is None:
        return old is not new
    if old.kind != new.kind:
        return True
    if new.kind == "file":
        return old.mode != new.mode or not same_bytes(old_root / path, new_root / path)
    if new.kind == "symlink":
        return old.target != new.target
    return new.kind == "other"  # a fifo or device is never part of a starting state we trust


def changed_paths(
    old_root: Path,
    new_root: Path,
    old: dict[str, TreeEntry] | None = None,
    new: dict[str, TreeEntry] | None = None,
) -> list[str]:
    """The paths that differ between two trees, sorted so that a folder precedes its entries.

    `old`/`new` are the trees' scans where the caller already has them."""
    old = scan_tree(old_root) if old is None else old
    new = scan_tree(new_root) if new is None else new
    paths = [
        path
        for path in old.keys() | new.keys()
        if entry_changed(path, old_root, new_root, old.get(path), new.get(path))
    ]
    return sorted(paths, key=lambda p: p.split("/"))
