"""The ReAct-style tool-calling loop: sample, parse, call tools, hint, repeat, until `finish`.

Ownership of outcomes (see `conveyor.types.Status`):
- the policy finished by calling `finish` -> `ok`;
- a length budget (prompt, per-turn completion, total context) or the turn budget ran out ->
  `truncated`; the model answered without ever calling a tool and hints are off -> `policy_error`;
- the rollout's wall budget (`agent.rollout_timeout_s`) ran out -> `timeout`. The budget counts
  the time the policy is answerable for (tool calls, the loop itself) and not the time spent
  waiting for the engine, which depends on how busy the engine is, not on the policy; a stuck
  engine is the engine client's request timeout (infra). The loop keeps the turns sampled so far;
- `EngineError` / `RuntimeFailure` propagate to the dispatcher, which owns infrastructure failures.
Whatever happens, the turns sampled so far stay token-exact and are returned.

Two hooks serve families beyond single-question tasks:
- a conversational family (BFCL, tau2) passes `user_turn`: when the agent replies with text and no
  tool call, the family's user answers (the next question, a simulated customer's reply) and the
  loop goes on; when the user has nothing more to say the rollout ends `ok` (`user_done`).
  `agent.max_steps_per_user_turn` bounds the tool-calling replies of one user turn, and a
  family may ask (`malformed_ends_turn`, BFCL) that a reply whose calls do not parse end the
  user turn, none of its calls run, instead of drawing a hint or ending the rollout;
- a tool may call `ToolContext.reset_context(messages)` (a memory agent's `update_memory`): after
  that turn the history is dropped and a fresh conversation starts from `messages`, as a new
  training sample. Resets are counted in `counters["resets"]`, apart from template `splits`, and
  `messages` keeps every context, each new one after a `context_reset` marker. Each context has
  its own `agent.max_turns`; `agent.max_contexts` bounds how many a rollout opens.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.agent.chat import ChatRenderer, TokenLedger
from conveyor.agent.hints import HintPolicy, TurnObservation
from conveyor.agent.parsing import parse_tool_calls
from conveyor.agent.tools import RESET_KEY, ToolContext, ToolRegistry
from conveyor.config import AgentConfig, HintsConfig, SamplingConfig
from conveyor.engines.base import SampleRequest, SampleResult, SamplingClient
from conveyor.runtime.base import Runtime
from conveyor.types import EndReason, Message, Status, StopReason, Task, Trajectory, Turn


@dataclass(frozen=True)
class FirstTurn:
    """The first generation of a rollout, sampled before its runtime existed (`first_turn`)."""

    prompt_ids: tuple[int, ...]
    result: SampleResult
    engine_s: float


# The user of a conversational family: (task, runtime, the agent's text reply) -> the user's next
# message, or None when the conversation is over.
UserTurn = Callable[[Task, Runtime | None, str], Awaitable[str | None]]

# `Message.role` of the marker between two contexts of a rollout that reset its history.
CONTEXT_RESET_ROLE = "context_reset"


@dataclass
class _State:
    ledger: TokenLedger
    history: list[Message] = field(default_factory=list)  # messages of earlier contexts
    splits: int = 0  # template splits of earlier contexts
    turns: list[Turn] = field(default_factory=list)
    status: Status = Status.TRUNCATED
    stop_reason: EndReason = EndReason.MAX_TURNS
    counters: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    engine_s: float = 0.0

    def policy_time(self) -> float:
        """Wall time of the rollout so far, less the time spent waiting for the engine."""
        return time.monotonic() - self.started - self.engine_s

    def bump(self, key: str, by: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + by


class AgentLoop:
    """Runs one task instance to a `Trajectory` with a model, its tools and a runtime."""

    def __init__(
        self,
        renderer: ChatRenderer,
        client: SamplingClient,
        tools: ToolRegistry,
        agent: AgentConfig,
        sampling: SamplingConfig,
        *,
        rollout_timeout_s: float,
        hint_policy: Callable[[HintsConfig], HintPolicy] = HintPolicy,
        user_turn: UserTurn | None = None,
        malformed_ends_turn: bool = False,
    ) -> None:
        self.renderer = renderer
        self.user_turn = user_turn
        self.malformed_ends_turn = malformed_ends_turn and user_turn is not None
        self.client = client
        self.tools = tools
        self.agent = agent
        self.sampling = sampling
        self.rollout_timeout_s = rollout_timeout_s
        self.hint_policy = hint_policy
        self._schemas = {
            s["function"]["name"]: s["function"].get("parameters", {}) for s in tools.schemas()
        }

    def _request(
        self, prompt: list[int], session: str, turn_index: int, room: int
    ) -> SampleRequest:
        return SampleRequest(
            prompt_ids=prompt,
            max_tokens=min(self.agent.max_completion_tokens, room),
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            seed=request_seed(self.sampling.sampling_seed, session, turn_index),
            session_id=session,
        )

    def _over_budget(self, prompt: list[int]) -> EndReason | None:
        """The length budget a prompt leaves no room under (the stop reason), or None."""
        if len(prompt) > self.agent.max_prompt_tokens:
            return EndReason.MAX_PROMPT_TOKENS
        if len(prompt) >= self.agent.max_context_tokens:
            return EndReason.MAX_CONTEXT_TOKENS
        return None

    async def first_turn(self, task: Task, sample_index: int) -> FirstTurn | None:
        """The rollout's first generation, which reads only the task's prompt and so needs no
        runtime: the dispatcher starts it beside the runtime's set-up and `run` continues from
        it. None where the prompt alone exceeds a budget (`run` then ends the rollout itself)."""
        prompt = TokenLedger(self.renderer).start(task.prompt)
        if self._over_budget(prompt) is not None:
            return None
        room = self.agent.max_context_tokens - len(prompt)
        asked = time.monotonic()
        result = await self.client.sample(
            self._request(prompt, f"{task.id}/{sample_index}", 0, room)
        )
        return FirstTurn(tuple(prompt), result, time.monotonic() - asked)

    async def run(
        self,
        task: Task,
        sample_index: int,
        runtime: Runtime | None,
        head: FirstTurn | None = None,
    ) -> Trajectory:
        """One rollout. Infra failures raise; every policy outcome is a status in the result.
        With `head` (from `first_turn`, same task and sample) its generation is the first turn."""
        start = time.monotonic()
        state = _State(ledger=TokenLedger(self.renderer))
        hints = self.hint_policy(self.agent.hints)
        ctx = ToolContext(task=task, runtime=runtime)
        await self._turns(task, sample_index, hints, ctx, state, head)
        ledger = state.ledger
        state.counters["splits"] = state.splits + ledger.splits
        state.counters["hints"] = sum(hints.counts.values())
        for trigger, count in hints.counts.items():
            state.counters[f"hint_{trigger}"] = count
        state.counters["turns"] = len(state.turns)
        answer = ctx.state.get("answer")
        messages = [*state.history, *ledger.messages]
        if answer is not None:
            messages.append({"role": "answer", "content": str(answer), "_meta": True})
        return Trajectory(
            task_id=task.id,
            sample_index=sample_index,
            turns=state.turns,
            messages=messages,
            status=state.status,
            stop_reason=state.stop_reason,
            timings={
                "run_s": time.monotonic() - start,
                "engine_s": state.engine_s,
                "policy_s": time.monotonic() - start - state.engine_s,
                **({"first_turn_engine_s": head.engine_s} if head is not None else {}),
            },
            counters=state.counters,
            metrics={
                "prompt_tokens": float(len(state.turns[0].prompt_ids)) if state.turns else 0.0,
                "completion_tokens": float(sum(len(t.completion_ids) for t in state.turns)),
            },
        )

    async def _turns(
        self,
        task: Task,
        sample_index: int,
        hints: HintPolicy,
        ctx: ToolContext,
        state: _State,
        head: FirstTurn | None = None,
    ) -> None:
        cfg = self.agent
        ledger = state.ledger
        prompt = ledger.start(task.prompt)
        previous_action: str | None = None
        session = f"{task.id}/{sample_index}"
        context_turns = 0  # turns of the current context: a reset opens a fresh budget
        user_turn_steps = 0  # tool-calling replies since the last user message
        for turn_index in itertools.count():
            if context_turns == cfg.max_turns:
                break
            context_turns += 1
            over = self._over_budget(prompt)
            if over is not None:
                state.status, state.stop_reason = Status.TRUNCATED, over
                return
            room = cfg.max_context_tokens - len(prompt)
            if state.policy_time() > self.rollout_timeout_s:
                state.status, state.stop_reason = Status.TIMEOUT, EndReason.ROLLOUT_TIMEOUT
                return
            if turn_index == 0 and head is not None and head.prompt_ids == tuple(prompt):
                # sampled before the runtime existed; its engine time is not the run's
                result = head.result
            else:
                asked = time.monotonic()
                result = await self.client.sample(self._request(prompt, session, turn_index, room))
                state.engine_s += time.monotonic() - asked
            stopped = result.finish_reason == StopReason.STOP
            state.turns.append(sampled_turn(prompt, result, ledger.sample_index))
            assistant = ledger.add_completion(result.token_ids, stopped_on_eos=stopped)
            if not stopped:
                which = (
                    EndReason.MAX_CONTEXT_TOKENS
                    if room < cfg.max_completion_tokens
                    else EndReason.MAX_COMPLETION_TOKENS
                )
                state.status, state.stop_reason = Status.TRUNCATED, which
                return
            parsed = parse_tool_calls(
                assistant["content"], self.renderer.tool_format, self._schemas
            )
            if parsed.errors:
                state.bump("parse_errors", len(parsed.errors))
                if self.malformed_ends_turn:
                    # BFCL: a reply that does not decode ends the user turn, none of it runs
                    state.bump("malformed_turn_ends")
                    parsed = dataclasses.replace(parsed, calls=[], errors=[])
            assistant["_tool_calls"] = [c.model_dump() for c in parsed.calls]
            if parsed.calls and self.user_turn is not None:
                user_turn_steps += 1
                if (
                    cfg.max_steps_per_user_turn is not None
                    and user_turn_steps > cfg.max_steps_per_user_turn
                ):
                    state.bump("user_turn_step_limit")
                    state.status, state.stop_reason = Status.TRUNCATED, EndReason.MAX_TURNS
                    return
            replies: list[Message] = []
            tool_errors: list[str] = []
            for call in parsed.calls:
                state.bump("tool_calls")
                outcome = await self.tools.execute(
                    call,
                    ctx,
                    timeout_s=cfg.tool_timeout_s,
                    max_output_chars=cfg.tool_output_max_chars,
                )
                if outcome.is_error:
                    state.bump("tool_errors")
                    state.bump(f"tool_{outcome.kind}")
                    tool_errors.append(outcome.output)
                replies.append({"role": "tool", "content": outcome.output, "name": call.name})
                if ctx.state.get("finished"):
                    break
            if ctx.state.get("finished"):
                state.status, state.stop_reason = Status.OK, EndReason.FINISH
                return
            if not parsed.calls and not parsed.errors and self.user_turn is not None:
                said = await self.user_turn(task, ctx.runtime, assistant["content"])
                if said is None:
                    state.status, state.stop_reason = Status.OK, EndReason.USER_DONE
                    return
                state.bump("user_turns")
                previous_action = None
                user_turn_steps = 0
                prompt = ledger.next_prompt([{"role": "user", "content": said}])
                continue
            fresh = ctx.state.pop(RESET_KEY, None)
            if fresh is not None:
                if state.counters.get("resets", 0) + 1 >= cfg.max_contexts:
                    state.status, state.stop_reason = Status.TRUNCATED, EndReason.MAX_TURNS
                    return
                ledger = self._reset(state, replies, fresh)
                prompt = ledger.start(fresh)
                previous_action = None
                context_turns = 0
                continue
            if not parsed.calls and not cfg.hints.enabled:
                # Without hints nobody will tell the model to use a tool: the text is its answer.
                state.status = Status.POLICY_ERROR
                state.stop_reason = (
                    EndReason.INVALID_TOOL_CALL if parsed.errors else EndReason.NO_TOOL_CALL
                )
                return
            action = json.dumps([c.model_dump() for c in parsed.calls], sort_keys=True)
            fired = hints.hints_for(
                TurnObservation(
                    turn_index=turn_index,
                    turns_left=cfg.max_turns - context_turns,
                    tool_names=[c.name for c in parsed.calls],
                    action_key=action,
                    parse_errors=parsed.errors,
                    tool_errors=tool_errors,
                    previous_action_key=previous_action,
                )
            )
            previous_action = action
            replies = _attach_hints(replies, fired)
            prompt = ledger.next_prompt(replies)
        state.status, state.stop_reason = Status.TRUNCATED, EndReason.MAX_TURNS

    def _reset(self, state: _State, replies: list[Message], fresh: list[Message]) -> TokenLedger:
        """Close the current context (its messages and this turn's tool replies kept in the
        history) and open a new ledger whose turns form the next training sample."""
        old = state.ledger
        state.history.extend([*old.messages, *replies])
        state.splits += old.splits
        state.bump("resets")
        state.history.append(
            {
                "role": CONTEXT_RESET_ROLE,
                "content": f"context reset {state.counters['resets']}: the history is dropped",
                "_meta": True,
            }
        )
        state.ledger = TokenLedger(self.renderer, sample_index=old.sample_index + 1)
        return state.ledger


def sampled_turn(prompt: list[int], result: SampleResult, sample_index: int) -> Turn:
    """The record of one generation: the exact prompt the engine saw and what it returned,
    every sampled token trained on (loss mask 1), in training sample `sample_index`."""
    return Turn(
        prompt_ids=list(prompt),
        completion_ids=result.token_ids,
        completion_logprobs=result.logprobs,
        loss_mask=[1] * len(result.token_ids),
        policy_version=result.policy_version,
        stop_reason=result.finish_reason,
        sample_index=sample_index,
    )


def request_seed(base: int | None, session: str, turn_index: int) -> int | None:
    """A per-request seed from the run seed, the rollout and the turn: reproducible samples that
    are independent across tasks, samples and turns (None keeps the engine's own randomness).
    The recording gateway uses it too, so seeded sampling there repeats the native loop's."""
    if base is None:
        return None
    digest = hashlib.blake2b(f"{base}/{session}/{turn_index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def _attach_hints(replies: list[Message], hints: list[str]) -> list[Message]:
    """Hints ride on the last tool response when there is one, else form a user turn.

    Riding on the tool response keeps templates such as Qwen3's from treating the hint as a new
    user query (which would strip earlier reasoning and force a split).
    """
    if not hints:
        return replies
    text = "\n".join(hints)
    if replies:
        last = dict(replies[-1])
        last["content"] = f"{last['content']}\n{text}"
        last["_hint"] = True
        return [*replies[:-1], last]
    return [{"role": "user", "content": text, "_hint": True}]


def final_answer(trajectory: Trajectory) -> str | None:
    """The answer submitted through `finish`, if any."""
    for message in reversed(trajectory.messages):
        if message.get("role") == "answer":
            return str(message["content"])
    return None


def conversation(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The chat messages without our bookkeeping entries."""
    return [m for m in trajectory.messages if m.get("role") != "answer"]
