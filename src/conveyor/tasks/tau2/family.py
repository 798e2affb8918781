"""tau2-bench's airline (50 tasks) and retail (114 tasks) customer-service domains as a
conversational task family.

The agent serves a simulated customer under the domain's policy, with the domain's tools over a
private copy of its database. The customer is a chat model (`services.user()`, from
`tasks.user_engine`) prompted with tau2-bench's user guidelines and the task's scenario; it ends
the conversation with ``###STOP###`` (or ``###TRANSFER###`` / ``###OUT-OF-SCOPE###``). An empty
reply from the agent also ends it, and so does the user-turn budget.

Reward, as tau2-bench (inspect-evals' airline and retail scorers) grades these domains: 1.0 when
the final database equals the database the task's reference actions produce (a canonical hash of
the records that differ from the initial database)
AND every `communicate_info` string occurs in what the agent said to the customer (lowercased,
commas dropped), else 0.0. The breakdown holds both parts. Tasks that neither change the database
nor require information (refusals, which tau2-bench judges by natural-language assertions) would
reward doing nothing, so they are left out unless `include_unverifiable` is set, or a judge model
is configured (`judge`): then those with `nl_assertions` are served and their reward also
requires every assertion judged met (tau2-bench's NL_ASSERTION basis, `judge_assertions`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from conveyor.agent.chat_client import ChatClient, EndpointChatClient
from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import ToolContext, ToolRegistry
from conveyor.config import ConveyorConfig, RuntimeConfig
from conveyor.config.sections import RUN_ENGINE
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.selection import started
from conveyor.tasks.family import (
    FamilyServices,
    Grade,
    check_split,
    family_options,
    instance_task,
    opening,
    register_family,
    runtime_choice,
    say,
    shuffled_pool,
)
from conveyor.tasks.tau2 import airline, data, retail
from conveyor.tasks.tau2.common import Tau2Runtime
from conveyor.types import Message, Status, Task, ToolCall, Trajectory

Domain = Literal["airline", "retail"]
STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
GREETING = "Hi! How can I help you today?"
# The customer's first message, fixed so that a task's prompt needs no model; the user model
# sees it as its own opening line and goes on from the agent's answer to it.
OPENING = "Hi!"
BEGIN = (
    "Begin the interaction. Remember you are the customer, and you are interacting with a "
    "customer service agent."
)
# Tasks whose every database-changing reference action is refused by the original tools (so the
# expected database is the initial one) and that require no information: nothing to verify.
# The test suite checks this list against the recorded original results.
_REFUSED_WRITES = {"retail": frozenset({"12", "105"}), "airline": frozenset[str]()}
_TOOLS = {tools.domain: tools for tools in (airline.AIRLINE, retail.RETAIL)}
_SPLIT_SALT = "tau2/eval-or-test/"


def _all_domains() -> list[Domain]:
    return ["airline", "retail"]


class UserEndpoint(BaseModel):
    """`tasks.options.tau2.user`: the simulated customer on an OpenAI-compatible endpoint."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="The endpoint's URL, e.g. https://api.openai.com/v1.")
    model: str = Field(description="The model name the endpoint serves, e.g. gpt-4.1.")
    api_key_env: str | None = Field(
        default=None,
        description="The environment variable holding the API key (none: no key is sent).",
    )
    timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="Wall-time limit of one customer reply; past it the rollout is an "
        "infrastructure error.",
    )
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature.")
    max_tokens: int = Field(default=1024, gt=0, description="Longest customer reply, in tokens.")

    def client(self) -> EndpointChatClient:
        """A chat client of this endpoint (the customer's, or the judge's)."""
        return EndpointChatClient(
            self.base_url,
            self.model,
            api_key_env=self.api_key_env,
            timeout_s=self.timeout_s,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
        )


