"""Filing: find a fact that three documents disagree on, kept current in one by an unstated
rule (RL's headroom task).

The workspace is filenav's (/workspace/<group>/<name>/<file>, `list_dir`, `read_file`,
`finish`), with one rule the prompt never states: every folder keeps its facts current in its
notes; its log and its README state the same facts with values that have since changed. The
question names the folder only ("What is the access code for vault C? It is filed under
project alpha."), and the folder's notes, log and README each state that fact with a value of
its own, so reading the wrong one gives a well-formed wrong answer, and nothing in the text
says which is current.

The warm start imitates `demonstration_calls`: list the folder, read one of its three fact
documents chosen at random, submit the value found there. Those traces teach the tool format and
the shape of the plan; they do not teach the rule (a third of them are right, by chance). The
rule is what RL has to find from the reward, which is what makes this family the protocol's
test of RL's own share (issue 19; docs/algorithms.md says why the rule is one rule for every
question and not one per kind of fact).
"""

from __future__ import annotations

import json
import posixpath
import random
from dataclasses import dataclass

from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.tasks.family import instance_task, opening, register_family, sample_instances
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

# The documents that state the asked fact in a folder, and the names each may have. The rule:
# the notes hold the current value; the log and the README hold stale ones.
CURRENT = "notes"
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
    asked = rng.randrange(3)
    kind: FactKind = FACT_KINDS[asked]
    # The asked key: its current value and two stale ones, all in the named folder. The other
    # folders state other keys of the same kind, once per document (their own values).
    keys = rng.sample(kind.keys, len(folders))
    values = kind.distinct_values(3 * len(folders), rng)

    files: dict[str, str] = {}
    target = ""
    documents: dict[str, str] = {}
    for slot, (group, name) in enumerate(folders):
        title = f"{GROUPS[group][0]} {name}"
        folder = f"{ROOT}/{group}/{name}"
        for offset, doc in enumerate(DOC_NAMES):
            path = f"{folder}/{rng.choice(DOC_NAMES[doc])}"
            value = values[3 * slot + offset]
            statement = kind.statement.format(key=keys[slot], value=value)
            files[path] = _document(doc, title, statement, rng)
            if slot == 0:
                documents[path] = value
                if doc == CURRENT:
                    target = path
        for other in rng.sample(sorted(OTHER_DOCS), rng.randint(0, 2)):
            path = f"{folder}/{rng.choice(OTHER_DOCS[other])}"
            files[path] = "".join(f"- {item}\n" for item in rng.sample(_TODOS, 2))
    groups = sorted({group for group, _ in folders})
    files[f"{ROOT}/README.md"] = "Shared workspace. Folders: " + ", ".join(groups) + ".\n"

    group, name = folders[0]
    question = f"{kind.question.format(key=keys[0])} It is filed under {GROUPS[group][0]} {name}."
    answer = values[0]
    return _Puzzle(
        question,
        dict(sorted(files.items())),
        target,
        answer,
        [value for value in values if value != answer],
        dict(sorted(documents.items())),
    )


@register_family
class FilingFamily(FileNavFamily):
    """Find the current value of a fact by an unstated rule; filenav's tools, runtime, scorer
    and oracle.

    `Task.data`: `files`, `target` (the named folder's notes, where the rule keeps the fact
    current), `answer`, `distractors` (every other value in the tree, the stale ones included)
    and `documents` (the named folder's three documents that state the fact, each with the
    value it states, in listing order).
    """

    name = "filing"

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct trees and questions of `split`, deterministic in (n, seed, split)."""

        def draw(rng: random.Random) -> tuple[str, _Puzzle]:
            puzzle = _draw_puzzle(rng)
            return json.dumps([puzzle.question, puzzle.files]), puzzle

        puzzles = sample_instances(self.name, n, seed, split, draw)
        return [
            instance_task(
                self.name,
                split,
                index,
                opening(SYSTEM_PROMPT, puzzle.question),
                {
                    "files": puzzle.files,
                    "target": puzzle.target,
                    "answer": puzzle.answer,
                    "distractors": puzzle.distractors,
                    "documents": puzzle.documents,
                },
            )
            for index, puzzle in enumerate(puzzles)
        ]

    def demonstration_calls(self, task: Task) -> list[ToolCall]:
        """What the warm start imitates: list the folder, read one of the three documents that
        state the fact (chosen by a hash of the task, so a third are the notes), submit the value
        read there."""
        documents: dict[str, str] = task.data["documents"]
        rng = random.Random(f"{self.name}/demonstration/{task.id}/{task.data['answer']}")
        read = rng.choice(sorted(documents))
        return [
            ToolCall(name="list_dir", arguments={"path": posixpath.dirname(read)}),
            ToolCall(name="read_file", arguments={"path": read}),
            ToolCall(name="finish", arguments={"answer": documents[read]}),
        ]
