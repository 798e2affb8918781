"""The sampling protocol every engine client implements."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from conveyor.types import FinishReason, TokenIds

if TYPE_CHECKING:
    from torch import Tensor


class EngineError(RuntimeError):
    """The engine failed through no fault of the policy (an infrastructure error)."""


class EngineDown(EngineError):
    """The engine stopped answering altogether: retrying rollouts cannot help, the run stops."""


class OutputFormat(BaseModel):
    """A format the sampled text must follow, enforced by masking each step's logits to the
    tokens the grammar allows (OpenAI's `response_format`).

    - `json_object`: any JSON object;
    - `json_schema`: a JSON value valid under `schema_text` (a JSON schema, serialized).

    With `tool_call_open` the reply may instead start with that text (the opening of a tool
    call in the model's format), after which it is sampled freely: a call is not content.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["json_object", "json_schema"]
    schema_text: str = ""
    tool_call_open: str = ""

    def json_schema(self) -> str:
        """The JSON schema the content must follow (`json_object`: any object)."""
        return self.schema_text if self.type == "json_schema" else '{"type": "object"}'

    def grammar(self) -> Any:
        """The format as an xgrammar `Grammar`: compact JSON (no free whitespace, which a
        small model can spend its whole budget on), or the tool-call opening then any text."""
        import xgrammar

        content = xgrammar.Grammar.from_json_schema(self.json_schema(), any_whitespace=False)
        if not self.tool_call_open:
            return content
        call = xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(self.tool_call_open)} [^]*")
        return xgrammar.Grammar.union(content, call)


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
    # Also report the `top_logprobs` most likely tokens at each position (engines that can:
    # `TopLogprobs`); 0 = the sampled token's logprob only.
    top_logprobs: int = Field(default=0, ge=0, le=20)
    # Constrain the sampled text to a grammar (engines that can: `StructuredOutput`); None =
    # sample freely.
    output_format: OutputFormat | None = None


class SampleResult(BaseModel):
    """What the engine returned: the sampled ids, their logprobs and why generation stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    token_ids: TokenIds
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int = 0
    # With `SampleRequest.top_logprobs` k > 0 on an engine that reports them: per sampled
    # position, the k most likely (token id, logprob) pairs of the distribution it was sampled
    # from, most likely first. None when not asked for or not reported.
    top_logprobs: list[list[tuple[int, float]]] | None = None


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


@runtime_checkable
class TopLogprobs(Protocol):
    """An engine that reports the most likely tokens at each position (`top_logprobs`)."""

    @property
    def max_top_logprobs(self) -> int:
        """The largest `SampleRequest.top_logprobs` it serves."""
        ...


@runtime_checkable
class StructuredOutput(Protocol):
    """An engine that decodes under a grammar: `SampleRequest.output_format` is enforced."""

    @property
    def output_formats(self) -> frozenset[str]:
        """The `OutputFormat.type`s it enforces (empty when its grammar library is missing)."""
        ...


class NoEngine:
    """The engine of a run that samples nothing (a warm start alone: `conveyor sft` with
    `rl.eval.tasks=0`, which trains on oracle traces): nothing is started, and a request is a
    bug that says so."""

    async def sample(self, request: SampleRequest) -> SampleResult:
        raise RuntimeError("this run samples nothing: it started no engine")

    @property
    def in_flight(self) -> int:
        return 0

    @property
    def policy_version(self) -> int:
        return 0

    async def close(self) -> None:
        return None


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
class ServedModelCheck(Protocol):
    """An engine behind a server that can say, at start, whether it serves the asked-for model."""

    async def check_served(self) -> None:
        """Return if the server answers and serves the model; `EngineError` saying why not."""
        ...


@runtime_checkable
class RequestCounters(Protocol):
    """An engine client that counts what it had to do again (an HTTP client's retries)."""

    def request_counters(self) -> dict[str, int]:
        """Counts since the client was made, by name (`retries`, `retries_503`, ...)."""
        ...


@runtime_checkable
class TrainableCheck(Protocol):
    """An engine behind a server that can say, at start, whether training can reach it."""

    async def check_trainable(self) -> None:
        """Return if weights can be loaded into the server and token ids come back;
        `EngineError` saying, in one message, what the server lacks."""
        ...


@runtime_checkable
class WeightFolder(Protocol):
    """An engine that hands weights to its server as files, written under a folder of the run."""

    def use_weights_dir(self, path: Path) -> None:
        """Write weight versions under `path` (created when needed; the server must read it)."""
        ...


@runtime_checkable
class ServesFingerprint(Protocol):
    """An engine that can say which weights it serves (what a checked weight sync reads)."""

    @property
    def policy_version(self) -> int:
        """Version of the policy the engine now serves: the version of the last weight
        update (0 before any). Every `SampleResult` carries the version it was sampled under,
        which is how the trainer measures staleness."""
        ...

    async def weight_fingerprint(self, probe_ids: Sequence[int]) -> WeightFingerprint:
        """The fingerprint of the weights being served now, probed with `probe_ids` (at least
        two tokens), tagged with `policy_version`.

        Taken after every update queued before it has been applied, so right after an update
        it describes exactly the weights that update loaded.
        """
        ...


@runtime_checkable
class ReplicaFingerprints(Protocol):
    """Several engine replicas behind one client (`conveyor.engines.router`): a checked weight
    sync compares each replica's fingerprint, not one for all."""

    async def replica_fingerprints(
        self, probe_ids: Sequence[int]
    ) -> list[tuple[str, WeightFingerprint]]:
        """(replica name, `weight_fingerprint(probe_ids)` of that replica) for every replica
        that serves requests."""
        ...


@runtime_checkable
class WeightReceiver(ServesFingerprint, Protocol):
    """An engine whose weights a trainer replaces in place and can then verify.

    The built-in trainer refuses at start an engine that is not one (a chat-only server, the
    simulated engine): training could never reach the weights it samples from.
    """

    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> float:
        """Load full weights, named as in the Hugging Face model, into the live engine.

        `version` is the policy version they carry (the trainer's, so staleness is measured on
        one scale also after a resume); None means the current version + 1. Requests already
        running may finish on the new weights. Returns the seconds the load took; raises
        `EngineError` when the engine cannot take them.
        """
        ...


@runtime_checkable
class KVCacheStats(Protocol):
    """An engine's KV-cache figures: what the `auto` dispatcher sizes its run pool by.

    Gauges, read at any time from the event loop's thread: cheap, never blocking, and at most
    one engine step old. Token figures count every replica together. With an engine that does
    not report them `auto` keeps its rules for engines without a KV reading.
    """

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache can hold (vLLM: usable blocks x block size); 0 when the engine
        does not know, which `auto` treats as no KV reading."""
        ...

    @property
    def kv_used_tokens(self) -> int:
        """KV-cache tokens held by requests now being served. Cached prefixes that no request
        holds (an idle session's, kept for its next turn) are free space and not counted."""
        ...


@runtime_checkable
class ContextLimit(Protocol):
    """An engine that states how long one request's context may grow."""

    @property
    def max_model_len(self) -> int:
        """The longest context (prompt + completion) one request may have; 0 if unbounded."""
        ...


@runtime_checkable
class EngineStats(KVCacheStats, ContextLimit, Protocol):
    """Everything an engine reports about its scheduler: the KV cache, the context limit, the
    batch and the queue (same reading rules as `KVCacheStats`).

    `auto` reads the parts it needs (`KVCacheStats`, `ContextLimit`), so an engine reporting
    only those is sized by its KV figures too.
    """

    @property
    def running_requests(self) -> int:
        """Requests the engine is generating for now (scheduled into its batch)."""
        ...

    @property
    def waiting_requests(self) -> int:
        """Requests received and waiting for room in the batch (new or preempted ones)."""
        ...


@runtime_checkable
class EngineCounters(Protocol):
    """Cumulative work counters of an engine since it started, read by `auto` per period.

    Differences between two readings give the work of the period between them.
    """

    @property
    def generated_tokens(self) -> int:
        """Completion tokens generated so far."""
        ...

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens computed so far (prefix-cache hits are not computed; a preempted
        request's recompute is)."""
        ...

    @property
    def preemptions(self) -> int:
        """Requests evicted from the batch for lack of KV room so far."""
        ...
