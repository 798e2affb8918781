"""The `math` family: generated exact-answer problems, their answers (checked against the oracle's
own program in the sandbox), strict answer parsing, and the reward attacks that must score 0."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext
from conveyor.config import RuntimeConfig, load_config
from conveyor.tasks.executor import executor_available
from conveyor.tasks.family import FamilyServices, get_family, split_of
from conveyor.tasks.math import (
    TEMPLATES,
    MathFamily,
    _digit_sum_count,
    _fibonacci_mod,
    _primes_between,
    format_answer,
    parse_answer,
)
from conveyor.types import Task

T = TypeVar("T")
AVAILABLE, WHY = executor_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no bubblewrap sandbox here: {WHY}")
FAMILY = MathFamily()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def score(task: Task, answer: str | None) -> float:
    return run(FAMILY.score(task, answer, None))  # type: ignore[arg-type]


def test_tasks_are_deterministic_distinct_and_split_by_question() -> None:
    first = FAMILY.make_tasks(30, 0, "train")
    assert [t.prompt for t in FAMILY.make_tasks(30, 0, "train")] == [t.prompt for t in first]
    assert [t.prompt for t in FAMILY.make_tasks(10, 0, "train")] == [t.prompt for t in first[:10]]
    assert first[0].id == "math-train-0000"
    questions = {
        split: {t.prompt[1]["content"] for t in FAMILY.make_tasks(30, 0, split)}
        for split in ("train", "eval", "test")
    }
    assert all(len(q) == 30 for q in questions.values())
    assert not questions["train"] & questions["eval"] and not questions["eval"] & questions["test"]
    assert all(split_of(q) == split for split, group in questions.items() for q in group)
    templates = {t.data["template"] for t in FAMILY.make_tasks(200, 0, "train")}
    assert templates == set(TEMPLATES)


def test_options_choose_templates_and_refuse_unknown_keys() -> None:
    only = get_family("math", services=FamilyServices(options={"templates": ["modpow"]}))
    assert isinstance(only, MathFamily)
    assert {t.data["template"] for t in only.make_tasks(20, 0, "eval")} == {"modpow"}
    with pytest.raises(ValueError, match="unknown or no templates"):
        MathFamily(services=FamilyServices(options={"templates": ["calculus"]}))
    with pytest.raises(ValueError, match=r"tasks\.options\.math"):
        MathFamily(services=FamilyServices(options={"seed": 1}))
    with pytest.raises(ValueError, match=r"cannot use runtime\.kind 'simulated'"):
        MathFamily(runtime=RuntimeConfig(kind="simulated"))


def test_exact_computations_agree_with_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(20):
        n, s = rng.randint(1, 3000), rng.randint(1, 30)
        assert _digit_sum_count(n, s) == sum(
            1 for k in range(1, n + 1) if sum(map(int, str(k))) == s
        )
        lo = rng.randint(0, 3000)
        hi = lo + rng.randint(0, 500)
        primes = sum(1 for p in range(max(lo, 2), hi + 1) if all(p % q for q in range(2, p)))
        assert _primes_between(lo, hi) == primes
        m = rng.randint(2, 1000)
        a, b = 0, 1
        for _ in range(n):
            a, b = b, (a + b) % m
        assert _fibonacci_mod(n, m) == a


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        (" 42. ", Fraction(42)),
        ("1,234,567", Fraction(1234567)),
        ("-17", Fraction(-17)),
        ("\\boxed{42}", Fraction(42)),
        ("$42$", Fraction(42)),
        ("**42**", Fraction(42)),
        ("`42`", Fraction(42)),
        ("3/4", Fraction(3, 4)),
        ("6 / 8", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("$\\boxed{\\dfrac{3}{4}}$", Fraction(3, 4)),
        ("0.75", Fraction(3, 4)),
        ("42.0", Fraction(42)),
        ("12 13", None),
        ("12, 13", None),
        ("12 or 13", None),
        ("[12, 13]", None),
        ("2**10", None),
        ("10!", None),
        ("pow(2, 10, 7)", None),
        ("The answer is 42", None),
        ("42 (maybe 43)", None),
        ("1/0", None),
        ("", None),
        ("4" * 300, None),
    ],
)
def test_answers_parse_to_exactly_one_number(text: str, value: Fraction | None) -> None:
    assert parse_answer(text) == value


def test_scoring_is_an_exact_match_and_attacks_score_zero() -> None:
    task = FAMILY.make_tasks(1, 0, "eval")[0]
    expected = Fraction(task.data["answer"])
    right = task.data["answer"]
    assert score(task, right) == 1.0
    assert score(task, f"\\boxed{{{right}}}") == 1.0
    assert score(task, None) == 0.0
    attacks = [
        f"{right} {expected + 1}",  # several numbers
        f"{expected - 1}, {right}, {expected + 1}",
        " ".join(str(k) for k in range(int(expected) - 3, int(expected) + 4)),
        f"{right} or {expected + 1}",
        f"{int(expected) - 1} + 1",  # an expression instead of the value
        f"({right})",
        f"{right}/1 = {right}",
        f"{right}.000001",  # close is not equal
        task.prompt[1]["content"],  # the question back
        "",
    ]
    assert {a: score(task, a) for a in attacks} == dict.fromkeys(attacks, 0.0)


def test_fractions_are_stated_in_lowest_terms_and_scored_by_value() -> None:
    task = next(t for t in FAMILY.make_tasks(80, 0, "train") if "/" in t.data["answer"])
    value = Fraction(task.data["answer"])
    assert format_answer(value) == task.data["answer"]
    assert score(task, f"{value.numerator * 3}/{value.denominator * 3}") == 1.0
    assert score(task, f"{value.numerator}/{value.denominator + 1}") == 0.0
    assert format_answer(Fraction(6, 3)) == "2"


@needs_sandbox
def test_the_oracle_program_computes_the_answer_in_the_sandbox() -> None:
    # One instance of each template: the program the oracle runs prints what we computed.
    tasks: dict[str, Task] = {}
    for task in FAMILY.make_tasks(200, 3, "test"):
        tasks.setdefault(task.data["template"], task)

    async def outputs() -> dict[str, str]:
        runtime = await FAMILY.make_runtime(next(iter(tasks.values())))
        registry = FAMILY.tools()
        found: dict[str, str] = {}
        try:
            for name, task in tasks.items():
                ctx = ToolContext(task=task, runtime=runtime)
                call = FAMILY.oracle_calls(task)[0]
                outcome = await registry.execute(call, ctx, timeout_s=60, max_output_chars=4000)
                found[name] = outcome.output
        finally:
            await runtime.close()
        return found

    printed = run(outputs())
    assert set(printed) == set(TEMPLATES)
    for name, output in printed.items():
        assert output == f"{tasks[name].data['answer']}\n[exit code: 0]", name


@pytest.mark.slow
@needs_sandbox
def test_oracle_scores_one_and_empty_scores_zero_through_the_loop(model_dir: Path) -> None:
    from conveyor.app.families import check_family

    config = load_config(None, ["tasks.families=[math]"]).config
    report = run(check_family(config, "math", n=4, say=lambda _: None))
    assert report["ok"], report["problems"]
