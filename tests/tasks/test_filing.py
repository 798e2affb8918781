"""Filing, the RL-headroom family: an unstated filing rule, demonstrations that teach the format
but not the rule, an oracle that follows it, and a scorer a guessing policy cannot game."""

from __future__ import annotations

import asyncio
import posixpath
import re
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext
from conveyor.app.compose import Composition
from conveyor.app.train import warm_start_samples
from conveyor.config import load_config
from conveyor.tasks.filenav import FACT_KINDS
from conveyor.tasks.filing import CURRENT, DOC_NAMES, FilingFamily
from conveyor.types import Task, ToolCall

T = TypeVar("T")
FAMILY = FilingFamily()
TASKS = FAMILY.make_tasks(300, 0, "train")
REPO = Path(__file__).resolve().parents[2]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def play(task: Task, calls: list[ToolCall]) -> float:
    """Run the calls through the family's real tools and runtime; the score of the `finish`."""
    registry = FAMILY.tools()
    runtime = await FAMILY.make_runtime(task)
    ctx = ToolContext(task=task, runtime=runtime)
    answer = None
    for call in calls:
        if call.name == "finish":
            answer = call.arguments["answer"]
            break
        outcome = await registry.execute(call, ctx, timeout_s=5.0, max_output_chars=4000)
        assert not outcome.is_error, outcome
    return await FAMILY.score(task, answer, runtime)


def kind_asked(task: Task) -> int:
    question = task.prompt[-1]["content"]
    (index,) = [
        i for i, kind in enumerate(FACT_KINDS[:3]) if kind.question.split("{key}")[0] in question
    ]
    return index


def test_the_named_folder_states_the_fact_three_times_and_its_notes_hold_the_current_value() -> (
    None
):
    for task in TASKS[:50]:
        files: dict[str, str] = task.data["files"]
        kind = FACT_KINDS[kind_asked(task)]
        key = re.search(
            kind.question.replace("{key}", r"(\S+)").replace("?", r"\?"), task.prompt[-1]["content"]
        )
        assert key is not None
        statement = (
            re.escape(kind.statement).replace(r"\{key\}", r"(\S+)").replace(r"\{value\}", r"(\S+)")
        )
        target = task.data["target"]
        folder = posixpath.dirname(target)
        stated: dict[str, tuple[str, str]] = {}
        for path, text in files.items():
            facts = [
                m.groups()
                for line in text.splitlines()
                if (m := re.fullmatch(f"- {statement}", line))
            ]
            assert len(facts) <= 1, (path, text)
            if facts:
                stated[path] = facts[0]
        # the named folder: the notes, the log and the README each state the asked key, each
        # with a value of its own; the notes' is the answer
        in_folder = {p: v for p, v in stated.items() if posixpath.dirname(p) == folder}
        assert sorted(in_folder) == sorted(task.data["documents"])
        kinds = sorted(
            next(doc for doc, names in DOC_NAMES.items() if posixpath.basename(p) in names)
            for p in in_folder
        )
        assert kinds == ["log", "notes", "readme"]
        assert {k for k, _ in in_folder.values()} == {key.group(1)}
        values = [v for _, v in in_folder.values()]
        assert len(set(values)) == 3
        assert posixpath.basename(target) in DOC_NAMES[CURRENT]
        assert in_folder[target][1] == task.data["answer"]
        assert task.data["documents"] == {p: v for p, (_, v) in in_folder.items()}
        # elsewhere, other keys; every value but the answer is a distractor
        assert all(k != key.group(1) for p, (k, _) in stated.items() if p not in in_folder)
        assert sorted(task.data["distractors"] + [task.data["answer"]]) == sorted(
            v for _, v in stated.values()
        )
        # the question names the folder, never the document or the rule; nor does the system
        question = task.prompt[-1]["content"]
        assert not re.search(r"notes|log|readme|about|current", question, re.IGNORECASE), question
        system = task.prompt[0]["content"]
        assert "notes" not in system.lower() and "log" not in system.lower().replace("logy", "")
        assert "current" not in system.lower() and "stale" not in system.lower()


def test_the_oracle_solves_and_demonstrations_are_right_by_chance_only() -> None:
    assert all(run(play(t, FAMILY.oracle_calls(t))) == 1.0 for t in TASKS[:20])
    scores = [run(play(t, FAMILY.demonstration_calls(t))) for t in TASKS]
    # a demonstration reads one of the folder's three fact documents and submits its fact
    read = Counter(
        list(t.data["documents"]).index(FAMILY.demonstration_calls(t)[1].arguments["path"])
        for t in TASKS
    )
    assert set(read) == {0, 1, 2} and min(read.values()) > 70
    assert 0.25 < sum(scores) / len(scores) < 0.42
    # and never carries the rule, for any kind of fact asked
    per_kind = Counter(
        (kind_asked(t), FAMILY.demonstration_calls(t)[1].arguments["path"] == t.data["target"])
        for t in TASKS
    )
    for index in range(3):
        right, wrong = per_kind[(index, True)], per_kind[(index, False)]
        assert 0.15 < right / (right + wrong) < 0.5, (index, right, wrong)


