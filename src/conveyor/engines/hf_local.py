"""A small in-process sampler on plain transformers, for tiny models and engine-free tests.

Not a serving engine: requests run one at a time in a worker thread with the model's own forward
pass, token by token with a KV cache. What it offers is exactness and control: the sampled ids
and their logprobs come from the very weights the trainer exports (`update_weights`), and a
request's `seed` makes its sample reproducible. Use vLLM for anything of size.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.engines.base import (
    EngineError,
    OutputFormat,
    SampleRequest,
    SampleResult,
    WeightFingerprint,
    readable_fingerprint,
)
from conveyor.types import StopReason

if TYPE_CHECKING:
    from torch import Tensor


class HFEngine:
    """`SamplingClient` over a transformers causal LM on the CPU (or one GPU)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        eos_token_id: int | None = None,
        request_timeout_s: float | None = None,
        seed: int = 0,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.eval()
        config_eos = self.model.config.eos_token_id
        self.eos_token_id = eos_token_id if eos_token_id is not None else config_eos
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        # Seeds of the requests that bring none: one stream per engine (as vLLM's engine seed),
        # so two unseeded requests for the same prompt (the samples of a GRPO group) differ,
        # and a fresh engine given the same requests in the same order repeats them.
        self._seeds = random.Random(seed)
        self._version = 0
        self._in_flight = 0
        self._model_dir = str(model_dir)
        self._grammar_compiler: Any = None
        self._grammars: dict[OutputFormat, Any] = {}

    @property
    def output_formats(self) -> frozenset[str]:
        """`SampleRequest.output_format` is enforced with xgrammar (when it is installed): the
        format's grammar is compiled against the model's tokenizer, and at each step the
        logits of every token the grammar does not allow next are set to -inf before sampling."""
        try:
            import xgrammar  # noqa: F401
        except ImportError:
            return frozenset()
        return frozenset({"json_object", "json_schema"})

    def _matcher(self, form: OutputFormat) -> Any:
        """A fresh xgrammar matcher for `form` (its grammar compiled once per format)."""
        import xgrammar
        from transformers import AutoTokenizer

        if self._grammar_compiler is None:
            tokenizer = AutoTokenizer.from_pretrained(self._model_dir)
            info = xgrammar.TokenizerInfo.from_huggingface(
                tokenizer,
                vocab_size=self.model.config.vocab_size,
                stop_token_ids=[int(self.eos_token_id)] if self.eos_token_id is not None else None,
            )
            self._grammar_compiler = xgrammar.GrammarCompiler(info)
        if form not in self._grammars:
            if len(self._grammars) >= 64:  # bounded: each client may send its own schemas
                self._grammars.clear()
            self._grammars[form] = self._grammar_compiler.compile_grammar(form.grammar())
        return xgrammar.GrammarMatcher(self._grammars[form])

    @property
    def max_top_logprobs(self) -> int:
        """`SampleRequest.top_logprobs` is served up to 20 (a top-k of each step's logprobs)."""
        return 20

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet answered."""
        return self._in_flight

    @property
    def policy_version(self) -> int:
        """Bumped by every `update_weights`."""
        return self._version

    async def sample(self, request: SampleRequest) -> SampleResult:
        """Sample one completion (ancestral sampling; temperature 0 is greedy).

        A request's `seed` makes its sample reproducible; without one the seed is the next of
        the engine's own stream (the `seed` it was built with), so repeated requests differ.

        Past `request_timeout_s` (waiting for the model included) the request stops between
        two tokens and raises `EngineError`, like every engine's request deadline.
        """
        timeout = self.request_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        self._in_flight += 1
        try:
            return await asyncio.to_thread(self._sample, request, deadline)
        except TimeoutError as exc:
            raise EngineError(f"HF sampler did not answer within {timeout} s") from exc
        except (RuntimeError, ValueError) as exc:
            raise EngineError(f"HF sampler failed: {exc}") from exc
        finally:
            self._in_flight -= 1

    def _sample(self, request: SampleRequest, deadline: float | None) -> SampleResult:
        wait = -1.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not self._lock.acquire(timeout=wait):
            raise TimeoutError
        try:
            return self._generate(request, deadline)
        finally:
            self._lock.release()

    def _generate(self, request: SampleRequest, deadline: float | None) -> SampleResult:
        torch = self._torch
        stops = set(request.stop_token_ids)
        if self.eos_token_id is not None:
            stops.add(int(self.eos_token_id))
        seed = request.seed if request.seed is not None else self._seeds.getrandbits(31)
        generator = torch.Generator().manual_seed(seed)
        matcher: Any = None
        bitmask: Any = None
        if request.output_format is not None:
            import xgrammar

            matcher = self._matcher(request.output_format)
            bitmask = xgrammar.allocate_token_bitmask(1, self.model.config.vocab_size)
        ids: list[int] = []
        logprobs: list[float] = []
        top: list[list[tuple[int, float]]] = []
        with torch.no_grad():
            version = self._version
            inputs = torch.tensor([request.prompt_ids])
            past: Any = None
            reason = StopReason.LENGTH
            for _ in range(request.max_tokens):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError
                out = self.model(input_ids=inputs, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                if matcher is not None:  # only the tokens the format allows next
                    import xgrammar

                    matcher.fill_next_token_bitmask(bitmask)
                    logits = logits[None, :].clone()
                    xgrammar.apply_token_bitmask_inplace(logits, bitmask)
                    logits = logits[0]
                if request.temperature > 0:
                    logp = torch.log_softmax(logits / request.temperature, dim=-1)
                    token = int(torch.multinomial(logp.exp(), 1, generator=generator))
                else:
                    logp = torch.log_softmax(logits, dim=-1)
                    token = int(torch.argmax(logp))
                ids.append(token)
                logprobs.append(float(logp[token]))
                if matcher is not None and not matcher.accept_token(token):
                    raise RuntimeError(f"the output grammar refused token {token}")
                if request.top_logprobs:
                    values, indices = torch.topk(logp, request.top_logprobs)
                    top.append([(int(i), float(v)) for i, v in zip(indices, values, strict=True)])
                if token in stops:
                    reason = StopReason.STOP
                    break
                inputs = torch.tensor([[token]])
        return SampleResult(
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=reason,
            policy_version=version,
            top_logprobs=top if request.top_logprobs else None,
        )

    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> float:
        """Load new weights (HF names) in place; returns seconds taken.

        `version` sets the policy version the new weights carry (the trainer's); by default +1.
        """
        import time

        start = time.perf_counter()

        def load() -> None:
            with self._lock:
                state = {name: tensor.detach().clone() for name, tensor in weights}
                _missing, unexpected = self.model.load_state_dict(state, strict=False)
                if unexpected:
                    raise EngineError(f"unknown weights: {unexpected[:5]}")
                self._version = self._version + 1 if version is None else version

        await asyncio.to_thread(load)
        return time.perf_counter() - start

    async def weight_fingerprint(self, probe_ids: Sequence[int]) -> WeightFingerprint:
        """Digests of the embedding and 1-D tensors, and the prompt logprobs of `probe_ids`."""
        if len(probe_ids) < 2:
            raise ValueError("a weight probe needs at least two tokens")

        def read() -> WeightFingerprint:
            torch = self._torch
            with self._lock, torch.no_grad():
                weights = readable_fingerprint(self.model.named_parameters(), self._version)
                ids = torch.tensor([list(probe_ids)])
                logp = torch.log_softmax(self.model(input_ids=ids).logits[0, :-1].float(), -1)
                probe = logp.gather(-1, ids[0, 1:, None])[:, 0]
            return weights.model_copy(update={"probe_logprobs": [0.0, *probe.tolist()]})

        return await asyncio.to_thread(read)

    async def close(self) -> None:
        """Nothing to release beyond the model object."""
