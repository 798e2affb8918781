"""openai-agents, unmodified, against the gateway: `Runner.run_streamed` with two function
tools over the Responses API (its default model) and `Runner.run` over chat completions. The
engine's words are scripted (tokenizer, renderer, HTTP stack, the `openai` SDK and
openai-agents are real). Skipped where openai-agents is not installed (the dev extra has it)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from gateway.scripted import ROOMY, two_tools_then_answer


def lookup(word: str) -> str:
    """Look a word up."""
    return f"FOUND: {word} is a feline."


def define(word: str) -> str:
    """Define a word."""
    return f"DEFINED: {word} is a pet."


async def _run(agents: Any, url: str, rollout: str, *, chat: bool) -> str:
    client = openai.AsyncOpenAI(base_url=f"{url}/rollouts/{rollout}/v1", api_key="x")
    model: Any = (
        agents.OpenAIChatCompletionsModel(model="policy", openai_client=client)
        if chat
        else agents.OpenAIResponsesModel(model="policy", openai_client=client)
    )
    agent = agents.Agent(
        name="definer",
        instructions="Be brief.",
        tools=[agents.function_tool(lookup), agents.function_tool(define)],
        model=model,
    )
    if chat:
        result: Any = await agents.Runner.run(agent, "Define cat.")
    else:
        result = agents.Runner.run_streamed(agent, "Define cat.")
        async for _event in result.stream_events():
            pass
    return str(result.final_output)


def test_openai_agents_runs_streamed_and_chat_through_the_gateway(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    # imported here, not at collection: every xdist worker collects every module
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    gateway = make_gw(two_tools_then_answer(tokenizer), agent=ROOMY)
    with serve(gateway) as url:
        streamed = asyncio.run(_run(agents, url, "agents-responses", chat=False))
        chat = asyncio.run(_run(agents, url, "agents-chat", chat=True))
    assert streamed == chat == "A cat is a small animal."
    for rollout in ("agents-responses", "agents-chat"):
        trajectory = gateway.trajectory(rollout)
        assert len(trajectory.turns) == 3 and trajectory.counters["splits"] == 0
        # which API and whether streamed, as the record says
        api = {k: trajectory.counters.get(k) for k in ("responses_requests", "streamed_requests")}
        over_responses = rollout == "agents-responses"
        assert api == ({k: 3 for k in api} if over_responses else dict.fromkeys(api))
        assert trajectory.counters["sampled_tool_calls"] == 2
        (sample,) = trajectory.samples()
        text = tokenizer.decode(sample.input_ids)
        assert "FOUND: cat is a feline." in text and "DEFINED: cat is a pet." in text
