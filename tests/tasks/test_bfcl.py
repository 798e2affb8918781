"""BFCL v4 multi-turn: the shipped data, the simulators dispatched by name, the user turns, BFCL's
own checker on our executed instances, and the attacks a reward-seeking policy would try."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext, ToolOutcome
from conveyor.app.compose import Composition
from conveyor.app.families import check_config, check_family, scripted_rollouts
from conveyor.config import load_config
from conveyor.runtime.base import RuntimeFailure
from conveyor.tasks import bfcl as bfcl_module
from conveyor.tasks.bfcl import BfclFamily, BfclRegistry
from conveyor.tasks.bfcl.data import (
    CATEGORIES,
    Entry,
    function_docs,
    load_category,
    parse_call,
    simulator_class,
    simulator_classes,
)
from conveyor.tasks.bfcl.grading import check
from conveyor.tasks.bfcl.runtime import BfclRuntime, UnknownFunction
from conveyor.tasks.family import CALLS, SAY, FamilyServices, Grading, get_family, say, split_of
from conveyor.types import Task, ToolCall, Trajectory

T = TypeVar("T")
FAMILY = BfclFamily()
# Budgets a BFCL conversation needs: up to 37 replies, prompts that list ~35 tool schemas, and
# answers whose one call is 1,202 tokens long.
LOOP_SETTINGS = [
    "tasks.families=[bfcl]",
    "agent.max_turns=48",
    "agent.max_prompt_tokens=16384",
    "agent.max_context_tokens=16384",
    "agent.max_completion_tokens=2048",
]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def entry_task(bfcl_id: str) -> Task:
    """The task of one BFCL entry, whatever its split."""
    for split in ("train", "eval", "test"):
        for entry in FAMILY.entries(split):
            if entry.id == bfcl_id:
                return FAMILY._task(entry, split, 0)
    raise KeyError(bfcl_id)


async def play(
    task: Task, steps: Sequence[ToolCall]
) -> tuple[BfclRuntime, list[ToolOutcome], list[str | None]]:
    """Run `steps` (tool calls; `say` ends the user turn) against a fresh runtime, through the
    task's real registry and the family's `user_turn`; the runtime, the outcomes, the user
    messages."""
    runtime = await FAMILY.make_runtime(task)
    assert isinstance(runtime, BfclRuntime)
    registry = FAMILY.tools_for(task)
    ctx = ToolContext(task=task, runtime=runtime)
    outcomes: list[ToolOutcome] = []
    said: list[str | None] = []
    for step in steps:
        if step.name == SAY:
            said.append(await FAMILY.user_turn(task, runtime, str(step.arguments["text"])))
        elif step.name == CALLS:
            for call in step.arguments["calls"]:
                outcomes.append(
                    await registry.execute(
                        ToolCall.model_validate(call), ctx, timeout_s=5.0, max_output_chars=4000
                    )
                )
        else:
            outcomes.append(await registry.execute(step, ctx, timeout_s=5.0, max_output_chars=4000))
    return runtime, outcomes, said


def score(task: Task, runtime: BfclRuntime) -> float:
    return run(FAMILY.score(task, None, runtime))


# --- data --------------------------------------------------------------------------------------


def test_the_wheel_ships_four_categories_of_200_with_answers_per_turn() -> None:
    assert CATEGORIES == bfcl_module._ALL_CATEGORIES
    for category in CATEGORIES:
        entries = load_category(category)
        assert len(entries) == 200
        for entry in entries:
            assert len(entry.answer) == len(entry.turns) and entry.turns[0]
            assert set(entry.missed) <= set(range(1, len(entry.turns)))
            assert all(not entry.turns[t] for t in entry.missed)


def test_every_documented_function_is_a_public_method_of_its_class() -> None:
    for class_name in simulator_classes():
        cls = simulator_class(class_name)
        for doc in function_docs(class_name):
            assert not doc["name"].startswith("_")
            assert callable(getattr(cls, doc["name"])), (class_name, doc["name"])


def test_answers_parse_as_literal_calls_and_code_does_not() -> None:
    call = parse_call("sort('final_report.pdf')")
    assert (call.name, call.args, call.kwargs) == ("sort", ("final_report.pdf",), {})
    assert parse_call("mv(source='a', destination='b')").kwargs == {
        "source": "a",
        "destination": "b",
    }
    for bad in ("__import__('os').system('x')", "cd(folder=open('/etc/passwd').read())", "x", ""):
        with pytest.raises(ValueError):
            parse_call(bad)


def test_a_missing_bfcl_eval_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.resources

    def missing(name: str) -> Any:
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(importlib.resources, "files", missing)
    load_category.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"pip install --no-deps bfcl-eval==2026\.3\.23"):
            load_category("base")
    finally:
        monkeypatch.undo()
        load_category.cache_clear()


# --- instances and splits ----------------------------------------------------------------------


def test_make_tasks_is_deterministic_and_a_larger_n_extends_a_smaller_one() -> None:
    small = FAMILY.make_tasks(5, 3, "eval")
    big = FAMILY.make_tasks(12, 3, "eval")
    assert [t.data["bfcl_id"] for t in small] == [t.data["bfcl_id"] for t in big[:5]]
    assert FAMILY.make_tasks(5, 3, "eval") == small
    assert len({t.data["bfcl_id"] for t in big}) == 12
    assert [t.id for t in small] == [f"bfcl-eval-{i:04d}" for i in range(5)]
    assert small[0].prompt[1]["content"] == small[0].data["turns"][0]


def test_splits_are_disjoint_by_scenario_so_variants_never_leak() -> None:
    seen: dict[int, str] = {}
    sizes = {}
    for split in ("train", "eval", "test"):
        entries = FAMILY.entries(split)
        sizes[split] = len(entries)
        for entry in entries:
            assert seen.setdefault(entry.scenario, split) == split
            assert split_of(f"bfcl/multi_turn/{entry.scenario}") == split
    assert sum(sizes.values()) == 800 and sizes["eval"] >= 40
    with pytest.raises(ValueError, match="asked for 1000"):
        FAMILY.make_tasks(1000, 0, "eval")
    with pytest.raises(ValueError, match="unknown split"):
        FAMILY.make_tasks(1, 0, "validation")


def test_options_choose_categories_and_refuse_unknown_keys() -> None:
    family = get_family("bfcl", services=FamilyServices(options={"categories": ["miss_func"]}))
    assert isinstance(family, BfclFamily)
    assert {t.data["category"] for t in family.make_tasks(10, 0, "eval")} == {"miss_func"}
    with pytest.raises(ValueError, match=r"tasks\.options\.bfcl: categorys"):
        get_family("bfcl", services=FamilyServices(options={"categorys": ["base"]}))
    with pytest.raises(ValueError, match=r"tasks\.options\.bfcl: categories"):
        get_family("bfcl", services=FamilyServices(options={"categories": ["web_search"]}))
    with pytest.raises(ValueError, match="max_steps_per_turn"):
        get_family("bfcl", services=FamilyServices(options={"max_steps_per_turn": 0}))
    assert isinstance(FAMILY, Grading)


# --- tools and user turns ----------------------------------------------------------------------


def test_tools_are_the_classes_functions_and_held_out_ones_come_with_their_turn() -> None:
    task = entry_task("multi_turn_miss_func_3")  # GorillaFileSystem; find and ls held out
    ((turn, held),) = task.data["missed"].items()
    assert sorted(held) == ["find", "ls"]
    registry = FAMILY.tools_for(task)
    assert isinstance(registry, BfclRegistry)
    shown = {s["function"]["name"] for s in registry.schemas()}
    documented = {d["name"] for c in task.data["classes"] for d in function_docs(c)}
    assert shown == documented - {"find", "ls"} and set(registry.names) == documented
    schema = next(s for s in registry.schemas() if s["function"]["name"] == "cd")
    assert schema["function"]["parameters"]["type"] == "object"
    assert schema["function"]["parameters"]["required"] == ["folder"]
    _, _, said = run(play(task, [say("ok")] * len(task.data["turns"])))
    # said[k] is the user message that opens turn k + 1
    holdout = said[int(turn) - 1]
    assert holdout is not None and not task.data["turns"][int(turn)]
    assert holdout.endswith(
        "I have updated some more functions you can choose from. What about now?"
    )
    revealed = json.loads(holdout.split("\n")[0])
    assert sorted(s["function"]["name"] for s in revealed) == ["find", "ls"]
    assert said[-1] is None
    assert [m for k, m in enumerate(said[:-1]) if k + 1 != int(turn)] == [
        t for k, t in enumerate(task.data["turns"]) if k and k != int(turn)
    ]


def test_a_call_runs_the_simulator_method_and_shows_bfcls_rendering() -> None:
    task = entry_task("multi_turn_base_0")
    runtime, outcomes, _ = run(
        play(
            task,
            [
                ToolCall(name="cd", arguments={"folder": "document"}),
                ToolCall(name="mkdir", arguments={"dir_name": "temp"}),
                ToolCall(name="ls", arguments={}),
                ToolCall(name="cd", arguments={"folder": "nowhere"}),
                ToolCall(name="mkdir", arguments={"dir_name": 5}),
            ],
        )
    )
    assert [o.kind for o in outcomes] == ["ok", "ok", "ok", "ok", "raised"]
    assert json.loads(outcomes[0].output) == {"current_working_directory": "document"}
    assert "temp" in json.loads(outcomes[2].output)["current_directory_content"]
    assert [c.name for c in runtime.results[0]] == ["cd", "mkdir", "ls", "cd", "mkdir"]
    # a refusal is the simulator's own answer; an exception is BFCL's error text
    assert "error" in json.loads(outcomes[3].output)
    failed = runtime.results[0][4].result
    assert failed.startswith("Error during execution: ") and failed in outcomes[4].output


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "missing required argument 'folder'"),
        ({"folder": "a", "path": "b"}, "unknown argument 'path'"),
    ],
)
def test_bad_arguments_are_the_policys_error(arguments: dict[str, Any], problem: str) -> None:
    task = entry_task("multi_turn_base_0")
    runtime, (outcome,), _ = run(play(task, [ToolCall(name="cd", arguments=arguments)]))
    assert outcome.kind == "invalid_arguments" and problem in outcome.output
    assert runtime.results[0] == []  # never reached the simulator


def test_without_its_runtime_a_tool_is_an_infrastructure_failure() -> None:
    task = entry_task("multi_turn_base_0")
    call = ToolCall(name="ls", arguments={})
    registry = FAMILY.tools_for(task)
    with pytest.raises(RuntimeFailure, match="BfclRuntime"):
        run(registry.execute(call, ToolContext(task=task), timeout_s=5, max_output_chars=100))
    with pytest.raises(RuntimeFailure, match="BfclRuntime"):
        run(FAMILY.user_turn(task, None, "done"))


# --- the oracle and BFCL's checker -------------------------------------------------------------


def _oracle_runtime(task: Task) -> BfclRuntime:
    runtime, outcomes, _ = run(play(task, FAMILY.oracle_calls(task)))
    assert all(o.kind in ("ok", "raised") for o in outcomes)
    return runtime


def _bfcl_verdict(entry: Entry, model_steps: list[list[list[str]]]) -> dict[str, Any]:
    """BFCL's own `multi_turn_checker` on call strings from the DATASET (never model output)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    name = f"parity_{uuid.uuid4().hex}"
    test_entry = {"id": entry.id, "initial_config": entry.initial_config}
    test_entry["involved_classes"] = entry.classes
    try:
        return multi_turn_checker(model_steps, entry.answer, test_entry, "", name)
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[key]


