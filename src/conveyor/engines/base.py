"""The sampling protocol every engine client implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from conveyor.types import FinishReason, TokenIds


class EngineError(RuntimeError):
    """The engine failed through no fault of the policy (an infrastructure error)."""


class SampleRequest(BaseModel):
    """One generation request: exact prompt token ids and the sampling settings for this turn."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_ids: TokenIds
    max_tokens: int = Field(gt=0)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    session_id: str = ""


class SampleResult(BaseModel):
    """What the engine returned: the sampled ids, their logprobs and why generation stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    token_ids: TokenIds
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int = 0


@runtime_checkable
class SamplingClient(Protocol):
    """A generation engine seen from the agent: never text in, never re-tokenized text out."""

    async def sample(self, request: SampleRequest) -> SampleResult:
        """Generate one completion for `request.prompt_ids`.

        Requests of one rollout carry the same `session_id` so an engine can route them to the
        same replica (prefix cache). Raises `EngineError` on an engine failure.
        """
        ...

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet answered."""
        ...

    @property
    def policy_version(self) -> int:
        """Version of the weights now being sampled from (bumped by each weight update)."""
        ...

    async def close(self) -> None:
        """Release the engine; idempotent."""
        ...
