"""The chaos test's sandboxed task family and its fault-injecting stages (test-only).

`ChaosSandboxFamily`: write `hello` to answer.txt with `bash`, then `finish`; each rollout in a
bubblewrap sandbox over an overlay workspace with its own 8 MiB disk. `ScriptedChaosStages`:
the real `AgentStages`, plus the policy-side writes the tiny model cannot be steered into
(filling its disk, code that hangs under pytest) and the injected infra faults (a wedged grader,
a full host disk). Used by `test_chaos_real.py`.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from conveyor.agent.tools import ToolRegistry, finish
from conveyor.engines.base import EngineError
from conveyor.rollout import AgentStages
from conveyor.runtime.base import ExecResult, Runtime
from conveyor.runtime.bubblewrap import BubblewrapRuntime
from conveyor.runtime.limits import MiB
from conveyor.runtime.selection import started
from conveyor.runtime.workspace import Workspace, make_workspace
from conveyor.tasks.swe.tools import make_bash_tool
from conveyor.types import Task, ToolCall, Trajectory

WORKSPACE_DISK = 8 * MiB  # each sandbox's own disk
GRADER_TIMEOUT_S = 6.0  # the grader's pytest budget: a hang past it is a failed test
REWARD_TIMEOUT_S = 30.0  # the dispatcher's reward budget: a grader stuck past it is infra
HANGING_SOLUTION = "import time\n\ntime.sleep(10**6)\nVALUE = 1\n"
TEST_SOLUTION = "from solution import VALUE\n\n\ndef test_value():\n    assert VALUE == 1\n"
PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider"
# A grader's pytest that hangs through no fault of the policy (a wedged test environment).
WEDGE = (
    "mkdir -p /tmp/wedge && printf 'import time\\ntime.sleep(10**6)\\n' > /tmp/wedge/conftest.py"
    f" && {PYTEST} /tmp/wedge"
)


def fault_of(task: Task) -> str:
    return str(task.data["fault"])


def fault_plan(index: int) -> str:
    """The fault of task `index` (two samples each)."""
    if index % 10 == 1:
        return "policy_fill"
    if index % 20 == 2:
        return "policy_hang"
    if index % 20 == 3:
        return "grader_hang"
    if index % 20 == 4:
        return "host_full"
    return "none"


class ChaosRuntime(BubblewrapRuntime):
    """A bubblewrap sandbox over a workspace it owns (removed on close)."""

    def __init__(self, workspace: Workspace, env_dir: Path) -> None:
        super().__init__(workspace.path, env_dir=env_dir)
        self.task_workspace = workspace

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self.task_workspace.remove)


class ChaosSandboxFamily:
    """Test-only family: write `hello` to /workspace/answer.txt with `bash`, then `finish`
    (nameable only while a chaos test runs: its fixture registers it).

    Graded in the rollout's sandbox: `grep` for the answer, or, for `policy_hang` tasks, the
    task's pytest test of the policy's `solution.py` under `GRADER_TIMEOUT_S`.
    """

    name = "chaos-sandbox-test"
    root: ClassVar[Path] = Path("/nonexistent")
    full_root: ClassVar[Path] = Path("/nonexistent")  # a host disk that is full, see below
    template: ClassVar[Path] = Path("/nonexistent")
    sandbox_ids: ClassVar[list[str]] = []
    grades: ClassVar[list[ExecResult]] = []

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        prompt = [
            {
                "role": "system",
                "content": "You work in a Linux sandbox; your files are in /workspace. "
                "Run shell commands with the bash tool, one call per message.",
            },
            {"role": "user", "content": "Write the word hello into answer.txt, then finish."},
        ]
        return [
            Task(
                id=f"chaos-{i:03d}-{fault_plan(i)}",
                family=self.name,
                prompt=prompt,
                data={"fault": fault_plan(i)},
                split=split,
            )
            for i in range(n)
        ]

    def tools(self) -> ToolRegistry:
        return ToolRegistry([make_bash_tool(10.0), finish])

    async def make_runtime(self, task: Task) -> Runtime:
        root = self.full_root if DISK_FULL_AT_START.get() else self.root
        workspace = await asyncio.to_thread(
            make_workspace, self.template, root, size_bytes=WORKSPACE_DISK
        )
        runtime = ChaosRuntime(workspace, Path(sys.prefix))
        self.sandbox_ids.append(runtime.sandbox_id)
        return await started(runtime)

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        if fault_of(task) == "policy_hang":
            command = f"{PYTEST} tests/test_solution.py"
            result = await runtime.exec(command, GRADER_TIMEOUT_S)
            self.grades.append(result)
            # A test that hangs in the policy's code fails like any other: the policy's result.
            return 1.0 if result.exit_code == 0 and not result.timed_out else 0.0
        result = await runtime.exec("grep -qx hello answer.txt", 30.0)
        return 1.0 if result.exit_code == 0 else 0.0

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        return [
            ToolCall(name="bash", arguments={"command": "echo hello > answer.txt"}),
            ToolCall(name="finish", arguments={"answer": "done"}),
        ]


class ScriptedChaosStages(AgentStages):
    """Test-only: the real agent stages, plus the faults the tiny model cannot be steered into
    (policy writes made on its behalf through its sandbox) and the injected infra faults."""

    def __init__(self, *args: Any, family: type[ChaosSandboxFamily], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fills: dict[tuple[str, int], ExecResult] = {}
        self.wedged: set[tuple[str, int]] = set()
        self.host_full: dict[tuple[str, int], int | None] = {}  # errno of the failed start
        self.engine_errors: list[EngineError] = []
        # what each reward stage did and when (shown when a rollout is lost)
        self.reward_trace: dict[tuple[str, int], list[str]] = {}

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        if fault_of(task) == "host_full" and attempt == 0:
            token = DISK_FULL_AT_START.set(True)  # make_runtime makes it on the full disk
            try:
                return await super().init(task, sample_index, attempt)
            except OSError as error:
                self.host_full[(task.id, sample_index)] = error.errno
                raise
            finally:
                DISK_FULL_AT_START.reset(token)
        return await super().init(task, sample_index, attempt)

    async def run(
        self, task: Task, sample_index: int, runtime: Runtime, head: object = None
    ) -> Trajectory:
        fault = fault_of(task)
        if fault == "policy_fill":  # the policy's command that writes until the disk is full
            self.fills[(task.id, sample_index)] = await runtime.exec("yes chaos > fill.txt", 30)
        elif fault == "policy_hang":  # the policy's code: hangs when imported
            await runtime.write_file("solution.py", HANGING_SOLUTION)
        try:
            return await super().run(task, sample_index, runtime, head)
        except EngineError as error:
            self.engine_errors.append(error)
            raise

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        key = (task.id, trajectory.sample_index)
        trace = self.reward_trace.setdefault(key, [])
        trace.append(f"start {time.monotonic():.1f}")
        try:
            if fault_of(task) == "grader_hang" and key not in self.wedged:
                self.wedged.add(key)
                await runtime.exec(WEDGE, 10**6)  # cut by the dispatcher's reward timeout
            scored = await super().reward(task, trajectory, runtime)
        except BaseException as error:
            trace.append(f"{type(error).__name__} {time.monotonic():.1f}")
            raise
        trace.append(f"end {time.monotonic():.1f}")
        return scored


# Set by the stages for a start that is to meet a full host disk: the family makes that
# workspace under `full_root`, a filesystem of its own that the fixture filled (another
# process's ballast). Nothing else writes or frees space there, so the start fails with ENOSPC
# every time. (Filling the shared root around such a start was flaky: any workspace removed or
# failed meanwhile freed the page it needed; seen in CI, 9 of 10.)
DISK_FULL_AT_START: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "chaos_disk_full_at_start", default=False
)


def fill_disk(path: Path) -> None:
    """Fill the filesystem holding `path` with the file `path`, to the last page."""
    with open(path, "ab") as handle:
        # tmpfs takes all of a fallocate or none of it: claim big, then smaller, to the page
        size, chunk = os.fstat(handle.fileno()).st_size, 1 << 20
        while chunk >= 4096:
            try:
                os.posix_fallocate(handle.fileno(), size, chunk)
                size += chunk
            except OSError:
                chunk //= 2
