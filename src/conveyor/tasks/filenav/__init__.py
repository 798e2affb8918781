"""File navigation: find one fact in a generated directory tree with `list_dir` and `read_file`.

The tree lives in a `SimulatedRuntime` under /workspace, as /workspace/<group>/<name>/<file>
(projects/alpha/notes.txt, teams/red/README.md, ...) plus a top-level README. The question names
the folder and the kind of document ("the notes of project alpha"); the file's exact name varies,
so the agent lists the folder, reads the file and submits the fact. Other files hold facts of the
same kind for other keys, so only the right file gives the right answer.
"""

from __future__ import annotations

import json
import posixpath
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import ToolContext, ToolRegistry, finish, tool
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.selection import RuntimeRequest, start_runtime
from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.tasks.family import (
    instance_task,
    opening,
    register_family,
    runtime_choice,
    sample_instances,
)
from conveyor.types import Task, ToolCall

ROOT = SimulatedRuntime.root

# group folder -> (the word the question uses, folder names)
GROUPS: dict[str, tuple[str, list[str]]] = {
    "projects": ("project", ["alpha", "beta", "gamma", "delta", "orion", "nova", "atlas"]),
    "teams": ("team", ["red", "blue", "green", "gold", "silver"]),
    "clients": ("client", ["acme", "globex", "initech", "umbra", "vertex"]),
}
# document kind -> possible file names; the first three kinds can hold facts.
_DOCS: dict[str, list[str]] = {
    "notes": ["notes.txt", "meeting-notes.txt", "notes.md"],
    "readme": ["README.md", "readme.txt"],
    "log": ["log.txt", "changes.log"],
    "todo": ["todo.txt", "tasks.md"],
    "budget": ["budget.csv", "costs.csv"],
}
_FACT_DOCS = ["notes", "readme", "log"]
FILLER = [
    "The weekly sync moved to Thursday.",
    "Back up the drafts before Friday.",
    "The printer upstairs is fixed.",
    "Next review is in two weeks.",
    "Order more paper for the office.",
    "The new desks arrive soon.",
    "Remember to water the plants.",
    "Lunch is on the roof this week.",
]
_TODOS = ["update the slides", "clean the shared drive", "book the meeting room", "send the recap"]
_BUDGET_ITEMS = ["paper", "coffee", "cables", "snacks", "chairs", "lamps"]
_WORDS = ["maple", "river", "stone", "cloud", "ember", "cedar", "frost", "pixel", "comet"]
_PEOPLE = ["Priya", "Tomas", "Mei", "Omar", "Lena", "Kofi", "Sven", "Rosa", "Yuki", "Ana"]


def _code(rng: random.Random) -> str:
    return str(rng.randint(1000, 9999))


def _password(rng: random.Random) -> str:
    return f"{rng.choice(_WORDS)}{rng.randint(10, 99)}"


def _person(rng: random.Random) -> str:
    return rng.choice(_PEOPLE)


@dataclass(frozen=True)
class FactKind:
    """A kind of fact: how a file states it, how the question asks for it, its keys and values."""

    statement: str
    question: str
    keys: list[str]
    value: Callable[[random.Random], str]

    def distinct_values(self, n: int, rng: random.Random) -> list[str]:
        """`n` different values, drawn in order (a repeat is drawn again)."""
        values: list[str] = []
        while len(values) < n:
            value = self.value(rng)
            if value not in values:
                values.append(value)
        return values


FACT_KINDS = [
    FactKind(
        "The access code for vault {key} is {value}.",
        "What is the access code for vault {key}?",
        list("ABCDEFGH"),
        _code,
    ),
    FactKind(
        "The {key} server runs on port {value}.",
        "Which port does the {key} server run on?",
        ["mail", "web", "backup", "build", "chat", "files"],
        _code,
    ),
    FactKind(
        "The wifi password in the {key} room is {value}.",
        "What is the wifi password in the {key} room?",
        ["north", "south", "east", "west", "lab", "lobby"],
        _password,
    ),
    FactKind(
        "The contact for the {key} review is {value}.",
        "Who is the contact for the {key} review?",
        ["budget", "safety", "design", "security", "hiring"],
        _person,
    ),
]


