"""The swe-sim rollout stages and runtime: what a SWE rollout does, in simulated time.

`SimEnvironment` implements `RolloutStages` on top of `SimEngine` and a fixed pool of CPU slots
(init and reward each hold one). It counts live runtimes from init start to close, so a bench
run can check the bound R from outside the dispatcher, and the runtime-seconds they cost.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from conveyor.runtime.base import ExecResult, Runtime, RuntimeFailure
from conveyor.sim.engine import SimEngine
from conveyor.sim.swe import RolloutPlan, SweSimWorkload, plan_rollout
from conveyor.types import EndReason, Status, Task, Trajectory

ATTEMPT_FILE = "/sim/attempt"


class SimRuntime:
    """A simulated sandbox: `exec("sleep S")` takes S seconds, `exec("hang")` never returns."""

    def __init__(self, env: SimEnvironment, attempt: int, born: float) -> None:
        self._env = env
        self._attempt = attempt
        self._born = born
        self._closed = False

    async def start(self) -> None:
        """Already started by the init stage."""

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        """`sleep S` or `hang` (a policy command that never ends, up to `timeout_s`)."""
        if self._closed:
            raise RuntimeFailure("runtime is closed")
        if command == "hang":
            try:
                async with asyncio.timeout(timeout_s):
                    await asyncio.Event().wait()
            except TimeoutError:
                return ExecResult(exit_code=124, timed_out=True)
        seconds = float(command.removeprefix("sleep "))
        await asyncio.sleep(seconds)
        return ExecResult(exit_code=0)

    async def read_file(self, path: str) -> str:
        """Only `ATTEMPT_FILE` exists: which attempt this runtime serves."""
        if path != ATTEMPT_FILE:
            raise FileNotFoundError(path)
        return str(self._attempt)

    async def write_file(self, path: str, content: str) -> None:
        """Writes go nowhere."""

    async def list_dir(self, path: str) -> list[str]:
        """An empty tree."""
        return []

    def alive(self) -> bool:
        """Until closed."""
        return not self._closed

    async def close(self) -> None:
        """Idempotent; books the runtime's lifetime."""
        if self._closed:
            return
        self._closed = True
        self._env.release_runtime(self._born)


@dataclass(frozen=True, slots=True)
class SimHead:
    """A first turn generated before the runtime existed: which attempt, and the context after."""

    attempt: int
    context: int


class SimEnvironment:
    """`RolloutStages` of the swe-sim workload, with its shared CPU slots and engine."""

    def __init__(
        self, workload: SweSimWorkload, seed: int, engine: SimEngine | None = None
    ) -> None:
        self.workload = workload
        self.seed = seed
        self.engine = engine
        self.live = 0
        self.peak_live = 0
        self.runtime_seconds = 0.0
        self.runtimes_made = 0
        self._cpu: asyncio.Semaphore | None = None

    def tasks(self, count: int | None = None) -> list[Task]:
        """The workload's task instances (`count` overrides how many)."""
        n = self.workload.tasks if count is None else count
        return [
            Task(id=f"swe-sim-{i:05d}", family="swe-sim", prompt=[], data={"index": i})
            for i in range(n)
        ]

    def plan(self, task: Task, sample_index: int, attempt: int) -> RolloutPlan:
        """The seeded draw of one attempt."""
        return plan_rollout(self.workload, self.seed, task.data["index"], sample_index, attempt)

    @property
    def cpu(self) -> asyncio.Semaphore:
        """The fixed CPU slots (made on first use, on the running loop)."""
        if self._cpu is None:
            self._cpu = asyncio.Semaphore(self.workload.cpu_slots)
        return self._cpu

    def release_runtime(self, born: float) -> None:
        """Book one runtime's end."""
        self.live -= 1
        self.runtime_seconds += asyncio.get_running_loop().time() - born

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        """Take a CPU slot for the set-up time; fails (infra) where the plan says so."""
        plan = self.plan(task, sample_index, attempt)
        born = asyncio.get_running_loop().time()
        self.live += 1
        self.peak_live = max(self.peak_live, self.live)
        self.runtimes_made += 1
        try:
            async with self.cpu:
                await asyncio.sleep(plan.init_s * (0.5 if plan.init_fails else 1.0))
            if plan.init_fails:
                raise RuntimeFailure(f"simulated sandbox start failure ({task.id}/{sample_index})")
        except BaseException:
            self.release_runtime(born)
            raise
        return SimRuntime(self, attempt, born)

    def _engine(self) -> SimEngine:
        if self.engine is None:
            raise RuntimeError("SimEnvironment needs an engine for the run stage")
        return self.engine

    async def first_turn(self, task: Task, sample_index: int, attempt: int) -> SimHead:
        """The first generation: it reads only the prompt, so it needs no runtime."""
        plan = self.plan(task, sample_index, attempt)
        session = f"{task.id}/{sample_index}/{attempt}"
        context = self.workload.prompt_tokens
        await self._engine().generate(session, context, plan.turns[0].completion_tokens)
        return SimHead(attempt, context + plan.turns[0].completion_tokens)

    async def run(
        self, task: Task, sample_index: int, runtime: Runtime, head: object = None
    ) -> Trajectory:
        """Turns of generation on the engine and tool calls on the runtime (the first turn's
        generation already done when `head` comes from `first_turn`)."""
        engine = self._engine()
        if head is not None and not isinstance(head, SimHead):
            raise TypeError(f"SimEnvironment.run: head must be a SimHead, got {type(head)}")
        attempt = head.attempt if head else int(await runtime.read_file(ATTEMPT_FILE))
        plan = self.plan(task, sample_index, attempt)
        session = f"{task.id}/{sample_index}/{attempt}"
        context = self.workload.prompt_tokens
        last = len(plan.turns) - 1
        try:
            for index, turn in enumerate(plan.turns):
                if index == 0 and head is not None:
                    context = head.context
                else:
                    await engine.generate(session, context, turn.completion_tokens)
                    context += turn.completion_tokens
                if index == last and not plan.truncated:
                    break  # the last turn calls `finish`
                command = "hang" if turn.tool_hangs else f"sleep {turn.tool_s:.6f}"
                await runtime.exec(command, timeout_s=1e9)
                context += turn.observation_tokens
        finally:
            engine.end_session(session)  # a retry is a new attempt, so a new session
        return Trajectory(
            task_id=task.id,
            sample_index=sample_index,
            status=Status.TRUNCATED if plan.truncated else Status.OK,
            stop_reason=EndReason.CONTEXT_LENGTH if plan.truncated else EndReason.FINISH,
            counters={"tool_calls": len(plan.turns)},
            metrics={
                "prompt_tokens": float(self.workload.prompt_tokens),
                "context_tokens": float(context),
            },
        )

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        """The tests take a CPU slot; they crash the sandbox (infra) where the plan says so."""
        attempt = int(await runtime.read_file(ATTEMPT_FILE))
        plan = self.plan(task, sample_index=trajectory.sample_index, attempt=attempt)
        async with self.cpu:
            await runtime.exec(f"sleep {plan.reward_s * (0.5 if plan.reward_fails else 1.0)}", 1e9)
        if plan.reward_fails:
            raise RuntimeFailure(f"simulated test-run crash ({task.id}/{trajectory.sample_index})")
        passed = plan.passed and trajectory.status is Status.OK
        return trajectory.model_copy(update={"reward": 1.0 if passed else 0.0})

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cpu"] = None  # a semaphore belongs to one loop; each process makes its own
        state["engine"] = None
        return state
