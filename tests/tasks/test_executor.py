"""The sandboxed Python executor: its runtime (a temporary bubblewrap workspace) and the
`python` tool, through the real registry and sandbox."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext, ToolOutcome, ToolRegistry
from conveyor.config import RuntimeConfig
from conveyor.runtime import bubblewrap
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.limits import SandboxLimits
from conveyor.tasks import executor
from conveyor.tasks.executor import (
    EXECUTOR_RUNTIMES,
    ExecutorRuntime,
    executor_available,
    make_python_tool,
    python,
    start_executor_runtime,
)
from conveyor.types import Task, ToolCall

T = TypeVar("T")
AVAILABLE, WHY = executor_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no bubblewrap sandbox here: {WHY}")
TASK = Task(id="executor-test", family="math", prompt=[])


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def calls(
    codes: list[str], *, tool: Any = python, files: dict[str, str] | None = None
) -> tuple[list[ToolOutcome], Path]:
    """Run each code through the registry in one fresh executor runtime (closed after)."""
    runtime = await start_executor_runtime(RuntimeConfig(), files)
    assert isinstance(runtime, ExecutorRuntime)
    ctx = ToolContext(task=TASK, runtime=runtime)
    registry = ToolRegistry([tool])
    try:
        outcomes = [
            await registry.execute(
                ToolCall(name="python", arguments={"code": code}),
                ctx,
                timeout_s=60.0,
                max_output_chars=100_000,
            )
            for code in codes
        ]
    finally:
        await runtime.close()
    return outcomes, runtime.workspace


@needs_sandbox
def test_python_prints_output_and_exit_status_and_final_expression() -> None:
    outcomes, _ = run(calls(["print('hi')\n2**100 % 7", "import sys\nsys.exit(3)", "x = 1"]))
    assert [o.kind for o in outcomes] == ["ok", "ok", "ok"]
    assert outcomes[0].output == "hi\n2\n[exit code: 0]"
    assert outcomes[1].output == "[exit code: 3]"
    assert outcomes[2].output == "[exit code: 0]"


@needs_sandbox
def test_errors_are_shown_to_the_model_without_the_runner() -> None:
    outcomes, _ = run(calls(["1/0", "def f(:\n  pass", "import sys; print('e', file=sys.stderr)"]))
    assert "ZeroDivisionError: division by zero" in outcomes[0].output
    assert "_run.py" not in outcomes[0].output and "[exit code: 1]" in outcomes[0].output
    assert "SyntaxError" in outcomes[1].output and "_run.py" not in outcomes[1].output
    assert outcomes[2].output == "[stderr]\ne\n[exit code: 0]"


@needs_sandbox
def test_each_call_is_a_fresh_interpreter_but_files_persist_and_are_cleaned_up() -> None:
    outcomes, workspace = run(
        calls(
            [
                "x = 5\nopen('note.txt', 'w').write('kept')",
                "print('x' in globals(), open('note.txt').read(), open('given.txt').read())",
            ],
            files={"given.txt": "from the family"},
        )
    )
    assert outcomes[1].output == "False kept from the family\n[exit code: 0]"
    assert not workspace.exists()


@needs_sandbox
def test_code_runs_as_the_sandbox_user_without_network_or_host_files() -> None:
    code = (
        "import os, socket\n"
        "print(os.getuid(), os.getcwd())\n"
        "print(os.path.exists('/etc/shadow'), os.path.exists('/work/main/src'))\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    print('network')\n"
        "except OSError:\n"
        "    print('no network')\n"
        "import sympy, mpmath\nprint(sympy.factorint(2**32 + 1))"
    )
    (outcome,), _ = run(calls([code]))
    lines = outcome.output.splitlines()
    assert lines[:2] == ["65534 /workspace", "False False"]
    assert lines[2] == "no network"
    assert lines[3] == "{641: 1, 6700417: 1}"


@needs_sandbox
def test_endless_code_is_killed_at_the_time_limit() -> None:
    quick = make_python_tool(timeout_s=1.0)
    (outcome,), _ = run(calls(["print('started', flush=True)\nwhile True: pass"], tool=quick))
    assert outcome.kind == "raised"
    assert "CodeTimedOut" in outcome.output and "started" in outcome.output


@needs_sandbox
def test_floods_of_output_are_truncated() -> None:
    small = make_python_tool(max_output_chars=200)
    (outcome,), _ = run(calls(["print('x' * 10**7)"], tool=small))
    assert len(outcome.output) < 400
    assert "truncated" in outcome.output and outcome.output.endswith("[exit code: 0]")


@needs_sandbox
def test_hidden_folders_are_empty_in_the_sandbox() -> None:
    env = executor.python_env_dir()
    folder = (env / "lib") if env is not None else Path("/usr/lib")

    async def listing(hidden: list[Path]) -> str:
        runtime = await start_executor_runtime(RuntimeConfig(), hidden=hidden)
        try:
            return (await runtime.exec(f"ls {folder}", 10)).stdout
        finally:
            await runtime.close()

    assert run(listing([])).strip()
    assert run(listing([folder])) == ""


def test_the_executor_refuses_runtime_kinds_it_cannot_use() -> None:
    assert EXECUTOR_RUNTIMES[0] == "bubblewrap"
    with pytest.raises(ValueError, match=r"cannot use runtime\.kind 'simulated'"):
        run(start_executor_runtime(RuntimeConfig(kind="simulated")))


def test_hiding_needs_bubblewrap(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot hide folders"):
        run(start_executor_runtime(RuntimeConfig(kind="local"), hidden=[tmp_path]))


def test_missing_bubblewrap_is_a_clear_infrastructure_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing() -> tuple[bool, str]:
        return False, "missing bwrap on PATH (apt-get install bubblewrap)"

    monkeypatch.setattr(bubblewrap, "bubblewrap_available", missing)
    assert executor.executor_available() == (False, missing()[1])
    with pytest.raises(RuntimeFailure, match=r"needs bubblewrap.*apt-get install bubblewrap"):
        run(start_executor_runtime(RuntimeConfig()))


def test_python_without_a_runtime_is_an_infrastructure_error() -> None:
    ctx = ToolContext(task=TASK, runtime=None)
    call = ToolCall(name="python", arguments={"code": "1"})
    with pytest.raises(RuntimeFailure, match="needs a runtime"):
        run(ToolRegistry([python]).execute(call, ctx, timeout_s=5, max_output_chars=100))


def test_bad_arguments_are_the_policys_error() -> None:
    ctx = ToolContext(task=TASK, runtime=None)
    registry = ToolRegistry([python])
    missing = run(
        registry.execute(
            ToolCall(name="python", arguments={}), ctx, timeout_s=5, max_output_chars=99
        )
    )
    assert missing.kind == "invalid_arguments"
    wrong = ToolCall(name="python", arguments={"code": 5})
    assert run(registry.execute(wrong, ctx, timeout_s=5, max_output_chars=99)).kind == (
        "invalid_arguments"
    )


@needs_sandbox
def test_the_runtime_passes_file_descriptors_and_limits() -> None:
    async def check() -> tuple[str, str]:
        limits = SandboxLimits(memory_bytes=512 << 20)
        runtime: Runtime = await start_executor_runtime(RuntimeConfig(), limits=limits)
        assert isinstance(runtime, ExecutorRuntime)
        read_end, write_end = os.pipe()
        os.write(write_end, b"secret")
        os.close(write_end)
        try:
            piped = await runtime.exec(f"cat <&{read_end}", 10, pass_fds=(read_end,))
            big = await runtime.exec("python3 -c 'x = bytearray(1 << 30)'", 10)
        finally:
            os.close(read_end)
            await runtime.close()
        return piped.stdout, big.stderr

    piped, big = run(check())
    assert piped == "secret"
    assert "MemoryError" in big


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_local_runtime_runs_the_same_tool_without_isolation() -> None:
    async def check() -> tuple[str, Path]:
        runtime = await start_executor_runtime(RuntimeConfig(kind="local"), {"a.txt": "given"})
        assert isinstance(runtime, ExecutorRuntime)
        try:
            result = await executor.run_python(runtime, "print(open('a.txt').read())\n6 * 7", 30)
        finally:
            await runtime.close()
        return executor.format_result(result, 1000), runtime.workspace

    output, workspace = run(check())
    assert output == "given\n42\n[exit code: 0]"
    assert not workspace.exists()
