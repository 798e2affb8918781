"""Filing: find a fact in a folder whose filing rule the agent is never told (RL's headroom task).

The workspace is filenav's (/workspace/<group>/<name>/<file>, `list_dir`, `read_file`,
`finish`), with one rule the prompt never states: every folder files each kind of fact in one
kind of document — access codes in the notes, server ports in the log, wifi passwords in the
README. The question names the folder only ("What is the access code for vault C? It is filed
under project alpha."), and the folder holds all three documents, each with a fact of its own
kind, so reading the wrong one gives a well-formed wrong answer.

The warm start imitates `demonstration_calls`: list the folder, read one of its three fact
documents chosen at random, submit the fact found there. Those traces teach the tool format and
the shape of the plan; they do not teach the rule (a third of them are right, by chance). The
rule is what RL has to find from the reward, which is what makes this family the protocol's
test of RL's own share (issue 19, docs/algorithms.md). A policy may also read every document
and pick the matching line; that earns the reward too.
"""

from __future__ import annotations

import json
import posixpath
import random
from dataclasses import dataclass

from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.tasks.family import register_family, sample_instances, task_id
from conveyor.tasks.filenav import (
    FACT_KINDS,
    FILLER,
    GROUPS,
    SYSTEM_PROMPT,
    FactKind,
    FileNavFamily,
)
from conveyor.types import Task, ToolCall

ROOT = SimulatedRuntime.root

# The filing rule: fact kind (index into FACT_KINDS) -> the document kind that holds it, and the
# names that document kind may have in a folder.
RULE: dict[int, str] = {0: "notes", 1: "log", 2: "readme"}
DOC_NAMES: dict[str, list[str]] = {
    "notes": ["notes.txt", "meeting-notes.txt", "notes.md"],
    "log": ["log.txt", "changes.log", "server.log"],
    "readme": ["README.md", "readme.txt", "ABOUT.md"],
}
# Documents without facts, listed beside the three (noise in the listing).
OTHER_DOCS: dict[str, list[str]] = {
    "todo": ["todo.txt", "tasks.md"],
    "budget": ["budget.csv", "costs.csv"],
}
_TODOS = ["update the slides", "clean the shared drive", "book the meeting room", "send the recap"]
_HEADINGS = {"notes": "Notes", "log": "Log", "readme": "About"}


@dataclass(frozen=True)
class _Puzzle:
    question: str
    files: dict[str, str]
    target: str
    answer: str
    distractors: list[str]
    documents: dict[str, str]  # the target folder's three fact documents -> their facts' values


def _document(kind: str, title: str, fact: str, rng: random.Random) -> str:
    lines = rng.sample(FILLER, 2)
    lines.insert(rng.randint(0, len(lines)), fact)
    return f"{_HEADINGS[kind]}: {title}\n" + "".join(f"- {line}\n" for line in lines)


def _draw_puzzle(rng: random.Random) -> _Puzzle:
    pairs = [(group, name) for group, (_, names) in GROUPS.items() for name in names]
    folders = rng.sample(pairs, rng.randint(3, 5))
    asked = rng.choice(sorted(RULE))
    # Per fact kind: distinct keys and values, one per folder (the target folder's come first).
    drawn: dict[int, list[tuple[str, str]]] = {}
    for index in RULE:
        kind: FactKind = FACT_KINDS[index]
        keys = rng.sample(kind.keys, len(folders))
        values: list[str] = []
        while len(values) < len(folders):
            value = kind.value(rng)
            if value not in values:
                values.append(value)
        drawn[index] = list(zip(keys, values, strict=True))

    files: dict[str, str] = {}
    target = ""
    documents: dict[str, str] = {}
    for slot, (group, name) in enumerate(folders):
        title = f"{GROUPS[group][0]} {name}"
        folder = f"{ROOT}/{group}/{name}"
        for index, doc in RULE.items():
            key, value = drawn[index][slot]
            path = f"{folder}/{rng.choice(DOC_NAMES[doc])}"
            statement = FACT_KINDS[index].statement.format(key=key, value=value)
            files[path] = _document(doc, title, statement, rng)
            if slot == 0:
                documents[path] = value
                if index == asked:
                    target = path
        for doc in rng.sample(sorted(OTHER_DOCS), rng.randint(0, 2)):
            path = f"{folder}/{rng.choice(OTHER_DOCS[doc])}"
            files[path] = "".join(f"- {item}\n" for item in rng.sample(_TODOS, 2))
    groups = sorted({group for group, _ in folders})
    files[f"{ROOT}/README.md"] = "Shared workspace. Folders: " + ", ".join(groups) + ".\n"

    key, answer = drawn[asked][0]
    group, name = folders[0]
    question = (
        f"{FACT_KINDS[asked].question.format(key=key)} It is filed under {GROUPS[group][0]} {name}."
    )
    distractors = [value for index in RULE for _, value in drawn[index] if value != answer]
    return _Puzzle(
        question,
        dict(sorted(files.items())),
        target,
        answer,
        distractors,
        dict(sorted(documents.items())),
    )


@register_family
class FilingFamily(FileNavFamily):
    """Find a fact filed by an unstated rule; filenav's tools, runtime, scorer and oracle.

    `Task.data`: `files`, `target` (the document the rule files the fact in), `answer`,
    `distractors` (every other fact value in the tree) and `documents` (the target folder's
    three fact documents, each with the value of its fact, in listing order).
    """

    name = "filing"

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct trees and questions of `split`, deterministic in (n, seed, split)."""

        def draw(rng: random.Random) -> tuple[str, _Puzzle]:
            puzzle = _draw_puzzle(rng)
            return json.dumps([puzzle.question, puzzle.files]), puzzle

        puzzles = sample_instances(self.name, n, seed, split, draw)
        return [
            Task(
                id=task_id(self.name, split, index),
                family=self.name,
                prompt=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": puzzle.question},
                ],
                data={
                    "files": puzzle.files,
                    "target": puzzle.target,
                    "answer": puzzle.answer,
                    "distractors": puzzle.distractors,
                    "documents": puzzle.documents,
                },
                split=split,
            )
            for index, puzzle in enumerate(puzzles)
        ]

    def demonstration_calls(self, task: Task) -> list[ToolCall]:
        """What the warm start imitates: list the folder, read one of its three fact documents
        (chosen by a hash of the task, so a third are the right one), submit its fact."""
        documents: dict[str, str] = task.data["documents"]
        rng = random.Random(f"{self.name}/demonstration/{task.id}/{task.data['answer']}")
        read = rng.choice(sorted(documents))
        return [
            ToolCall(name="list_dir", arguments={"path": posixpath.dirname(read)}),
            ToolCall(name="read_file", arguments={"path": read}),
            ToolCall(name="finish", arguments={"answer": documents[read]}),
        ]
