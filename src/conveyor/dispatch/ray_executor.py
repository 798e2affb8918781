"""The Ray executor: each runtime lives in its own Ray actor, placed by a resource request.

The init stage creates an actor (e.g. `resources={"sandbox": 1}`) and starts the runtime inside
it; the run stage's agent loop stays in the dispatcher's process (next to the engine client) and
reaches that same actor through a `RayRuntime` proxy for every tool call; the reward stage runs
on the actor. Closing the proxy closes the runtime and kills the actor. Ray is imported only
when this executor is used (`pip install 'conveyor[ray]'`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.dispatch.stages import FirstTurnStages, RolloutStages
from conveyor.engines.base import EngineError
from conveyor.registry import EXECUTORS
from conveyor.runtime.base import ExecResult, Runtime, RuntimeFailure
from conveyor.types import Task, Trajectory


def import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "the Ray executor needs Ray: pip install 'conveyor[ray]' (or pip install ray)"
        ) from error
    return ray


class RuntimeHost:
    """The body of one runtime actor: holds the runtime the inner init stage started."""

    def __init__(self, stages: RolloutStages) -> None:
        # `stages` as pickled: `conveyor.rollout.AgentStages` leaves its engine client and agent
        # loops behind (they serve the run stage, which stays in the driver).
        self._stages = stages
        self._runtime: Runtime | None = None

    async def init(self, task: Task, sample_index: int, attempt: int) -> None:
        self._runtime = await self._stages.init(task, sample_index, attempt)

    def _live(self) -> Runtime:
        if self._runtime is None:
            raise RuntimeFailure("runtime actor holds no runtime")
        return self._runtime

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        return await self._live().exec(command, timeout_s)

    async def read_file(self, path: str) -> str:
        return await self._live().read_file(path)

    async def write_file(self, path: str, content: str) -> None:
        await self._live().write_file(path, content)

    async def list_dir(self, path: str) -> list[str]:
        return await self._live().list_dir(path)

    def alive(self) -> bool:
        return self._runtime is not None and self._runtime.alive()

    async def reward(self, task: Task, trajectory: Trajectory) -> Trajectory:
        return await self._stages.reward(task, trajectory, self._live())

    async def close(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await runtime.close()


async def _call(ray: Any, ref: Any) -> Any:
    """Await an actor call; map Ray's errors back to the failure taxonomy."""
    try:
        return await ref
    except ray.exceptions.RayTaskError as error:
        cause = getattr(error, "cause", None)
        if isinstance(cause, RuntimeFailure | EngineError | FileNotFoundError | IsADirectoryError):
            raise cause from error
        raise RuntimeFailure(f"runtime actor call failed: {cause or error}") from error
    except ray.exceptions.RayError as error:  # actor died, placement failed, ...
        raise RuntimeFailure(f"runtime actor lost: {type(error).__name__}: {error}") from error


