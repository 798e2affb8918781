"""TokenLedger and the doctor on the real SmolLM2 tokenizer with real chat templates."""

from __future__ import annotations

from typing import Any

from chat_templates import template
from conveyor.agent.chat import ChatRenderer, TokenLedger, template_supports_tools
from conveyor.doctor import _SCHEMAS, diagnose


def test_smollm2_template_has_no_tools_so_hermes_goes_into_the_system_message(
    tokenizer: Any,
) -> None:
    renderer = ChatRenderer(tokenizer, _SCHEMAS)
    assert not renderer.native_tools
    text = renderer.render(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "tool", "content": "42"},
        ],
        add_generation_prompt=True,
    )
    assert '"name": "calculator"' in text and "<tools>" in text
    assert "<tool_response>\n42\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_qwen25_template_is_consistent_token_for_token(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, _SCHEMAS, chat_template=template("qwen2.5.jinja"))
    assert renderer.native_tools and template_supports_tools(renderer.chat_template)
    report = diagnose(renderer)
    assert report.consistent, report.as_dict()
    assert report.splits == 0 and report.samples == 1


def test_qwen3_template_forces_splits_and_each_split_sample_is_token_exact(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, _SCHEMAS, chat_template=template("qwen3.jinja"))
    report = diagnose(renderer)
    assert not report.consistent
    assert report.splits > 0 and report.samples == report.splits + 1
    assert report.samples_exact, report.mismatches
    # The split is where the follow-up user query makes Qwen3 drop earlier reasoning.
    assert any("think" in reason for reason in report.split_reasons)


def test_a_template_that_rewrites_earlier_turns_is_flagged(tokenizer: Any) -> None:
    # Drops reasoning from assistant turns, as DeepSeek-R1-style templates do: the sampled
    # `<think>` block no longer renders back, so the prefix property breaks.
    stripping = (tokenizer.chat_template or "").replace(
        "message['content']", "message['content'].split('</think>')[-1]"
    )
    report = diagnose(ChatRenderer(tokenizer, _SCHEMAS, chat_template=stripping))
    assert not report.consistent and report.splits > 0


def test_ledger_extends_prompt_with_sampled_ids_untouched(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, _SCHEMAS, chat_template=template("qwen2.5.jinja"))
    ledger = TokenLedger(renderer)
    first = ledger.start([{"role": "user", "content": "hi"}])
    # A non-canonical tokenization of "Hello": what a sampler may produce; never re-tokenized.
    odd = [
        *tokenizer.encode("Hel", add_special_tokens=False),
        *tokenizer.encode("lo", add_special_tokens=False),
    ]
    completion = odd + tokenizer.encode("<|im_end|>", add_special_tokens=False)
    ledger.add_completion(completion, stopped_on_eos=True)
    second = ledger.next_prompt([{"role": "user", "content": "again"}])
    assert second[: len(first) + len(completion)] == first + completion
    assert ledger.splits == 0
    glue = second[len(first) + len(completion) :]
    assert tokenizer.decode(glue).startswith("\n<|im_start|>user\nagain")


def test_truncated_completion_gets_end_of_turn_as_glue(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer, _SCHEMAS)
    ledger = TokenLedger(renderer)
    first = ledger.start([{"role": "user", "content": "hi"}])
    completion = tokenizer.encode("A long answer that was cut", add_special_tokens=False)
    ledger.add_completion(completion, stopped_on_eos=False)
    second = ledger.next_prompt([{"role": "user", "content": "go on"}])
    assert second[: len(first) + len(completion)] == first + completion
    glue = tokenizer.decode(second[len(first) + len(completion) :])
    assert glue.startswith("<|im_end|>\n"), glue
