"""File navigation: the generated tree, the list_dir/read_file tools and the scorer."""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext, ToolOutcome
from conveyor.runtime.base import RuntimeFailure
from conveyor.tasks.filenav import FileNavFamily
from conveyor.types import Task, ToolCall

T = TypeVar("T")
FAMILY = FileNavFamily()
TASK = FAMILY.make_tasks(1, 0, "eval")[0]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def call_tools(task: Task, calls: list[ToolCall]) -> list[ToolOutcome]:
    """Run `calls` in order through the family's registry against a fresh runtime for `task`."""
    registry = FAMILY.tools()
    ctx = ToolContext(task=task, runtime=await FAMILY.make_runtime(task))
    return [
        await registry.execute(call, ctx, timeout_s=5.0, max_output_chars=4000) for call in calls
    ]


def test_trees_are_small_and_two_to_three_levels_deep() -> None:
    for task in FAMILY.make_tasks(100, 0, "train"):
        files = task.data["files"]
        assert 8 <= len(files) <= 20
        depths = [len(path.split("/")) - 2 for path in files]  # components below /workspace
        assert min(depths) >= 1 and max(depths) == 3
        for path in files:
            assert path.startswith("/workspace/")
            assert len(posixpath.basename(path)) <= 20


def test_only_the_target_file_states_the_answer() -> None:
    for task in FAMILY.make_tasks(100, 0, "eval"):
        files, answer = task.data["files"], task.data["answer"]
        holding = [path for path, content in files.items() if answer in content]
        assert holding == [task.data["target"]]
        assert answer not in task.prompt[1]["content"]
        for other in task.data["distractors"]:
            assert other != answer
            assert sum(other in content for content in files.values()) == 1


def test_question_names_the_folder_and_the_kind_of_document() -> None:
    task = TASK
    group, name, filename = task.data["target"].split("/")[2:]
    question = task.prompt[1]["content"]
    word = {"projects": "project", "teams": "team", "clients": "client"}[group]
    assert f"of {word} {name}." in question
    kind = question.split("It is in the ")[1].split(" ")[0]
    assert kind in filename.lower()


def test_oracle_lists_a_folder_then_reads_the_file() -> None:
    for task in FAMILY.make_tasks(50, 0, "eval"):
        names = [call.name for call in FAMILY.oracle_calls(task)]
        assert names == ["list_dir", "read_file", "finish"]
        outcomes = run(call_tools(task, FAMILY.oracle_calls(task)))
        # The listing shows the target's full path; reading it shows the fact.
        assert task.data["target"] in outcomes[0].output.splitlines()
        assert task.data["answer"] in outcomes[1].output


def test_list_dir_gives_full_paths_with_folders_marked() -> None:
    outcomes = run(
        call_tools(
            TASK,
            [
                ToolCall(name="list_dir", arguments={"path": "/workspace"}),
                ToolCall(name="list_dir", arguments={"path": "projects/../teams"}),
            ],
        )
    )
    root = outcomes[0].output.splitlines()
    assert "/workspace/README.md" in root
    groups = {path.split("/")[2] for path in TASK.data["files"] if path.count("/") > 2}
    assert {f"/workspace/{group}/" for group in groups} <= set(root)
    if "teams" in groups:
        assert all(line.startswith("/workspace/teams/") for line in outcomes[1].output.splitlines())


@pytest.mark.parametrize(
    ("name", "path", "error"),
    [
        ("read_file", "/workspace/projects/nowhere/notes.txt", "FileNotFoundError"),
        ("read_file", "/workspace", "IsADirectoryError"),
        ("read_file", "/etc/passwd", "PermissionError"),
        ("list_dir", "/workspace/nowhere", "FileNotFoundError"),
        ("list_dir", "/workspace/README.md", "NotADirectoryError"),
        ("list_dir", "../..", "PermissionError"),
    ],
)
def test_bad_paths_are_tool_errors(name: str, path: str, error: str) -> None:
    (outcome,) = run(call_tools(TASK, [ToolCall(name=name, arguments={"path": path})]))
    assert outcome.kind == "raised"
    assert outcome.output.startswith(f"Error: {error}: ")


def test_missing_runtime_is_an_infrastructure_failure() -> None:
    call = ToolCall(name="read_file", arguments={"path": TASK.data["target"]})
    ctx = ToolContext(task=TASK, runtime=None)
    with pytest.raises(RuntimeFailure, match="need a runtime"):
        run(FAMILY.tools().execute(call, ctx, timeout_s=5.0, max_output_chars=4000))


def test_runtime_holds_the_tree_and_each_rollout_gets_its_own() -> None:
    async def check() -> None:
        first = await FAMILY.make_runtime(TASK)
        second = await FAMILY.make_runtime(TASK)
        assert first.alive() and second.alive()
        await first.write_file("/workspace/scratch.txt", "x")
        assert await second.list_dir("/workspace") != await first.list_dir("/workspace")
        assert await first.read_file(TASK.data["target"]) == TASK.data["files"][TASK.data["target"]]

    run(check())


def test_score_accepts_the_fact_alone_or_as_a_whole_token() -> None:
    task = TASK.model_copy(
        update={"data": {**TASK.data, "answer": "Maple42", "distractors": ["cedar17", "4821"]}}
    )

    async def score(answer: str | None) -> float:
        return await FAMILY.score(task, answer, await FAMILY.make_runtime(task))

    for right in ("Maple42", " maple42 ", "MAPLE42.", "The password is maple42.", '"maple42"'):
        assert run(score(right)) == 1.0, right
    for wrong in (None, "", "maple4", "maple421", "xmaple42", "cedar17", "maple42 or cedar17"):
        assert run(score(wrong)) == 0.0, wrong
    assert run(score("maple42, not 4821")) == 0.0
