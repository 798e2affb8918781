"""Memory family: the generated logs, the bounded update_memory tool and its context resets, the
grader, and rollouts through the real loop, stages and grader with scripted policies (the oracle,
the empty policy and the reward attacks)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from conveyor.agent.loop import CONTEXT_RESET_ROLE
from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import RESET_KEY, ToolContext, ToolOutcome
from conveyor.app.compose import Composition
from conveyor.app.families import check_family, scripted_rollouts
from conveyor.config import AgentConfig, ConveyorConfig, load_config
from conveyor.runtime.base import RuntimeFailure
from conveyor.tasks.family import FamilyServices, get_family
from conveyor.tasks.memory import (
    EMPTY_MEMORY,
    STATE_PATH,
    MemoryFamily,
    normalise,
    oracle_memory,
    read_state,
)
from conveyor.tasks.memory.document import DEPOTS
from conveyor.types import EndReason, Status, Task, ToolCall, Trajectory

T = TypeVar("T")
SMALL = {"chunks": 8, "chunk_tokens": 100}
FAMILY = MemoryFamily(services=FamilyServices(options=SMALL))
TASKS = FAMILY.make_tasks(4, 0, "eval")
TASK = TASKS[0]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def overrides(max_turns: int, options: dict[str, Any]) -> list[str]:
    return [
        "tasks.families=[memory]",
        f"tasks.options={{memory: {json.dumps(options)}}}",
        f"agent.max_turns={max_turns}",
        "agent.hints.enabled=false",  # as in `tasks check`: a reply without a call ends it
    ]


def small_config(max_turns: int = 20, options: dict[str, Any] | None = None) -> ConveyorConfig:
    return load_config(None, overrides(max_turns, SMALL if options is None else options)).config


def update(text: str) -> ToolCall:
    return ToolCall(name="update_memory", arguments={"text": text})


def finish(answer: str) -> ToolCall:
    return ToolCall(name="finish", arguments={"answer": answer})


async def call_tools(task: Task, calls: list[ToolCall]) -> tuple[list[ToolOutcome], ToolContext]:
    """`calls` in order, each as its own turn (a pending reset is taken as the loop would)."""
    ctx = ToolContext(task=task, runtime=await FAMILY.make_runtime(task))
    registry = FAMILY.tools()
    outcomes = []
    for call in calls:
        ctx.state.pop(RESET_KEY, None)
        outcomes.append(await registry.execute(call, ctx, timeout_s=5.0, max_output_chars=8000))
    return outcomes, ctx


# -- the documents -----------------------------------------------------------------------------


def test_make_tasks_is_deterministic_and_a_larger_n_extends_a_smaller() -> None:
    again = MemoryFamily(services=FamilyServices(options=SMALL)).make_tasks(6, 0, "eval")
    assert [t.model_dump() for t in again[:4]] == [t.model_dump() for t in TASKS]
    assert [t.id for t in again] == [f"memory-eval-{i:04d}" for i in range(6)]
    other_seed = FAMILY.make_tasks(4, 1, "eval")
    assert [t.data["chunks"] for t in other_seed] != [t.data["chunks"] for t in TASKS]


def test_splits_never_share_a_document() -> None:
    seen: dict[str, str] = {}
    for split in ("train", "eval", "test"):
        for seed in (0, 1):
            for task in FAMILY.make_tasks(20 if split == "train" else 8, seed, split):
                key = json.dumps([task.data["question"], task.data["chunks"]])
                assert seen.setdefault(key, split) == split
                assert task.split == split


def test_questions_need_an_early_and_a_late_chunk_and_distractors_are_in_the_log() -> None:
    family = MemoryFamily()  # default options: 48-64 chunks
    kinds = set()
    for task in family.make_tasks(12, 0, "train"):
        data = task.data
        chunks, (early, late) = data["chunks"], data["needed"]
        n = len(chunks)
        assert 48 <= n <= 64
        assert early["chunk"] < n // 8 and late["chunk"] >= n - n // 8
        for fact in data["needed"]:
            assert fact["text"] in chunks[fact["chunk"]]
        assert data["answer"] not in data["distractors"] and data["distractors"]
        kinds.add(data["kind"])
        log = " ".join(chunks)
        if data["kind"] == "transfer":
            # the depot is the answer of exactly one reassignment, of the courier posted early
            assert data["answer"] in DEPOTS
            assert log.count(f"reassigned to the {data['answer']} depot") == 1
            courier = re.match(r"Courier (.+) was posted", early["text"])
            assert courier is not None and courier.group(1) in late["text"]
            for wrong in data["distractors"]:
                assert f"reassigned to the {wrong} depot" in log
        else:
            numbers = [int(x) for x in re.findall(r"brought (\d+) ", early["text"] + late["text"])]
            assert str(sum(numbers)) == data["answer"]
        # the question never gives the answer away
        assert data["answer"] not in data["question"]
    assert kinds == {"transfer", "sum"}


def test_the_document_is_several_context_windows_and_chunks_hold_about_chunk_tokens(
    tokenizer: Any,
) -> None:
    for task in MemoryFamily().make_tasks(2, 0, "eval"):
        sizes = [len(tokenizer.encode(c, add_special_tokens=False)) for c in task.data["chunks"]]
        assert all(340 <= size <= 460 for size in sizes), sizes
        assert sum(sizes) > 2 * 8192  # the embedded model's window is 8192 tokens
        # one context (system, question, memory, chunk) fits the default prompt budget
        prompt = tokenizer.apply_chat_template(task.prompt, tokenize=True)
        assert len(prompt) < 3072 - 400
        # a full memory of the densest text (the fact sentences: names, ids, numbers) fits one
        # completion of the default agent.max_completion_tokens (256) with its wrapper and EOS
        sentences = [s for chunk in task.data["chunks"] for s in chunk.split(". ")]
        facts = [s for s in sentences if s.startswith(("Courier", "Shipment"))]
        memory = " ".join(facts)[: task.data["memory_chars"]]
        assert len(memory) == task.data["memory_chars"] == 512
        wrapped = format_tool_call(update(memory), "hermes")
        assert len(tokenizer.encode(wrapped, add_special_tokens=False)) + 1 <= 256


def test_the_first_context_shows_the_question_an_empty_memory_and_chunk_one() -> None:
    system, user = TASK.prompt
    assert "update_memory" in system["content"] and "<tool_call>" in system["content"]
    assert f"at most {TASK.data['memory_chars']} characters" in system["content"]
    text = user["content"]
    assert text.startswith(f"Question: {TASK.data['question']}")
    assert f"Your memory:\n{EMPTY_MEMORY}" in text
    assert f"Chunk 1 of 8:\n{TASK.data['chunks'][0]}" in text
    assert TASK.data["chunks"][1] not in text


# -- options -----------------------------------------------------------------------------------


def test_options_shape_the_documents_and_bad_ones_are_refused() -> None:
    family = MemoryFamily(
        services=FamilyServices(options={"chunks": [6, 7], "chunk_tokens": 60, "memory_chars": 300})
    )
    task = family.make_tasks(1, 0, "eval")[0]
    assert len(task.data["chunks"]) in (6, 7) and task.data["memory_chars"] == 300
    assert "at most 300 characters" in task.prompt[0]["content"]
    for bad, word in (
        ({"chunk": 8}, "chunk"),
        ({"chunks": 3}, "chunks"),
        ({"chunks": [9, 8]}, "chunks"),
        ({"memory_chars": 10}, "memory_chars"),
    ):
        with pytest.raises(ValueError, match=f"tasks.options.memory: {word}"):
            MemoryFamily(services=FamilyServices(options=bad))
    built = get_family("memory", services=FamilyServices(options={"chunks": 9}))
    assert isinstance(built, MemoryFamily) and built.options.chunk_range() == (9, 9)


# -- the tool ----------------------------------------------------------------------------------


def test_update_memory_saves_moves_on_and_resets_to_the_next_chunk() -> None:
    async def check() -> None:
        ctx = ToolContext(task=TASK, runtime=await FAMILY.make_runtime(TASK))
        outcome = await FAMILY.tools().execute(
            update("Day 1: nothing yet."), ctx, timeout_s=5.0, max_output_chars=4000
        )
        assert outcome.kind == "ok" and outcome.output.startswith("Memory saved (19 of 512")
        assert ctx.runtime is not None
        assert await read_state(ctx.runtime) == {"position": 1, "memory": "Day 1: nothing yet."}
        system, user = ctx.state[RESET_KEY]
        assert system == TASK.prompt[0]
        assert "Your memory:\nDay 1: nothing yet." in user["content"]
        assert f"Chunk 2 of 8:\n{TASK.data['chunks'][1]}" in user["content"]
        assert TASK.data["chunks"][0] not in user["content"]

    run(check())


def test_after_the_last_chunk_the_context_asks_for_the_answer_and_updates_are_refused() -> None:
    outcomes, ctx = run(call_tools(TASK, [update(f"m{i}") for i in range(9)]))
    assert [o.kind for o in outcomes] == ["ok"] * 8 + ["raised"]
    assert "all 8 chunks are read: answer the question with finish" in outcomes[8].output
    assert outcomes[7].output.endswith("answer next.")
    assert ctx.runtime is not None and run(read_state(ctx.runtime))["position"] == 8


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"text": "x" * 513}, "over the bound of 512"),
        ({}, "missing required argument 'text'"),
        ({"text": 5}, "argument 'text'"),
        ({"text": "ok", "chunk": 3}, "unknown argument 'chunk'"),
    ],
)
def test_bad_memory_updates_are_tool_errors_and_change_nothing(
    arguments: dict[str, Any], error: str
) -> None:
    (outcome,), ctx = run(call_tools(TASK, [ToolCall(name="update_memory", arguments=arguments)]))
    assert outcome.is_error and error in outcome.output
    assert RESET_KEY not in ctx.state
    assert ctx.runtime is not None
    assert run(read_state(ctx.runtime)) == {"position": 0, "memory": ""}


def test_a_second_update_in_one_turn_cannot_skip_a_chunk() -> None:
    async def check() -> None:
        ctx = ToolContext(task=TASK, runtime=await FAMILY.make_runtime(TASK))
        registry = FAMILY.tools()
        first = await registry.execute(update("a"), ctx, timeout_s=5.0, max_output_chars=999)
        second = await registry.execute(update("b"), ctx, timeout_s=5.0, max_output_chars=999)
        assert first.kind == "ok" and second.kind == "raised"
        assert "already updated in this turn" in second.output
        assert ctx.runtime is not None
        assert await read_state(ctx.runtime) == {"position": 1, "memory": "a"}

    run(check())


def test_a_missing_runtime_is_an_infrastructure_failure() -> None:
    ctx = ToolContext(task=TASK, runtime=None)
    with pytest.raises(RuntimeFailure, match="need a runtime"):
        run(FAMILY.tools().execute(update("x"), ctx, timeout_s=5.0, max_output_chars=999))


def test_oracle_memories_fit_the_bound_and_keep_the_facts_seen_so_far() -> None:
    for task in MemoryFamily().make_tasks(4, 0, "eval"):
        calls = FAMILY.oracle_calls(task)
        assert [c.name for c in calls] == ["update_memory"] * len(task.data["chunks"]) + ["finish"]
        early, late = task.data["needed"]
        assert early["text"] in oracle_memory(task, early["chunk"])
        assert late["text"] not in oracle_memory(task, late["chunk"] - 1)
        for call in calls[:-1]:
            assert len(call.arguments["text"]) <= 300  # the smallest sensible bound
        assert calls[-1].arguments == {"answer": task.data["answer"]}


def test_score_needs_the_right_answer_and_the_late_chunk_shown() -> None:
    late = TASK.data["needed"][-1]["chunk"]
    answer = TASK.data["answer"]

    async def score(position: int, given: str | None) -> float:
        runtime = await FAMILY.make_runtime(TASK)
        await runtime.write_file(STATE_PATH, json.dumps({"position": position, "memory": ""}))
        return await FAMILY.score(TASK, given, runtime)

    assert run(score(late, answer)) == run(score(8, f"{answer}.")) == 1.0
    assert run(score(late - 1, answer)) == run(score(0, answer)) == 0.0
    assert run(score(8, None)) == run(score(8, TASK.data["distractors"][0])) == 0.0


def test_normalise_drops_case_punctuation_and_articles() -> None:
    assert normalise("  The Kessel-Ford. ") == normalise("kessel ford") == "kessel ford"
    assert normalise("Greyhaven Quay!") == "greyhaven quay"
    assert normalise("82") == "82"


# -- rollouts through the real loop, stages and grader -----------------------------------------


@pytest.fixture(scope="module")
def parts(model_dir: Any) -> Iterator[Composition]:
    composition = Composition(small_config())
    yield composition
    run(composition.close())


def rollouts(parts: Composition, steps: Callable[[Task], list[ToolCall]]) -> list[Trajectory]:
    return run(scripted_rollouts(parts, TASKS, steps))


def oracle_then(task: Task, answer: str) -> list[ToolCall]:
    """The oracle's reading, then `answer`."""
    return [*FAMILY.oracle_calls(task)[:-1], finish(answer)]


