"""The family registry, split sampling, and the contract every registered family keeps."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from conveyor.agent.parsing import parse_tool_calls
from conveyor.agent.tools import ToolContext
from conveyor.registry import FAMILIES as FAMILY_REGISTRY
from conveyor.tasks import ArithmeticFamily, TaskFamily, get_family
from conveyor.tasks.family import SPLIT_SHARES, register_family, sample_instances, split_of
from conveyor.types import Task

T = TypeVar("T")
# The built-in families; recipes such as "swe" register lazily and have tests of their own.
FAMILIES = ["arithmetic", "filenav"]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def run_oracle(family: TaskFamily, task: Task) -> tuple[str | None, float]:
    """Execute the oracle's calls through the family's registry and score what `finish` got."""
    registry = family.tools()
    runtime = await family.make_runtime(task)
    ctx = ToolContext(task=task, runtime=runtime)
    for call in family.oracle_calls(task):
        outcome = await registry.execute(call, ctx, timeout_s=5.0, max_output_chars=4000)
        assert not outcome.is_error, (call, outcome.output)
    answer = ctx.state.get("answer")
    score = await family.score(task, answer, runtime)
    await runtime.close()
    return answer, score


def test_builtin_families_are_registered() -> None:
    assert {"arithmetic", "filenav"} <= set(FAMILIES)
    assert FAMILIES == sorted(FAMILIES)
    for name in FAMILIES:
        family = get_family(name)
        assert isinstance(family, TaskFamily)
        assert family.name == name


def test_unknown_family_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"unknown task family 'nope'.*arithmetic, bfcl, code"):
        get_family("nope")


def test_registering_another_class_under_a_taken_name_is_an_error() -> None:
    class Impostor(ArithmeticFamily):
        name = "arithmetic"

    with pytest.raises(ValueError, match="'arithmetic' is already registered"):
        register_family(Impostor)
    register_family(ArithmeticFamily)  # the same class again is a no-op (a re-imported module)
    assert isinstance(get_family("arithmetic"), ArithmeticFamily)


def test_register_family_makes_a_class_nameable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FAMILY_REGISTRY, "_parts", dict(FAMILY_REGISTRY._parts))

    @register_family
    class Echo(ArithmeticFamily):
        # not "echo": tests/plugins imports a plugin family of that name into this process
        name = "registry_echo"

    assert "registry_echo" in FAMILY_REGISTRY.names()
    assert isinstance(get_family("registry_echo"), Echo)

    class Nameless:
        pass

    with pytest.raises(TypeError, match="needs a name"):
        register_family(Nameless)  # type: ignore[type-var]


def test_split_shares_cover_every_hash_bucket() -> None:
    assert sum(SPLIT_SHARES.values()) == 100
    counts = {split: 0 for split in SPLIT_SHARES}
    for i in range(5000):
        counts[split_of(f"key-{i}")] += 1
    for split, share in SPLIT_SHARES.items():
        assert abs(counts[split] / 5000 - share / 100) < 0.03, counts


def test_sample_instances_rejects_bad_requests() -> None:
    def draw(rng: random.Random) -> tuple[str, int]:
        value = rng.randint(0, 9)
        return str(value), value

    with pytest.raises(ValueError, match="unknown split 'dev'; expected one of train, eval, test"):
        sample_instances("digits", 1, 0, "dev", draw)
    with pytest.raises(ValueError, match="non-negative"):
        sample_instances("digits", -1, 0, "train", draw)
    # Ten possible instances cannot make fifty distinct ones: a clear error, not a hang.
    with pytest.raises(ValueError, match=r"found only .* distinct 'train' instances of 50"):
        sample_instances("digits", 50, 0, "train", draw)


@pytest.mark.parametrize("name", FAMILIES)
def test_make_tasks_is_deterministic_with_unique_ids(name: str) -> None:
    family = get_family(name)
    tasks = family.make_tasks(40, 3, "eval")
    assert tasks == get_family(name).make_tasks(40, 3, "eval")
    assert family.make_tasks(25, 3, "eval") == tasks[:25]
    assert tasks != family.make_tasks(40, 4, "eval")
    assert len({t.id for t in tasks}) == 40
    assert tasks[7].id == f"{name}-eval-0007"
    assert all(t.family == name and t.split == "eval" for t in tasks)
    assert family.make_tasks(0, 3, "eval") == []


@pytest.mark.parametrize("name", FAMILIES)
def test_splits_never_share_an_instance(name: str) -> None:
    family = get_family(name)

    def content(task: Task) -> str:
        return Task(id="", family=task.family, prompt=task.prompt, data=task.data).model_dump_json()

    train = {content(t) for t in family.make_tasks(300, 0, "train")}
    for seed in (0, 1):
        evals = [content(t) for t in family.make_tasks(300, seed, "eval")]
        assert len(set(evals)) == 300
        assert not train & set(evals)


@pytest.mark.parametrize("name", FAMILIES)
def test_prompt_is_short_and_shows_a_parseable_call(name: str) -> None:
    family = get_family(name)
    task = family.make_tasks(1, 0, "train")[0]
    system, user = task.prompt
    assert system["role"] == "system" and user["role"] == "user"
    assert len(system["content"].split()) <= 120
    assert len(user["content"].split()) <= 60
    assert '<tool_call>\n{"name": ' in system["content"]
    parsed = parse_tool_calls(system["content"], "hermes")
    assert not parsed.errors
    assert {call.name for call in parsed.calls} <= set(family.tools().names)
    assert "finish" in {call.name for call in parsed.calls}


@pytest.mark.parametrize("name", FAMILIES)
def test_tools_are_a_fresh_registry_with_finish(name: str) -> None:
    family = get_family(name)
    first, second = family.tools(), family.tools()
    assert first is not second
    assert "finish" in first.names


@pytest.mark.parametrize("name", FAMILIES)
def test_oracle_solves_every_task_with_at_least_two_calls(name: str) -> None:
    family = get_family(name)
    for task in family.make_tasks(30, 0, "eval"):
        calls = family.oracle_calls(task)
        assert calls[-1].name == "finish"
        assert len(calls) >= 3  # two or more working calls, then finish
        answer, score = run(run_oracle(family, task))
        assert answer is not None
        assert score == 1.0


@pytest.mark.parametrize("name", FAMILIES)
def test_wrong_or_missing_answers_score_zero(name: str) -> None:
    family = get_family(name)

    async def scores(task: Task) -> list[float]:
        runtime = await family.make_runtime(task)
        return [
            await family.score(task, None, runtime),
            await family.score(task, "", runtime),
            await family.score(task, "I don't know", runtime),
            await family.score(task, "12345678", runtime),
        ]

    for task in family.make_tasks(10, 0, "eval"):
        assert run(scores(task)) == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", FAMILIES)
def test_tasks_round_trip_through_json(name: str) -> None:
    for task in get_family(name).make_tasks(5, 0, "train"):
        assert Task.model_validate_json(task.model_dump_json()) == task
