"""Typed settings of the dispatcher: which strategy, how wide each stage, what bounds."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from conveyor.config import ConveyorConfig, DispatchConfig
from conveyor.registry import ENGINES

# Seconds the dispatcher waits past the agent loop's own wall budget before cancelling a run stage.
RUN_TIMEOUT_GRACE_S = 30.0


class DispatchSettings(DispatchConfig):
    """The dispatcher's settings: the `dispatch` config section plus the run-stage timeout.

    `run_timeout_s` is not a config key: it derives from `agent.rollout_timeout_s` (see
    `from_config`), so the run budget is set in one place. `strategy` may name any registered
    strategy (the section's own check), not only the built-in ones.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_timeout_s: float = Field(default=3600.0, gt=0)

    @classmethod
    def from_config(cls, config: ConveyorConfig) -> DispatchSettings:
        """The settings a run config implies. The dispatcher's own run timeout is a safety net
        that fires only after the agent loop's budget, every turn's engine request timeout and a
        grace period, so the loop's own timeout (which keeps partial turns) comes first."""
        agent = config.agent
        # The loop's budget excludes engine waits, each bounded by the engine's request timeout;
        # it is checked before each turn, so the last turn's tool call may run past it.
        per_request = config.engine.request_timeout_s
        if ENGINES.spec(config.engine.kind).needs_base_url:
            per_request += config.engine.reconnect_s  # a lost request waits for the server once
        engine_bound = agent.max_turns * per_request
        loop_bound = agent.rollout_timeout_s + agent.tool_timeout_s
        return cls(
            **config.dispatch.model_dump(),
            run_timeout_s=loop_bound + engine_bound + RUN_TIMEOUT_GRACE_S,
        )