def test_oracle_scores_one_on_every_category_and_bfcl_agrees() -> None:
    for category in CATEGORIES:
        for task in BfclFamily(FamilyServices(options={"categories": [category]})).make_tasks(
            6, 0, "eval"
        ):
            entry = Entry.from_data(task.data)
            assert score(task, _oracle_runtime(task)) == 1.0, entry.id
            assert _bfcl_verdict(entry, [[[c] for c in turn] for turn in entry.answer]) == {
                "valid": True
            }


def test_a_wrong_turn_fails_with_the_same_error_as_bfcls_checker() -> None:
    """Drop the last call of the last turn with calls: ours and BFCL's checker both fail it,
    with the same error type."""
    for task in FAMILY.make_tasks(12, 1, "eval"):
        entry = Entry.from_data(task.data)
        last = max(t for t, calls in enumerate(entry.answer) if calls)
        steps: list[ToolCall] = []
        strings: list[list[list[str]]] = []
        oracle = iter(FAMILY.oracle_calls(task))
        for turn, calls in enumerate(entry.answer):
            kept = calls[:-1] if turn == last else calls
            turn_steps = [next(oracle) for _ in calls]
            steps += [*turn_steps[: len(kept)], next(oracle)]
            strings.append([[c] for c in kept])
        runtime, _, _ = run(play(task, steps))
        ours = check(entry, runtime, [], 20)
        theirs = _bfcl_verdict(entry, strings)
        assert not ours.valid and theirs["valid"] is False, entry.id
        assert ours.error_type == theirs["error_type"], entry.id