class RayRuntime:
    """A `Runtime` whose every call runs on one Ray actor."""

    def __init__(self, ray: Any, actor: Any) -> None:
        self._ray = ray
        self.actor = actor
        self._closed = False

    async def start(self) -> None:
        """Started by the init stage on the actor."""

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run a command on the actor's runtime."""
        result: ExecResult = await _call(self._ray, self.actor.exec.remote(command, timeout_s))
        return result

    async def read_file(self, path: str) -> str:
        """Read a file in the actor's runtime."""
        text: str = await _call(self._ray, self.actor.read_file.remote(path))
        return text

    async def write_file(self, path: str, content: str) -> None:
        """Write a file in the actor's runtime."""
        await _call(self._ray, self.actor.write_file.remote(path, content))

    async def list_dir(self, path: str) -> list[str]:
        """List a folder of the actor's runtime."""
        entries: list[str] = await _call(self._ray, self.actor.list_dir.remote(path))
        return entries

    def alive(self) -> bool:
        """Whether the proxy is open (the actor's liveness is checked on each call)."""
        return not self._closed

    async def close(self) -> None:
        """Close the runtime on the actor, then kill the actor; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(_call(self._ray, self.actor.close.remote()), timeout=60)
        finally:
            self._ray.kill(self.actor, no_restart=True)


class RayStages:
    """`RolloutStages` that host each rollout's runtime in a Ray actor (see module docstring)."""

    def __init__(self, inner: RolloutStages, actor_options: dict[str, Any]) -> None:
        self._ray = import_ray()
        self._inner = inner
        # Serialised once into the object store, not once per rollout's actor.
        self._shipped = self._ray.put(inner)
        self._host = self._ray.remote(RuntimeHost)
        self._options = actor_options

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        """Create the actor where resources allow and start the runtime inside it."""
        actor = self._host.options(**self._options).remote(self._shipped)
        try:
            await _call(self._ray, actor.init.remote(task, sample_index, attempt))
        except BaseException:
            self._ray.kill(actor, no_restart=True)
            raise
        return RayRuntime(self._ray, actor)

    async def run(self, task: Task, sample_index: int, runtime: Runtime) -> Trajectory:
        """The agent loop runs here; its tool calls go to the runtime's actor."""
        return await self._inner.run(task, sample_index, runtime)

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        """Score on the runtime's actor."""
        if not isinstance(runtime, RayRuntime):
            raise TypeError("RayStages.reward needs the RayRuntime its init returned")
        scored: Trajectory = await _call(self._ray, runtime.actor.reward.remote(task, trajectory))
        return scored


class RayFirstTurnStages(RayStages):
    """`RayStages` for inner stages with a `first_turn`: it runs here, beside the engine client
    (it needs no runtime), and the run stage continues from it."""

    def __init__(self, inner: FirstTurnStages, actor_options: dict[str, Any]) -> None:
        super().__init__(inner, actor_options)
        self._first = inner

    async def first_turn(self, task: Task, sample_index: int, attempt: int) -> object:
        """The inner stages' first turn, in this process."""
        return await self._first.first_turn(task, sample_index, attempt)

    async def run(
        self, task: Task, sample_index: int, runtime: Runtime, head: object = None
    ) -> Trajectory:
        """The agent loop from `head`; its tool calls go to the runtime's actor."""
        return await self._first.run(task, sample_index, runtime, head=head)


# What a local Ray started by the executor offers of each requested resource: enough that
# placement never waits, so the dispatcher's own bound (`max_live_runtimes`) is the only one.
LOCAL_RESOURCE_UNITS = 1_000_000.0


@EXECUTORS.register("ray")
class RayExecutor:
    """Places every runtime in a Ray actor with `resources` (default `{"sandbox": 1}`).

    On first use, unless Ray is already initialised: connects to the cluster at `address`, or,
    without one, starts a local Ray that offers the requested resources (a local Ray has no
    `sandbox` resource of its own, and actors asking for it would wait forever).
    """

    def __init__(
        self,
        resources: dict[str, float] | None = None,
        num_cpus: float = 0.0,
        address: str | None = None,
    ) -> None:
        self.resources = {"sandbox": 1.0} if resources is None else resources
        self.num_cpus = num_cpus
        self.address = address

    def place(self, stages: RolloutStages) -> RolloutStages:
        """Stages whose runtimes live in Ray actors."""
        ray = import_ray()
        if not ray.is_initialized():
            if self.address is None:
                # Ray counts CPUs and GPUs itself and refuses them as custom resources.
                custom = [name for name in self.resources if name not in ("CPU", "GPU")]
                local = dict.fromkeys(custom, LOCAL_RESOURCE_UNITS)
                ray.init(resources=local, include_dashboard=False)
            else:
                ray.init(address=self.address)
        options = {"resources": self.resources, "num_cpus": self.num_cpus, "max_restarts": 0}
        if isinstance(stages, FirstTurnStages):
            return RayFirstTurnStages(stages, options)
        return RayStages(stages, options)