@dataclass(frozen=True)
class _Puzzle:
    question: str
    files: dict[str, str]
    target: str
    answer: str
    distractors: list[str]


def _filler_file(kind: str, title: str, rng: random.Random, fact: str | None) -> str:
    """A short document of `kind`; fact-bearing kinds carry `fact` among filler lines."""
    if kind == "todo":
        return "".join(f"- {item}\n" for item in rng.sample(_TODOS, 2))
    if kind == "budget":
        rows = [f"{item},{rng.randint(5, 95)}" for item in rng.sample(_BUDGET_ITEMS, 3)]
        return "item,cost\n" + "\n".join(rows) + "\n"
    lines = rng.sample(FILLER, 2)
    if fact is not None:
        lines.insert(rng.randint(0, len(lines)), fact)
    heading = {"notes": "Notes", "readme": "About", "log": "Log"}[kind]
    return f"{heading}: {title}\n" + "".join(f"- {line}\n" for line in lines)


def _draw_puzzle(rng: random.Random) -> _Puzzle:
    pairs = [(group, name) for group, (_, names) in GROUPS.items() for name in names]
    folders = rng.sample(pairs, rng.randint(4, 6))
    kind = rng.choice(FACT_KINDS)
    # One key per fact-bearing slot; the first key and value belong to the target.
    keys = rng.sample(kind.keys, min(len(kind.keys), 4))
    values = kind.distinct_values(len(keys), rng)
    target_folder = folders[0]
    target_doc = rng.choice(_FACT_DOCS)

    files: dict[str, str] = {}
    target = ""
    fact_slots: list[str] = []
    for folder in folders:
        docs = rng.sample(list(_DOCS), rng.randint(2, 3))
        if folder == target_folder and target_doc not in docs:
            docs[0] = target_doc
        group, name = folder
        for doc in docs:
            path = f"{ROOT}/{group}/{name}/{rng.choice(_DOCS[doc])}"
            if folder == target_folder and doc == target_doc:
                target = path
            elif doc in _FACT_DOCS:
                fact_slots.append(path)
            files[path] = doc
    # Distractor facts go into random other fact-bearing files, at most one each.
    distractor_paths = rng.sample(fact_slots, min(len(fact_slots), len(keys) - 1))
    facts = {target: kind.statement.format(key=keys[0], value=values[0])}
    for path, key, value in zip(distractor_paths, keys[1:], values[1:], strict=False):
        facts[path] = kind.statement.format(key=key, value=value)
    contents = {}
    for path, doc in files.items():
        group, name = path.split("/")[2:4]
        title = f"{GROUPS[group][0]} {name}"
        contents[path] = _filler_file(doc, title, rng, facts.get(path))
    groups = sorted({group for group, _ in folders})
    contents[f"{ROOT}/README.md"] = "Shared workspace. Folders: " + ", ".join(groups) + ".\n"

    word = GROUPS[target_folder[0]][0]
    where = f"It is in the {target_doc} of {word} {target_folder[1]}."
    question = f"{kind.question.format(key=keys[0])} {where}"
    distractors = [values[1 + i] for i in range(len(distractor_paths))]
    return _Puzzle(question, dict(sorted(contents.items())), target, values[0], distractors)


def _absolute(path: str) -> str:
    return posixpath.normpath(posixpath.join(ROOT, path))


def _runtime(ctx: ToolContext) -> Runtime:
    if ctx.runtime is None:
        raise RuntimeFailure("the filenav tools need a runtime, and this rollout has none")
    return ctx.runtime


@tool
async def list_dir(path: str, ctx: ToolContext) -> str:
    """List a folder: one full path per line, folders end with '/'.

    Args:
        path: The folder to list, for example "/workspace/projects/alpha".
    """
    entries = await _runtime(ctx).list_dir(path)
    base = _absolute(path)
    return "\n".join(posixpath.join(base, entry) for entry in entries) or "(empty folder)"


