"""Full disks, fast: a workspace's own disk (`size_bytes`) and a full host disk under workspaces.

The chaos test (`test_chaos_real.py`) runs these faults under load; these check the pieces
alone, with real mounts and a real bubblewrap sandbox.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.runtime.bubblewrap import BubblewrapRuntime, bubblewrap_available
from conveyor.runtime.limits import MiB
from conveyor.runtime.workspace import WorkspaceMethod, make_workspace, sweep_stale

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (tmpfs mounts)")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root) + "/"
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


@pytest.fixture
def host_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs standing for the host disk that holds the workspaces."""
    root = tmp_path / "disk"
    root.mkdir()
    if _libc().mount(b"tmpfs", os.fsencode(root), b"tmpfs", 0, b"size=2m,mode=0755") != 0:
        pytest.skip(f"cannot mount a tmpfs: {os.strerror(ctypes.get_errno())}")
    try:
        yield root
    finally:
        for mount in [*_mounts_under(root), str(root)]:
            _libc().umount2(os.fsencode(mount), 2)


@pytest.fixture
def template(tmp_path: Path) -> Path:
    folder = tmp_path / "template"
    folder.mkdir()
    (folder / "a.txt").write_text("a\n")
    return folder


def _free(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


@pytest.mark.parametrize("method", ["overlay", "copy"])
def test_a_sandbox_that_fills_its_own_disk_fills_nobody_elses(
    host_disk: Path, template: Path, method: WorkspaceMethod
) -> None:
    ok, why = bubblewrap_available()
    if not ok:
        pytest.skip(why)
    # 4 MiB each: without a disk of its own, one fill would exhaust the 2 MiB host disk.
    workspace = make_workspace(template, host_disk, method=method, size_bytes=4 * MiB)
    neighbour = make_workspace(template, host_disk, method=method, size_bytes=4 * MiB)
    free_before = _free(host_disk)

    async def fill() -> tuple[str, int]:
        runtime = BubblewrapRuntime(workspace.path)
        await runtime.start()
        try:
            result = await runtime.exec("yes chaos > fill.txt", 30)
        finally:
            await runtime.close()
        return result.stderr, (workspace.path / "fill.txt").stat().st_size

    stderr, size = asyncio.run(fill())
    assert "No space left on device" in stderr
    assert 3 * MiB < size <= 4 * MiB
    assert _free(host_disk) == free_before  # the host disk did not move
    (neighbour.path / "b.txt").write_text("still room\n")  # the neighbour writes as before
    assert (workspace.path / "a.txt").read_text() == "a\n"
    workspace.remove()
    neighbour.remove()
    assert _mounts_under(host_disk) == [] and list(host_disk.iterdir()) == []


def test_sweep_unmounts_the_disks_of_a_dead_process(host_disk: Path, template: Path) -> None:
    workspace = make_workspace(template, host_disk, method="overlay", size_bytes=1 * MiB)
    assert len(_mounts_under(host_disk)) == 2  # the overlay and its own tmpfs
    record = json.loads(workspace.marker.read_text())
    record["pid"] = 2**22 + 1  # a pid that is not running: its maker crashed
    workspace.marker.write_text(json.dumps(record))
    assert sweep_stale(host_disk) == [workspace.path]
    assert _mounts_under(host_disk) == [] and list(host_disk.iterdir()) == []


def test_a_full_host_disk_fails_the_start_and_leaves_nothing(
    host_disk: Path, template: Path
) -> None:
    ballast = host_disk / "ballast"
    with open(ballast, "wb") as handle:
        size, chunk = 0, 1 << 20
        while chunk >= 4096:  # tmpfs takes all of a fallocate or none of it
            try:
                os.posix_fallocate(handle.fileno(), size, chunk)
                size += chunk
            except OSError:
                chunk //= 2
    with pytest.raises(OSError) as caught:
        make_workspace(template, host_disk, method="overlay", size_bytes=1 * MiB)
    assert caught.value.errno == 28  # ENOSPC: the dispatcher's infra retry takes it from here
    ballast.unlink()
    assert list(host_disk.iterdir()) == [] and _mounts_under(host_disk) == []


def test_bad_disk_sizes_are_refused(host_disk: Path, template: Path) -> None:
    with pytest.raises(ValueError, match="size_bytes must be > 0"):
        make_workspace(template, host_disk, size_bytes=0)
    with pytest.raises(ValueError, match="overlay or copy"):
        make_workspace(template, host_disk, method="hardlink", size_bytes=MiB)
