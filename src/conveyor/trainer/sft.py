"""Supervised warm start from oracle traces (`conveyor sft`).

An oracle trace is a real rollout of the real agent loop in which the "engine" is the task
family's oracle: each turn it emits the next correct tool call as token ids. The trajectory is
therefore rendered, masked and token-exact exactly like a sampled one, and supervised fine-tuning
is one policy-gradient step per batch with advantage 1 and fresh old logprobs (ratio 1), whose
gradient is exactly the negative log-likelihood gradient over the assistant tokens. No private
path around the training-backend protocol is needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conveyor.agent.parsing import format_tool_call
from conveyor.engines.base import SampleRequest, SampleResult
from conveyor.types import Task, ToolCall

# The name of an oracle step that is a plain text reply; equal to `conveyor.tasks.family.SAY`
# (the trainer may not import the task layer; a test checks they agree).
ORACLE_SAY = "_say"
# ... and one that holds several tool calls in one reply (`conveyor.tasks.family.CALLS`).
ORACLE_CALLS = "_calls"


class OracleEngine:
    """A `SamplingClient` that answers each rollout with its task's oracle tool calls, in order.

    Rollouts are told apart by the session id the agent loop sends (`task_id/sample_index`).
    """

    def __init__(
        self,
        calls: Mapping[str, list[ToolCall]],
        encode: Callable[[str], list[int]],
        eos_token_id: int,
        tool_format: str = "hermes",
    ) -> None:
        # task id -> the task family's oracle calls (the command layer asks the families)
        self._calls: dict[str, list[ToolCall]] = dict(calls)
        self._encode = encode
        self._eos = eos_token_id
        self._format = "xml" if tool_format == "xml" else "hermes"
        self._turn: dict[str, int] = {}
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Requests being answered (always answered at once)."""
        return self._in_flight

    @property
    def policy_version(self) -> int:
        """The oracle never changes."""
        return 0

    async def sample(self, request: SampleRequest) -> SampleResult:
        """The next oracle call of this session's task, as ids, ending with end-of-turn."""
        task_id = request.session_id.rsplit("/", 1)[0]
        calls = self._calls[task_id]
        turn = self._turn.get(request.session_id, 0)
        self._turn[request.session_id] = turn + 1
        call = calls[min(turn, len(calls) - 1)]
        # A conversational family's oracle answers its user in plain text between tool calls.
        if call.name == ORACLE_SAY:
            text = str(call.arguments.get("text", ""))
        elif call.name == ORACLE_CALLS:  # several calls in one reply
            text = "\n".join(
                format_tool_call(ToolCall.model_validate(c), self._format)  # type: ignore[arg-type]
                for c in call.arguments["calls"]
            )
        else:
            text = format_tool_call(call, self._format)  # type: ignore[arg-type]
        ids = [*self._encode(text), self._eos]
        ids = ids[: request.max_tokens]
        reason = "stop" if ids and ids[-1] == self._eos else "length"
        return SampleResult(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=reason)

    async def close(self) -> None:
        """Nothing to release."""


async def oracle_rollouts(
    stages: Any,
    tasks: Sequence[Task],
    *,
    concurrency: int | None = None,
    keep_infra_errors: bool = False,
) -> list[Any]:
    """Run the agent loop once per task with the oracle as engine; returns scored trajectories
    in task order. `concurrency` bounds the live runtimes (None: all at once). An
    infrastructure failure (`RuntimeFailure`, `EngineError`) raises, or with
    `keep_infra_errors` is that rollout's `infra_error` trajectory and the others go on."""
    from conveyor.engines.base import EngineError
    from conveyor.runtime.base import RuntimeFailure
    from conveyor.types import Status, Trajectory

    gate = asyncio.Semaphore(concurrency or max(1, len(tasks)))

    async def one(task: Task) -> Any:
        async with gate:
            try:
                runtime = await stages.init(task, 0, 0)
                try:
                    trajectory = await stages.run(task, 0, runtime)
                    return await stages.reward(task, trajectory, runtime)
                finally:
                    await runtime.close()
            except (RuntimeFailure, EngineError) as error:
                if not keep_infra_errors:
                    raise
                return Trajectory(
                    task_id=task.id,
                    sample_index=0,
                    status=Status.INFRA_ERROR,
                    error=f"{type(error).__name__}: {error}",
                )

    return list(await asyncio.gather(*(one(t) for t in tasks)))
