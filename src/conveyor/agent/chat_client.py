"""Chat-level clients for the models that play a part in a task: tau2's simulated user, the search
family's optional judge.

A `ChatClient` takes chat messages and returns the reply text. `RenderedChatClient` makes one from
any `SamplingClient` (in-process vLLM, HF, an OpenAI-compatible server, the run's own engine) and
the model's tokenizer: the messages are rendered with the model's own chat template, sampled as
token ids, and decoded. Nothing of it is trained on; its replies enter a rollout as user or
grading text, with loss mask 0.
"""

from __future__ import annotations

import itertools

from conveyor.agent.chat import Tokenizer
from conveyor.engines.base import SampleRequest, SamplingClient
from conveyor.types import ChatClient, Message, StopReason

# `ChatClient` is defined in `conveyor.types`, whose `FamilyServices` hands one to a family and
# which may name nothing above it; it is named here too, where the clients are made.
__all__ = ["ChatClient", "ChatEndpointError", "EndpointChatClient", "RenderedChatClient"]


class RenderedChatClient:
    """A `ChatClient` over a `SamplingClient`: the tokenizer's chat template renders the
    messages, the engine samples, the tokenizer decodes (special tokens dropped)."""

    def __init__(
        self,
        client: SamplingClient,
        tokenizer: Tokenizer,
        *,
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int | None = 0,
        name: str = "chat",
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        self.name = name
        self._count = itertools.count()

    async def reply(self, messages: list[Message]) -> str:
        """Render, sample (seeded, so a seeded run repeats), decode."""
        text = self.tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m.get("content") or ""} for m in messages],
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = self.tokenizer.encode(str(text), add_special_tokens=False)
        number = next(self._count)
        result = await self.client.sample(
            SampleRequest(
                prompt_ids=ids,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                seed=None if self.seed is None else self.seed + number,
                session_id=f"{self.name}/{number}",
            )
        )
        reply = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        if result.finish_reason is StopReason.LENGTH:
            reply += " ..."
        return reply.strip()


class EndpointChatClient:
    """A `ChatClient` over any OpenAI-compatible chat-completions endpoint (a hosted API, a
    vLLM or llama.cpp server): POST `{base_url}/chat/completions` with the messages, the reply
    is the first choice's text. The key, if any, is read from the environment variable
    `api_key_env` at each call (never stored in a config). Any failure (connection, HTTP
    status, timeout after `timeout_s`, a reply without text) raises `ChatEndpointError`."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        temperature: float = 0.0,
        max_tokens: int = 1024,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.max_tokens = max_tokens

    async def reply(self, messages: list[Message]) -> str:
        """One completion of `messages`; `ChatEndpointError` on any failure."""
        import os

        import httpx

        headers = {}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ChatEndpointError(f"the environment variable {self.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        body = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m.get("content") or ""} for m in messages],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as http:
                response = await http.post(self.url, json=body, headers=headers)
            response.raise_for_status()
            text = response.json()["choices"][0]["message"]["content"]
        except httpx.TimeoutException as error:
            raise ChatEndpointError(f"{self.url}: no reply in {self.timeout_s} s") from error
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
            raise ChatEndpointError(f"{self.url}: {type(error).__name__}: {error}") from error
        if not isinstance(text, str):
            raise ChatEndpointError(f"{self.url}: the reply holds no text")
        return text.strip()


class ChatEndpointError(RuntimeError):
    """A chat endpoint did not answer (the caller decides whose failure that is)."""
