"""Rollouts of an outside agent program: our runtime and reward, its own loop, our gateway.

`ExternalAgentStages` is a `RolloutStages`: `init` starts the family's runtime (as
`AgentStages.init`); `run` opens a gateway rollout for (task, sample) on an in-process gateway
and runs the configured command with

- `OPENAI_BASE_URL` = the rollout's base URL (`.../rollouts/ID/v1`), `OPENAI_API_KEY=x`,
- `CONVEYOR_ROLLOUT_URL` = `.../rollouts/ID` (its task, tools and finish endpoints),

in the runtime's workspace folder where it has one, for at most `agent.rollout_timeout_s`.
The trajectory is what the gateway recorded. The program is the policy: it finishing is `ok`,
running out of time is `timeout`, exiting non-zero without finishing is `policy_error`; an
engine or runtime failure seen by the gateway is raised as an infra error. `reward` is the
family's score of the submitted answer, as for the native agent (the reward the program sends
is kept beside it as the metric `agent_reward`), unless the family declares
`reward_from_agent = True`: then the program's `finish` reward is the reward.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conveyor.agent.chat import RendererFactory, renderer_factory
from conveyor.agent.loop import final_answer
from conveyor.config import AgentConfig, ConveyorConfig, RuntimeConfig, SamplingConfig
from conveyor.engines.base import EngineError, SamplingClient
from conveyor.gateway.recording import RolloutRecord, RolloutState
from conveyor.gateway.server import GatewayServer
from conveyor.gateway.service import Gateway
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.starts import RuntimeStarts
from conveyor.tasks.family import TaskFamily, get_family
from conveyor.types import EndReason, Status, Task, Trajectory

_TAIL_CHARS = 2000


class ExternalAgentStages:
    """init / run / reward of one rollout whose agent is an outside program."""

    def __init__(
        self,
        command: Sequence[str],
        client: SamplingClient,
        make_renderer: RendererFactory,
        agent: AgentConfig,
        sampling: SamplingConfig,
        *,
        families: Mapping[str, TaskFamily] | None = None,
        env: Mapping[str, str] | None = None,
        runtime: RuntimeConfig | None = None,
        starts: RuntimeStarts | None = None,
    ) -> None:
        """`command`: the agent program's argv; `env`: extra environment for it (on top of
        this process's environment and the gateway variables); `starts`: the run's runtime
        start limits (default: this stage set's own, from the `runtime` settings)."""
        if not command:
            raise ValueError("ExternalAgentStages needs a non-empty command (argv list)")
        self.command = list(command)
        self.agent = agent
        self.env = dict(env or {})
        self._families: dict[str, TaskFamily] = dict(families or {})
        self.starts = starts if starts is not None else RuntimeStarts(runtime or RuntimeConfig())
        self._owns_starts = starts is None
        self.gateway = Gateway(client, make_renderer, agent, sampling, families=self._families)
        self._server: GatewayServer | None = None
        self._server_loop: asyncio.AbstractEventLoop | None = None
        self._server_lock: asyncio.Lock | None = None

    @classmethod
    def from_config(
        cls,
        config: ConveyorConfig,
        command: Sequence[str],
        client: SamplingClient,
        tokenizer: Any,
        sampling: SamplingConfig | None = None,
        *,
        families: Mapping[str, TaskFamily] | None = None,
        starts: RuntimeStarts | None = None,
    ) -> ExternalAgentStages:
        """Stages rendering as `AgentStages.from_config` does, for the program `command`;
        requests that name no sampling settings get `sampling` (default: the config's)."""
        return cls(
            command,
            client,
            renderer_factory(config.model, tokenizer),
            config.agent,
            sampling or config.sampling,
            families=families,
            runtime=config.runtime,
            starts=starts,
        )

    def family(self, name: str) -> TaskFamily:
        """The run's instance of family `name`, built once on first use."""
        if name not in self._families:
            self._families[name] = get_family(name)
        return self._families[name]

    async def server(self) -> GatewayServer:
        """The in-process gateway server, started on first use in the running loop.

        Concurrent rollouts of one dispatcher ask for it at once: the loop is claimed before
        the first start is awaited and the start is behind a lock, so they all get the one
        server (the loop was once set only after the start, and every rollout that asked during
        it failed as "serves one event loop", retried as an infrastructure fault)."""
        loop = asyncio.get_running_loop()
        if self._server_loop is None or self._server_lock is None:
            self._server_loop, self._server_lock = loop, asyncio.Lock()
        elif self._server_loop is not loop:
            raise RuntimeError("ExternalAgentStages serves one event loop; close() it first")
        async with self._server_lock:
            if self._server is None:
                server = GatewayServer(self.gateway)
                await server.start()  # a failed start leaves none: the next caller tries again
                self._server = server
            return self._server

    async def close(self) -> None:
        """Stop the gateway server and close this stage set's own warm runtimes
        (idempotent)."""
        server, self._server = self._server, None
        self._server_loop = self._server_lock = None
        if server is not None:
            await server.stop()
        if self._owns_starts:
            await self.starts.close()

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        """A started runtime from the task's family, under the run's start limits."""
        with self.starts.active():
            return await self.family(task.family).make_runtime(task)

    async def run(self, task: Task, sample_index: int, runtime: Runtime) -> Trajectory:
        """Run the agent program against a fresh gateway rollout; the recorded trajectory."""
        server = await self.server()
        rollout_id = f"{task.id}.{sample_index}.{uuid.uuid4().hex[:8]}"
        record = await self.gateway.create(
            rollout_id,
            task=task,
            sample_index=sample_index,
            runtime=runtime,
            score_on_finish=False,
        )
        rollout_url = f"{server.url}/rollouts/{rollout_id}"
        env = {
            **os.environ,
            **self.env,
            "OPENAI_BASE_URL": f"{rollout_url}/v1",
            "OPENAI_API_KEY": "x",
            "CONVEYOR_ROLLOUT_URL": rollout_url,
        }
        workspace = getattr(runtime, "workspace", None)
        cwd = (
            str(workspace)
            if isinstance(workspace, str | Path) and Path(workspace).is_dir()
            else None
        )
        process = await asyncio.create_subprocess_exec(
            *self.command,
            env=env,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            return await self._wait(process, record)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            self.gateway.rollouts.pop(rollout_id, None)

    async def _wait(self, process: asyncio.subprocess.Process, record: RolloutRecord) -> Trajectory:
        """Wait for the program within the rollout budget; the trajectory, owned as it ended."""
        timed_out = False
        output = b""
        try:
            output, _ = await asyncio.wait_for(
                process.communicate(), timeout=self.agent.rollout_timeout_s
            )
        except TimeoutError:
            timed_out = True
            process.kill()
            await process.wait()
        failure = record.infra_failure
        if failure is not None:
            message = record.error or str(failure)
            if isinstance(failure, RuntimeFailure):
                raise RuntimeFailure(message) from failure
            raise EngineError(message) from failure
        if record.state is not RolloutState.FINISHED:
            if record.closed_as is None and timed_out:
                record.closed_as = (Status.TIMEOUT, EndReason.ROLLOUT_TIMEOUT)
            elif record.closed_as is None and process.returncode != 0:
                if not record.finished_by_agent():
                    tail = output.decode(errors="replace")[-_TAIL_CHARS:]
                    record.closed_as = (Status.POLICY_ERROR, EndReason.UNSET)
                    record.error = f"the agent program exited with {process.returncode}: {tail}"
            await self.gateway.finish(record.rollout_id, {})
        return self.gateway.trajectory(record.rollout_id)

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        """The reward of every status but infra_error: the family's score of the submitted
        answer, or, for a family that declares `reward_from_agent = True`, the reward the
        program sent with `finish` (0.0 when it sent none).

        The program is the policy, so on a family that grades its own tasks the reward it
        sends is never trusted: it is kept as the metric `agent_reward` (to compare with the
        grader's) and the family grades as for the native agent."""
        if trajectory.status is Status.INFRA_ERROR:
            return trajectory
        family = self.family(task.family)
        sent = trajectory.reward  # the gateway records only the program's `finish` reward
        if getattr(family, "reward_from_agent", False):
            return trajectory.model_copy(update={"reward": 0.0 if sent is None else sent})
        with self.starts.active():
            score = await family.score(task, final_answer(trajectory), runtime)
        metrics = (
            trajectory.metrics if sent is None else {**trajectory.metrics, "agent_reward": sent}
        )
        return trajectory.model_copy(update={"reward": score, "metrics": metrics})