@pytest.mark.parametrize(
    "attack",
    [
        "every value in the folder",
        "the value of another document",
        "the answer and a neighbour",
        "every value in the tree",
    ],
)
def test_guessing_attacks_earn_nothing(attack: str) -> None:
    """A policy that wants the reward without finding the rule: it reads every document of the
    folder and submits all their values, or a stale one, or hedges with two, or names every
    value of the tree."""
    for task in TASKS[:30]:
        values = list(task.data["documents"].values())
        others = [v for v in values if v != task.data["answer"]]
        answer = {
            "every value in the folder": " ".join(values),
            "the value of another document": others[0],
            "the answer and a neighbour": f"{task.data['answer']} or {others[1]}",
            "every value in the tree": ", ".join([*task.data["distractors"], task.data["answer"]]),
        }[attack]
        calls = [
            *FAMILY.oracle_calls(task)[:2],
            ToolCall(name="finish", arguments={"answer": answer}),
        ]
        assert run(play(task, calls)) == 0.0, (attack, answer)


def test_held_out_instances_come_from_their_own_seed_and_never_from_training(
    tmp_path: Path,
) -> None:
    config = load_config(
        REPO / "configs" / "rl-headroom.yaml", [f"run.dir={tmp_path}", "tasks.num_tasks=64"]
    ).config
    parts = Composition(config)
    held_out = parts.tasks(40, "eval")
    train = parts.tasks(512, "train")
    same_seed = FAMILY.make_tasks(40, config.tasks.task_seed, "eval")
    assert config.tasks.eval_seed == 1 != config.tasks.task_seed
    assert [t.data for t in held_out] == [t.data for t in FAMILY.make_tasks(40, 1, "eval")]
    assert [t.data for t in held_out] != [t.data for t in same_seed]
    trained = {t.prompt[-1]["content"] + str(sorted(t.data["files"].items())) for t in train}
    assert not any(
        t.prompt[-1]["content"] + str(sorted(t.data["files"].items())) in trained for t in held_out
    )


def test_the_warm_start_imitates_demonstrations_solved_or_not_and_only_solved_oracle_traces(
    tmp_path: Path, model_dir: Path
) -> None:
    """Through the real tokenizer, renderer and agent loop: filing's demonstrations are all
    kept (most do not solve their task); filenav's oracle traces are kept because they solve."""
    sets = [f"run.dir={tmp_path}", f"model.path={model_dir}", "rl.warm_start.tasks=12"]
    filing = Composition(load_config(REPO / "configs" / "rl-headroom.yaml", sets).config)
    samples, said = run(warm_start_samples(filing))
    kept, solved = map(int, re.search(r"(\d+)/12 traces kept \((\d+) solve", said).groups())
    assert kept == 12 and 0 < solved < 12 and "12 of them demonstrations" in said, said
    assert len(samples) == 12  # one sample per trace: its turns share one prefix
    filenav = Composition(load_config(REPO / "configs" / "filenav.yaml", sets).config)
    _, said = run(warm_start_samples(filenav))
    assert "12/12 traces kept (12 solve their task)" in said and "demonstrations" not in said


def test_an_evaluation_may_stop_once_its_interval_is_narrow_over_a_prefix_in_task_order(
    tmp_path: Path, model_dir: Path
) -> None:
    """`rl.eval.stop_halfwidth`: through the real dispatcher, renderer and tools, with a
    scripted policy (the oracle on even instances, a wrong document on odd ones: pass rate 1/2);
    the report covers the first instances in task order, never the quickest ones."""
    from conveyor.app.reports import wilson_interval
    from conveyor.app.train import evaluate
    from conveyor.trainer.sft import OracleEngine

    sets = [f"run.dir={tmp_path}", f"model.path={model_dir}"]
    config = load_config(REPO / "configs" / "rl-headroom.yaml", sets).config
    tasks = FAMILY.make_tasks(120, 1, "eval")

    def policy(index: int, task: Task) -> list[ToolCall]:
        if index % 2 == 0:
            return FAMILY.oracle_calls(task)
        wrong = next(p for p in task.data["documents"] if p != task.data["target"])
        return [
            ToolCall(name="list_dir", arguments={"path": posixpath.dirname(wrong)}),
            ToolCall(name="read_file", arguments={"path": wrong}),
            ToolCall(name="finish", arguments={"answer": task.data["documents"][wrong]}),
        ]

    def report(**held_out: Any) -> dict[str, Any]:
        settings = config.rl.model_copy(update={"eval": config.rl.eval.model_copy(update=held_out)})
        parts = Composition(config.model_copy(update={"rl": settings}))
        tokenizer = parts.tokenizer
        engine = OracleEngine(
            {t.id: policy(i, t) for i, t in enumerate(tasks)},
            lambda text: tokenizer.encode(text, add_special_tokens=False),
            tokenizer.eos_token_id,
            config.model.tool_format,
        )
        try:
            return run(evaluate(parts, parts.stages(engine=engine), tasks))
        finally:
            run(parts.close())

    whole = report()
    assert whole["n"] == 120 and whole["pass_rate"] == 0.5 and "stopped_early" not in whole
    early = report(stop_halfwidth=0.12, min_tasks=20)
    n = early["n"]
    assert 20 <= n < 120 and early["stopped_early"]["evaluated"] == n
    assert sorted(early["outcomes"]) == sorted(t.id for t in tasks[:n])
    assert early["outcomes"] == {t.id: int(i % 2 == 0) for i, t in enumerate(tasks[:n])}
    low, high = wilson_interval(sum(early["outcomes"].values()), n)
    assert (high - low) / 2 <= 0.12
