"""The canonical data model: every layer imports its shapes from here.

Everything that crosses a process or file boundary is one of these frozen pydantic models, so a
trajectory written to JSONL reads back equal to what was written (floats, -inf logprobs and all).

Token layout of a trajectory. Each `Turn` holds the full prompt the engine saw and the completion
it returned. Within one training sample, turn k's `prompt_ids` start with turn k-1's
`prompt_ids + completion_ids` (the prefix property); the extra tokens between them are template
glue, tool output and hints, all with loss mask 0. Where a chat template makes the prefix property
impossible, a new sample starts: `Turn.sample_index` says which sample a turn belongs to and
`Trajectory.counters["splits"]` counts the boundaries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

TokenIds = list[int]
Message = dict[str, Any]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


class TaskDefect(RuntimeError):
    """The task itself is broken (e.g. its hidden test patch does not apply): neither the policy's
    result nor a passing infrastructure fault. Never scored, never retried: the dispatcher stops
    with this error so the broken instance is fixed, not trained on."""


class Status(StrEnum):
    """How a rollout ended, and so who owns the outcome.

    - `ok`: the agent finished (called `finish`) within every budget; the reward says how well.
    - `truncated`: a length budget ran out (prompt, per-turn completion or total context) or the
      turn budget did; the policy's own result, scored by the task.
    - `policy_error`: the policy failed on its own terms: no or invalid tool call when one was
      needed, no answer. Scored by the task (usually reward 0) and trained on.
    - `timeout`: the rollout's wall-clock budget ran out. Scored by the task.
    - `infra_error`: a sandbox or the engine failed through no fault of the policy. Never scored:
      retried with a fresh runtime, and kept out of the learning signal.
    """

    OK = "ok"
    TRUNCATED = "truncated"
    POLICY_ERROR = "policy_error"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"


class StopReason(StrEnum):
    """Why one turn's generation stopped, as the engine reports it (`Turn.stop_reason`,
    `SampleResult.finish_reason`)."""

    STOP = "stop"  # the engine hit an end-of-turn / stop token
    LENGTH = "length"  # the per-turn completion budget ran out
    ABORT = "abort"  # the engine aborted the request


# The engine-facing name of the same reasons (OpenAI's `finish_reason`).
FinishReason = StopReason


class EndReason(StrEnum):
    """Why a rollout ended (`Trajectory.stop_reason`); `Trajectory.status` says who owns it.

    The values are the strings trajectory files have always held, so old run folders and the
    viewer read them unchanged.
    """

    # Status ok
    FINISH = "finish"  # the agent called `finish`
    USER_DONE = "user_done"  # a conversational family's user ended the conversation
    # Status truncated: a budget of the agent config ran out
    MAX_TURNS = "max_turns"  # every turn of `agent.max_turns` was used without finishing
    MAX_PROMPT_TOKENS = "max_prompt_tokens"  # the next prompt is longer than its budget
    MAX_CONTEXT_TOKENS = "max_context_tokens"  # prompt + completion reached the context limit
    MAX_COMPLETION_TOKENS = "max_completion_tokens"  # one turn's completion hit its budget
    CONTEXT_LENGTH = "context_length"  # the simulator's rollout outgrew its context limit
    # Status policy_error: the policy answered without acting, hints being off
    NO_TOOL_CALL = "no_tool_call"  # a reply with no tool call at all
    INVALID_TOOL_CALL = "invalid_tool_call"  # a reply whose tool calls could not be parsed
    # Status timeout
    ROLLOUT_TIMEOUT = "rollout_timeout"  # the policy's own time (engine waits excluded) ran out
    RUN_TIMEOUT = "run_timeout"  # the dispatcher's wall-clock limit of the run stage ran out
    # Status infra_error: never scored
    INFRA_RETRIES_EXHAUSTED = "infra_retries_exhausted"  # every retry met an infra fault
    ENGINE_DOWN = "engine_down"  # the engine stopped answering; the run stops
    # A trajectory built without a reason (tests, hand-made records)
    UNSET = ""


class Task(_Frozen):
    """One task instance: what the agent is asked and what the reward needs to grade it.

    `prompt` is the opening conversation (system and user messages); `data` holds what the family's
    reward and runtime set-up need (an expected answer, a generated file tree, a test list ...).
    """

    id: str
    family: str
    prompt: list[Message]
    data: dict[str, Any] = Field(default_factory=dict)
    split: str = "train"


class ToolCall(_Frozen):
    """One parsed tool call: a function name and its JSON arguments."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str = ""


