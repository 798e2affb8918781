"""Reasoning Gym: instances, splits, options, tools and the guarded scorers, through the real
reasoning-gym datasets, the real executor sandbox and the real agent loop."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext, ToolOutcome
from conveyor.config import RuntimeConfig, load_config
from conveyor.tasks import rg as rg_module
from conveyor.tasks.executor import executor_available
from conveyor.tasks.family import FamilyServices, family_info, get_family, split_of
from conveyor.tasks.rg import DEFAULT_DATASETS, RgFamily
from conveyor.tasks.rg import scoring as rg_scoring
from conveyor.types import Task, ToolCall, Trajectory

T = TypeVar("T")
FAMILY = RgFamily()
EVAL = FAMILY.make_tasks(12, 0, "eval")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def family(**options: Any) -> RgFamily:
    built = get_family("rg", services=FamilyServices(options=options))
    assert isinstance(built, RgFamily)
    return built


def score(task: Task, answer: str | None, on: RgFamily = FAMILY) -> float:
    return run(on.score(task, answer, runtime=None))  # type: ignore[arg-type]  # unused


def answer_of(task: Task) -> str:
    return str(task.data["entry"]["answer"])


def test_tasks_are_deterministic_balanced_and_a_larger_n_extends_a_smaller_one() -> None:
    again = FAMILY.make_tasks(12, 0, "eval")
    assert [t.model_dump() for t in again] == [t.model_dump() for t in EVAL]
    assert [t.model_dump() for t in FAMILY.make_tasks(7, 0, "eval")] == [
        t.model_dump() for t in EVAL[:7]
    ]
    names = [t.data["dataset"] for t in EVAL]
    assert names == [*DEFAULT_DATASETS, *DEFAULT_DATASETS]
    assert [t.id for t in EVAL[:2]] == ["rg-eval-0000", "rg-eval-0001"]
    assert len({t.prompt[1]["content"] for t in EVAL}) == len(EVAL)
    other_seed = FAMILY.make_tasks(12, 1, "eval")
    assert [t.prompt[1]["content"] for t in other_seed] != [t.prompt[1]["content"] for t in EVAL]


def test_splits_are_disjoint_and_a_hash_of_dataset_and_question() -> None:
    keys: dict[str, set[str]] = {}
    for split in ("train", "eval", "test"):
        tasks = [t for seed in (0, 1) for t in FAMILY.make_tasks(18, seed, split)]
        keys[split] = {json.dumps([t.data["dataset"], t.prompt[1]["content"]]) for t in tasks}
        assert all(split_of(key) == split for key in keys[split])
        assert all(t.split == split for t in tasks)
    assert not keys["train"] & keys["eval"]
    assert not keys["train"] & keys["test"]
    assert not keys["eval"] & keys["test"]


def test_task_data_is_json_and_names_a_reproducible_entry() -> None:
    for task in EVAL:
        data = task.data
        assert json.loads(json.dumps(data)) == data
        fresh = rg_scoring.json_entry(rg_scoring.dataset(data["dataset"])[data["index"]])
        assert fresh == data["entry"]
        assert task.prompt[1]["content"] == data["entry"]["question"]
        assert task.prompt[0]["content"] == FAMILY.system_prompt
        copy = Task.model_validate_json(task.model_dump_json())
        assert score(copy, answer_of(copy)) == 1.0


def test_the_families_table_names_the_source_and_its_version() -> None:
    info = family_info("rg")
    assert info["splits"] == ["train", "eval", "test"]
    assert info["source"].startswith("reasoning-gym") and info["version"] == "0.1.25"


def test_the_prompt_shows_the_hermes_tool_call_format() -> None:
    prompt = FAMILY.system_prompt
    assert '<tool_call>\n{"name": "finish", "arguments": {"answer": "42"}}\n</tool_call>' in prompt
    assert "python" not in prompt
    with_python = family(python=True).system_prompt
    assert '{"name": "python", "arguments": {"code": "print(6 * 7)"}}' in with_python


def test_every_default_dataset_scores_its_oracle_one_and_empty_answers_zero() -> None:
    assert {t.data["dataset"] for t in EVAL} == set(DEFAULT_DATASETS)
    for task in EVAL:
        assert score(task, answer_of(task)) == 1.0
        # the answer reaches the scorer as given, never stripped (upstream's score_answer)
        padded = f"  {answer_of(task)}\n"
        upstream = rg_scoring.dataset(task.data["dataset"]).score_answer(padded, task.data["entry"])
        assert score(task, padded) == (1.0 if upstream >= 1.0 else 0.0)
        for empty in (None, "", "   ", "\n"):
            assert score(task, empty) == 0.0


def test_attack_every_candidate_listed_scores_zero() -> None:
    every = sorted({answer_of(t) for t in FAMILY.make_tasks(60, 3, "train")} | {"1", "2", "Yes"})
    for task in EVAL:
        for joiner in ("\n", ", ", " or "):
            assert score(task, joiner.join([*every, answer_of(task)])) == 0.0, task.id
        assert score(task, f"{answer_of(task)} or {answer_of(task)}x") == 0.0


def test_attack_the_question_echoed_or_wrapped_around_the_answer_scores_zero() -> None:
    for task in EVAL:
        question = task.prompt[1]["content"]
        assert score(task, question) == 0.0
        assert score(task, f"{question}\n{answer_of(task)}") == 0.0
        assert score(task, f"{answer_of(task)}\n{question}") == 0.0


def test_attack_a_very_long_answer_scores_zero_even_for_a_lenient_scorer() -> None:
    for task in EVAL:
        assert score(task, answer_of(task) + " " + "x" * 5000) == 0.0
        assert score(task, (answer_of(task) + " ") * 200) == 0.0
    # gsm_symbolic reads the first number, whatever follows it; the length cap still holds.
    (gsm,) = family(datasets=["gsm_symbolic"]).make_tasks(1, 0, "train")
    limit = rg_scoring.max_answer_chars(gsm.data["entry"])
    assert score(gsm, f"{answer_of(gsm)} is it") == 1.0
    assert score(gsm, answer_of(gsm) + " " * 3 + "x" * limit) == 0.0


def test_partial_credit_is_off_by_default_and_recorded_in_the_breakdown() -> None:
    task = EVAL[0]  # chain_sum: the base scorer gives len(oracle)/len(answer) to a superstring
    padded = f"= {answer_of(task)}"
    assert score(task, padded) == 0.0
    partial = family(partial_credit=True)
    value = score(task, padded, on=partial)
    assert value == pytest.approx(len(answer_of(task)) / len(padded))
    trajectory = Trajectory(task_id=task.id, messages=[{"role": "answer", "content": padded}])
    grade = run(FAMILY.grade(task, trajectory, runtime=None))  # type: ignore[arg-type]
    assert grade.reward == 0.0 and grade.breakdown == {"scorer": value}
    assert run(partial.grade(task, trajectory, runtime=None)).reward == value  # type: ignore[arg-type]


def test_options_refuse_unknown_refused_repeated_and_extra_entries() -> None:
    with pytest.raises(ValueError, match=r"unknown reasoning-gym dataset 'chain_sums'.*'chain_sum"):
        family(datasets=["chain_sums"])
    with pytest.raises(ValueError, match=r"'game_of_life_halting' cannot be used: .*bool"):
        family(datasets=["gcd", "game_of_life_halting"])
    with pytest.raises(ValueError, match=r"'rush_hour' cannot be used: .*no oracle"):
        family(datasets=["rush_hour"])
    with pytest.raises(ValueError, match=r"'countdwn'.*'countdown'.*'xyz' \(no close name\)"):
        family(datasets=["countdwn", "xyz"])
    with pytest.raises(ValueError, match="more than once"):
        family(datasets=["gcd", "gcd"])
    with pytest.raises(ValueError, match=r"tasks.options.rg: datasets"):
        family(datasets=[])
    with pytest.raises(ValueError, match=r"tasks.options.rg: pyton: Extra inputs"):
        family(pyton=True)
    chosen = family(datasets=["lcm", "coin_flip"])
    assert [t.data["dataset"] for t in chosen.make_tasks(4, 0, "test")] == ["lcm", "coin_flip"] * 2


def test_a_dataset_config_shapes_the_instances_and_their_grading() -> None:
    on = family(datasets=["chain_sum"], config={"chain_sum": {"min_terms": 5, "max_terms": 5}})
    tasks = on.make_tasks(3, 0, "eval")
    for task in tasks:
        assert task.data["config"] == {"min_terms": 5, "max_terms": 5}
        sum_ = task.prompt[1]["content"].split(": ")[1]
        assert len(sum_.replace(" - ", " + ").split(" + ")) == 5
        assert score(task, answer_of(task), on=on) == 1.0
    assert tasks != family(datasets=["chain_sum"]).make_tasks(3, 0, "eval")
    with pytest.raises(ValueError, match=r"config names datasets not in datasets: gcd"):
        family(datasets=["lcm"], config={"gcd": {}})
    with pytest.raises(ValueError, match=r"'chain_sum': unknown fields seed, terms \(its fields"):
        family(datasets=["chain_sum"], config={"chain_sum": {"terms": 3, "seed": 1}})
    with pytest.raises(ValueError, match=r"refused by reasoning-gym: max_terms must be >= min"):
        family(datasets=["chain_sum"], config={"chain_sum": {"min_terms": 5, "max_terms": 2}})


def test_config_carries_the_options_to_the_family() -> None:
    config = load_config(
        None, ["tasks.families=[rg]", "tasks.options={rg: {datasets: [lcm], python: false}}"]
    ).config
    assert config.tasks.options["rg"] == {"datasets": ["lcm"], "python": False}


def test_a_runtime_kind_follows_the_python_option() -> None:
    with pytest.raises(ValueError, match=r"runtime.kind 'bubblewrap'.*supports simulated"):
        get_family("rg", RuntimeConfig(kind="bubblewrap"))
    with pytest.raises(ValueError, match=r"runtime.kind 'simulated'"):
        get_family("rg", RuntimeConfig(kind="simulated"), FamilyServices(options={"python": True}))


async def call_tools(on: RgFamily, task: Task, calls: list[ToolCall]) -> list[ToolOutcome]:
    runtime = await on.make_runtime(task)
    try:
        ctx = ToolContext(task=task, runtime=runtime)
        registry = on.tools()
        return [
            await registry.execute(call, ctx, timeout_s=60.0, max_output_chars=4000)
            for call in calls
        ]
    finally:
        await runtime.close()


def test_finish_is_the_only_tool_by_default_and_bad_calls_are_the_policy_s_errors() -> None:
    assert FAMILY.tools().names == ["finish"]
    bad = [
        ToolCall(name="finish", arguments={}),
        ToolCall(name="finish", arguments={"answer": ["1", "2"]}),
        ToolCall(name="python", arguments={"code": "print(1)"}),
    ]
    outcomes = run(call_tools(FAMILY, EVAL[0], bad))
    assert [o.kind for o in outcomes] == ["invalid_arguments", "invalid_arguments", "unknown_tool"]
    assert "missing required argument 'answer'" in outcomes[0].output


needs_sandbox = pytest.mark.skipif(
    not executor_available()[0], reason=f"no executor sandbox here: {executor_available()[1]}"
)


@needs_sandbox
def test_python_runs_in_a_sandbox_that_cannot_see_reasoning_gym() -> None:
    on = family(python=True, datasets=["gcd"])
    task = on.make_tasks(1, 0, "train")[0]
    assert on.tools().names == ["python", "finish"]
    oracle = on.oracle_calls(task)
    assert [c.name for c in oracle] == ["python", "finish"]
    probe = (
        "try:\n    import reasoning_gym.factory\n    print('seen')\n"
        "except ImportError:\n    print('hidden')"
    )
    calls = [oracle[0], ToolCall(name="python", arguments={"code": probe})]
    bad = ToolCall(name="python", arguments={"code": 3})
    shown, hidden, refused = run(call_tools(on, task, [*calls, bad]))
    assert shown.kind == "ok" and shown.output.startswith(answer_of(task) + "\n")
    # The package folder is empty in the sandbox: no dataset to regenerate and look up.
    assert hidden.kind == "ok" and hidden.output.startswith("hidden\n"), hidden.output
    assert refused.kind == "invalid_arguments"


@pytest.mark.parametrize(
    ("dataset", "payload"),
    [
        ("n_queens", "open({marker!r}, 'w').write('x')"),
        ("string_insertion", "__import__('pathlib').Path({marker!r}).touch()"),
        ("binary_matrix", "[open({marker!r}, 'w')]"),
        ("spiral_matrix", "(lambda: open({marker!r}, 'w'))()"),
    ],
)
def test_attack_code_in_the_answer_never_reaches_an_eval_scorer(
    dataset: str, payload: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    (task,) = family(datasets=[dataset]).make_tasks(1, 0, "train")
    assert score(task, payload.format(marker=str(marker))) == 0.0
    assert not marker.exists()
    assert score(task, answer_of(task)) == 1.0


def test_attack_a_huge_power_never_reaches_a_sympy_scorer() -> None:
    on = family(datasets=["puzzle24"])
    (task,) = on.make_tasks(1, 0, "train")
    start = time.monotonic()
    for attack in ("9**9**9**9", "9 ** 9 ** 9", "__import__('os').getcwd()", "2^3^4"):
        assert score(task, attack, on=on) == 0.0
    assert time.monotonic() - start < 2.0
    assert score(task, answer_of(task), on=on) == 1.0


def test_the_eval_screens_pass_the_answers_they_must_and_stop_the_rest() -> None:
    assert rg_scoring._inert_for_eval("[[1, 0], [0, -1]]")
    assert rg_scoring._inert_for_eval("1 0\n0 1")  # not Python: eval fails harmlessly
    assert rg_scoring._inert_for_eval("['a', 'b']")
    for code in ("print(1)", "x.y", "a[0]", "1+1", "[i for i in x]", "lambda: 0", "2**100"):
        assert not rg_scoring._inert_for_eval(code), code
    assert rg_scoring._plain_arithmetic("(3 + 5) * 6 / 2 - 0")
    for text in ("3**4", "3 * * 4", "x + 1", "abs(-1)", "3^4"):
        assert not rg_scoring._plain_arithmetic(text), text


def test_a_scorer_that_hangs_scores_zero_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def hang(*args: Any, **kwargs: Any) -> float:
        time.sleep(0.5)
        return 1.0

    monkeypatch.setattr(rg_module, "SCORE_TIMEOUT_S", 0.05)
    monkeypatch.setattr(rg_scoring, "raw_score", hang)

    async def timed() -> tuple[float, float]:
        start = time.monotonic()
        value = await FAMILY.score(EVAL[0], answer_of(EVAL[0]), runtime=None)  # type: ignore[arg-type]
        return value, time.monotonic() - start

    # (asyncio.run itself then waits for the sleeping thread; a run's event loop does not.)
    value, elapsed = run(timed())
    assert value == 0.0 and elapsed < 0.4


def test_a_scorer_that_raises_scores_zero() -> None:
    (task,) = family(datasets=["prime_factorization"]).make_tasks(1, 0, "train")
    assert score(task, task.prompt[1]["content"][:60]) == 0.0
    assert score(task, answer_of(task)) == 1.0


@pytest.mark.slow  # ~20 s: builds the composition (tokenizer, engine) for the real loop
def test_oracle_and_empty_policies_through_the_real_loop(model_dir: Path) -> None:
    from conveyor.app.families import check_family

    config = load_config(None, ["tasks.families=[rg]"]).config
    report = run(check_family(config, "rg", n=3, say=lambda _: None))
    assert report["ok"], report["problems"]
    assert report["oracle_mean"] == 1.0 and report["empty_mean"] == 0.0


@pytest.mark.slow
def test_every_usable_dataset_has_an_oracle_and_refuses_empty_echoed_and_long_answers() -> None:
    names = [n for n in rg_scoring.dataset_names() if n not in rg_scoring.REFUSED]
    assert len(names) == 94
    for name in names:
        (task,) = family(datasets=[name]).make_tasks(1, 0, "train")
        assert score(task, answer_of(task)) == 1.0, name
        assert score(task, "") == 0.0, name
        assert score(task, task.prompt[1]["content"]) == 0.0, name
        assert score(task, answer_of(task) + " " + "x" * 5000) == 0.0, name
