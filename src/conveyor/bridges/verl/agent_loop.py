"""Our agent as a VeRL agent loop: `agent_name: conveyor` in VeRL's dataset runs it.

VeRL's `AgentLoopWorker` builds one `ConveyorAgentLoop` per rollout and calls `run` with the
dataset row (`conveyor bridge export-dataset` writes the rows: `extra_info.task` is the task's
JSON). `run` does what our dispatcher's three stages do for one rollout (the family's runtime,
our `AgentLoop`, the family's score) with VeRL's rollout servers as the engine, and returns one
`AgentLoopOutput` (`conveyor.bridges.verl.sequence`).

Sampling: VeRL's `sampling_params` (its trainer's temperature, top-p, top-k, or the validation
ones) decide how to sample; our loop decides how many tokens a turn may take, so each request
carries VeRL's params with our `max_tokens` and `logprobs` on.

Infra failures (`EngineError`, runtime failures) propagate: VeRL's worker owns them; a policy
outcome (no answer, a truncated rollout) is scored like in our own runs.

This module imports VeRL at top and runs only inside `.venv-verl` (scripts/venv-verl.sh).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from conveyor.bridges.verl.sequence import VerlSequence
from conveyor.config import ConveyorConfig, load_config
from conveyor.engines.base import EngineError, SampleRequest, SampleResult
from conveyor.rollout import AgentStages
from conveyor.runtime.starts import RuntimeStarts
from conveyor.tasks.family import TaskFamily, build_families, options_services
from conveyor.types import StopReason, Task, Trajectory

logger = logging.getLogger(__name__)

# A Conveyor config file that replaces the one each dataset row carries.
CONFIG_ENV = "CONVEYOR_CONFIG"

# config (file path or row JSON) -> (config, its families built once with its runtime
# settings): VeRL builds one agent loop per rollout; a family instance lives for the whole run.
_RUNS: dict[str, tuple[ConveyorConfig, dict[str, TaskFamily]]] = {}
# One set of runtime start limits per config in this worker, shared by its rollouts.
_STARTS: dict[int, RuntimeStarts] = {}


def run_parts(extra_info: dict[str, Any]) -> tuple[ConveyorConfig, dict[str, TaskFamily]]:
    """The config a row runs under (CONVEYOR_CONFIG, else the row's `conveyor_config` JSON)
    and its families."""
    key = os.environ.get(CONFIG_ENV) or str(extra_info.get("conveyor_config") or "")
    if not key:
        raise ValueError(
            f"no Conveyor config: export the dataset with `conveyor bridge export-dataset` "
            f"or set {CONFIG_ENV} to a config file"
        )
    parts = _RUNS.get(key)
    if parts is None:
        if os.environ.get(CONFIG_ENV):
            config = load_config(Path(key)).config
        else:
            config = ConveyorConfig.model_validate_json(key)
        services = options_services(config.tasks.options)
        parts = (config, build_families(config.tasks.families, config.runtime, services))
        _RUNS[key] = parts
    return parts


def run_starts(config: ConveyorConfig) -> RuntimeStarts:
    """The runtime start limits of this worker's rollouts under `config` (one `run_parts`
    config). Without a warm pool: VeRL gives a rollout worker no end to close one at."""
    starts = _STARTS.get(id(config))
    if starts is None:
        if config.runtime.warm_pool:
            logger.warning(
                "runtime.warm_pool (%d) is not used inside VeRL's rollout workers (nothing would "
                "close the pool); the start rate limit still applies",
                config.runtime.warm_pool,
            )
        starts = RuntimeStarts(config.runtime.model_copy(update={"warm_pool": 0}))
        _STARTS[id(config)] = starts
    return starts


class VerlSamplingClient:
    """Our `SamplingClient` over VeRL's `server_manager.generate`: token ids in, ids and logprobs
    out. One per rollout: its request id keeps the rollout on one server (prefix cache)."""

    def __init__(self, server_manager: Any, sampling_params: dict[str, Any], request_id: str):
        self.server_manager = server_manager
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet answered."""
        return self._in_flight

    @property
    def policy_version(self) -> int:
        """VeRL syncs its own weights; our loop's version stamp stays 0."""
        return 0

    async def sample(self, request: SampleRequest) -> SampleResult:
        """One generation through VeRL's server manager, with VeRL's sampling params."""
        params = {**self.sampling_params, "max_tokens": request.max_tokens, "logprobs": True}
        if request.stop_token_ids:
            params["stop_token_ids"] = sorted(
                set(params.get("stop_token_ids") or []) | set(request.stop_token_ids)
            )
        self._in_flight += 1
        try:
            output = await self.server_manager.generate(
                request_id=self.request_id,
                prompt_ids=list(request.prompt_ids),
                sampling_params=params,
            )
        finally:
            self._in_flight -= 1
        ids = list(output.token_ids)
        if output.log_probs is None or len(output.log_probs) != len(ids):
            raise EngineError(
                f"VeRL's server returned {len(ids)} token ids and "
                f"{'no' if output.log_probs is None else len(output.log_probs)} logprobs; "
                "the conveyor agent loop needs one logprob per sampled token"
            )
        if output.stop_reason == "aborted":
            reason = StopReason.ABORT
        elif len(ids) >= request.max_tokens:
            reason = StopReason.LENGTH
        else:
            reason = StopReason.STOP
        return SampleResult(
            token_ids=ids, logprobs=[float(lp) for lp in output.log_probs], finish_reason=reason
        )

    async def close(self) -> None:
        """VeRL owns the servers; nothing to release."""


