"""The local runtime: plain subprocesses with rlimits, group kills and a loud warning."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.runtime import local
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.limits import CappedBuffer, SandboxLimits, find_marked, prlimit_argv
from conveyor.runtime.local import LocalRuntime

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def started(workspace: Path, **limits: Any) -> LocalRuntime:
    runtime = LocalRuntime(workspace, limits=SandboxLimits(**limits) if limits else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        await runtime.start()
    return runtime


def test_warns_once_that_it_does_not_isolate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "_warned", False)

    async def scenario() -> None:
        with pytest.warns(RuntimeWarning, match="does not isolate"):
            await LocalRuntime(tmp_path).start()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await LocalRuntime(tmp_path).start()

    run(scenario())
    assert isinstance(LocalRuntime(tmp_path), Runtime)


def test_runs_in_the_workspace_and_reports_exit_codes(tmp_path: Path) -> None:
    async def scenario() -> None:
        rt = await started(tmp_path)
        result = await rt.exec("pwd; echo err >&2; exit 5", 10)
        assert result == result.model_copy(
            update={"exit_code": 5, "stdout": f"{tmp_path.resolve()}\n", "stderr": "err\n"}
        )
        assert rt.root == str(tmp_path.resolve())
        await rt.write_file(f"{rt.root}/pkg/a.py", "x = 1\n")
        assert await rt.read_file("pkg/a.py") == "x = 1\n"
        assert await rt.list_dir(".") == ["pkg/"]
        with pytest.raises(PermissionError):
            await rt.read_file("../outside.txt")
        await rt.close()

    run(scenario())


def test_limits_apply(tmp_path: Path) -> None:
    async def scenario() -> None:
        rt = await started(tmp_path, memory_bytes=512 << 20, file_size_bytes=1 << 20)
        hog = await rt.exec("python3 -c 'b = bytearray(4 << 30)'", 20)
        assert hog.exit_code != 0 and "MemoryError" in hog.stderr
        big = await rt.exec("head -c 3000000 /dev/zero > big.bin", 10)
        assert big.exit_code != 0 and (tmp_path / "big.bin").stat().st_size <= 1 << 20
        await rt.close()

    run(scenario())


def test_timeout_kills_the_group_and_processes_that_left_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        rt = await started(tmp_path)
        start = time.perf_counter()
        result = await rt.exec("setsid sleep 300 & sleep 300 & echo go; while :; do :; done", 1.0)
        assert result.timed_out and result.exit_code == 124 and result.stdout == "go\n"
        assert time.perf_counter() - start < 4.0
        assert find_marked(rt.sandbox_id) == []
        # Background processes do not outlive a command that finished either, nor hold it up.
        start = time.perf_counter()
        background = await rt.exec("sleep 300 & echo bg", 10)
        assert background.stdout == "bg\n" and not background.timed_out
        assert time.perf_counter() - start < 3.0
        assert find_marked(rt.sandbox_id) == []
        await rt.close()

    run(scenario())


def test_concurrent_commands_do_not_kill_each_other(tmp_path: Path) -> None:
    async def scenario() -> None:
        rt = await started(tmp_path)
        slow, fast = await asyncio.gather(
            rt.exec("sleep 0.5; echo slow", 10), rt.exec("echo fast", 10)
        )
        assert (slow.exit_code, slow.stdout, fast.stdout) == (0, "slow\n", "fast\n")
        await rt.close()

    run(scenario())


def test_cancellation_kills_the_command(tmp_path: Path) -> None:
    async def scenario() -> None:
        rt = await started(tmp_path)
        task = asyncio.create_task(rt.exec("sleep 300", 60))
        await asyncio.sleep(0.3)
        assert find_marked(rt.sandbox_id) != []
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert find_marked(rt.sandbox_id) == []
        await rt.close()
        await rt.close()
        with pytest.raises(RuntimeFailure, match="closed"):
            await rt.exec("true", 1)

    run(scenario())


def test_start_checks_the_workspace(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure, match="not a folder"):
        run(LocalRuntime(tmp_path / "missing").start())


def test_capped_buffer_keeps_head_and_tail() -> None:
    buffer = CappedBuffer(10)
    for chunk in [b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"]:
        buffer.feed(chunk)
    assert buffer.total == 26
    assert buffer.text() == "abcde\n[... 16 bytes of output truncated ...]\nvwxyz"
    small = CappedBuffer(10)
    small.feed(b"0123456789")
    assert small.text() == "0123456789"


def test_prlimit_sets_every_limit() -> None:
    argv = prlimit_argv(SandboxLimits(memory_bytes=1, cpu_seconds=2, file_size_bytes=3))
    assert argv[0] == "prlimit" and argv[-1] == "--"
    assert {"--as=1", "--cpu=2:3", "--fsize=3", "--nproc=256", "--core=0"} <= set(argv)
