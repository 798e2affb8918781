"""BFCL v4 multi-turn: stateful tool use over several user turns, graded by BFCL's own checker.

Each instance is one entry of the Berkeley Function-Calling Leaderboard's multi-turn categories
(`base`, `long_context`, `miss_func`, `miss_param`; data, function docs and simulators from the
`bfcl-eval` wheel). The agent gets the functions of the entry's simulator classes (a file system,
messages, Twitter, tickets, trading, travel, vehicle control, math) as tools and the first user
request; after each reply without a tool call the next request follows (`user_turn`), and after
the last one the rollout ends and is graded.

- Dispatch: a parsed call goes to the simulator instance's method of that name with its JSON
  arguments, checked against BFCL's function doc first; only documented names reach a method and
  nothing the model wrote is ever evaluated (BFCL's own executor `eval`s call strings).
- `miss_func`: the held-out functions are missing from the prompt until their turn, whose user
  message is BFCL's prompting-mode text: their docs, then "I have updated some more functions
  ...". As with BFCL's executor they are callable all along (one answer calls one early).
- Grade: `conveyor.tasks.bfcl.grading` (BFCL's state and response checks on our executed
  instances against the ground truth executed by BFCL); 1.0 valid, 0.0 otherwise.
- Splits: by a hash of the scenario number, so the four categories' variants of one scenario
  (``multi_turn_base_7``, ``multi_turn_miss_func_7``, ...) always share a split.

Options (`tasks.options.bfcl`): `categories` (default all four), `max_steps_per_turn` (BFCL's
force-quit limit of tool-calling replies in one user turn, default 20), `whole_set` (every entry
whatever the split: the leaderboard's 800), `malformed_call_ends_turn` (as BFCL: a reply whose
calls do not parse ends the user turn, not the rollout) and `benchmark` (refuse a run whose
number could not stand beside BFCL's: see `BfclFamily.config_problems`;
configs/benchmarks/bfcl.yaml is that run).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import Tool, ToolArgumentsError, ToolContext, ToolRegistry
from conveyor.config import ConveyorConfig
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.tasks.bfcl.data import (
    BFCL_VERSION,
    Entry,
    function_docs,
    load_category,
    named_arguments,
    openai_schema,
    owner_of,
    parse_call,
    simulator_classes,
)
from conveyor.tasks.bfcl.grading import Verdict, check
from conveyor.tasks.bfcl.runtime import BfclRuntime, UnknownFunction
from conveyor.tasks.family import (
    SPLIT_SHARES,
    FamilyServices,
    Grade,
    check_split,
    family_options,
    instance_task,
    opening,
    register_family,
    say,
    several,
    shuffled_pool,
    split_of,
)
from conveyor.types import Task, ToolCall, Trajectory

Category = Literal["base", "long_context", "miss_func", "miss_param"]
_ALL_CATEGORIES: tuple[Category, ...] = ("base", "long_context", "miss_func", "miss_param")

# JSON-safe integers: a bigger one is refused before it reaches a simulator.
_MAX_INT = 2**53
# Arguments whose size sets a simulator's work (mpmath precision, an integer power): bounded so
# a call cannot hold the process; the dataset's answers stay far below.
_ARGUMENT_LIMITS: dict[tuple[str, str], int] = {
    ("logarithm", "precision"): 1000,
    ("square_root", "precision"): 1000,
    ("power", "exponent"): 10_000,
}
DONE_REPLY = "Done."


class BfclOptions(BaseModel):
    """`tasks.options.bfcl`."""

    model_config = ConfigDict(extra="forbid")

    categories: list[Category] = Field(
        default_factory=lambda: list(_ALL_CATEGORIES),
        min_length=1,
        description="Which BFCL v4 multi-turn categories to draw instances from.",
    )
    max_steps_per_turn: int = Field(
        default=20,
        gt=0,
        description="Most tool-calling replies in one user turn; more fails the instance, as "
        "BFCL's force quit does.",
    )
    whole_set: bool = Field(
        default=False,
        description="Serve every entry of the chosen categories whatever split is asked (the "
        "leaderboard's whole set, 200 per category): for evaluation only, since it holds the "
        "train split's entries too.",
    )
    malformed_call_ends_turn: bool = Field(
        default=True,
        description="A reply whose tool calls do not parse ends the user turn (none of its "
        "calls run; the next user message follows), as BFCL's runner does; false: the loop's "
        "usual handling (a hint, or the end of the rollout with hints off).",
    )
    benchmark: bool = Field(
        default=False,
        description="Benchmark mode: refuse settings that make the number incomparable with "
        "BFCL's (compact tool prompt, hints, a step budget other than max_steps_per_turn per "
        "user turn) unless allow_incomparable is set.",
    )
    allow_incomparable: bool = Field(
        default=False,
        description="With benchmark: only warn about incomparable settings, do not refuse.",
    )


class SimulatorTool(Tool):
    """One BFCL function as a tool: its schema is BFCL's doc, its call goes to the rollout's
    simulator method of the same name (`BfclRuntime.call`)."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        # Not `Tool.__init__`: the schema comes from BFCL's JSON doc, not a Python signature.
        self.schema = openai_schema(dict(doc))
        function = self.schema["function"]
        self.name = str(function["name"])
        self.description = str(function["description"])
        self.timeout_s = None
        self.fn = self._call
        self._properties: dict[str, Any] = function["parameters"].get("properties", {})
        self._required: list[str] = list(function["parameters"].get("required", []))

    async def _call(self, ctx: ToolContext, **arguments: Any) -> str:
        runtime = ctx.runtime
        if not isinstance(runtime, BfclRuntime):
            raise RuntimeFailure(f"the bfcl tools need a BfclRuntime, got {type(runtime).__name__}")
        executed = runtime.call(self.name, arguments)
        if executed.failed:
            raise SimulatorError(executed.result)
        return executed.result

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check the arguments against BFCL's doc: known names, required ones present, sizes
        bounded (an unknown or missing argument would be the method's TypeError anyway)."""
        problems = [
            f"unknown argument '{key}' (expected: {', '.join(self._properties) or 'none'})"
            for key in arguments
            if key not in self._properties
        ]
        problems += [
            f"missing required argument '{k}'" for k in self._required if k not in arguments
        ]
        for key, value in arguments.items():
            problems += _value_problems(self.name, key, value)
        if problems:
            raise ToolArgumentsError(
                f"Error: invalid arguments for tool '{self.name}': " + "; ".join(problems)
            )
        return dict(arguments)

    async def _run(self, values: dict[str, Any], ctx: ToolContext) -> Any:
        return await self._call(ctx, **values)


class SimulatorError(RuntimeError):
    """A simulator method raised: the call's result is BFCL's error text (the policy's error)."""


def _value_problems(tool: str, key: str, value: Any) -> list[str]:
    """Size limits only: BFCL passes values to the simulators unchecked (its own answers pass a
    string where a doc says integer), so types are the simulator's business, as in BFCL."""
    if isinstance(value, int) and not isinstance(value, bool):
        limit = _ARGUMENT_LIMITS.get((tool, key), _MAX_INT)
        if abs(value) > limit:
            return [f"argument '{key}' is too large (at most {limit} in size)"]
    return []


class BfclRegistry(ToolRegistry):
    """A task's tools; the held-out ones (`miss_func`) are dispatchable but not in `schemas()`
    (the prompt): their turn's user message shows them."""

    def __init__(self, tools: Iterable[Tool], hidden: Iterable[str] = ()) -> None:
        super().__init__(tools)
        self.hidden = frozenset(hidden)

    def schemas(self) -> list[dict[str, Any]]:
        """The schemas shown from the first turn: every tool but the held-out ones."""
        return [s for s in super().schemas() if s["function"]["name"] not in self.hidden]


def _system_prompt() -> str:
    example = format_tool_call(
        ToolCall(name="function_name", arguments={"parameter": "value"}), "hermes"
    )
    return (
        "You are an assistant that carries out the user's requests by calling the functions "
        "you are given. Call a function exactly like this:\n"
        f"{example}\n"
        "You may make several calls, one after another, and you see each result. Do what the "
        "current request asks in this turn. When it is done, or when no function can do it, or "
        "when the request lacks a value you need, reply in plain text without a function call: "
        "that ends your turn, and the user may ask something more."
    )


SYSTEM_PROMPT = _system_prompt()


@register_family(options=BfclOptions)
class BfclFamily:
    """BFCL v4 multi-turn entries; tools per instance (its classes' functions), a user turn
    after each text reply, graded by BFCL's multi-turn checker.

    `Task.data` is the entry (`bfcl_data.Entry.to_data`): its BFCL id, category, scenario, the
    user message of every turn, initial config, classes, held-out functions and ground truth.
    """

    name = "bfcl"
    splits: tuple[str, ...] = tuple(SPLIT_SHARES)
    source = "bfcl-eval (BFCL v4 multi-turn: base, long_context, miss_func, miss_param)"
    version = BFCL_VERSION

    def __init__(self, services: FamilyServices | None = None) -> None:
        services = services if services is not None else FamilyServices()
        self.options = family_options(self.name, BfclOptions, services.options)

    @property
    def malformed_call_ends_turn(self) -> bool:
        """Read by the rollout stages: a reply that does not parse ends the user turn."""
        return self.options.malformed_call_ends_turn

    def config_problems(self, config: ConveyorConfig) -> list[str]:
        """With `benchmark`: what in `config` makes the number incomparable with BFCL's
        leaderboard (the composition refuses the run unless `allow_incomparable`)."""
        if not self.options.benchmark:
            return []
        problems = []
        if config.model.tool_prompt == "compact":
            problems.append(
                "model.tool_prompt is 'compact' (no parameter descriptions, required flags, "
                "enums or nested schemas); BFCL shows the full function docs: use 'schema'"
            )
        if config.agent.hints.enabled:
            problems.append("agent.hints.enabled adds text BFCL never shows: set it false")
        if config.agent.max_steps_per_user_turn != self.options.max_steps_per_turn:
            problems.append(
                f"agent.max_steps_per_user_turn is {config.agent.max_steps_per_user_turn}; "
                f"BFCL allows {self.options.max_steps_per_turn} steps per user turn"
            )
        if not self.options.malformed_call_ends_turn:
            problems.append("malformed_call_ends_turn is off; in BFCL a bad reply ends the turn")
        return problems

    def entries(self, split: str) -> list[Entry]:
        """Every entry of the chosen categories in `split` (every one with `whole_set`), in
        dataset order."""
        check_split(split)
        return [
            entry
            for category in self.options.categories
            for entry in load_category(category)
            if self.options.whole_set or split_of(f"bfcl/multi_turn/{entry.scenario}") == split
        ]

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` entries of `split` in an order fixed by `seed` (a larger `n` extends a smaller
        one); `ValueError` when the split holds fewer."""
        pool = shuffled_pool(
            self.name,
            self.entries(split),
            n,
            seed,
            split,
            lambda held: (
                f"task family 'bfcl' has {held} '{split}' instances in categories "
                f"{self.options.categories}; asked for {n}"
            ),
        )
        return [self._task(entry, split, index) for index, entry in enumerate(pool)]

    def _task(self, entry: Entry, split: str, index: int) -> Task:
        return instance_task(
            self.name, split, index, opening(SYSTEM_PROMPT, entry.turns[0]), entry.to_data()
        )

    def tools(self) -> ToolRegistry:
        """Every function of every simulator class (instances use `tools_for`)."""
        return ToolRegistry(
            SimulatorTool(doc) for cls in simulator_classes() for doc in function_docs(cls)
        )

    def tools_for(self, task: Task) -> ToolRegistry:
        """The functions of the task's classes; held-out ones hidden from the prompt."""
        entry = Entry.from_data(task.data)
        hidden = [name for names in entry.missed.values() for name in names]
        return BfclRegistry(
            (SimulatorTool(doc) for cls in entry.classes for doc in function_docs(cls)), hidden
        )

    async def make_runtime(self, task: Task) -> Runtime:
        """Fresh simulator instances loaded with the entry's initial config."""
        return BfclRuntime(Entry.from_data(task.data))

    async def user_turn(self, task: Task, runtime: Runtime | None, reply: str) -> str | None:
        """End the turn in progress; the next turn's user message, or None after the last."""
        return _bfcl_runtime(runtime).end_turn()

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """BFCL's verdict on the executed instances, with BFCL's step limit per turn."""
        verdict = self._verdict(task, runtime, _steps_per_turn(trajectory))
        return Grade(
            reward=1.0 if verdict.valid else 0.0,
            breakdown={
                "valid": float(verdict.valid),
                "turns_passed": verdict.turns_passed / max(1, verdict.turns_checked),
            },
            records=[{"role": "bfcl_check", "content": json.dumps(_verdict_record(verdict))}],
        )

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """BFCL's verdict from the runtime alone (for callers without a trajectory, such as
        the gateway; the step limit needs the trajectory and is not applied)."""
        return 1.0 if self._verdict(task, runtime, []).valid else 0.0

    def _verdict(self, task: Task, runtime: Runtime, steps: list[int]) -> Verdict:
        return check(
            Entry.from_data(task.data),
            _bfcl_runtime(runtime),
            steps,
            self.options.max_steps_per_turn,
        )

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """Per turn, the ground truth's calls (named arguments), one a reply, and then a plain
        reply; a turn with more calls than `max_steps_per_turn` makes them all in one reply
        (BFCL's parallel calls: two long_context entries have 34 in one turn)."""
        entry = Entry.from_data(task.data)
        steps: list[ToolCall] = []
        for texts in entry.answer:
            calls = []
            for text in texts:
                parsed = parse_call(text)
                owner = owner_of(parsed.name, entry.classes)
                calls.append(ToolCall(name=parsed.name, arguments=named_arguments(owner, parsed)))
            steps.extend(
                calls if len(calls) <= self.options.max_steps_per_turn else [several(calls)]
            )
            steps.append(say(DONE_REPLY))
        return steps


def _bfcl_runtime(runtime: Runtime | None) -> BfclRuntime:
    if not isinstance(runtime, BfclRuntime):
        raise RuntimeFailure(f"a bfcl rollout needs a BfclRuntime, got {type(runtime).__name__}")
    return runtime


def _steps_per_turn(trajectory: Trajectory) -> list[int]:
    """Tool-calling replies per user turn, read from the loop's record of the conversation."""
    steps: list[int] = []
    for message in trajectory.messages:
        if message.get("role") == "user" and not message.get("_hint"):  # a hint is no new turn
            steps.append(0)
        elif message.get("role") == "assistant" and message.get("_tool_calls") and steps:
            steps[-1] += 1
    return steps


def _verdict_record(verdict: Verdict) -> dict[str, Any]:
    return {
        "valid": verdict.valid,
        "error_type": verdict.error_type,
        "message": verdict.message[:500],
        "turns_passed": verdict.turns_passed,
        "turns_checked": verdict.turns_checked,
    }


__all__ = ["BfclFamily", "BfclOptions", "BfclRegistry", "SimulatorTool", "UnknownFunction"]
