"""A plain OpenAI-SDK tool agent for the conveyor gateway (no conveyor imports).

Run it in a rollout's environment (`ExternalAgentStages` sets these):
    OPENAI_BASE_URL       the rollout's chat base URL   http://127.0.0.1:PORT/rollouts/ID/v1
    OPENAI_API_KEY        anything
    CONVEYOR_ROLLOUT_URL  the rollout itself            http://127.0.0.1:PORT/rollouts/ID
    SDK_AGENT_TEMPERATURE optional; unset, the gateway samples with the run's sampling settings

It reads the task (messages, tool schemas, budgets), asks for completions, runs each
tool call through the gateway's tool endpoint (the rollout's own runtime), and stops when
`finish` was called, the model made no tool call, or a reply was cut off by its length; then it
ends the rollout with POST .../finish (the gateway scores the submitted answer).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from typing import Any

import openai


def post(url: str, body: Any) -> Any:
    """POST JSON, return the decoded answer."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def get(url: str) -> Any:
    """GET JSON."""
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def main() -> int:
    rollout = os.environ["CONVEYOR_ROLLOUT_URL"]
    task = get(f"{rollout}/task")
    client = openai.OpenAI(max_retries=0, timeout=600)  # OPENAI_BASE_URL / OPENAI_API_KEY
    # Unset: the gateway samples as the run says (greedy evaluation, temperature-1 training;
    # with a sampling seed it supplies the same per-turn seed our own loop would use).
    chosen = os.environ.get("SDK_AGENT_TEMPERATURE")
    sampling: dict[str, Any] = {"temperature": float(chosen)} if chosen else {}
    messages: list[dict[str, Any]] = list(task["messages"])
    finished = False
    for _ in range(task["max_turns"]):
        try:
            response = client.chat.completions.create(
                model="policy",
                messages=messages,  # type: ignore[arg-type]
                tools=task["tools"],
                max_tokens=task["max_tokens"],
                **sampling,
            )
        except openai.BadRequestError as exc:  # a budget ran out: the rollout has ended
            print(f"stopped: {exc}", file=sys.stderr)
            break
        choice = response.choices[0]
        message = choice.message
        messages.append(message.model_dump(exclude_none=True))
        if choice.finish_reason == "length" or not message.tool_calls:
            break
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            # the name-in-body form: a model may invent names that are not URL-safe
            result = post(f"{rollout}/tools", {"name": call.function.name, "arguments": arguments})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result["output"]})
            if result.get("finished"):
                finished = True
                break
        if finished:
            break
    post(f"{rollout}/finish", {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