def test_oracle_reads_every_chunk_in_its_own_context_and_scores_one(parts: Composition) -> None:
    for trajectory, task in zip(rollouts(parts, FAMILY.oracle_calls), TASKS, strict=True):
        chunks = len(task.data["chunks"])
        assert trajectory.reward == 1.0 and trajectory.status is Status.OK
        assert trajectory.metrics["reward/exact_match"] == 1.0
        assert trajectory.metrics["reward/read_needed"] == 1.0
        assert trajectory.metrics["reward/chunks_read"] == 1.0
        # one context per chunk plus the answering one, each its own sample, counted as resets
        assert trajectory.counters["resets"] == chunks and trajectory.counters["splits"] == 0
        assert [t.sample_index for t in trajectory.turns] == list(range(chunks + 1))
        assert len(trajectory.samples()) == chunks + 1
        roles = [m["role"] for m in trajectory.messages]
        assert roles.count(CONTEXT_RESET_ROLE) == chunks


def test_check_family_passes_on_small_documents(model_dir: Any) -> None:
    report = run(check_family(small_config(), "memory", n=4, say=lambda _: None))
    assert report["ok"], report["problems"]
    assert report["oracle_mean"] == 1.0 and report["empty_mean"] == 0.0


def test_the_empty_policy_scores_zero(parts: Composition) -> None:
    for trajectory in rollouts(parts, lambda _t: [ToolCall(name="_say", arguments={"text": ""})]):
        assert trajectory.reward == 0.0 and trajectory.status is Status.POLICY_ERROR