def test_grade_records_bfcls_verdict_and_breakdown() -> None:
    task = entry_task("multi_turn_base_0")
    runtime = _oracle_runtime(task)
    trajectory = Trajectory(task_id=task.id, messages=[{"role": "user", "content": "q"}])
    grade = run(FAMILY.grade(task, trajectory, runtime))
    assert grade.reward == 1.0 and grade.breakdown == {"valid": 1.0, "turns_passed": 1.0}
    assert json.loads(grade.records[0]["content"])["valid"] is True


# --- attacks -----------------------------------------------------------------------------------


def test_python_code_in_arguments_is_data_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    code = f"__import__('os').system('touch {marker}')"
    task = entry_task("multi_turn_base_0")
    runtime, outcomes, _ = run(
        play(
            task,
            [
                ToolCall(name="mkdir", arguments={"dir_name": code}),
                ToolCall(name="cd", arguments={"folder": f"x'); {code}; ('"}),
                ToolCall(name="touch", arguments={"file_name": "a.txt"}),
                ToolCall(name="echo", arguments={"content": code, "file_name": "a.txt"}),
            ],
        )
    )
    assert not marker.exists()
    fs = runtime.instances["GorillaFileSystem"]
    assert fs._current_dir.contents["a.txt"].content == code  # stored as text, nothing more
    assert [o.kind for o in outcomes] == ["ok"] * 4


