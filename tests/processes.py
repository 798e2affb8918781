"""Process facts read from /proc, for tests that check what a run left running."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def parent_of(pid: int) -> int | None:
    """`pid`'s parent process id, None once it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def children_of(parent: int) -> list[int]:
    """The processes whose parent is `parent` (zombies included)."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and parent_of(int(entry.name)) == parent
    ]
