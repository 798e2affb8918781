"""One BFCL rollout's world: the entry's simulator instances and the conversation's turns.

`BfclRuntime` builds fresh instances of the entry's classes (BFCL's own simulator classes, loaded
with the entry's initial config as BFCL's executor loads them) and dispatches a tool call to the
instance's METHOD BY NAME with the parsed JSON arguments: only names from the entry's function
docs reach `getattr`, so a private method, a dunder or a name the docs do not list is never
called, and no string the model wrote is ever evaluated. It records, per user turn, each call's
result as BFCL's executor renders it, and a deep copy of every instance when the turn ends: what
the grader compares with the ground truth.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from conveyor.runtime.base import ExecResult
from conveyor.tasks.bfcl.data import (
    Entry,
    function_docs,
    openai_schema,
    owner_of,
    simulator_class,
)

# BFCL's executor: a failed call's result, as the model and the checker see it.
ERROR_PREFIX = "Error during execution: "


class UnknownFunction(LookupError):
    """A call to a function that no doc of the entry's classes names."""


@dataclass(frozen=True)
class ExecutedCall:
    """A call that reached a simulator: its name, arguments and rendered result."""

    name: str
    arguments: dict[str, Any]
    result: str
    failed: bool


def render_result(value: Any) -> str:
    """A method's return value as BFCL's executor renders it: text as is, a dict as JSON (its
    `str` when not serialisable), anything else through `str`."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def build_instances(entry: Entry) -> dict[str, Any]:
    """Fresh simulator instances of `entry`'s classes, each loaded with its initial config."""
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    instances: dict[str, Any] = {}
    for class_name in entry.classes:
        instance = simulator_class(class_name)()
        if class_name not in STATELESS_CLASSES:
            config = copy.deepcopy(entry.initial_config.get(class_name, {}))
            instance._load_scenario(config, long_context=entry.long_context)
        instances[class_name] = instance
    return instances


class BfclRuntime:
    """A `Runtime` holding one rollout's simulators and turn bookkeeping (no shell, no files).

    `turn` is the index of the user turn in progress; `results[t]` the calls executed in turn
    `t`; `snapshots[t]` deep copies of the instances when turn `t` ended (`end_turn`).
    """

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.instances = build_instances(entry)
        # function name -> its class: only these documented names are ever dispatched
        self._owners: dict[str, str] = {}
        for class_name in entry.classes:
            for doc in function_docs(class_name):
                self._owners.setdefault(doc["name"], class_name)
        self.turn = 0
        self.results: list[list[ExecutedCall]] = [[]]
        self.snapshots: list[dict[str, Any]] = []
        self.done = False
        self._alive = True

    def call(self, name: str, arguments: dict[str, Any]) -> ExecutedCall:
        """Run one call on the instance that owns `name`; a method that raises gives BFCL's
        error text as the result. `UnknownFunction` if no function doc of the entry's classes
        names it. A `miss_func` function held out of the prompt is callable all along, as with
        BFCL's executor (one answer even needs it before its turn): only the prompt hides it."""
        if self.done:
            raise UnknownFunction("the conversation is over; no more calls are taken")
        if name not in self._owners:
            raise UnknownFunction(f"unknown function '{name}'")
        method = getattr(self.instances[self._owners[name]], name)
        try:
            value = method(**arguments)
        except Exception as error:  # the simulator's own failure is the call's result
            executed = ExecutedCall(name, dict(arguments), f"{ERROR_PREFIX}{error}", True)
        else:
            executed = ExecutedCall(name, dict(arguments), render_result(value), False)
        self.results[self.turn].append(executed)
        return executed

    def end_turn(self) -> str | None:
        """Close the turn in progress (snapshot the instances) and open the next one: its user
        message, or None when the last turn has ended."""
        if self.done:
            return None
        self.snapshots.append(copy.deepcopy(self.instances))
        if self.turn + 1 >= len(self.entry.turns):
            self.done = True
            return None
        self.turn += 1
        self.results.append([])
        revealed = self.entry.missed.get(self.turn, [])
        return self.entry.turns[self.turn] or _holdout_message(self.entry, revealed)

    # The `Runtime` protocol: the simulators are in-process objects, so there is nothing to
    # start or release, and no shell or file system to offer.
    async def start(self) -> None:
        """Nothing to start: the instances exist from construction."""

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        """A BFCL rollout has no shell."""
        return ExecResult(exit_code=127, stderr="the bfcl runtime has no shell\n")

    async def read_file(self, path: str) -> str:
        """A BFCL rollout has no files outside its simulators."""
        raise FileNotFoundError(f"the bfcl runtime has no files: {path}")

    async def write_file(self, path: str, content: str) -> None:
        """A BFCL rollout has no files outside its simulators."""
        raise PermissionError(f"the bfcl runtime has no files: {path}")

    async def list_dir(self, path: str) -> list[str]:
        """A BFCL rollout has no files outside its simulators."""
        raise FileNotFoundError(f"the bfcl runtime has no files: {path}")

    def alive(self) -> bool:
        """Usable until closed."""
        return self._alive

    async def close(self) -> None:
        """Mark closed (the instances are garbage collected)."""
        self._alive = False


def _holdout_message(entry: Entry, revealed: list[str]) -> str:
    """BFCL's prompting-mode holdout turn: the new functions' docs, then its fixed question."""
    from bfcl_eval.constants.default_prompts import (
        DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING as TEMPLATE,
    )

    schemas: list[dict[str, Any]] = []
    for name in revealed:
        docs = function_docs(owner_of(name, entry.classes))
        schemas.extend(openai_schema(doc) for doc in docs if doc["name"] == name)
    return str(TEMPLATE.format(functions=json.dumps(schemas)))
