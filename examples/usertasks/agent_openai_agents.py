"""An openai-agents agent with two tools, unmodified for conveyor (no conveyor imports).

`agent.external_command` runs it once per rollout with OPENAI_BASE_URL (the rollout's
recording gateway) and CONVEYOR_ROLLOUT_URL set. It streams (`Runner.run_streamed`, the
Responses API: openai-agents' defaults), then ends the rollout with its final output as the
answer, which the run's reward command grades (configs/usertasks-agents.yaml).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI


@function_tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@function_tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def post(url: str, body: object) -> object:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


async def main() -> None:
    rollout = os.environ["CONVEYOR_ROLLOUT_URL"]
    with urllib.request.urlopen(f"{rollout}/task", timeout=60) as response:
        task = json.loads(response.read())
    question = task["messages"][-1]["content"]
    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="policy", openai_client=AsyncOpenAI(max_retries=0))
    agent = Agent(
        name="calculator",
        instructions="Use the tools, then answer with the number only.",
        tools=[add, multiply],
        model=model,
    )
    answer = ""
    try:
        result = Runner.run_streamed(agent, question, max_turns=task["max_turns"])
        async for _event in result.stream_events():
            pass
        answer = str(result.final_output)
    except Exception as exc:  # the policy's failure (bad tool call, too many turns): no answer
        print(f"agent stopped: {type(exc).__name__}: {exc}")
    post(f"{rollout}/finish", {"answer": answer})


if __name__ == "__main__":
    asyncio.run(main())
