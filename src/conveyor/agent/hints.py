"""Hints: short structured nudges injected when the agent errs or loops.

A hint is text the policy did not sample: it is rendered into the next prompt with loss mask 0 and
counted per trajectory and per trigger. The policy object only decides *whether* and *what*; the
agent loop decides where the text goes (appended to the tool response, or as a user turn).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from conveyor.config import HintsConfig


class HintTrigger(StrEnum):
    """What made a hint fire."""

    NO_TOOL_CALL = "no_tool_call"
    INVALID_ARGUMENTS = "invalid_arguments"
    REPEATED_ACTION = "repeated_action"
    TOOL_ERROR = "tool_error"
    STEPS_LEFT = "steps_left"


@dataclass(frozen=True)
class TurnObservation:
    """What the loop saw in one turn, for the hint policy to judge."""

    turn_index: int
    turns_left: int
    tool_names: list[str]
    action_key: str
    parse_errors: list[str]
    tool_errors: list[str]
    previous_action_key: str | None


@dataclass
class HintPolicy:
    """Decides which hints to inject after a turn, from the `agent.hints` config."""

    config: HintsConfig
    counts: Counter[str] = field(default_factory=Counter)

    def hints_for(self, seen: TurnObservation) -> list[str]:
        """Hint texts for this turn (possibly none); counts every one fired."""
        if not self.config.enabled:
            return []
        fired: list[tuple[HintTrigger, str]] = []
        cfg = self.config
        if seen.parse_errors and cfg.on_invalid_arguments:
            fired.append(
                (
                    HintTrigger.INVALID_ARGUMENTS,
                    "Your tool call could not be parsed: "
                    + "; ".join(seen.parse_errors[:2])
                    + '. Use exactly <tool_call>{"name": ..., "arguments": {...}}</tool_call>.',
                )
            )
        elif not seen.tool_names and cfg.on_no_tool_call:
            fired.append(
                (
                    HintTrigger.NO_TOOL_CALL,
                    "You did not call a tool. Every step must be a tool call; call `finish` "
                    "with your answer when you are done.",
                )
            )
        if seen.tool_errors and cfg.on_tool_error:
            fired.append(
                (
                    HintTrigger.TOOL_ERROR,
                    "The last tool call failed. Read the error, fix the arguments, and try again.",
                )
            )
        if (
            cfg.on_repeated_action
            and seen.tool_names
            and seen.previous_action_key is not None
            and seen.action_key == seen.previous_action_key
        ):
            fired.append(
                (
                    HintTrigger.REPEATED_ACTION,
                    "You repeated the same call with the same arguments. Try something different.",
                )
            )
        if cfg.on_steps_left and 0 < seen.turns_left <= cfg.steps_left_threshold:
            fired.append(
                (
                    HintTrigger.STEPS_LEFT,
                    f"Only {seen.turns_left} step(s) left: call `finish` with your best "
                    "answer soon.",
                )
            )
        for trigger, _ in fired:
            self.counts[trigger.value] += 1
        return [f"[hint] {text}" for _, text in fired]
