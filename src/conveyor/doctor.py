"""`conveyor doctor`: does a model's chat template tokenize a tool conversation exactly?

A scripted conversation (system, user, assistant turns with reasoning and tool calls, tool results,
a follow-up user question) is fed through `TokenLedger` as if the assistant text had been sampled.
The report says whether incremental rendering equals the full rendering token for token, and where
and why not. A template that rewrites earlier turns (Qwen3 strips earlier reasoning) forces splits;
each split sample is still checked to be token-exact on its own. `check` also says which setting
fixes splits: where the template splits and `model.reasoning_history: keep` (every assistant turn
rendered as sampled) does not, that is the fix the report names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conveyor.agent.chat import ChatRenderer, ReasoningHistory, Tokenizer, TokenLedger
from conveyor.agent.parsing import format_tool_call
from conveyor.types import Message, ToolCall

_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 3 * 4"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Submit the final answer.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
                "additionalProperties": False,
            },
        },
    },
]


def _script(fmt: str) -> tuple[list[Message], list[tuple[str, list[Message]]]]:
    """Opening messages, then (assistant text, follow-up messages) per turn."""

    def call(name: str, **args: Any) -> str:
        return format_tool_call(
            ToolCall(name=name, arguments=args), "xml" if fmt == "xml" else "hermes"
        )

    opening: list[Message] = [
        {"role": "system", "content": "You solve word problems with the calculator tool."},
        {"role": "user", "content": "Ann has 3 bags of 12 apples and eats 5. How many are left?"},
    ]
    turns: list[tuple[str, list[Message]]] = [
        (
            "<think>\nFirst the total.\n</think>\n\n" + call("calculator", expression="3 * 12"),
            [{"role": "tool", "content": "36"}],
        ),
        (
            "<think>\nNow subtract.\n</think>\n\n" + call("calculator", expression="36 - 5"),
            [{"role": "tool", "content": "31"}],
        ),
        (
            "She has 31 apples left.\n" + call("finish", answer="31"),
            [
                {"role": "tool", "content": "Answer submitted."},
                {"role": "user", "content": "And if she then buys 4 more?"},
            ],
        ),
        (
            "<think>\nAdd four.\n</think>\n\n" + call("calculator", expression="31 + 4"),
            [{"role": "tool", "content": "35"}],
        ),
        ("She would have 35 apples.", []),
    ]
    return opening, turns


@dataclass
class DoctorReport:
    """What `conveyor doctor` found; `consistent` means no split and token-exact throughout."""

    consistent: bool
    splits: int
    samples: int
    samples_exact: bool
    native_tools: bool
    tool_format: str
    reasoning_history: str = "template"
    split_reasons: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    fix: str | None = None  # the setting that makes the conversation one exact sample, if any

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the `--json` contract: `consistent` and `splits` at least)."""
        return {
            "consistent": self.consistent,
            "splits": self.splits,
            "samples": self.samples,
            "samples_exact": self.samples_exact,
            "native_tools": self.native_tools,
            "tool_format": self.tool_format,
            "reasoning_history": self.reasoning_history,
            "fix": self.fix,
            "split_reasons": self.split_reasons,
            "mismatches": self.mismatches,
        }


def diagnose(renderer: ChatRenderer) -> DoctorReport:
    """Run the scripted conversation through `renderer` and compare incremental with full.

    Two checks per turn: the prompt the ledger built equals the tokenization of the full rendering
    of the conversation so far (with the generation prompt); and, for the last sequence of each
    sample, the full rendering without a generation prompt equals it up to trailing glue (the
    newline a ChatML template writes after `<|im_end|>`). A template that decorates only the last
    assistant turn (Qwen3's empty think block) fails the second check and is reported.
    """
    opening, turns = _script(renderer.tool_format)
    eos = renderer.eos_text
    ledger = TokenLedger(renderer)
    ledger.start(opening)
    mismatches: list[str] = []
    samples = 1
    for index, (text, follow_up) in enumerate(turns):
        full_prompt = renderer.encode(renderer.render(ledger.messages, add_generation_prompt=True))
        if full_prompt != ledger.prompt_ids:
            mismatches.append(
                f"turn {index}: prompt differs from the full rendering at token "
                f"{_first_diff(full_prompt, ledger.prompt_ids)}"
            )
        completion = renderer.encode(text + eos)
        sequence = ledger.prompt_ids + completion
        ledger.add_completion(completion, stopped_on_eos=True)
        before = ledger.sample_index
        is_last = index == len(turns) - 1
        if not is_last:
            ledger.next_prompt(follow_up)
        if is_last or ledger.sample_index != before:
            upto = len(ledger.messages) - (0 if is_last else len(follow_up))
            full = renderer.encode(
                renderer.render(ledger.messages[:upto], add_generation_prompt=False)
            )
            if not (
                full[: len(sequence)] == sequence and _only_glue(full[len(sequence) :], renderer)
            ):
                at = _first_diff(full, sequence)
                mismatches.append(
                    f"sample {samples - 1}: full rendering differs at token {at}: sampled "
                    f"{renderer.decode(sequence[at : at + 8])!r}, "
                    f"template wrote {renderer.decode(full[at : at + 8])!r}"
                )
            if not is_last:
                samples += 1
    return DoctorReport(
        consistent=ledger.splits == 0 and not mismatches,
        splits=ledger.splits,
        samples=samples,
        samples_exact=not any(m.startswith("turn") for m in mismatches),
        native_tools=renderer.native_tools,
        tool_format=renderer.tool_format,
        reasoning_history=renderer.reasoning_history,
        split_reasons=ledger.split_reasons,
        mismatches=mismatches,
    )


def check(
    tokenizer: Tokenizer,
    *,
    chat_template: str | None = None,
    reasoning_history: ReasoningHistory = "template",
) -> DoctorReport:
    """`diagnose` with the given settings; where that is not consistent, try the other
    `model.reasoning_history` and name it as the fix when it is."""
    report = diagnose(
        ChatRenderer(
            tokenizer, _SCHEMAS, chat_template=chat_template, reasoning_history=reasoning_history
        )
    )
    if report.consistent:
        return report
    other: ReasoningHistory = "keep" if reasoning_history == "template" else "template"
    try:
        alternative = diagnose(
            ChatRenderer(tokenizer, _SCHEMAS, chat_template=chat_template, reasoning_history=other)
        )
    except ValueError:  # 'keep' refused: the template does not write assistant content as given
        return report
    if alternative.consistent:
        report.fix = f"model.reasoning_history: {other}"
    return report


def _first_diff(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _only_glue(rest: list[int], renderer: ChatRenderer) -> bool:
    """Tokens a full rendering adds after the last sampled token: whitespace the template appends.

    ChatML templates write a newline after `<|im_end|>`; that newline is never sampled.
    """
    return renderer.decode(rest).strip() == ""