class Turn(_Frozen):
    """One generation: the exact prompt token ids sent, and the completion the engine returned.

    `loss_mask` is aligned with `completion_ids`: 1 for tokens the policy sampled and should learn
    from; `completion_logprobs` are the engine's (behaviour) logprobs of those same tokens.
    """

    prompt_ids: TokenIds
    completion_ids: TokenIds
    completion_logprobs: list[float]
    loss_mask: list[int]
    policy_version: int = 0
    stop_reason: StopReason = StopReason.STOP
    sample_index: int = 0


class Trajectory(_Frozen):
    """One rollout of one task instance, from its first prompt to its reward.

    `timings` holds stage start/end times and queue waits in seconds (keys such as `init_start`,
    `run_end`, `reward_queue_wait`); `counters` holds integers such as `hints`, `splits`,
    `tool_calls`, `tool_errors`, `parse_errors`, `infra_retries`.
    """

    task_id: str
    sample_index: int = 0
    turns: list[Turn] = Field(default_factory=list)
    messages: list[Message] = Field(default_factory=list)
    reward: float | None = None
    status: Status = Status.OK
    stop_reason: EndReason = EndReason.UNSET
    error: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    counters: dict[str, int] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def solved(self) -> bool:
        """Whether this rollout solved its task: the one "solved" rule (reward 1, the verifier's
        full score) behind pass@k, pass rates and the warm start's choice of oracle traces."""
        return is_solved(self.reward)

    def to_json(self) -> str:
        """One JSONL line."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        """Inverse of `to_json`."""
        return cls.model_validate_json(line)

    def samples(self) -> list[TrainingSample]:
        """The token-exact training samples: one per run of turns that keeps the prefix property."""
        out: list[TrainingSample] = []
        by_sample: dict[int, list[Turn]] = {}
        for turn in self.turns:
            by_sample.setdefault(turn.sample_index, []).append(turn)
        for index in sorted(by_sample):
            turns = by_sample[index]
            last = turns[-1]
            ids = last.prompt_ids + last.completion_ids
            mask = [0] * len(ids)
            logprobs = [0.0] * len(ids)
            versions = []
            for turn in turns:
                start = len(turn.prompt_ids)
                if ids[start : start + len(turn.completion_ids)] != turn.completion_ids:
                    raise ValueError(
                        f"trajectory {self.task_id}/{self.sample_index}: turn breaks the prefix "
                        f"property inside sample {index}"
                    )
                for offset, (m, lp) in enumerate(
                    zip(turn.loss_mask, turn.completion_logprobs, strict=True)
                ):
                    mask[start + offset] = m
                    logprobs[start + offset] = lp
                versions.append(turn.policy_version)
            out.append(
                TrainingSample(
                    input_ids=ids,
                    loss_mask=mask,
                    logprobs=logprobs,
                    prompt_length=len(turns[0].prompt_ids),
                    min_policy_version=min(versions),
                )
            )
        return out


class TrainingSample(_Frozen):
    """One token sequence for the trainer: ids, loss mask and behaviour logprobs, all aligned."""

    input_ids: TokenIds
    loss_mask: list[int]
    logprobs: list[float]
    prompt_length: int
    min_policy_version: int = 0


class TrajectoryGroup(_Frozen):
    """All samples of one task instance, handed to the trainer together (GRPO-style groups)."""

    task_id: str
    trajectories: list[Trajectory]

    @property
    def rewards(self) -> list[float | None]:
        """Rewards in sample order."""
        return [t.reward for t in self.trajectories]


SOLVED_REWARD = 1.0


def is_solved(reward: float | None) -> bool:
    """A reward that counts as solving the task (no reward, e.g. an infra error, never does)."""
    return reward is not None and reward >= SOLVED_REWARD


@runtime_checkable
class ChatClient(Protocol):
    """Messages in, reply text out: a model that plays a part in a task (tau2's simulated user,
    a judge). Declared here, beside `FamilyServices` which hands one to a family, so the data
    model names no type of a higher layer; `conveyor.agent.chat_client` makes them."""

    async def reply(self, messages: list[Message]) -> str:
        """The next assistant message's text after `messages` (roles system/user/assistant)."""
        ...


@dataclass(frozen=True)
class FamilyServices:
    """What a run hands a family built with a `services` parameter: its `tasks.options` entry,
    and the chat clients of `tasks.user_engine` and `tasks.judge_engine` (each built on first
    call; `judge` is None when no judge is configured)."""

    options: Mapping[str, Any] = field(default_factory=dict)
    user: Callable[[], ChatClient] | None = None
    judge: Callable[[], ChatClient] | None = None