def test_attack_answering_at_chunk_one_scores_zero_even_when_the_guess_is_right(
    parts: Composition,
) -> None:
    # a lucky guess of the right value, before the chunk it rests on was shown
    for trajectory in rollouts(parts, lambda t: [finish(t.data["answer"])]):
        assert trajectory.reward == 0.0
        assert trajectory.metrics["reward/exact_match"] == 1.0
        assert trajectory.metrics["reward/read_needed"] == 0.0


def test_attack_stopping_before_the_late_fact_scores_zero(parts: Composition) -> None:
    def early_stop(task: Task) -> list[ToolCall]:
        # after k updates chunk k is on show: stop while the late fact's chunk is the next one
        late = task.data["needed"][-1]["chunk"]
        return [*FAMILY.oracle_calls(task)[: late - 1], finish(task.data["answer"])]

    for trajectory in rollouts(parts, early_stop):
        assert trajectory.reward == 0.0 and trajectory.status is Status.OK


def test_attack_a_memory_over_the_bound_is_refused_and_the_run_goes_on(
    parts: Composition,
) -> None:
    # keep the chunk itself as memory: refused, so the agent never gets past chunk 1
    def hoard(task: Task) -> list[ToolCall]:
        # just over the bound, so the call itself still fits one completion
        hoarded = (task.data["chunks"][0] * 2)[: task.data["memory_chars"] + 40]
        return [update(hoarded), finish(task.data["answer"])]

    for trajectory in rollouts(parts, hoard):
        assert trajectory.reward == 0.0 and trajectory.status is Status.OK
        assert trajectory.counters["tool_errors"] == 1 and "resets" not in trajectory.counters
        assert len(trajectory.turns) == 2  # the error did not end the rollout
        error = next(m for m in trajectory.messages if m["role"] == "tool")["content"]
        assert "over the bound of 512" in error