def test_methods_that_are_not_tools_are_unknown() -> None:
    task = entry_task("multi_turn_base_0")
    names = ["_load_scenario", "__class__", "__init__", "_parse_positions", "eval", "finish"]
    runtime, outcomes, _ = run(play(task, [ToolCall(name=n, arguments={}) for n in names]))
    assert all(o.kind == "unknown_tool" for o in outcomes)
    for name in names:
        with pytest.raises(UnknownFunction):
            runtime.call(name, {})
    assert runtime.results == [[]]


def test_oversized_arguments_are_refused_before_they_can_hold_the_process() -> None:
    task = entry_task("multi_turn_base_0")
    task = task.model_copy(update={"data": {**task.data, "classes": ["MathAPI"]}})
    calls = [
        ToolCall(name="logarithm", arguments={"value": 2, "base": 10, "precision": 10**8}),
        ToolCall(name="power", arguments={"base": 10**12, "exponent": 10**12}),
        ToolCall(name="add", arguments={"a": 10**100, "b": 1}),
    ]
    _, outcomes, _ = run(play(task, calls))
    assert [o.kind for o in outcomes] == ["invalid_arguments"] * 3
    assert "too large" in outcomes[0].output


def test_skipping_turns_scores_zero() -> None:
    """Text replies only (the empty policy), or the right calls but the conversation left
    before its last turn."""
    task = entry_task("multi_turn_base_0")
    turns = len(task.data["turns"])
    runtime, _, _ = run(play(task, [say("Done.")] * turns))
    assert score(task, runtime) == 0.0
    oracle = FAMILY.oracle_calls(task)
    first_turn = oracle[: oracle.index(next(c for c in oracle if c.name == SAY)) + 1]
    runtime, _, _ = run(play(task, first_turn))
    verdict = check(Entry.from_data(task.data), runtime, [], 20)
    assert verdict.error_type == "multi_turn:force_terminated" and score(task, runtime) == 0.0


def test_doing_every_turns_work_up_front_scores_zero() -> None:
    """All calls in the first turn, then "done" to every request: the state after turn 0 is
    not the state the user asked for."""
    task = entry_task("multi_turn_base_0")
    calls = [c for c in FAMILY.oracle_calls(task) if c.name != SAY]
    runtime, _, _ = run(play(task, [*calls, *[say("Done.")] * len(task.data["turns"])]))
    assert score(task, runtime) == 0.0


def test_calls_after_the_last_turn_are_refused_and_change_nothing() -> None:
    task = entry_task("multi_turn_base_0")
    runtime = _oracle_runtime(task)
    with pytest.raises(UnknownFunction, match="over"):
        runtime.call("rm", {"file_name": "final_report.pdf"})
    assert score(task, runtime) == 1.0


