"""`model.reasoning_history`: a multi-turn rollout of a thinking model as one training sample.

Qwen3's own chat template (the licensed fixture) drops earlier turns' `<think>` reasoning once a
new user message comes and re-spaces a think block it parses, so with `template` every such turn
starts a new sample carrying the whole prefix. With `keep` every assistant turn renders as it
was sampled and the rollout stays one sequence.

No Qwen3 model can exist here (no hub), so the engine is scripted: fixed completions with think
blocks and tool calls, tokenized by the real SmolLM2 tokenizer (Qwen3's template text set as its
chat template). The agent loop, rendering, parsing, tools and ledger are the real ones.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from chat_templates import TEMPLATES, template
from conveyor.agent.chat import ChatRenderer, renderer_factory
from conveyor.agent.loop import AgentLoop, conversation
from conveyor.agent.tools import ToolContext, ToolRegistry, finish, tool
from conveyor.config import AgentConfig, ModelConfig, SamplingConfig
from conveyor.doctor import _SCHEMAS, check
from conveyor.runtime.base import Runtime
from conveyor.types import Status, Task
from scripted_engine import call, scripted


@tool
async def lookup(key: str, ctx: ToolContext) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return f"value of {key}"


TASK = Task(
    id="think-0",
    family="test",
    prompt=[
        {"role": "system", "content": "Answer with the tools."},
        {"role": "user", "content": "Collect the values."},
    ],
)


def _think(reasoning: str, action: str, *, canonical: bool = True) -> str:
    if canonical:  # the spacing Qwen3's template writes back
        return f"<think>\n{reasoning}\n</think>\n\n{action}"
    return f"<think>{reasoning}</think>\n{action}"  # the model's own, which the template re-spaces


# Ten turns: tool calls with reasoning, two text replies a simulated user answers (each a new
# user query, after which Qwen3 drops all earlier reasoning), a think block spaced differently
# from the template's, and the finish call.
SCRIPT = [
    _think("Start with a.", call("lookup", key="a")),
    _think("Now b.", call("lookup", key="b")),
    _think("Report so far.", "I have a and b."),
    _think("Next c.", call("lookup", key="c")),
    _think("Then d.", call("lookup", key="d"), canonical=False),
    _think("Ask again.", "I have c and d too."),
    _think("Now e.", call("lookup", key="e")),
    "No reasoning this time.\n" + call("lookup", key="f"),
    _think("And g.", call("lookup", key="g")),
    _think("Done.", call("finish", answer="a-g")),
]


async def _user(_task: Task, _runtime: Runtime | None, _text: str) -> str | None:
    return "Good. Continue with the next keys."


def _renderer(tokenizer: Any, tools: ToolRegistry, mode: str) -> ChatRenderer:
    # The config path: the `model` section through the factory the loop and the gateway use,
    # with Qwen3's own template, verbatim.
    model = ModelConfig.model_validate(
        {"chat_template": str(TEMPLATES / "qwen3.jinja"), "reasoning_history": mode}
    )
    renderer = renderer_factory(model, tokenizer)(tools.schemas())
    assert renderer.native_tools and renderer.reasoning_history == mode
    return renderer


def _rollout(tokenizer: Any, mode: str) -> tuple[Any, ChatRenderer]:
    tools = ToolRegistry([lookup, finish])
    renderer = _renderer(tokenizer, tools, mode)
    loop = AgentLoop(
        renderer,
        scripted(tokenizer, SCRIPT),
        tools,
        AgentConfig(max_turns=12, max_context_tokens=8192, max_prompt_tokens=8192),
        SamplingConfig(),
        rollout_timeout_s=30.0,
        user_turn=_user,
    )
    return asyncio.run(loop.run(TASK, 0, None)), renderer


def _accumulate_thinking(qwen3: str) -> str:
    """An independent oracle: Qwen3's template edited by hand so that no assistant turn is parsed
    for reasoning (its content renders as given) and no empty think block is added (the variant
    SkyRL ships as an accumulate-thinking template)."""
    parse = "{%- if '</think>' in content %}"
    decorate = "{%- if loop.last or (not loop.last and reasoning_content) %}"
    assert parse in qwen3 and decorate in qwen3
    return qwen3.replace(parse, "{%- if false %}").replace(decorate, "{%- if reasoning_content %}")


# The tokens Qwen3's own tokenizer has as single added tokens, which SmolLM2's splits into text.
QWEN3_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
QWEN3_ADDED += ["<tool_response>", "</tool_response>"]


@pytest.fixture(scope="module", params=["smollm2", "with-qwen3-added-tokens"])
def any_tokenizer(request: pytest.FixtureRequest, tokenizer: Any) -> Any:
    if request.param == "smollm2":
        return tokenizer
    extended = copy.deepcopy(tokenizer)  # the session's tokenizer stays as it is
    assert extended.add_tokens(QWEN3_ADDED) == len(QWEN3_ADDED)
    assert len(extended.encode("<think>", add_special_tokens=False)) == 1
    return extended


def test_fake_engine_10_turn_qwen3_rollout_keep_trains_as_one_sample_equal_to_whole(
    any_tokenizer: Any,
) -> None:
    tokenizer = any_tokenizer
    t, renderer = _rollout(tokenizer, "keep")
    assert t.status is Status.OK and len(t.turns) == 10
    assert t.counters["splits"] == 0 and t.counters["user_turns"] == 2
    (sample,) = t.samples()
    # The loss mask covers the model's own tokens, every one of them, and nothing else.
    assert sum(sample.loss_mask) == sum(len(turn.completion_ids) for turn in t.turns)
    trained = [i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert trained == [i for turn in t.turns for i in turn.completion_ids]
    # The ids are the whole conversation rendered at once, then tokenized (only the newline the
    # template writes after the last <|im_end|>, never sampled, is past their end) ...
    messages = conversation(t)
    whole = renderer.encode(renderer.render(messages, add_generation_prompt=False))
    assert whole[: len(sample.input_ids)] == sample.input_ids
    assert renderer.decode(whole[len(sample.input_ids) :]) == "\n"
    # ... and what a hand-edited accumulate-thinking Qwen3 template renders for it.
    oracle = ChatRenderer(
        tokenizer,
        renderer.tool_schemas,
        chat_template=_accumulate_thinking(template("qwen3.jinja")),
    )
    assert oracle.encode(oracle.render(messages, add_generation_prompt=False)) == whole
    text = renderer.decode(sample.input_ids)
    assert "<think>Then d.</think>\n<tool_call>" in text  # as sampled, not re-spaced
    assert text.count("<think>") == 9  # every turn's reasoning, before and after user turns


def test_fake_engine_10_turn_qwen3_rollout_with_template_splits_into_growing_prefixes(
    tokenizer: Any,
) -> None:
    t, _ = _rollout(tokenizer, "template")
    assert t.status is Status.OK and len(t.turns) == 10
    # The two user turns drop earlier reasoning; the re-spaced think block rewrites turn 5.
    assert t.counters["splits"] == 3
    samples = t.samples()
    assert len(samples) == 4
    kept, _ = _rollout(tokenizer, "keep")
    (one,) = kept.samples()
    # Each split sample carries the history again: more tokens to train on than the one sample.
    assert sum(len(s.input_ids) for s in samples) > 2 * len(one.input_ids)


def test_doctor_on_qwen3_template_names_keep_as_the_fix(tokenizer: Any) -> None:
    qwen3 = template("qwen3.jinja")
    split = check(tokenizer, chat_template=qwen3)
    assert not split.consistent and split.splits > 0
    assert split.fix == "model.reasoning_history: keep"
    kept = check(tokenizer, chat_template=qwen3, reasoning_history="keep")
    assert kept.consistent and kept.splits == 0 and kept.samples == 1, kept.as_dict()
    assert kept.fix is None and kept.as_dict()["reasoning_history"] == "keep"


def test_keep_changes_nothing_for_a_template_that_already_appends(tokenizer: Any) -> None:
    qwen25 = template("qwen2.5.jinja")
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>\nx\n</think>\n\n" + call("finish", answer="1")},
        {"role": "tool", "content": "ok"},
    ]
    for add in (True, False):
        plain = ChatRenderer(tokenizer, _SCHEMAS, chat_template=qwen25)
        kept = ChatRenderer(tokenizer, _SCHEMAS, chat_template=qwen25, reasoning_history="keep")
        assert kept.render(messages, add_generation_prompt=add) == plain.render(
            messages, add_generation_prompt=add
        )
        # and a trailing assistant turn (no generation prompt) renders the same way too
        assert kept.render(messages[:2], add_generation_prompt=False) == plain.render(
            messages[:2], add_generation_prompt=False
        )
    assert check(tokenizer, chat_template=qwen25, reasoning_history="keep").consistent


def test_keep_refuses_a_template_that_does_not_write_assistant_content_as_given(
    tokenizer: Any,
) -> None:
    doubled = (tokenizer.chat_template or "").replace(
        "message['content']", "message['content'] + message['content']"
    )
    assert doubled != tokenizer.chat_template
    renderer = ChatRenderer(tokenizer, _SCHEMAS, chat_template=doubled, reasoning_history="keep")
    with pytest.raises(ValueError, match="reasoning_history"):
        renderer.render(
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
            add_generation_prompt=True,
        )
