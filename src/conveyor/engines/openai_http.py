"""A basic client for an OpenAI-compatible completions server (`vllm serve`, SGLang).

Token ids go in as the `prompt` array; ids come back through vLLM's `return_token_ids` (or, on
servers without it, `return_tokens_as_token_ids`, which writes each token as `token_id:N`), with
the sampled tokens' logprobs. Text is never re-tokenized. Uses only the standard library, in a
thread, so the core needs no HTTP dependency.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from typing import Any

from conveyor.engines.base import EngineError, SampleRequest, SampleResult


class OpenAICompatibleClient:
    """`SamplingClient` over HTTP `/v1/completions`; the session id is sent as `user` (sticky)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = os.environ.get(api_key_env, "")
        self.timeout_s = timeout_s
        self._in_flight = 0
        self._version = 0

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return self._in_flight

    @property
    def policy_version(self) -> int:
        """The server's weights are opaque to us; bumped by `mark_weights_updated`."""
        return self._version

    def mark_weights_updated(self) -> None:
        """Record that the server now serves new weights (after an external sync)."""
        self._version += 1

    def payload(self, request: SampleRequest) -> dict[str, Any]:
        """The JSON body for one request."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "logprobs": 0,
            "echo": False,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "user": request.session_id or None,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if request.stop_token_ids:
            body["stop_token_ids"] = list(request.stop_token_ids)
        return body

    async def sample(self, request: SampleRequest) -> SampleResult:
        """POST one completion request; a transport or server failure is an `EngineError`."""
        self._in_flight += 1
        try:
            data = await asyncio.to_thread(self._post, self.payload(request))
        finally:
            self._in_flight -= 1
        return parse_completion(data, self._version)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(
            f"{self.base_url}/completions",
            data=json.dumps(body).encode(),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise EngineError(f"{self.base_url}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, TimeoutError, OSError, json.JSONDecodeError) as exc:
            raise EngineError(f"{self.base_url}: {exc}") from exc

    async def close(self) -> None:
        """Nothing to release: each request opens its own connection."""


def parse_completion(data: dict[str, Any], version: int = 0) -> SampleResult:
    """Token ids, logprobs and finish reason from a completions response."""
    try:
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            tokens = logprobs.get("tokens") or []
            if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                raise EngineError(
                    "the server returned no token ids; start vLLM with token-id support "
                    "(return_token_ids / --return-tokens-as-token-ids)"
                )
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        values = [float(v) if v is not None else 0.0 for v in logprobs.get("token_logprobs") or []]
        if len(values) != len(ids):
            raise EngineError(f"server returned {len(ids)} ids but {len(values)} logprobs")
        reason = choice.get("finish_reason")
        finish = reason if reason in ("stop", "length") else "abort"
        return SampleResult(
            token_ids=[int(i) for i in ids],
            logprobs=values,
            finish_reason=finish,
            policy_version=version,
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EngineError(f"malformed completions response: {exc}") from exc
