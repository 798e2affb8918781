"""A simulated sampling engine: deterministic completions, a latency model and injected failures.

Every random choice of one request (failure, default completion, logprobs) comes from an RNG keyed
by (seed, session id, that session's call count), never from the clock or from scheduling, so a
run with the same seed and the same per-session call order reproduces exactly.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable

from conveyor.engines.base import EngineError, SampleRequest, SampleResult
from conveyor.types import StopReason, TokenIds

Responder = Callable[[TokenIds], TokenIds]

# The latency model re-reads the batch size every few decoded tokens, so a request speeds up or
# slows down as others join and leave, without one event-loop wake-up per token.
_DECODE_CHUNK_TOKENS = 8


class SimulatedEngine:
    """A `SamplingClient` for tests and benchmarks.

    `responder` maps prompt ids to the completion ids to emit; by default the completion is a
    seeded number (within `length_range`, inclusive) of pseudo-random ids in
    `[vocab_lo, vocab_hi)`, followed by `eos_token_id` when one is set. The completion is cut
    after the first `eos_token_id` or request stop token (finish reason `stop`) or at
    `max_tokens` (finish reason `length`); a shorter completion without a stop token ends with
    `stop` (the responder chose to end there).

    Latency: `prefill_s_per_token` per prompt token, then per decoded token
    `decode_s_per_token + decode_batch_slope_s * (in_flight - 1)`, so a lone request decodes at
    `decode_s_per_token` per token and each concurrent request adds the slope.

    Statistics (`EngineStats`): every request in flight runs (none waits), and holds its prompt
    plus the tokens decoded so far in a KV cache of `kv_capacity_tokens`; the default 0 reports
    no cache, so `auto` keeps its rules for engines without a KV reading. `max_model_len` is
    reported as given (0: no limit); the engine itself does not enforce either.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        eos_token_id: int | None = None,
        seed: int = 0,
        vocab_lo: int = 10,
        vocab_hi: int = 1000,
        length_range: tuple[int, int] = (1, 32),
        prefill_s_per_token: float = 0.0,
        decode_s_per_token: float = 0.0,
        decode_batch_slope_s: float = 0.0,
        fail_probability: float = 0.0,
        kv_capacity_tokens: int = 0,
        max_model_len: int = 0,
    ):
        if not 0 <= vocab_lo < vocab_hi:
            raise ValueError(f"need 0 <= vocab_lo < vocab_hi, got {vocab_lo}, {vocab_hi}")
        if not 0 <= length_range[0] <= length_range[1]:
            raise ValueError(f"need 0 <= low <= high in length_range, got {length_range}")
        if not 0.0 <= fail_probability <= 1.0:
            raise ValueError(f"fail_probability must be in [0, 1], got {fail_probability}")
        if min(prefill_s_per_token, decode_s_per_token, decode_batch_slope_s) < 0:
            raise ValueError("latency parameters must not be negative")
        if min(kv_capacity_tokens, max_model_len) < 0:
            raise ValueError("kv_capacity_tokens and max_model_len must not be negative")
        self._responder = responder
        self.eos_token_id = eos_token_id
        self.seed = seed
        self.vocab_lo = vocab_lo
        self.vocab_hi = vocab_hi
        self.length_range = length_range
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_s_per_token = decode_s_per_token
        self.decode_batch_slope_s = decode_batch_slope_s
        self.fail_probability = fail_probability
        self._kv_capacity_tokens = kv_capacity_tokens
        self._max_model_len = max_model_len
        self._kv_used_tokens = 0
        self._policy_version = 0
        self._in_flight = 0
        self._peak_in_flight = 0
        self._requests = 0
        self._calls_by_session: dict[str, int] = {}
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet answered (failed and cancelled ones leave at once)."""
        return self._in_flight

    @property
    def peak_in_flight(self) -> int:
        """The most requests that were ever in flight together."""
        return self._peak_in_flight

    @property
    def requests(self) -> int:
        """Requests received so far, including failed and cancelled ones."""
        return self._requests

    @property
    def policy_version(self) -> int:
        """Bumped by every `update_weights`."""
        return self._policy_version

    @property
    def kv_capacity_tokens(self) -> int:
        """The cache size given at construction (0: no cache reported)."""
        return self._kv_capacity_tokens

    @property
    def kv_used_tokens(self) -> int:
        """Prompt and decoded tokens of the requests in flight."""
        return self._kv_used_tokens

    @property
    def running_requests(self) -> int:
        """Every request in flight runs: the simulated batch has no limit."""
        return self._in_flight

    @property
    def waiting_requests(self) -> int:
        """Always 0: no request waits for room."""
        return 0

    @property
    def max_model_len(self) -> int:
        """The context limit given at construction (0: none)."""
        return self._max_model_len

    async def update_weights(self, responder: Responder | None = None) -> int:
        """Simulate a weight update: bump the policy version, optionally swap the responder.

        Returns the new version. Requests already running keep the version they started with.
        """
        if self._closed:
            raise EngineError("simulated engine is closed")
        if responder is not None:
            self._responder = responder
        self._policy_version += 1
        return self._policy_version

    async def sample(self, request: SampleRequest) -> SampleResult:
        """Generate one completion; raises `EngineError` when the keyed RNG draws a failure."""
        if self._closed:
            raise EngineError("simulated engine is closed")
        call_index = self._calls_by_session.get(request.session_id, 0)
        self._calls_by_session[request.session_id] = call_index + 1
        self._requests += 1
        rng = _keyed_rng(self.seed, request.session_id, call_index)
        version = self._policy_version
        self._in_flight += 1
        self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        held = len(request.prompt_ids)
        self._kv_used_tokens += held
        try:
            await asyncio.sleep(0)
            if rng.random() < self.fail_probability:
                raise EngineError(
                    f"simulated engine failure (session {request.session_id!r}, call {call_index})"
                )
            await asyncio.sleep(self.prefill_s_per_token * len(request.prompt_ids))
            proposed = (
                self._responder(list(request.prompt_ids))
                if self._responder is not None
                else self._default_completion(rng)
            )
            token_ids, finish_reason = self._cut(proposed, request)
            logprobs = [-(rng.random() * 4.0 + 1e-3) for _ in token_ids]
            held += await self._decode(len(token_ids))
        finally:
            self._in_flight -= 1
            self._kv_used_tokens -= held
        return SampleResult(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish_reason,
            policy_version=version,
        )

    async def close(self) -> None:
        """Refuse further requests; idempotent."""
        self._closed = True

    def _default_completion(self, rng: random.Random) -> TokenIds:
        length = rng.randint(*self.length_range)
        ids = [rng.randrange(self.vocab_lo, self.vocab_hi) for _ in range(length)]
        if self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return ids

    def _cut(self, proposed: TokenIds, request: SampleRequest) -> tuple[TokenIds, StopReason]:
        stops = set(request.stop_token_ids)
        if self.eos_token_id is not None:
            stops.add(self.eos_token_id)
        for index, token in enumerate(proposed[: request.max_tokens]):
            if token in stops:
                return list(proposed[: index + 1]), StopReason.STOP
        if len(proposed) >= request.max_tokens:
            return list(proposed[: request.max_tokens]), StopReason.LENGTH
        return list(proposed), StopReason.STOP

    async def _decode(self, n_tokens: int) -> int:
        """Spend the decode time of `n_tokens`, holding each decoded chunk in the KV cache
        from when it is decoded; returns the tokens added to `kv_used_tokens`."""
        if self.decode_s_per_token == 0.0 and self.decode_batch_slope_s == 0.0:
            self._kv_used_tokens += n_tokens
            return n_tokens
        done = 0
        try:
            while done < n_tokens:
                chunk = min(_DECODE_CHUNK_TOKENS, n_tokens - done)
                per_token = self.decode_s_per_token + self.decode_batch_slope_s * (
                    self._in_flight - 1
                )
                await asyncio.sleep(chunk * per_token)
                done += chunk
                self._kv_used_tokens += chunk
        except asyncio.CancelledError:
            self._kv_used_tokens -= done  # the caller only frees what `_decode` returned
            raise
        return done


def _keyed_rng(seed: int, session_id: str, call_index: int) -> random.Random:
    """An RNG determined by its key alone (hashlib, not `hash()`, which is salted per process)."""
    digest = hashlib.blake2b(f"{seed}\x00{session_id}\x00{call_index}".encode(), digest_size=8)
    return random.Random(int.from_bytes(digest.digest(), "big"))