class JudgeEndpoint(UserEndpoint):
    """`tasks.options.tau2.judge`: the model judging natural-language assertions, on an
    OpenAI-compatible endpoint."""

    max_tokens: int = Field(default=2048, gt=0, description="Longest judge reply, in tokens.")


class Tau2Options(BaseModel):
    """`tasks.options.tau2`."""

    model_config = ConfigDict(extra="forbid")

    domains: list[Domain] = Field(
        default_factory=_all_domains, min_length=1, description="Domains served."
    )
    user: UserEndpoint | None = Field(
        default=None,
        description="The simulated customer on an OpenAI-compatible endpoint (base_url, model, "
        "api_key_env); none: tasks.user_engine plays it.",
    )
    judge: JudgeEndpoint | None = Field(
        default=None,
        description="The judge of natural-language assertions (base_url, model, api_key_env, "
        "timeout_s): with one, the tasks tau2-bench grades by NL assertions (nothing to change, "
        "no information to give) are served and each assertion is judged met or not; all met "
        "is required. A judge failure is an infrastructure error. null: those tasks are dropped "
        "(unless include_unverifiable).",
    )
    max_user_turns: int | None = Field(
        default=10,
        gt=0,
        description="Most replies of the simulated user in one rollout; null: no cap but the "
        "agent's budgets (tau2-bench has none).",
    )
    include_unverifiable: bool = Field(
        default=False,
        description="Also serve tasks that change nothing and require no information (an "
        "agent that does nothing scores 1.0 on them, as in tau2-bench's own scoring).",
    )
    max_foreign_info: int | None = Field(
        default=2,
        ge=0,
        description="Most required-info strings of OTHER tasks the agent may say although no "
        "tool output and not the customer's scenario holds them; more fails the info check. "
        "null: no such rule (tau2-bench has none).",
    )
    upstream_split: Literal["test", "all"] | None = Field(
        default=None,
        description="Serve tau2-bench's own split whatever split is asked: 'test' (its whole "
        "test split, our eval and test halves together: 60 tasks) or 'all' (every task: 164, "
        "training ones included); for evaluation only. null: our train/eval/test splits.",
    )
    benchmark: bool = Field(
        default=False,
        description="Benchmark mode: refuse settings that make the number incomparable with "
        "tau2-bench's (the embedded or the policy's own model as the customer, compact tool "
        "prompt, hints, user-turn caps, dropped tasks, the foreign-info rule) unless "
        "allow_incomparable is set.",
    )
    allow_incomparable: bool = Field(
        default=False,
        description="With benchmark: only mark the run NOT COMPARABLE, do not refuse.",
    )


@dataclass(frozen=True)
class _Source:
    """One task of tau2-bench, as the family serves it."""

    domain: str
    source_id: str
    record: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.domain}/{self.source_id}"

    @property
    def actions(self) -> list[dict[str, Any]]:
        return list(self.record["evaluation_criteria"].get("actions") or [])

    @property
    def info(self) -> list[str]:
        return [str(i) for i in self.record["evaluation_criteria"].get("communicate_info") or []]

    @property
    def nl_assertions(self) -> list[str]:
        return [str(a) for a in self.record["evaluation_criteria"].get("nl_assertions") or []]


def verifiable(source: _Source) -> bool:
    """Whether doing nothing fails the task: it requires information, or a reference action
    that the original tools accept changes the database."""
    if source.info:
        return True
    writes = _TOOLS[source.domain].writes
    if source.source_id in _REFUSED_WRITES[source.domain]:
        return False
    return any(action["name"] in writes for action in source.actions)


def split_of_source(source: _Source) -> str:
    """tau2-bench's train tasks are ours; its test tasks are halved into eval and test: ranked
    by a hash of their key within their domain, alternately (so each domain has both)."""
    if data.source_splits(source.domain)[source.source_id] == "train":
        return "train"
    return _eval_or_test(source.domain)[source.source_id]


