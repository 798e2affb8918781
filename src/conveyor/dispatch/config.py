"""Typed settings of the dispatcher: which strategy, how wide each stage, what bounds."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AdmissionOrder = Literal["trajectory_major", "group_aware"]


class DispatchSettings(BaseModel):
    """How rollouts are scheduled.

    - `strategy`: a name in the strategy registry (`batch`, `bounded_batch`, `pipeline`, `auto`).
    - `max_parallel` (P): trajectories in flight for `bounded_batch`, the wave size for `batch`.
    - `p_init`, `p_run`, `p_reward`: stage pool widths of `pipeline` (and the start point of
      `auto`); `init_queue` / `run_queue` / `reward_queue` bound the hand-off queues.
    - `max_live_runtimes` (R): a hard bound on runtimes alive at once, for every strategy.
    - `admission_order`: `trajectory_major` (first wave covers every task once) or `group_aware`
      (all samples of a task admitted together, so whole groups finish early).
    - Stage timeouts in seconds: init and reward overruns are infrastructure failures; a run
      overrun is the policy's (`timeout`), still scored by the reward stage.
    - `max_infra_retries`: fresh-runtime retries of a rollout after an infrastructure failure.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: str = "pipeline"
    max_parallel: int = Field(default=96, ge=1)
    p_init: int = Field(default=32, ge=1)
    p_run: int = Field(default=96, ge=1)
    p_reward: int = Field(default=32, ge=1)
    init_queue: int = Field(default=32, ge=1)
    run_queue: int = Field(default=16, ge=1)
    reward_queue: int = Field(default=64, ge=1)
    max_live_runtimes: int = Field(default=128, ge=1)
    admission_order: AdmissionOrder = "group_aware"
    init_timeout_s: float = Field(default=600.0, gt=0)
    run_timeout_s: float = Field(default=3600.0, gt=0)
    reward_timeout_s: float = Field(default=600.0, gt=0)
    max_infra_retries: int = Field(default=2, ge=0)
    telemetry_interval_s: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _known_strategy(self) -> DispatchSettings:
        from conveyor.dispatch.registry import strategy_names

        names = strategy_names()
        if self.strategy not in names:
            raise ValueError(f"unknown dispatch strategy {self.strategy!r}; known: {sorted(names)}")
        return self
