"""The bubblewrap sandbox, for real: what a command can do, and that it cannot get out.

Each containment test ends by checking that sentinel files on the host are unchanged and that no
process carrying the sandbox's marker is left in the host's /proc.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.runtime import bubblewrap
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.bubblewrap import BubblewrapRuntime, bubblewrap_available
from conveyor.runtime.limits import SANDBOX_GID, SANDBOX_UID, SandboxLimits, find_marked

AVAILABLE, REASON = bubblewrap_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"bubblewrap unusable here: {REASON}")

T = TypeVar("T")
VENV = Path(sys.prefix)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def checksums(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class Host:
    """A workspace, sentinel files next to it, and their checksums before the test."""

    def __init__(self, tmp_path: Path):
        self.workspace = tmp_path / "workspace"
        self.workspace.mkdir()
        (self.workspace / "main.py").write_text("print('hello')\n")
        (self.workspace / "owned_by_root.txt").write_text("root's\n")
        os.chown(self.workspace, SANDBOX_UID, SANDBOX_GID)
        os.chown(self.workspace / "main.py", SANDBOX_UID, SANDBOX_GID)
        self.sentinels = tmp_path / "sentinels"
        self.sentinels.mkdir()
        (self.sentinels / "secret.txt").write_text("do not touch\n")
        (self.sentinels / "data.bin").write_bytes(os.urandom(4096))
        self.before = checksums(self.sentinels)
        self.env_before = checksums(VENV / "bin")

    def assert_untouched(self, runtime: BubblewrapRuntime) -> None:
        assert checksums(self.sentinels) == self.before
        assert checksums(VENV / "bin") == self.env_before
        assert find_marked(runtime.sandbox_id) == []


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    yield Host(tmp_path)


async def sandbox(host: Host, **limits: Any) -> BubblewrapRuntime:
    runtime = BubblewrapRuntime(
        host.workspace, env_dir=VENV, limits=SandboxLimits(**limits) if limits else None
    )
    await runtime.start()
    return runtime


def test_implements_the_runtime_protocol(host: Host) -> None:
    assert isinstance(BubblewrapRuntime(host.workspace), Runtime)


def test_commands_run_unprivileged_in_the_workspace_with_the_venv(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host)
        result = await rt.exec(
            "id -u; pwd; python -c 'import pydantic, sys; print(sys.prefix)'", 30
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout.split() == [str(SANDBOX_UID), "/workspace", str(VENV)]
        edit = await rt.exec("echo more >> main.py && echo x > new.txt && cat main.py", 10)
        assert edit.exit_code == 0 and edit.stdout == "print('hello')\nmore\n"
        assert (host.workspace / "new.txt").read_text() == "x\n"
        assert (await rt.exec("exit 3", 10)).exit_code == 3
        await rt.close()
        host.assert_untouched(rt)

    run(scenario())


def test_network_is_unreachable(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host)
        connect = (
            "python -c 'import socket; s = socket.socket(); s.settimeout(3); "
            's.connect(("1.1.1.1", 53)); print("CONNECTED")\''
        )
        result = await rt.exec(connect, 20)
        assert result.exit_code != 0 and "CONNECTED" not in result.stdout
        assert "Network is unreachable" in result.stderr
        lookup = await rt.exec("getent hosts pypi.org", 20)
        assert lookup.exit_code != 0 and lookup.stdout == ""
        await rt.close()
        host.assert_untouched(rt)

    run(scenario())


def test_writes_outside_the_workspace_fail(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host)
        targets = [
            host.sentinels / "secret.txt",
            host.sentinels / "new.txt",
            VENV / "bin" / "python",
            VENV / "injected.txt",
            Path("/usr/bin/injected"),
            Path("/etc/passwd"),
            Path("/root/injected"),
            Path("/workspace/../escaped"),
            Path("/workspace/owned_by_root.txt"),
        ]
        for target in targets:
            result = await rt.exec(f"echo pwned >> {target}", 10)
            assert result.exit_code != 0, f"writing {target} succeeded"
        # The sandbox's /tmp is private: writing it works but never reaches the host's /tmp.
        marker = f"/tmp/conveyor-bwrap-{os.getpid()}"
        assert (await rt.exec(f"echo x > {marker} && cat {marker}", 10)).stdout == "x\n"
        assert not Path(marker).exists()
        assert (host.workspace / "owned_by_root.txt").read_text() == "root's\n"
        assert not (host.workspace.parent / "escaped").exists()
        await rt.close()
        host.assert_untouched(rt)

    run(scenario())


def test_tmp_is_private_kept_across_commands_and_removed_on_close(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host)
        assert (await rt.exec("echo 'print(41 + 1)' > /tmp/repro.py", 10)).exit_code == 0
        out = (await rt.exec("python /tmp/repro.py; ls -A /tmp", 10)).stdout.split()
        assert out[0] == "42" and "repro.py" in out
        # Nothing of the host's /tmp shows; only the mount point of the read-only venv, when
        # the checkout itself lives under /tmp (a fresh clone there, say).
        venv = VENV.resolve()
        mount_points = {venv.parts[2]} if venv.parts[1] == "tmp" else set()
        assert set(out[1:]) - {"repro.py"} <= mount_points
        assert not Path("/tmp/repro.py").exists()
        leftovers = [p for p in Path(tempfile.gettempdir()).iterdir() if rt.sandbox_id in p.name]
        assert len(leftovers) == 1
        await rt.close()
        assert not leftovers[0].exists()

    run(scenario())


def test_a_fork_bomb_is_stopped_and_the_host_stays_responsive(host: Host) -> None:
    async def loop_lag() -> float:
        worst = 0.0
        for _ in range(40):
            start = time.perf_counter()
            await asyncio.sleep(0.05)
            worst = max(worst, time.perf_counter() - start - 0.05)
        return worst

    async def scenario() -> None:
        rt = await sandbox(host, max_processes=64)
        counted = await rt.exec(
            "python -c '\nimport os, time\nn = 0\ntry:\n    for _ in range(500):\n"
            "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
            "        n += 1\nexcept OSError:\n    pass\nprint(n)\n'",
            20,
        )
        assert counted.exit_code == 0, counted.stderr
        assert 0 < int(counted.stdout) < 64
        start = time.perf_counter()
        bomb, lag = await asyncio.gather(rt.exec(":(){ :|:& };:; sleep 60", 3), loop_lag())
        assert bomb.timed_out and bomb.exit_code == 124
        assert time.perf_counter() - start < 6
        assert lag < 1.0
        assert (await rt.exec("echo alive", 10)).stdout == "alive\n"
        await rt.close()
        host.assert_untouched(rt)

    run(scenario())


def test_a_memory_hog_is_stopped(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host, memory_bytes=512 << 20)
        result = await rt.exec("python -c 'b = bytearray(4 << 30); print(\"ALLOCATED\")'", 20)
        assert result.exit_code != 0 and "ALLOCATED" not in result.stdout
        assert "MemoryError" in result.stderr
        await rt.close()
        host.assert_untouched(rt)

    run(scenario())


def test_an_infinite_loop_is_killed_at_its_timeout_with_everything_it_started(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host)
        start = time.perf_counter()
        result = await rt.exec(
            "setsid sleep 300 & nohup sleep 300 >/dev/null & echo started; while :; do :; done",
            1.0,
        )
        elapsed = time.perf_counter() - start
        assert result.timed_out and result.exit_code == 124
        assert result.stdout == "started\n"
        assert 1.0 <= elapsed < 4.0
        assert find_marked(rt.sandbox_id) == []
        await rt.close()
        host.assert_untouched(rt)

    run(scenario())


def test_cpu_time_and_file_size_limits_bind(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host, cpu_seconds=1, file_size_bytes=1 << 20)
        spin = await rt.exec("while :; do :; done", 8)
        assert not spin.timed_out and spin.exit_code in (128 + 24, 128 + 9)  # SIGXCPU / SIGKILL
        big = await rt.exec("head -c 3000000 /dev/zero > big.bin", 10)
        assert big.exit_code != 0
        assert (host.workspace / "big.bin").stat().st_size <= 1 << 20
        await rt.close()
        host.assert_untouched(rt)

    run(scenario())


def test_concurrent_commands_do_not_kill_each_other(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host)
        slow, fast = await asyncio.gather(
            rt.exec("sleep 0.5; echo slow", 10), rt.exec("echo fast", 10)
        )
        assert (slow.exit_code, slow.stdout, fast.stdout) == (0, "slow\n", "fast\n")
        await rt.close()
        host.assert_untouched(rt)

    run(scenario())


def test_output_is_capped_with_a_marker(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host, output_bytes=10_000)
        result = await rt.exec("yes | head -c 5000000; echo THE-END", 10)
        assert result.exit_code == 0
        assert len(result.stdout) < 10_200
        assert "bytes of output truncated" in result.stdout
        assert result.stdout.endswith("THE-END\n")
        await rt.close()

    run(scenario())


def test_a_cancelled_command_leaves_nothing_behind(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host)
        task = asyncio.create_task(rt.exec("sleep 300 & sleep 300", 60))
        await asyncio.sleep(0.5)
        assert find_marked(rt.sandbox_id) != []
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert find_marked(rt.sandbox_id) == []
        await rt.close()

    run(scenario())


def test_file_operations_stay_inside_the_workspace(host: Host) -> None:
    async def scenario() -> None:
        rt = await sandbox(host)
        (host.workspace / "to_secret").symlink_to(host.sentinels / "secret.txt")
        (host.workspace / "to_sentinels").symlink_to(host.sentinels)
        (host.workspace / "to_main").symlink_to("main.py")
        assert await rt.read_file("/workspace/main.py") == "print('hello')\n"
        assert await rt.read_file("to_main") == "print('hello')\n"
        for bad in ["to_secret", "to_sentinels/data.bin", "../sentinels/secret.txt", "/etc/passwd"]:
            with pytest.raises(PermissionError):
                await rt.read_file(bad)
        for bad in ["to_secret", "to_sentinels/new.txt", "/workspace/../x.txt"]:
            with pytest.raises(PermissionError):
                await rt.write_file(bad, "pwned\n")
        with pytest.raises(PermissionError):
            await rt.list_dir("to_sentinels")
        await rt.write_file("/workspace/pkg/sub/mod.py", "x = 1\n")
        assert (host.workspace / "pkg/sub/mod.py").stat().st_uid == SANDBOX_UID
        assert (
            await rt.exec("echo 'y = 2' >> pkg/sub/mod.py && cat pkg/sub/mod.py", 10)
        ).stdout == ("x = 1\ny = 2\n")
        assert "pkg/" in await rt.list_dir("/workspace")
        with pytest.raises(FileNotFoundError):
            await rt.read_file("missing.py")
        with pytest.raises(IsADirectoryError):
            await rt.read_file("pkg")
        await rt.close()
        host.assert_untouched(rt)

    run(scenario())


def test_lifecycle_is_checked(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        rt = BubblewrapRuntime(host.workspace)
        with pytest.raises(RuntimeFailure, match="never started"):
            await rt.exec("true", 5)
        await rt.start()
        assert rt.alive()
        await rt.close()
        await rt.close()
        assert not rt.alive()
        with pytest.raises(RuntimeFailure, match="closed"):
            await rt.exec("true", 5)
        with pytest.raises(RuntimeFailure, match="is not a folder"):
            await BubblewrapRuntime(host.workspace / "missing").start()
        if os.geteuid() == 0:
            rootish = host.workspace.parent / "root_owned"
            rootish.mkdir()
            with pytest.raises(RuntimeFailure, match="not owned by the sandbox user"):
                await BubblewrapRuntime(rootish).start()
        monkeypatch.setattr(bubblewrap, "bubblewrap_available", lambda: (False, "no userns"))
        with pytest.raises(RuntimeFailure, match="bubblewrap is not usable here: no userns"):
            await BubblewrapRuntime(host.workspace).start()

    run(scenario())


def test_availability_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    ok, reason = bubblewrap_available.__wrapped__()
    assert not ok
    assert "missing bwrap" in reason and "apt-get install bubblewrap" in reason
