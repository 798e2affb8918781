"""`engine.kind: tinker`: our sampling protocol over a Tinker `SamplingClient`.

Token ids in, token ids, logprobs and a stop reason out, as every engine. The weights it samples
from live in the service: `TinkerBackend.sync_to` saves new ones there and points this engine at
them (`use_sampler`), which bumps `policy_version`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conveyor.config import ConveyorConfig
from conveyor.engines.base import (
    EngineError,
    SampleRequest,
    SampleResult,
    WeightFingerprint,
)
from conveyor.types import FinishReason

STOP_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class TinkerSamplingClient:
    """A `SamplingClient` (and `ServesFingerprint`) over the Tinker SDK's sampling client.

    `client` is a `tinker.SamplingClient` (or anything with its `sample` / `compute_logprobs`
    methods returning awaitable futures); `model_path` the tinker path of the weights it
    serves, None for the base model.
    """

    def __init__(
        self,
        client: Any,
        *,
        base_model: str,
        model_path: str | None = None,
        request_timeout_s: float = 120.0,
    ) -> None:
        self._client = client
        self.base_model = base_model
        self.model_path = model_path
        self._timeout = request_timeout_s
        self._in_flight = 0
        self._version = 0
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet answered."""
        return self._in_flight

    @property
    def policy_version(self) -> int:
        """The version of the weights at `model_path` (0: the base model)."""
        return self._version

    def use_sampler(self, client: Any, model_path: str, version: int) -> None:
        """Sample from now on with `client`, serving the weights saved at `model_path`, which
        carry policy `version`. Requests already running finish on the old weights."""
        self._client = client
        self.model_path = model_path
        self._version = version

    async def sample(self, request: SampleRequest) -> SampleResult:
        """One completion of `request.prompt_ids`; `EngineError` when the service fails."""
        from tinker import types

        if self._closed:
            raise EngineError("the tinker engine is closed")
        params = types.SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=list(request.stop_token_ids) or None,
        )
        version = self._version
        self._in_flight += 1
        try:
            future = self._client.sample(
                prompt=types.ModelInput.from_ints(list(request.prompt_ids)),
                num_samples=1,
                sampling_params=params,
            )
            response = await asyncio.wait_for(_awaited(future), self._timeout)
        except TimeoutError:
            raise EngineError(f"tinker sample timed out after {self._timeout:g} s") from None
        except EngineError:
            raise
        except Exception as exc:  # the SDK's errors have no common base we can name here
            raise EngineError(f"tinker sample failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._in_flight -= 1
        return to_result(response, version)

    async def weight_fingerprint(self, probe_ids: Sequence[int]) -> WeightFingerprint:
        """The served weights' logprobs of every probe token (position 0: 0.0); no digests,
        since the weights never leave the service."""
        from tinker import types

        if len(probe_ids) < 2:
            raise ValueError("the weight probe needs at least two tokens")
        future = self._client.compute_logprobs(types.ModelInput.from_ints(list(probe_ids)))
        logprobs = await asyncio.wait_for(_awaited(future), self._timeout)
        return WeightFingerprint(
            policy_version=self._version,
            probe_logprobs=[0.0 if lp is None else float(lp) for lp in logprobs],
        )

    async def close(self) -> None:
        """Stop sampling; idempotent (the service owns the sampler)."""
        self._closed = True


def to_result(response: Any, version: int) -> SampleResult:
    """A `tinker.types.SampleResponse` of one sequence as our `SampleResult`."""
    if not response.sequences:
        raise EngineError("tinker returned no sequence")
    sequence = response.sequences[0]
    tokens = list(sequence.tokens)
    logprobs = sequence.logprobs
    if logprobs is None or len(logprobs) != len(tokens):
        raise EngineError(
            f"tinker returned {len(tokens)} tokens with "
            f"{'no' if logprobs is None else len(logprobs)} logprobs; training needs one each"
        )
    reason = STOP_REASONS.get(str(sequence.stop_reason))
    if reason is None:
        raise EngineError(f"tinker returned an unknown stop reason {sequence.stop_reason!r}")
    return SampleResult(
        token_ids=tokens,
        logprobs=[float(lp) for lp in logprobs],
        finish_reason=reason,
        policy_version=version,
    )


async def _awaited(future: Any) -> Any:
    # the SDK's APIFuture is awaitable; a plain concurrent future is waited for in a thread
    if hasattr(future, "__await__"):
        return await future
    return await asyncio.to_thread(future.result)


def api_key(config: ConveyorConfig) -> str:
    """The Tinker API key from the variable `engine.api_key_env` names; `EngineError` when
    it is unset (the key never goes into a config file)."""
    name = config.engine.api_key_env
    if name == "OPENAI_API_KEY":  # the field's default names another service's key
        name = "TINKER_API_KEY"
    key = os.environ.get(name, "")
    if not key:
        raise EngineError(
            f"engine.kind 'tinker' needs the Tinker API key in ${name} (engine.api_key_env); "
            "it is unset"
        )
    return key


def base_model_name(config: ConveyorConfig, model_dir: Path) -> str:
    """The service's name of the base model: `engine.served_model_name`, else `model.path`."""
    name = config.engine.served_model_name or config.model.path
    if not name:
        raise EngineError(
            "engine.kind 'tinker' needs the service's base model name in "
            "engine.served_model_name (e.g. 'Qwen/Qwen3-4B-Instruct-2507') or model.path; "
            f"the local folder {model_dir} is only used for the tokenizer"
        )
    return name


def build_tinker_engine(config: ConveyorConfig, model_dir: Path) -> TinkerSamplingClient:
    """The `tinker` engine: a sampling client of the base model in the Tinker service."""
    key = api_key(config)
    base_model = base_model_name(config, model_dir)
    try:
        import tinker
    except ImportError:
        raise EngineError(
            "engine.kind 'tinker' needs the tinker SDK: pip install tinker==0.38.0"
        ) from None
    service = tinker.ServiceClient(api_key=key)
    client = service.create_sampling_client(base_model=base_model).result()
    return TinkerSamplingClient(
        client, base_model=base_model, request_timeout_s=config.engine.request_timeout_s
    )