@functools.cache
def _eval_or_test(domain: str) -> dict[str, str]:
    held_out = [i for i, split in data.source_splits(domain).items() if split == "test"]
    ranked = sorted(
        held_out, key=lambda i: hashlib.sha256(f"{_SPLIT_SALT}{domain}/{i}".encode()).hexdigest()
    )
    return {i: ("eval" if rank % 2 == 0 else "test") for rank, i in enumerate(ranked)}


def sources(domain: str) -> list[_Source]:
    """Every task of a domain, in tasks.json order."""
    return [_Source(domain, str(r["id"]), r) for r in data.raw_tasks(domain)]


def scenario_text(record: dict[str, Any]) -> str:
    """The user scenario as tau2-bench writes it for the user simulator."""
    scenario = record["user_scenario"]
    lines: list[str] = []
    if scenario.get("persona"):
        lines += ["Persona:", _indent(scenario["persona"])]
    instructions = scenario["instructions"]
    if isinstance(instructions, str):
        body = instructions
    else:
        parts = [
            f"Domain: {instructions['domain']}",
            f"Reason for call:\n{_indent(instructions['reason_for_call'])}",
        ]
        if instructions.get("known_info") is not None:
            parts.append(f"Known info:\n{_indent(instructions['known_info'])}")
        if instructions.get("unknown_info") is not None:
            parts.append(f"Unknown info:\n{_indent(instructions['unknown_info'])}")
        parts.append(f"Task instructions:\n{_indent(instructions['task_instructions'])}")
        body = "\n".join(parts)
    lines += ["Instructions:", _indent(body)]
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join(f"\t{line}" if line.strip() else line for line in text.split("\n"))


def user_system_prompt(record: dict[str, Any]) -> str:
    """The simulated user's system prompt: tau2-bench's guidelines and the task's scenario."""
    return f"{data.user_guidelines()}\n<scenario>\n{scenario_text(record)}\n</scenario>\n"


def agent_system_prompt(domain: str) -> str:
    """The agent's system prompt: how to talk and call tools, then the domain's policy."""
    example = format_tool_call(
        ToolCall(name="calculate", arguments={"expression": "(120 + 80) * 2"}), "hermes"
    )
    return (
        "You are a customer service agent. Help the customer according to the policy below.\n"
        "Each turn, do exactly one of these:\n"
        "- reply to the customer in plain text (no tool call), or\n"
        "- call one tool, exactly like this:\n"
        f"{example}\n"
        "and wait for its result. The customer sees only your plain-text replies, never tool "
        "calls or their results. An empty reply ends the conversation.\n"
        "<policy>\n"
        f"{data.policy(domain)}\n"
        "</policy>"
    )


def heard_text(heard: list[str]) -> str:
    """What the customer heard, as tau2-bench compares it: lowercased, commas dropped."""
    return "\n".join(heard).lower().replace(",", "")


def _mentions(text: str, needle: str) -> bool:
    """`needle` in `text` as a whole token (not inside a longer word or number)."""
    pattern = rf"(?<![a-z0-9.]){re.escape(needle)}(?![a-z0-9]|\.[0-9])"
    return re.search(pattern, text) is not None


