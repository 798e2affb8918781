"""The sampling protocol every engine client implements."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from conveyor.types import FinishReason, TokenIds

if TYPE_CHECKING:
    from torch import Tensor


class EngineError(RuntimeError):
    """The engine failed through no fault of the policy (an infrastructure error)."""


class EngineDown(EngineError):
    """The engine stopped answering altogether: retrying rollouts cannot help, the run stops."""


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


class WeightFingerprint(BaseModel):
    """What weights a model holds, in a form both sides of a weight sync can compute.

    - `digests`: blake2b of the raw bytes of named tensors in the dtype the engine holds them in
      (`tensor_digest`; `dtypes` and `shapes` say which), for the tensors the engine keeps
      readable after loading (a serving engine may re-pack the rest into an opaque layout).
    - `probe_logprobs`: the logprob of every token of a fixed probe sequence given its prefix,
      at temperature 1 (position 0 has no prefix and holds 0.0): the function actually served.

    `conveyor.trainer.weight_sync` compares an engine's fingerprint with the trainer's.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy_version: int
    digests: dict[str, str] = Field(default_factory=dict)
    dtypes: dict[str, str] = Field(default_factory=dict)
    shapes: dict[str, list[int]] = Field(default_factory=dict)
    probe_logprobs: list[float] = Field(default_factory=list)


def tensor_digest(tensor: Tensor, dtype: str) -> str:
    """Hex blake2b (16 bytes) of `tensor`'s values cast to the torch dtype named `dtype`.

    Exact on purpose: the engine and the trainer must hold bit-identical values after a sync
    (casting float32 to the engine's dtype is deterministic on both sides).
    """
    import hashlib

    import torch

    values = tensor.detach().to(dtype=getattr(torch, dtype)).contiguous().cpu()
    return hashlib.blake2b(values.view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()


def readable_fingerprint(named: Iterable[tuple[str, Tensor]], version: int) -> WeightFingerprint:
    """Digests of the token embedding and of every 1-D tensor (norms, biases) of `named` that
    reads back non-empty; no probe.

    The vLLM CPU backend's packed Linear weights read back empty; fused tensors (vLLM's
    qkv_proj) have no trainer-side name and drop out of the comparison there.
    """
    digests: dict[str, str] = {}
    dtypes: dict[str, str] = {}
    shapes: dict[str, list[int]] = {}
    for name, tensor in named:
        if tensor.numel() and (tensor.dim() == 1 or "embed_tokens" in name):
            dtypes[name] = str(tensor.dtype).removeprefix("torch.")
            digests[name] = tensor_digest(tensor, dtypes[name])
            shapes[name] = list(tensor.shape)
    return WeightFingerprint(policy_version=version, digests=digests, dtypes=dtypes, shapes=shapes)


@runtime_checkable
class WeightReceiver(Protocol):
    """An engine whose weights a trainer replaces in place and can then verify."""

    @property
    def policy_version(self) -> int:
        """Version of the weights now being sampled from."""
        ...

    async def update_weights(
        self, weights: Iterable[tuple[str, Any]], version: int | None = None
    ) -> float:
        """Load full weights under Hugging Face names; `version` is the one they carry.

        Returns the seconds taken.
        """
        ...

    async def weight_fingerprint(self, probe_ids: Sequence[int]) -> WeightFingerprint:
        """The fingerprint of the weights being served now, probed with `probe_ids`.

        Taken after every update queued before it has been applied.
        """
        ...