@tool
async def read_file(path: str, ctx: ToolContext) -> str:
    """Read a text file.

    Args:
        path: The file to read, for example "/workspace/projects/alpha/notes.txt".
    """
    return await _runtime(ctx).read_file(path)


def _system_prompt() -> str:
    example = format_tool_call(
        ToolCall(name="list_dir", arguments={"path": f"{ROOT}/projects/alpha"}), "hermes"
    )
    done = format_tool_call(ToolCall(name="finish", arguments={"answer": "4821"}), "hermes")
    return (
        f"You find facts in files under {ROOT}. Project alpha is the folder "
        f"{ROOT}/projects/alpha, team red is {ROOT}/teams/red, client acme is "
        f"{ROOT}/clients/acme. Use list_dir to see a folder's files and read_file to read one. "
        "Make one call per message and wait for the result. Call a tool exactly like this:\n"
        f"{example}\n"
        "When you know the fact, submit only the fact:\n"
        f"{done}"
    )


SYSTEM_PROMPT = _system_prompt()


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def _has_token(text: str, token: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(token)}(?![a-z0-9])", text) is not None


def score_fact(answer: str | None, expected: str, distractors: list[str]) -> float:
    """1.0 if `answer` is the fact `expected`, or holds it as a whole token and none of
    `distractors` (naming every value in the tree must not pass for knowing which one is asked
    for); else 0.0."""
    if answer is None:
        return 0.0
    text = _normalise(answer)
    wanted = _normalise(expected)
    if text.strip(" .'\"") == wanted:
        return 1.0
    if not _has_token(text, wanted):
        return 0.0
    guessed = any(_has_token(text, _normalise(other)) for other in distractors)
    return 0.0 if guessed else 1.0


@register_family
class FileNavFamily:
    """Find a fact in a generated tree; tools: `list_dir`, `read_file` and `finish`.

    `Task.data` holds `files` (absolute path -> content), `target` (the file with the fact),
    `answer` and `distractors` (the same kind of fact for other keys, elsewhere in the tree).
    """

    name = "filenav"
    runtimes: tuple[str, ...] = ("simulated",)

    def __init__(self, runtime: RuntimeConfig | None = None) -> None:
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct trees and questions of `split`, deterministic in (n, seed, split)."""

        def draw(rng: random.Random) -> tuple[str, _Puzzle]:
            puzzle = _draw_puzzle(rng)
            return json.dumps([puzzle.question, puzzle.files]), puzzle

        puzzles = sample_instances(self.name, n, seed, split, draw)
        return [
            instance_task(
                self.name, split, index, opening(SYSTEM_PROMPT, puzzle.question), _data(puzzle)
            )
            for index, puzzle in enumerate(puzzles)
        ]

    def tools(self) -> ToolRegistry:
        """`list_dir`, `read_file` and `finish`."""
        return ToolRegistry([list_dir, read_file, finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """A started runtime holding the task's tree."""
        request = RuntimeRequest(files=task.data["files"])
        return await start_runtime(self.runtime_kind, request, self.runtime)

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """1.0 if `answer` is the fact, or holds it as a whole token and no distractor."""
        return score_fact(answer, task.data["answer"], task.data["distractors"])

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """List the target's folder, read the target, submit the fact."""
        target = task.data["target"]
        return [
            ToolCall(name="list_dir", arguments={"path": posixpath.dirname(target)}),
            ToolCall(name="read_file", arguments={"path": target}),
            ToolCall(name="finish", arguments={"answer": task.data["answer"]}),
        ]


def _data(puzzle: _Puzzle) -> dict[str, Any]:
    return {
        "files": puzzle.files,
        "target": puzzle.target,
        "answer": puzzle.answer,
        "distractors": puzzle.distractors,
    }
