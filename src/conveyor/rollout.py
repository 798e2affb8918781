"""The agent's three rollout stages, as the dispatcher drives them.

`AgentStages` implements `conveyor.dispatch.stages.RolloutStages` for any registered task family:
`init` asks the family for a started runtime, `run` is the agent loop, `reward` is the family's
score of the answer submitted through `finish`. It is the only place where tasks, tools, renderer
and engine meet. It holds one instance of each family, built once with the run's `runtime`
settings (or handed in by the composition root), never one per stage call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from conveyor.agent.chat import ChatRenderer, renderer_factory
from conveyor.agent.hints import HintPolicy
from conveyor.agent.loop import AgentLoop, FirstTurn, final_answer
from conveyor.config import AgentConfig, ConveyorConfig, RuntimeConfig, SamplingConfig
from conveyor.engines.base import SamplingClient
from conveyor.registry import FAMILIES
from conveyor.runtime.base import Runtime
from conveyor.runtime.starts import RuntimeStarts
from conveyor.tasks.family import (
    Conversational,
    Grading,
    PerTaskTools,
    TaskFamily,
    get_family,
)
from conveyor.types import Status, Task, Trajectory


class AgentStages:
    """init / run / reward of one rollout for tasks of registered families."""

    def __init__(
        self,
        client: SamplingClient,
        make_renderer: Callable[[list[dict[str, Any]]], ChatRenderer],
        agent: AgentConfig,
        sampling: SamplingConfig,
        *,
        rollout_timeout_s: float,
        families: Mapping[str, TaskFamily] | None = None,
        runtime: RuntimeConfig | None = None,
        starts: RuntimeStarts | None = None,
    ) -> None:
        """`families`: the run's families by name (`tasks.family.build_families`); a task of
        another family gets one built on first use with the `runtime` settings. `starts`: the
        run's runtime start limits and warm pools (default: this stage set's own, from
        `runtime`; then `close()` releases its warm runtimes)."""
        self.client = client
        self.agent = agent
        self.sampling = sampling
        self.rollout_timeout_s = rollout_timeout_s
        self.runtime = runtime if runtime is not None else RuntimeConfig()
        self.starts = starts if starts is not None else RuntimeStarts(self.runtime)
        self._owns_starts = starts is None
        self._make_renderer = make_renderer
        self._families: dict[str, TaskFamily] = dict(families or {})
        self._loops: dict[str, AgentLoop] = {}

    @classmethod
    def from_config(
        cls,
        config: ConveyorConfig,
        client: SamplingClient,
        tokenizer: Any,
        sampling: SamplingConfig | None = None,
        *,
        families: Mapping[str, TaskFamily] | None = None,
        starts: RuntimeStarts | None = None,
    ) -> AgentStages:
        """Stages for a run config: its template, tool format, budgets and sampling, with the
        run's families (or ones built with the config's `runtime` settings) and runtime
        `starts`."""
        return cls(
            client,
            renderer_factory(config.model, tokenizer),
            config.agent,
            sampling or config.sampling,
            rollout_timeout_s=config.agent.rollout_timeout_s,
            families=families,
            runtime=config.runtime,
            starts=starts,
        )

    def __getstate__(self) -> dict[str, Any]:
        """What a runtime actor on another node gets (`conveyor.dispatch.ray_executor`): the
        families and settings that `init` and `reward` use. The engine client, the renderer and
        the agent loops serve `run`, which stays in the driver beside the engine."""
        return {**self.__dict__, "client": None, "_make_renderer": None, "_loops": {}}

    def family(self, name: str) -> TaskFamily:
        """The run's instance of family `name`, built once on first use if not handed in."""
        family = self._families.get(name)
        if family is None:
            family = get_family(name, self.runtime)
            self._families[name] = family
        return family

    def _family(self, task: Task) -> TaskFamily:
        return self.family(task.family)

    def loop_for(self, task: Task) -> AgentLoop:
        """One loop (renderer + tools) per family, built on first use; a family whose tools
        depend on the instance (`PerTaskTools`) gets one per distinct tool set."""
        family = self._family(task)
        if isinstance(family, PerTaskTools):
            tools = family.tools_for(task)
            key = f"{task.family}/{json.dumps(tools.schemas(), sort_keys=True)}"
        else:
            tools, key = None, task.family
        loop = self._loops.get(key)
        if loop is None:
            tools = tools if tools is not None else family.tools()
            loop = AgentLoop(
                self._make_renderer(tools.schemas()),
                self.client,
                tools,
                self.agent,
                self.sampling,
                rollout_timeout_s=self.rollout_timeout_s,
                # A family may bring its own hints (the SWE recipe adds view-without-search).
                hint_policy=_hint_policy(task.family),
                user_turn=family.user_turn if isinstance(family, Conversational) else None,
                malformed_ends_turn=bool(getattr(family, "malformed_call_ends_turn", False)),
            )
            self._loops[key] = loop
        return loop

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        """A started runtime from the task's family, under the run's start limits (and from its
        warm pool where the family's runtime has one)."""
        with self.starts.active():
            return await self._family(task).make_runtime(task)

    async def first_turn(self, task: Task, sample_index: int, attempt: int) -> FirstTurn | None:
        """The first generation, which needs no runtime (the dispatcher overlaps it with init)."""
        return await self.loop_for(task).first_turn(task, sample_index)

    async def run(
        self, task: Task, sample_index: int, runtime: Runtime, head: object = None
    ) -> Trajectory:
        """The agent loop, from `head` when `first_turn` ran; engine and runtime failures
        propagate as infrastructure errors."""
        if head is not None and not isinstance(head, FirstTurn):
            raise TypeError(f"AgentStages.run: head must be a FirstTurn, got {type(head)}")
        return await self.loop_for(task).run(task, sample_index, runtime, head)

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        """Score every policy outcome (ok, truncated, policy_error, timeout) with the family."""
        start = time.monotonic()
        if trajectory.status is Status.INFRA_ERROR:
            return trajectory
        family = self._family(task)
        with self.starts.active():  # a grader's own sandboxes start under the same limits
            return await self._scored(family, task, trajectory, runtime, start)

    async def _scored(
        self,
        family: TaskFamily,
        task: Task,
        trajectory: Trajectory,
        runtime: Runtime,
        start: float,
    ) -> Trajectory:
        update: dict[str, Any] = {}
        if isinstance(family, Grading):
            grade = await family.grade(task, trajectory, runtime)
            update["reward"] = grade.reward
            update["metrics"] = {
                **trajectory.metrics,
                **{f"reward/{name}": float(v) for name, v in grade.breakdown.items()},
            }
            if grade.records:
                records = [{**record, "_meta": True} for record in grade.records]
                update["messages"] = [*trajectory.messages, *records]
        else:
            update["reward"] = await family.score(task, final_answer(trajectory), runtime)
        update["timings"] = {**trajectory.timings, "score_s": time.monotonic() - start}
        return trajectory.model_copy(update=update)

    async def close(self) -> None:
        """Close the warm runtimes of this stage set's own `starts` (a run's shared one is
        closed by the run)."""
        if self._owns_starts:
            await self.starts.close()


def _hint_policy(family: str) -> type[HintPolicy]:
    """The hint policy the family's spec names (`FamilySpec.hint_policy`), else the default; a
    family known only to the caller (not registered) gets the default."""
    if family in FAMILIES:
        policy: type[HintPolicy] | None = FAMILIES.spec(family).hint_policy
        if policy is not None:
            return policy
    return HintPolicy
