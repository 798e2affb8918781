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
__all__ = ["ChatClient", "RenderedChatClient"]


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