@register_family(options=Tau2Options)
class Tau2Family:
    """tau2-bench airline and retail; tools per domain, a simulated customer, DB + info reward.

    `Task.data`: `domain`, `source_id` (tau2's task id), `actions` (the reference actions),
    `communicate_info`, `user_system` (the simulated user's system prompt).
    """

    name = "tau2"
    splits = ("train", "eval", "test")
    source = f"tau2-bench airline+retail via inspect-evals=={data.PACKAGE_VERSION}"
    version = data.PACKAGE_VERSION
    runtimes: tuple[str, ...] = ("simulated",)

    def __init__(
        self, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
    ) -> None:
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)
        self.services = services if services is not None else FamilyServices()
        self.options = family_options(self.name, Tau2Options, self.services.options)
        self._user: ChatClient | None = None
        self._judge: EndpointChatClient | None = None

    # -- instances ------------------------------------------------------------------------
    def served(self, split: str) -> list[_Source]:
        """The tasks of `split` this family serves, in a fixed order (with `upstream_split`,
        tau2-bench's own test split or every task)."""
        return [
            source
            for source in self._in_split(split)
            if self.options.include_unverifiable or verifiable(source) or self.judged(source)
        ]

    def judged(self, source: _Source) -> bool:
        """Whether the source's reward basis includes its NL assertions: a judge is configured
        and the task has nothing else to verify (no information, no database change)."""
        return (
            self.options.judge is not None and bool(source.nl_assertions) and not verifiable(source)
        )

    def dropped(self, split: str) -> list[str]:
        """The tasks of `split` left out (unverifiable ones without `include_unverifiable`),
        as `domain/id`: a report lists them."""
        served = {source.key for source in self.served(split)}
        return [source.key for source in self._in_split(split) if source.key not in served]

    def _in_split(self, split: str) -> list[_Source]:
        check_split(split, self.splits)
        return [
            source
            for domain in self.options.domains
            for source in sources(domain)
            if (
                split_of_source(source) == split
                if self.options.upstream_split is None
                else self.options.upstream_split == "all"
                or data.source_splits(domain)[source.source_id] == "test"
            )
        ]

    def config_problems(self, config: ConveyorConfig) -> list[str]:
        """What in `config` makes the pass rate incomparable with tau2-bench's: reported (one
        NOT COMPARABLE line each) in every run, refused in benchmark mode unless
        `allow_incomparable` (see `conveyor.app.compose.refuse_incomparable`)."""
        problems = []
        if self.options.user is None:
            side = config.tasks.user_engine
            if side.engine == RUN_ENGINE:
                problems.append(
                    "the policy plays its own customer (tasks.user_engine.engine: run); set "
                    "tasks.options.tau2.user to a capable model's endpoint"
                )
            elif side.model is None:
                problems.append(
                    "the customer is the embedded SmolLM2-135M, which cannot play one; set "
                    "tasks.options.tau2.user to a capable model's endpoint"
                )
        if not self.options.benchmark:
            return problems
        if config.model.tool_prompt == "compact":
            problems.append("model.tool_prompt is 'compact'; tau2-bench shows full tool schemas")
        if config.agent.hints.enabled:
            problems.append("agent.hints.enabled adds text tau2-bench never shows")
        if self.options.max_user_turns is not None:
            problems.append(f"max_user_turns caps the customer at {self.options.max_user_turns}")
        if not self.options.include_unverifiable:
            problems.append("include_unverifiable is off: tasks tau2-bench grades are dropped")
        if self.options.max_foreign_info is not None:
            problems.append("max_foreign_info adds a rule tau2-bench's scoring does not have")
        if self.options.judge is not None:
            problems.append(
                "judge adds the NL-assertion basis; tau2-bench's default basis is DB + COMMUNICATE"
            )
        return problems

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct tasks of `split` in a seeded order (a larger `n` extends a smaller)."""
        pool = shuffled_pool(
            self.name,
            self.served(split),
            n,
            seed,
            split,
            lambda held: (
                f"task family 'tau2' has only {held} '{split}' tasks in "
                f"{'+'.join(self.options.domains)}, {n} asked"
            ),
        )
        return [self._task(source, split, index) for index, source in enumerate(pool)]

    def task_of(self, domain: str, source_id: str, split: str = "eval", index: int = 0) -> Task:
        """The task built from tau2's task `source_id` of `domain`, whatever its split (for
        tests and debugging; `make_tasks` is what runs use)."""
        for source in sources(domain):
            if source.source_id == source_id:
                return self._task(source, split, index)
        raise KeyError(f"tau2 {domain} has no task {source_id!r}")

    def _task(self, source: _Source, split: str, index: int) -> Task:
        return instance_task(
            self.name,
            split,
            index,
            opening(agent_system_prompt(source.domain), OPENING),
            {
                "domain": source.domain,
                "source_id": source.source_id,
                "actions": source.actions,
                "communicate_info": source.info,
                "user_system": user_system_prompt(source.record),
                "nl_assertions": source.nl_assertions if self.judged(source) else [],
            },
        )

    # -- tools and runtime --------------------------------------------------------------
    def tools(self) -> ToolRegistry:
        """Every tool of every served domain (a rollout sees only its domain's: `tools_for`)."""
        seen: dict[str, Any] = {}
        for domain in self.options.domains:
            for item in _TOOLS[domain].tools:
                seen.setdefault(item.name, item)
        return ToolRegistry(seen.values())

    def tools_for(self, task: Task) -> ToolRegistry:
        """The tools of the task's domain."""
        registry: ToolRegistry = _TOOLS[task.data["domain"]].registry()
        return registry

    async def make_runtime(self, task: Task) -> Runtime:
        """A started runtime holding a fresh copy of the domain's database."""
        runtime = Tau2Runtime(task.data["domain"], data.load_db(task.data["domain"]))
        return await started(runtime)

    # -- the simulated customer ---------------------------------------------------------
    def user_client(self) -> ChatClient:
        """The simulated customer's chat client (`user`, else `tasks.user_engine`), built on
        first use."""
        if self._user is None and self.options.user is not None:
            endpoint = self.options.user
            self._user = endpoint.client()
        if self._user is None:
            if self.services.user is None:
                raise RuntimeFailure(
                    "the tau2 family needs a user model: set tasks.user_engine (a run builds "
                    "one by default)"
                )
            self._user = self.services.user()
        return self._user

    async def user_turn(self, task: Task, runtime: Runtime | None, reply: str) -> str | None:
        """The customer's answer to the agent's text `reply`; None ends the conversation (an
        empty reply, a stop token, or the user-turn budget spent). A user model that fails or
        times out is an infrastructure error of this rollout (`RuntimeFailure`)."""
        world = _world(runtime)
        world.heard.append(reply)
        if not reply.strip():
            return None
        cap = self.options.max_user_turns
        if cap is not None and world.user_turns >= cap:
            return None
        if not world.user_messages:
            world.user_messages = [
                {"role": "system", "content": task.data["user_system"]},
                {"role": "user", "content": BEGIN},
                {"role": "assistant", "content": OPENING},
            ]
        world.user_messages.append({"role": "user", "content": reply})
        try:
            said = (await self.user_client().reply(list(world.user_messages))).strip()
        except RuntimeFailure:
            raise
        except Exception as error:  # the user model's failure, never the policy's
            raise RuntimeFailure(f"tau2: the user model failed: {error}") from error
        world.user_messages.append({"role": "assistant", "content": said})
        world.user_turns += 1
        if any(token in said for token in STOP_TOKENS):
            return None
        return said

    # -- grading ------------------------------------------------------------------------
    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """Database match and required information, each 0/1; the reward is their AND."""
        outputs = [str(m.get("content") or "") for m in trajectory.messages if m["role"] == "tool"]
        grade = await self.judge(task, _world(runtime), outputs)
        if trajectory.status in (Status.TRUNCATED, Status.TIMEOUT):
            # tau2-bench: a conversation neither the agent nor the customer ended scores 0
            record = {"unfinished": f"{trajectory.status.value} ({trajectory.stop_reason})"}
            return Grade(
                reward=0.0,
                breakdown=grade.breakdown,
                records=[*grade.records, {"role": "tau2_grade", "content": json.dumps(record)}],
            )
        return grade

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """The reward of `grade` without a trajectory (no tool output grounds a value)."""
        return (await self.judge(task, _world(runtime), [])).reward

    async def judge(self, task: Task, world: Tau2Runtime, tool_outputs: list[str]) -> Grade:
        """The grade of a finished rollout's world; `tool_outputs` are what the agent's tool
        calls returned (values seen there may be said without counting as guesses)."""
        domain = task.data["domain"]
        final = data.state_digest(world.db, domain)
        expected = await expected_digest(domain, task.data["source_id"])
        text = heard_text(world.heard)
        missing = [info for info in task.data["communicate_info"] if info.lower() not in text]
        foreign = self._foreign_said(task, world, text, tool_outputs)
        db_ok = final == expected
        limit = self.options.max_foreign_info
        info_ok = not missing and (limit is None or len(foreign) <= limit)
        record: dict[str, Any] = {
            "db_changes_digest": final,
            "expected_db_changes_digest": expected,
            "missing_info": missing,
            "foreign_info_said": foreign,
        }
        breakdown = {"db": float(db_ok), "info": float(info_ok)}
        assertions = list(task.data.get("nl_assertions") or [])
        nl_ok = True
        if assertions:
            met = await self.judge_assertions(assertions, conversation(world))
            nl_ok = all(met)
            record["nl_assertions_met"] = dict(zip(assertions, met, strict=True))
            breakdown["nl"] = float(nl_ok)
        return Grade(
            reward=1.0 if db_ok and info_ok and nl_ok else 0.0,
            breakdown=breakdown,
            records=[{"role": "tau2_grade", "content": json.dumps(record, sort_keys=True)}],
        )

    def judge_client(self) -> EndpointChatClient:
        """The judge's chat client (`judge`), built on first use."""
        endpoint = self.options.judge
        if endpoint is None:
            raise RuntimeFailure("tau2: a task with NL assertions needs tasks.options.tau2.judge")
        if self._judge is None:
            self._judge = endpoint.client()
        return self._judge

    async def judge_assertions(self, assertions: list[str], transcript: str) -> list[bool]:
        """Whether each assertion is met by the conversation, as tau2-bench's NL assertion
        evaluator asks: one request listing them, a JSON `results` list of
        `{expectedOutcome, reasoning, metExpectation}` back. Any failure of the judge (no
        reply, a timeout, an answer that is not that JSON) is an infrastructure error of the
        rollout (`RuntimeFailure`), never a 0."""
        listed = "\n".join(f"- {a}" for a in assertions)
        messages: list[Message] = [
            {"role": "system", "content": NL_JUDGE_SYSTEM},
            {
                "role": "user",
                "content": f"conversation:\n{transcript}\n\nexpectedOutcomes:\n{listed}",
            },
        ]
        try:
            answer = await self.judge_client().reply(messages)
            met = _judge_verdicts(answer, len(assertions))
        except RuntimeFailure:
            raise
        except Exception as error:  # the judge's failure, never the policy's
            raise RuntimeFailure(f"tau2: the NL-assertion judge failed: {error}") from error
        return met

    def _foreign_said(
        self, task: Task, world: Tau2Runtime, text: str, tool_outputs: list[str]
    ) -> list[str]:
        """Required-info strings of other tasks of the domain that the agent said although
        neither a tool output nor the customer's scenario holds them: naming every candidate
        answer is not knowing which one is right."""
        own = {info.lower() for info in task.data["communicate_info"]}
        # The customer's scenario, not its replies: a user model may echo what it was told.
        grounded = "\n".join([task.data["user_system"], *tool_outputs]).lower()
        return sorted(
            info
            for info in domain_info(task.data["domain"])
            if info not in own
            and _mentions(text, info)
            and not _mentions(grounded.replace(",", ""), info)
        )

    # -- oracle ---------------------------------------------------------------------------
    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """Greet, replay the reference actions, tell the required information, then end."""
        info = task.data["communicate_info"]
        closing = (
            "Here is what you asked about: " + "; ".join(info) + "."
            if info
            else "Your request has been handled."
        )
        actions = [
            ToolCall(name=action["name"], arguments=dict(action["arguments"]))
            for action in task.data["actions"]
        ]
        return [say(GREETING), *actions, say(closing), say("")]


NL_JUDGE_SYSTEM = """TASK
- You will be given a list of expected outcomes and a conversation that was collected during \
a test case run.
- The conversation is between a customer service agent and a customer.
- Your job is to evaluate whether the agent satisfies each of the expected outcomes.
- Grade each expected outcome individually.

FORMAT
- Your response should be a JSON object with the following fields:
- `reasoning`: a short explanation for your classification
- `metExpectation`: `true` if the agent satisfies the expected outcomes, `false` otherwise
- `expectedOutcome`: repeat the expectation from the input that you are grading

Example response structure:
{"results": [{"expectedOutcome": "<one expected outcome>", "reasoning": "<reasoning>", \
"metExpectation": <false or true>}]}"""


def conversation(world: Tau2Runtime) -> str:
    """The conversation the judge reads: the customer's lines and the agent's replies, in
    order (tool calls and their results are not part of it)."""
    customer = [OPENING] + [
        str(m["content"]) for m in world.user_messages[3:] if m["role"] == "assistant"
    ]
    lines: list[str] = []
    for index in range(max(len(customer), len(world.heard))):
        if index < len(customer):
            lines.append(f"user: {customer[index]}")
        if index < len(world.heard) and world.heard[index].strip():
            lines.append(f"assistant: {world.heard[index]}")
    return "\n".join(lines)


def _judge_verdicts(answer: str, count: int) -> list[bool]:
    """The `metExpectation` of each of `count` results in the judge's JSON answer (a fenced
    block allowed); `ValueError` for anything else."""
    text = answer.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    results = json.loads(text)["results"]
    if not isinstance(results, list) or len(results) != count:
        raise ValueError(f"the judge answered {len(results)} results for {count} assertions")
    met = [r.get("metExpectation") if isinstance(r, dict) else None for r in results]
    if not all(isinstance(m, bool) for m in met):
        raise ValueError(f"a result without a boolean metExpectation: {results!r}")
    return [bool(m) for m in met]


def _world(runtime: Runtime | None) -> Tau2Runtime:
    if not isinstance(runtime, Tau2Runtime):
        raise RuntimeFailure(f"a tau2 rollout needs its tau2 runtime, got {runtime!r}")
    return runtime


@functools.cache
def domain_info(domain: str) -> frozenset[str]:
    """Every required-info string of the domain's tasks, lowercased, commas dropped."""
    return frozenset(
        info.lower().replace(",", "") for source in sources(domain) for info in source.info
    )


_EXPECTED: dict[tuple[str, str], str] = {}


async def expected_digest(domain: str, source_id: str) -> str:
    """The `state_digest` of the database after the task's reference actions, replayed with
    our tools as inspect-evals' `get_expected_db` replays them with the originals (cached)."""
    key = (domain, source_id)
    if key not in _EXPECTED:
        source = next(s for s in sources(domain) if s.source_id == source_id)
        _EXPECTED[key] = data.state_digest(await replay(domain, source.actions), domain)
    return _EXPECTED[key]


async def replay(domain: str, actions: list[dict[str, Any]]) -> dict[str, Any]:
    """A fresh database after `actions`, each run through the tool registry (arguments
    validated as a model's would be); refused actions leave it as they find it."""
    registry = _TOOLS[domain].registry()
    world = Tau2Runtime(domain, data.load_db(domain))
    ctx = ToolContext(task=_REPLAY_TASK, runtime=world)
    for action in actions:
        call = ToolCall(name=action["name"], arguments=dict(action["arguments"]))
        await registry.execute(call, ctx, timeout_s=60.0, max_output_chars=10**9)
    return world.db


_REPLAY_TASK = Task(id="tau2-replay", family="tau2", prompt=[], data={})