def output_of(trajectory: Trajectory) -> AgentLoopOutput:
    """The trajectory as VeRL's `AgentLoopOutput` (its first sample; the rest counted in
    `extra_fields["conveyor_dropped_samples"]`)."""
    sequence = VerlSequence.from_trajectory(trajectory)
    if sequence is None:
        raise ValueError(
            f"rollout of {trajectory.task_id} has no turn ({trajectory.stop_reason}): its prompt "
            "exceeds the agent's budget (agent.max_prompt_tokens / agent.max_context_tokens)"
        )
    if sequence.dropped_samples:
        logger.warning(
            "rollout of %s: kept the first of %d samples (the chat template broke the prefix "
            "property); VeRL trains one sequence per rollout",
            trajectory.task_id,
            sequence.dropped_samples + 1,
        )
    timings = trajectory.timings
    metrics = AgentLoopMetrics(
        generate_sequences=timings.get("engine_s", 0.0),
        tool_calls=timings.get("policy_s", 0.0),
        compute_score=timings.get("score_s", 0.0),
    )
    return AgentLoopOutput(
        prompt_ids=sequence.prompt_ids,
        response_ids=sequence.response_ids,
        response_mask=sequence.response_mask,
        response_logprobs=sequence.response_logprobs,
        reward_score=sequence.reward_score,
        num_turns=sequence.num_turns,
        metrics=metrics,
        # VeRL's metrics model has fixed fields; per-rollout counts go where its worker turns
        # every key into a batch column.
        extra_fields={
            "conveyor_dropped_samples": sequence.dropped_samples,
            "conveyor_splits": trajectory.counters.get("splits", 0),
            "conveyor_status": str(trajectory.status),
            "conveyor_task_id": trajectory.task_id,
        },
    )


@register("conveyor")
class ConveyorAgentLoop(AgentLoopBase):
    """init, run and reward of one Conveyor task inside VeRL's rollout worker."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One rollout of the task in `kwargs["extra_info"]["task"]`."""
        extra = kwargs.get("extra_info") or {}
        if "task" not in extra:
            raise ValueError(
                "dataset row without extra_info.task: write the dataset with "
                "`conveyor bridge export-dataset`"
            )
        task = Task.model_validate_json(extra["task"])
        config, families = run_parts(extra)
        trajectory = await self.rollout(config, families, task, sampling_params)
        return output_of(trajectory)

    async def rollout(
        self,
        config: ConveyorConfig,
        families: dict[str, TaskFamily],
        task: Task,
        sampling_params: dict[str, Any],
    ) -> Trajectory:
        """Our three stages for one rollout of `task`, sampling through VeRL's servers."""
        client = VerlSamplingClient(self.server_manager, sampling_params, uuid4().hex)
        # The trajectory records the temperature VeRL sampled at, not the config's.
        sampling = config.sampling.model_copy(
            update={
                "temperature": float(sampling_params.get("temperature", 1.0)),
                "top_p": float(sampling_params.get("top_p", 1.0)),
            }
        )
        stages = AgentStages.from_config(
            config, client, self.tokenizer, sampling, families=families, starts=run_starts(config)
        )
        runtime = await stages.init(task, 0, 0)
        try:
            trajectory = await stages.run(task, 0, runtime)
            return await stages.reward(task, trajectory, runtime)
        finally:
            await runtime.close()
