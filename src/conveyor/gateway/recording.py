"""One rollout as the gateway records it: its ledger, turns, tool context and lifecycle.

Lifecycle (`RolloutState`): `open` takes chat and tool requests; `closed` means a budget ended
it (the status is decided, only `finish` is left); `finished` holds the final `Trajectory`
(written to the run folder) and refuses everything but reading it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from conveyor.agent.chat import TokenLedger
from conveyor.agent.tools import ToolContext
from conveyor.runtime.base import Runtime
from conveyor.types import EndReason, Message, Status, Task, Trajectory, Turn

# The role of the `_meta` message that records one split (why a new training sample started).
SPLIT_ROLE = "split"


class RolloutState(StrEnum):
    """Where a gateway rollout is in its life."""

    OPEN = "open"
    CLOSED = "closed"
    FINISHED = "finished"


@dataclass
class LastTurn:
    """What the outcome of a rollout depends on in its last turn."""

    stopped: bool
    calls: int
    parse_errors: int
    length_reason: EndReason


@dataclass
class Fork:
    """One choice of a request with `n` > 1 that a next request may continue: the
    conversation it ends (normal form), its ledger and what the outcome depends on."""

    history: list[tuple[Any, ...]]
    ledger: TokenLedger
    last: LastTurn


@dataclass(frozen=True)
class SampledReply:
    """One reply the gateway sampled: the raw text (markup included) and the turn it came from."""

    turn: int
    raw: str
    visible: tuple[Any, ...]


@dataclass
class ReplyIndex:
    """The replies sampled in a rollout, found again by where they stand in a conversation.

    Two replies can look the same to the client (two empty replies, the same words with
    different whitespace or a broken tool call around them) while the model wrote different
    text; keyed by visible content, the later would stand in for the earlier in every prompt
    re-rendered after a split. So a reply is keyed by its path: the normal forms of the whole
    conversation it answered plus itself, in a prefix tree of every conversation returned. A
    resent message found on no returned path (the client dropped or rewrote something before
    it) falls back to the sampled replies that look like it, in the order they were sampled,
    each used once per conversation: the n-th such message is the n-th such reply.
    """

    replies: list[SampledReply] = field(default_factory=list)
    _children: dict[tuple[int, tuple[Any, ...]], int] = field(default_factory=dict)
    _reply_at: dict[int, int] = field(default_factory=dict)

    def add(self, history: list[tuple[Any, ...]], raw: str, turn: int) -> None:
        """Record a reply; `history` is the conversation in normal form ending with it."""
        node = 0
        for form in history:
            node = self._children.setdefault((node, form), len(self._children) + 1)
        self._reply_at[node] = len(self.replies)
        self.replies.append(SampledReply(turn=turn, raw=raw, visible=history[-1]))

    def resolve(self, normal: list[tuple[Any, ...]]) -> dict[int, SampledReply]:
        """Message index -> the sampled reply it stands for, for the assistant messages of a
        resent conversation that are ours."""
        found: dict[int, SampledReply] = {}
        used: set[int] = set()
        node: int | None = 0
        for index, form in enumerate(normal):
            node = self._children.get((node, form)) if node is not None else None
            if form[0] != "assistant":
                continue
            reply = self._reply_at.get(node) if node is not None else None
            if reply is None or reply in used:
                reply = next(
                    (i for i, r in enumerate(self.replies) if r.visible == form and i not in used),
                    None,
                )
            if reply is not None:
                used.add(reply)
                found[index] = self.replies[reply]
        return found


@dataclass
class RolloutRecord:
    """Everything the gateway keeps for one rollout id."""

    rollout_id: str
    task: Task | None = None
    sample_index: int = 0
    runtime: Runtime | None = None
    owns_runtime: bool = False
    score_on_finish: bool = True
    # "train" every sample a split closed, or "drop" them (mask 0): `AgentConfig.split_samples`.
    split_samples: str = "train"
    # Why the last chat request split, if it did (reported in its `x-conveyor-split` header).
    split_now: str | None = None
    ctx: ToolContext | None = None
    ledger: TokenLedger | None = None
    tools_key: str = ""
    # The conversation of the current sample in normal form (`chat_request.normal_message`).
    history: list[tuple[Any, ...]] = field(default_factory=list)
    # The other choices of the last request with n > 1 (choice 0 is `ledger`).
    forks: list[Fork] = field(default_factory=list)
    # Every reply sampled, with its raw text, keyed by the conversation it answered.
    replies: ReplyIndex = field(default_factory=ReplyIndex)
    call_names: dict[str, str] = field(default_factory=dict)
    # Responses API: response id -> its conversation (chat messages, its output included).
    responses: dict[str, list[Message]] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    last: LastTurn | None = None
    state: RolloutState = RolloutState.OPEN
    closed_as: tuple[Status, EndReason] | None = None
    # The refusal that closed it (a budget), answered again to every later chat request, so
    # a client that retries classifies the retry as it did the first answer.
    closed_by: Exception | None = None
    error: str | None = None
    # The engine or runtime exception that made this rollout an infra_error, if one did.
    infra_failure: BaseException | None = None
    reward: float | None = None
    answer: str | None = None
    trajectory: Trajectory | None = None
    started: float = field(default_factory=time.monotonic)
    engine_s: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def session(self) -> str:
        """The engine session (and seed) key: the same as the native loop's for a task."""
        if self.task is not None:
            return f"{self.task.id}/{self.sample_index}"
        return self.rollout_id

    def new_sample_index(self) -> int:
        """A training-sample index no turn of this rollout uses yet."""
        used = [t.sample_index for t in self.turns]
        if self.ledger is not None:
            used.append(self.ledger.sample_index)
        used += [f.ledger.sample_index for f in self.forks]
        return max(used, default=-1) + 1

    def bump(self, key: str, by: int = 1) -> None:
        """Add to an integer counter."""
        self.counters[key] = self.counters.get(key, 0) + by

    def submitted_answer(self) -> str | None:
        """The answer from `finish` (the tool or the finish request), if any."""
        if self.answer is not None:
            return self.answer
        if self.ctx is not None and self.ctx.state.get("answer") is not None:
            return str(self.ctx.state["answer"])
        return None

    def finished_by_agent(self) -> bool:
        """Whether the agent submitted its result (the `finish` tool, an answer or a reward)."""
        tool_finished = self.ctx is not None and bool(self.ctx.state.get("finished"))
        return tool_finished or self.answer is not None or self.reward is not None

    def outcome(self, max_turns: int) -> tuple[Status, EndReason]:
        """Who owns the result, decided as the native loop decides it."""
        if self.closed_as is not None:
            return self.closed_as
        if self.finished_by_agent():
            return Status.OK, EndReason.FINISH
        last = self.last
        if last is None:
            return Status.POLICY_ERROR, EndReason.NO_TOOL_CALL
        if not last.stopped:
            return Status.TRUNCATED, last.length_reason
        if last.calls == 0:
            reason = EndReason.INVALID_TOOL_CALL if last.parse_errors else EndReason.NO_TOOL_CALL
            return Status.POLICY_ERROR, reason
        if len(self.turns) >= max_turns:
            return Status.TRUNCATED, EndReason.MAX_TURNS
        # The agent stopped with its tool calls answered and no answer given.
        return Status.POLICY_ERROR, EndReason.UNSET

    def build(self, max_turns: int) -> Trajectory:
        """The trajectory recorded so far (final once the rollout is finished)."""
        if self.trajectory is not None:
            return self.trajectory
        status, stop_reason = self.outcome(max_turns)
        messages: list[Message] = list(self.ledger.messages) if self.ledger else []
        answer = self.submitted_answer()
        if answer is not None:
            messages.append({"role": "answer", "content": answer, "_meta": True})
        reasons = self.ledger.split_reasons if self.ledger else []
        messages += [
            {"role": SPLIT_ROLE, "content": f"split {i + 1}: {reason}", "_meta": True}
            for i, reason in enumerate(reasons)
        ]
        counters = dict(self.counters)
        counters["splits"] = self.ledger.splits if self.ledger else 0
        turns = list(self.turns)
        if self.split_samples == "drop" and turns:
            final = turns[-1].sample_index
            dropped = [i for i, t in enumerate(turns) if t.sample_index != final]
            for i in dropped:  # kept for the record, never trained
                turns[i] = turns[i].model_copy(update={"loss_mask": [0] * len(turns[i].loss_mask)})
            counters["dropped_split_turns"] = len(dropped)
        counters["turns"] = len(self.turns)
        run_s = time.monotonic() - self.started
        return Trajectory(
            task_id=self.task.id if self.task is not None else self.rollout_id,
            sample_index=self.sample_index,
            turns=turns,
            messages=messages,
            reward=self.reward,
            status=status,
            stop_reason=stop_reason,
            error=self.error,
            timings={"run_s": run_s, "engine_s": self.engine_s, "policy_s": run_s - self.engine_s},
            counters=counters,
            metrics={
                "prompt_tokens": float(len(self.turns[0].prompt_ids)) if self.turns else 0.0,
                "completion_tokens": float(sum(len(t.completion_ids) for t in self.turns)),
            },
        )
