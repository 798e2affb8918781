"""The simulated runtime: its file system, its tiny shell and its lifecycle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from conveyor.runtime.base import ExecResult, Runtime, RuntimeFailure
from conveyor.runtime.simulated import SimulatedRuntime

T = TypeVar("T")

FILES = {
    "README.md": "hello\n",
    "src/pkg/__init__.py": "",
    "src/pkg/core.py": "x = 1\n",
    "/workspace/data/facts.txt": "the answer is 42\n",
}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def started(**kwargs: Any) -> SimulatedRuntime:
    runtime = SimulatedRuntime(FILES, **kwargs)
    await runtime.start()
    return runtime


def test_implements_the_runtime_protocol() -> None:
    assert isinstance(SimulatedRuntime(), Runtime)


def test_files_are_normalised_under_the_root() -> None:
    async def scenario() -> None:
        rt = await started()
        assert await rt.read_file("data/facts.txt") == "the answer is 42\n"
        assert await rt.read_file("/workspace/src/pkg/../pkg/./core.py") == "x = 1\n"
        assert await rt.read_file("./README.md") == "hello\n"
        assert sorted(rt.files) == [
            "/workspace/README.md",
            "/workspace/data/facts.txt",
            "/workspace/src/pkg/__init__.py",
            "/workspace/src/pkg/core.py",
        ]

    run(scenario())


def test_list_dir_implies_folders() -> None:
    async def scenario() -> None:
        rt = await started()
        assert await rt.list_dir(".") == ["README.md", "data/", "src/"]
        assert await rt.list_dir("/workspace") == ["README.md", "data/", "src/"]
        assert await rt.list_dir("src") == ["pkg/"]
        assert await rt.list_dir("src/pkg/") == ["__init__.py", "core.py"]
        with pytest.raises(FileNotFoundError):
            await rt.list_dir("nope")
        with pytest.raises(NotADirectoryError):
            await rt.list_dir("README.md")

    run(scenario())


def test_read_errors() -> None:
    async def scenario() -> None:
        rt = await started()
        with pytest.raises(FileNotFoundError):
            await rt.read_file("missing.txt")
        with pytest.raises(IsADirectoryError):
            await rt.read_file("src")
        with pytest.raises(IsADirectoryError):
            await rt.read_file("/workspace")

    run(scenario())


def test_write_creates_and_replaces() -> None:
    async def scenario() -> None:
        rt = await started()
        await rt.write_file("new/deep/file.txt", "a")
        assert await rt.list_dir("new") == ["deep/"]
        await rt.write_file("new/deep/file.txt", "b")
        assert await rt.read_file("new/deep/file.txt") == "b"
        with pytest.raises(IsADirectoryError):
            await rt.write_file("src/pkg", "x")
        with pytest.raises(NotADirectoryError):
            await rt.write_file("README.md/inner.txt", "x")

    run(scenario())


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "src/../../x", "/workspacex/a"])
def test_paths_escaping_the_root_are_refused(path: str) -> None:
    async def scenario() -> None:
        rt = await started()
        with pytest.raises(PermissionError):
            await rt.read_file(path)
        with pytest.raises(PermissionError):
            await rt.write_file(path, "x")
        with pytest.raises(PermissionError):
            await rt.list_dir(path)

    run(scenario())
    with pytest.raises(PermissionError):
        SimulatedRuntime({path: "x"})


def test_shell_commands() -> None:
    async def scenario() -> None:
        rt = await started()
        assert await rt.exec("cat data/facts.txt README.md", 5) == ExecResult(
            exit_code=0, stdout="the answer is 42\nhello\n"
        )
        missing = await rt.exec("cat nope.txt", 5)
        assert missing.exit_code == 1 and "No such file" in missing.stderr
        assert (await rt.exec("cat src", 5)).stderr == "cat: src: Is a directory\n"
        assert "Permission denied" in (await rt.exec("cat ../secret", 5)).stderr
        assert (await rt.exec("ls", 5)).stdout == "README.md\ndata/\nsrc/\n"
        assert (await rt.exec("ls src/pkg", 5)).stdout == "__init__.py\ncore.py\n"
        assert (await rt.exec("ls nope", 5)).exit_code == 2
        assert (await rt.exec("echo 'hello   world' again", 5)).stdout == "hello   world again\n"
        assert (await rt.exec("true", 5)).exit_code == 0
        assert (await rt.exec("false", 5)).exit_code == 1
        unknown = await rt.exec("python -c 'print(1)'", 5)
        assert unknown.exit_code == 127 and "command not found" in unknown.stderr
        assert (await rt.exec("echo 'unbalanced", 5)).exit_code == 2
        assert (await rt.exec("sleep soon", 5)).exit_code == 1

    run(scenario())


def test_sleep_honours_the_timeout() -> None:
    async def scenario() -> tuple[ExecResult, ExecResult]:
        rt = await started()
        short = await rt.exec("sleep 0.05", 1.0)
        long = await rt.exec("sleep 100", 0.2)
        return short, long

    began = time.perf_counter()
    short, long = run(scenario())
    assert short == ExecResult(exit_code=0)
    assert long.timed_out and long.exit_code == 124
    assert 0.2 <= time.perf_counter() - began < 2.0


def test_exec_handler_overrides_the_shell() -> None:
    seen: list[tuple[str, float]] = []

    async def handler(command: str, timeout_s: float) -> ExecResult:
        seen.append((command, timeout_s))
        return ExecResult(exit_code=3, stdout="custom")

    async def scenario() -> ExecResult:
        rt = await started(exec_handler=handler)
        return await rt.exec("cat README.md", 7.5)

    assert run(scenario()) == ExecResult(exit_code=3, stdout="custom")
    assert seen == [("cat README.md", 7.5)]


def test_lifecycle_and_idempotent_close() -> None:
    async def scenario() -> None:
        rt = SimulatedRuntime(FILES)
        assert not rt.alive()
        with pytest.raises(RuntimeFailure, match="never started"):
            await rt.exec("true", 1)
        with pytest.raises(RuntimeFailure):
            await rt.read_file("README.md")
        await rt.start()
        assert rt.alive()
        await rt.close()
        assert not rt.alive()
        await rt.close()
        assert not rt.alive()
        for op in (rt.exec("true", 1), rt.read_file("README.md"), rt.list_dir(".")):
            with pytest.raises(RuntimeFailure, match="closed"):
                await op
        with pytest.raises(RuntimeFailure, match="closed"):
            await rt.write_file("a", "b")
        with pytest.raises(RuntimeFailure):
            await rt.start()

    run(scenario())


def test_fail_on_start_raises_runtime_failure_after_the_delay() -> None:
    async def scenario() -> SimulatedRuntime:
        rt = SimulatedRuntime(start_delay_s=0.1, fail_on_start=True)
        with pytest.raises(RuntimeFailure, match="failed to start"):
            await rt.start()
        return rt

    began = time.perf_counter()
    rt = run(scenario())
    assert time.perf_counter() - began >= 0.1
    assert not rt.alive()


def test_start_and_close_delays() -> None:
    async def scenario() -> tuple[float, float, float]:
        rt = SimulatedRuntime(start_delay_s=0.1, close_delay_s=0.1)
        t0 = time.perf_counter()
        await rt.start()
        t1 = time.perf_counter()
        await rt.close()
        t2 = time.perf_counter()
        await rt.close()
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2

    start_s, close_s, second_close_s = run(scenario())
    assert start_s >= 0.1 and close_s >= 0.1
    assert second_close_s < 0.05


def test_many_runtimes_start_concurrently() -> None:
    async def scenario() -> list[bool]:
        runtimes = [SimulatedRuntime(start_delay_s=0.2) for _ in range(20)]
        await asyncio.gather(*(rt.start() for rt in runtimes))
        alive = [rt.alive() for rt in runtimes]
        await asyncio.gather(*(rt.close() for rt in runtimes))
        return alive

    began = time.perf_counter()
    assert all(run(scenario()))
    assert time.perf_counter() - began < 1.0