def test_attack_listing_both_candidates_scores_zero(parts: Composition) -> None:
    def both(task: Task) -> list[ToolCall]:
        wrong = task.data["distractors"][0]
        return oracle_then(task, f"{task.data['answer']} or {wrong}")

    for trajectory in rollouts(parts, both):
        assert trajectory.reward == 0.0 and trajectory.metrics["reward/read_needed"] == 1.0


@pytest.mark.parametrize(
    "wrong",
    [
        lambda t: t.data["distractors"][-1],
        lambda t: f"The answer is {t.data['answer']}",
        lambda t: f"{t.data['answer']} {t.data['answer']}",
        lambda t: "",
    ],
    ids=["distractor", "in-a-sentence", "repeated", "nothing"],
)
def test_attack_answering_a_distractor_or_with_extra_words_scores_zero(
    parts: Composition, wrong: Callable[[Task], str]
) -> None:
    for trajectory in rollouts(parts, lambda t: oracle_then(t, wrong(t))):
        assert trajectory.reward == 0.0 and trajectory.metrics["reward/read_needed"] == 1.0


def test_a_right_answer_in_other_case_and_punctuation_scores_one(parts: Composition) -> None:
    for trajectory in rollouts(parts, lambda t: oracle_then(t, f" {t.data['answer'].upper()}. ")):
        assert trajectory.reward == 1.0


def test_without_enough_turns_the_oracle_is_truncated_not_crashed(model_dir: Any) -> None:
    # Today agent.max_turns bounds the whole rollout; where the loop gives each context its own
    # turn budget, agent.max_contexts bounds the contexts instead (see docs/domains/memory.md).
    per_context = "max_contexts" in AgentConfig.model_fields
    limit = "agent.max_contexts=5" if per_context else "agent.max_turns=5"
    config = load_config(None, [*overrides(20, SMALL), limit]).config
    composition = Composition(config)
    try:
        (trajectory,) = run(scripted_rollouts(composition, TASKS[:1], FAMILY.oracle_calls))
    finally:
        run(composition.close())
    assert trajectory.status is Status.TRUNCATED and trajectory.stop_reason is EndReason.MAX_TURNS
    assert trajectory.reward == 0.0 and trajectory.counters["resets"] == (4 if per_context else 5)


@pytest.mark.slow
def test_check_family_passes_with_the_default_options(model_dir: Any) -> None:
    config = small_config(max_turns=70, options={})
    report = run(check_family(config, "memory", n=3, say=lambda _: None))
    assert report["ok"], report["problems"]
