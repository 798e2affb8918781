"""`top_logprobs` from the engine's own distribution: the real SmolLM2 model on HFEngine
(float32, CPU) behind the gateway and the real `openai` SDK. Greedy, so the sampled token is
the most likely one at every position."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import openai


def test_top_logprobs_are_the_engines_most_likely_tokens(
    model_dir: Path, tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    from conveyor.engines.hf_local import HFEngine

    gateway = make_gw(HFEngine(model_dir))
    with serve(gateway) as url:
        client = openai.OpenAI(base_url=f"{url}/rollouts/top/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=3,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
        )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    turn = gateway.trajectory("top").turns[0]
    assert len(content) == len(turn.completion_ids) == 3  # cut by max_tokens: no end token
    for token, sampled_id, recorded in zip(
        content, turn.completion_ids, turn.completion_logprobs, strict=True
    ):
        assert [t.logprob for t in token.top_logprobs] == sorted(
            (t.logprob for t in token.top_logprobs), reverse=True
        )
        assert len(token.top_logprobs) == 3 and len({t.token for t in token.top_logprobs}) == 3
        best = token.top_logprobs[0]
        assert best.token == token.token == tokenizer.decode([sampled_id])
        assert best.logprob == token.logprob == recorded
        assert sum(math.exp(t.logprob) for t in token.top_logprobs) <= 1.0 + 1e-6
