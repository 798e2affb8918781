"""litellm, as litellm-based agents (mini-swe-agent...) call it, against the real gateway: an
over-long prompt arrives as `ContextWindowExceededError` (which such agents end or compact on),
and so does every later request of the rollout it closed. litellm is not a dependency of
conveyor but is in its dev extra, so CI runs this test; it is skipped where litellm is missing."""

from __future__ import annotations

import os
from typing import Any

import pytest

from conveyor.config import AgentConfig
from conveyor.engines.simulated import SimulatedEngine


def test_litellm_sees_a_context_window_error(tokenizer: Any, make_gw: Any, serve: Any) -> None:
    # imported here, not at collection (every xdist worker collects every module; litellm's
    # import takes seconds)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    litellm = pytest.importorskip("litellm")
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    engine = SimulatedEngine(lambda _prompt: end, eos_token_id=end[0])
    agent = AgentConfig(max_prompt_tokens=20, max_context_tokens=64, max_completion_tokens=16)
    gateway = make_gw(engine, agent=agent)
    long = [{"role": "user", "content": "word " * 50}]
    with serve(gateway) as url:
        ask = {
            "model": "openai/policy",
            "api_base": f"{url}/rollouts/r-litellm/v1",
            "api_key": "x",
            "messages": long,
        }
        with pytest.raises(litellm.ContextWindowExceededError):
            litellm.completion(**ask)
        # the rollout is closed: asked again, it answers the same (a 400, not retried)
        with pytest.raises(litellm.ContextWindowExceededError):
            litellm.completion(**{**ask, "messages": [{"role": "user", "content": "Hi."}]})
        assert gateway.trajectory("r-litellm").stop_reason == "max_prompt_tokens"