def test_more_steps_in_a_turn_than_bfcl_allows_scores_zero() -> None:
    task = entry_task("multi_turn_base_0")
    runtime = _oracle_runtime(task)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    step = {"role": "assistant", "content": "c", "_tool_calls": [{"name": "ls"}]}
    hint = {"role": "user", "content": "Use a tool.", "_hint": True}  # the loop's, not a turn
    messages += [step] * 10 + [hint] + [step] * 11
    grade = run(FAMILY.grade(task, Trajectory(task_id=task.id, messages=messages), runtime))
    assert grade.reward == 0.0
    at_limit = messages[:-1]  # 20 steps: allowed
    assert run(FAMILY.grade(task, Trajectory(task_id=task.id, messages=at_limit), runtime)).reward
    assert "limit 20" in json.loads(grade.records[0]["content"])["message"]


# --- through the real loop ---------------------------------------------------------------------


def test_attacks_through_the_real_loop(tokenizer: Any) -> None:
    """A BFCL-style python call string in the reply is text, not a call; calling a private
    method is an unknown tool; both end at 0 with the conversation completed."""
    config = load_config(None, LOOP_SETTINGS).config
    parts = Composition(check_config(config, "bfcl"))
    parts._tokenizer = tokenizer  # the session's tokenizer: loading another takes seconds
    task = entry_task("multi_turn_base_0")
    python_call = "[cd(folder=__import__('os').getcwd()), mkdir(dir_name='temp')]"
    scripts = {
        "python": [say(python_call)],
        "private": [ToolCall(name="_load_scenario", arguments={"scenario": {}}), say("Done.")],
    }

    async def go() -> list[Trajectory]:
        try:
            out = []
            for steps in scripts.values():

                def script(_task: Task, steps: list[ToolCall] = steps) -> list[ToolCall]:
                    return steps

                out += await scripted_rollouts(parts, [task], script)
            return out
        finally:
            await parts.close()

    for trajectory in run(go()):
        assert trajectory.reward == 0.0
        assert trajectory.counters.get("user_turns") == len(task.data["turns"]) - 1
        assert str(trajectory.status) == "ok"


@pytest.mark.slow
def test_oracle_scores_one_and_empty_zero_through_the_loop_on_20_instances(
    model_dir: Path,
) -> None:
    config = load_config(None, LOOP_SETTINGS).config
    report = run(check_family(config, "bfcl", n=20, say=lambda _: None))
    assert report["n"] == 20 and report["ok"], report["problems"]
    assert report["oracle_mean"] == 1.0 and report["empty_mean"] == 0.0


# --- benchmark mode (configs/benchmarks/bfcl.yaml) ---------------------------------------------

BENCHMARK = Path(__file__).resolve().parents[2] / "configs" / "benchmarks" / "bfcl.yaml"


def benchmark_config(overrides: Sequence[str] = (), **options: Any) -> Any:
    """The shipped benchmark config with `overrides` and bfcl options changed."""
    shipped = load_config(BENCHMARK, []).config.tasks.options["bfcl"]
    merged = json.dumps({**shipped, **options})
    return load_config(BENCHMARK, [*overrides, f"tasks.options={{bfcl: {merged}}}"]).config


def test_whole_set_serves_all_800_and_the_shipped_budget_fits_every_oracle_path() -> None:
    from conveyor.app.families import oracle_fits

    config = load_config(BENCHMARK, []).config
    family = BfclFamily(FamilyServices(options=config.tasks.options["bfcl"]))
    tasks = family.make_tasks(800, 0, "eval")
    assert len({t.data["bfcl_id"] for t in tasks}) == 800
    assert {c: sum(t.data["category"] == c for t in tasks) for c in CATEGORIES} == dict.fromkeys(
        CATEGORIES, 200
    )
    paths = [family.oracle_calls(t) for t in tasks]
    assert all(oracle_fits(path, config.agent) for path in paths)
    # the two 34-call turns are one reply each; the step limit would not hold one call a reply
    assert sum(any(step.name == CALLS for step in path) for path in paths) == 2
    # the embedded model's whole-conversation budget (configs/domains-eval.yaml) does not fit
    # 21 of the 92 eval entries: what issue 33 found, and why budgets are per user turn here
    domains = load_config(BENCHMARK.parents[1] / "domains-eval.yaml", []).config.agent
    eval_paths = [FAMILY.oracle_calls(t) for t in FAMILY.make_tasks(92, 0, "eval")]
    assert sum(not oracle_fits(path, domains) for path in eval_paths) == 21


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (["model.tool_prompt=compact"], "tool_prompt"),
        (["agent.hints.enabled=true"], "hints"),
        (["agent.max_steps_per_user_turn=null"], "max_steps_per_user_turn"),
        ([], "malformed_call_ends_turn"),
    ],
)
def test_benchmark_mode_refuses_incomparable_settings_unless_told(
    overrides: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert Composition(benchmark_config()).families  # the shipped one runs
    options = {} if overrides else {"malformed_call_ends_turn": False}
    with pytest.raises(ValueError, match=f"incomparable.*{problem}"):
        assert Composition(benchmark_config(overrides, **options)).families  # refused before this
    told = benchmark_config(overrides, **options, allow_incomparable=True)
    assert Composition(told).families
    assert "NOT COMPARABLE" in capsys.readouterr().err


def test_benchmark_protocol_through_the_real_loop(tokenizer: Any) -> None:
    """With the shipped benchmark config: a reply whose call does not parse ends only that user
    turn (none of it runs; the oracle's remaining turns still score 1.0), and a 21st
    tool-calling reply in one user turn ends the rollout (BFCL's force quit), scored 0."""
    config = benchmark_config(whole_set=False)
    parts = Composition(check_config(config, "bfcl"))
    parts._tokenizer = tokenizer  # the session's tokenizer: loading another takes seconds
    task = entry_task("multi_turn_base_0")
    oracle = FAMILY.oracle_calls(task)
    first_say = next(i for i, step in enumerate(oracle) if step.name == SAY)
    broken = say('<tool_call>\n{"name": "rm", "arguments": {"file_name": \n</tool_call>')
    scripts = {
        "malformed": [*oracle[:first_say], broken, *oracle[first_say + 1 :]],
        "at_limit": [ToolCall(name="pwd", arguments={})] * 20 + [say("Done.")] * 10,
        "over_limit": [ToolCall(name="pwd", arguments={})] * 21,
    }

    async def go() -> dict[str, Trajectory]:
        try:
            out = {}
            for name, steps in scripts.items():

                def script(_task: Task, steps: list[ToolCall] = steps) -> list[ToolCall]:
                    return steps

                out[name] = (await scripted_rollouts(parts, [task], script))[0]
            return out
        finally:
            await parts.close()

    got = run(go())
    malformed = got["malformed"]
    assert (str(malformed.status), malformed.reward) == ("ok", 1.0)
    assert malformed.counters["malformed_turn_ends"] == 1
    assert malformed.counters["user_turns"] == len(task.data["turns"]) - 1
    assert str(got["at_limit"].status) == "ok"  # 20 steps are allowed (the answer is wrong)
    over = got["over_limit"]
    assert (str(over.status), str(over.stop_reason), over.reward) == ("truncated", "max_turns", 0.0)
    assert over.counters["user_turn_step_limit"] == 1 and over.counters["tool_calls"] == 20


def test_verdicts_equal_bfcls_checker_on_gold_and_perturbed_answers() -> None:
    """A CI-sized sample of `conveyor tasks parity bfcl` (the full run: every gold answer and
    800 perturbed, docs/benchmarks-bfcl-tau2.md): ours and BFCL's `multi_turn_checker` agree
    on validity and error type, for every kind of perturbation."""
    from conveyor.tasks.bfcl import parity

    chosen = parity.cases(48, seed=3, gold=False)
    gold = [c for c in parity.cases(0) if c.entry.id.endswith(("_0", "_100"))]
    report = parity.compare([*gold, *chosen])
    assert report["ok"], report["mismatches"]
    assert set(report["by_kind"]) == {"gold", *parity.PERTURBATIONS}
    assert report["by_kind"]["gold"]["upstream_valid"] == len(gold) == 8
    # the sample is not trivial: BFCL rejects most perturbed answers and accepts some
    rejected = sum(
        r["n"] - r["upstream_valid"] for k, r in report["by_kind"].items() if k != "gold"
    )
    assert 0 < rejected < len(chosen)
