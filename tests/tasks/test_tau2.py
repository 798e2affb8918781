"""tau2 (airline + retail): instances and splits, the ported tools against the original tools'
recorded results, the simulated customer, the DB + info grade, the oracle and empty policies
through the real loop, and reward attacks.

The simulated customer is a scripted `ChatClient` (`ScriptedCustomer`): only the user model is
faked; the loop, tools, runtime and grader are the real ones.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext, ToolOutcome
from conveyor.runtime.base import RuntimeFailure
from conveyor.tasks.family import SAY, FamilyServices, Grade, get_family, say
from conveyor.tasks.tau2 import data
from conveyor.tasks.tau2.common import Tau2Runtime, arithmetic
from conveyor.tasks.tau2.family import (
    STOP_TOKENS,
    Tau2Family,
    _mentions,
    domain_info,
    expected_digest,
    sources,
    split_of_source,
    verifiable,
)
from conveyor.types import Message, Task, ToolCall, Trajectory

T = TypeVar("T")
FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "tau2" / "expected_db.json").read_text()
)


class ScriptedCustomer:
    """A scripted stand-in for the user model: states its request once, then says it is done
    (###STOP###). Records every conversation it was shown."""

    def __init__(self, request: str = "I need help with my booking.") -> None:
        self.request = request
        self.seen: list[list[Message]] = []

    async def reply(self, messages: list[Message]) -> str:
        self.seen.append([dict(m) for m in messages])
        agent_lines = [m for m in messages if m["role"] == "user"][1:]  # after BEGIN
        return self.request if len(agent_lines) <= 1 else "Thanks, that's all. ###STOP###"


def family(customer: ScriptedCustomer | None = None, **options: Any) -> Tau2Family:
    user = customer if customer is not None else ScriptedCustomer()
    built = get_family("tau2", services=FamilyServices(options=options, user=lambda: user))
    assert isinstance(built, Tau2Family)
    return built


FAMILY = family()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def act(task: Task, calls: list[ToolCall]) -> tuple[list[ToolOutcome], Tau2Runtime]:
    """Run `calls` through the task's tool registry against a fresh runtime."""
    registry = FAMILY.tools_for(task)
    runtime = await FAMILY.make_runtime(task)
    assert isinstance(runtime, Tau2Runtime)
    ctx = ToolContext(task=task, runtime=runtime)
    outcomes = [
        await registry.execute(call, ctx, timeout_s=30.0, max_output_chars=100_000)
        for call in calls
    ]
    return outcomes, runtime


def actions_of(task: Task) -> list[ToolCall]:
    return [ToolCall(name=a["name"], arguments=a["arguments"]) for a in task.data["actions"]]


def grade(
    task: Task, runtime: Tau2Runtime, said: list[str], outputs: tuple[str, ...] = ()
) -> Grade:
    runtime.heard.extend(said)
    messages: list[Message] = [{"role": "tool", "content": o} for o in outputs]
    return run(FAMILY.grade(task, Trajectory(task_id=task.id, messages=messages), runtime))


# -- instances and splits --------------------------------------------------------------------


def test_make_tasks_is_deterministic_and_a_larger_n_extends_a_smaller() -> None:
    first = FAMILY.make_tasks(8, 3, "train")
    assert [t.model_dump() for t in first] == [
        t.model_dump() for t in FAMILY.make_tasks(8, 3, "train")
    ]
    longer = FAMILY.make_tasks(12, 3, "train")
    assert [t.data["source_id"] for t in longer[:8]] == [t.data["source_id"] for t in first]
    other = FAMILY.make_tasks(8, 4, "train")
    assert [t.data["source_id"] for t in other] != [t.data["source_id"] for t in first]


def test_splits_are_disjoint_follow_tau2s_own_split_and_eval_holds_twenty() -> None:
    keys = {
        split: {f"{s.domain}/{s.source_id}" for s in FAMILY.served(split)}
        for split in FAMILY.splits
    }
    assert not keys["train"] & keys["eval"] and not keys["train"] & keys["test"]
    assert not keys["eval"] & keys["test"]
    assert len(keys["eval"]) >= 20 and len(keys["test"]) >= 20
    for split in FAMILY.splits:
        for source in FAMILY.served(split):
            theirs = data.source_splits(source.domain)[source.source_id]
            assert (theirs == "train") == (split == "train")
    with pytest.raises(ValueError, match="only 27 'eval' tasks"):
        FAMILY.make_tasks(28, 0, "eval")
    with pytest.raises(ValueError, match="unknown split"):
        FAMILY.make_tasks(1, 0, "dev")


def test_the_data_are_all_164_tasks() -> None:
    assert len(sources("airline")) == 50 and len(sources("retail")) == 114
    served = sum(len(FAMILY.served(split)) for split in FAMILY.splits)
    everything = family(include_unverifiable=True)
    assert sum(len(everything.served(split)) for split in everything.splits) == 164
    assert served == 164 - 26  # 19 airline and 7 retail tasks change nothing and say nothing


def test_served_tasks_are_exactly_those_that_doing_nothing_fails() -> None:
    # From the original tools' recorded results: the expected DB differs from the initial one,
    # or information is required.
    for domain in data.DOMAINS:
        recorded = FIXTURE["domains"][domain]
        for source in sources(domain):
            changed = recorded["tasks"][source.source_id]["hash"] != recorded["initial_hash"]
            assert verifiable(source) == (changed or bool(source.info)), source.key


def test_required_information_can_be_said() -> None:
    # tau2 drops commas from what the agent said before matching: an info string with a comma
    # could never match.
    for domain in data.DOMAINS:
        for source in sources(domain):
            assert all("," not in info for info in source.info), source.key


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"tasks.options.tau2: max_user_turn: Extra inputs"):
        family(max_user_turn=3)
    with pytest.raises(ValueError, match=r"tasks.options.tau2: domains.0"):
        family(domains=["telecom"])
    only_airline = family(domains=["airline"])
    assert {t.data["domain"] for t in only_airline.make_tasks(5, 0, "eval")} == {"airline"}
    assert (
        "book_reservation" in only_airline.tools()
        and "get_order_details" not in only_airline.tools()
    )


def test_the_prompt_carries_the_policy_and_the_tool_call_format() -> None:
    task = FAMILY.task_of("airline", "2")
    system = task.prompt[0]["content"]
    assert "<policy>" in system and "Airline Agent Policy" in system
    assert '<tool_call>\n{"name": "calculate"' in system
    assert task.prompt[1] == {"role": "user", "content": "Hi!"}
    # the scenario is the user model's, never the agent's
    assert "emma_kim_9957" not in system and "<scenario>" in task.data["user_system"]


# -- tools ----------------------------------------------------------------------------------


def test_reads_show_records_and_writes_change_only_the_rollouts_copy() -> None:
    task = FAMILY.task_of("airline", "2")
    calls = [
        ToolCall(name="get_reservation_details", arguments={"reservation_id": "EHGLP3"}),
        ToolCall(name="cancel_reservation", arguments={"reservation_id": "EHGLP3"}),
    ]
    (details, cancelled), runtime = run(act(task, calls))
    assert details.kind == "ok" and json.loads(details.output)["reservation_id"] == "EHGLP3"
    assert json.loads(cancelled.output)["status"] == "cancelled"
    assert runtime.db["reservations"]["EHGLP3"]["status"] == "cancelled"
    fresh = run(FAMILY.make_runtime(task))
    assert "status" not in fresh.db["reservations"]["EHGLP3"]  # type: ignore[attr-defined]
    assert data.base_db("airline") == data.load_db("airline")  # the shared copy is untouched


@pytest.mark.parametrize(
    ("domain", "call", "kind", "message"),
    [
        (
            "airline",
            ToolCall(name="get_user_details", arguments={"user_id": "nobody"}),
            "raised",
            "Error: ToolError: User nobody not found",
        ),
        (
            "airline",
            ToolCall(
                name="book_reservation",
                arguments={
                    "user_id": "mia_li_3668",
                    "origin": "JFK",
                    "destination": "SEA",
                    "flight_type": "one_way",
                    "cabin": "economy",
                    "flights": "HAT136",
                    "passengers": [],
                    "payment_methods": [],
                    "total_baggages": 0,
                    "nonfree_baggages": 0,
                    "insurance": "no",
                },
            ),
            "invalid_arguments",
            "argument 'flights'",
        ),
        (
            "airline",
            ToolCall(
                name="send_certificate", arguments={"user_id": "mia_li_3668", "amount": "lots"}
            ),
            "invalid_arguments",
            "argument 'amount'",
        ),
        (
            "airline",
            ToolCall(
                name="update_reservation_passengers",
                arguments={"reservation_id": "EHGLP3", "passengers": [{"first_name": "A"}]},
            ),
            "invalid_arguments",
            "Field required",
        ),
        (
            "airline",
            ToolCall(
                name="update_reservation_baggages",
                arguments={
                    "reservation_id": "EHGLP3",
                    "total_baggages": 1,
                    "nonfree_baggages": 1,
                    "payment_id": "bitcoin",
                },
            ),
            "raised",
            "Payment method not found",
        ),
        (
            "airline",
            ToolCall(name="calculate", arguments={"expression": "__import__('os')"}),
            "raised",
            "Invalid characters",
        ),
        (
            "airline",
            ToolCall(name="calculate", arguments={"expression": "1/0"}),
            "raised",
            "division by zero",
        ),
        (
            "retail",
            ToolCall(name="get_order_details", arguments={"order_id": "W0000000"}),
            "raised",
            "Order not found",
        ),
        (
            "retail",
            ToolCall(
                name="cancel_pending_order", arguments={"order_id": "#W5918442", "reason": "bored"}
            ),
            "raised",
            "Invalid reason",
        ),
        (
            "retail",
            ToolCall(
                name="return_delivered_order_items",
                arguments={
                    "order_id": "#W2611340",
                    "item_ids": "6469567736",
                    "payment_method_id": "x",
                },
            ),
            "invalid_arguments",
            "argument 'item_ids'",
        ),
        (
            "retail",
            ToolCall(name="book_reservation", arguments={}),
            "unknown_tool",
            "unknown tool 'book_reservation'",
        ),
    ],
)
def test_bad_calls_are_the_policys_errors_and_change_nothing(
    domain: str, call: ToolCall, kind: str, message: str
) -> None:
    task = FAMILY.task_of(domain, "2")
    (outcome,), runtime = run(act(task, [call]))
    assert outcome.kind == kind and message in outcome.output, outcome.output
    assert data.changes(runtime.db, domain) == {}


def test_calculate_is_arithmetic_only() -> None:
    assert arithmetic("(120 + 80) * 2") == 400.0
    assert arithmetic("-3 / 4") == -0.75
    for bad in ("2 ** 10", "1e9", "()", "9" * 2000):
        with pytest.raises(Exception, match=r"Invalid|longer"):
            arithmetic(bad)


def test_tools_without_their_runtime_are_an_infrastructure_failure() -> None:
    task = FAMILY.task_of("retail", "2")
    call = ToolCall(name="get_user_details", arguments={"user_id": "x"})
    with pytest.raises(RuntimeFailure, match="need a tau2 retail runtime"):
        run(
            FAMILY.tools_for(task).execute(
                call, ToolContext(task=task), timeout_s=5, max_output_chars=100
            )
        )


@pytest.mark.parametrize(
    ("domain", "source_id"),
    [("airline", "7"), ("retail", "2"), ("retail", "21")],
)
def test_parity_with_the_original_tools_on_a_sample(domain: str, source_id: str) -> None:
    """The fast sample of the parity test: flight changes and cancellations, refused actions,
    many steps."""
    check_parity(domain, source_id)


@pytest.mark.slow
def test_parity_with_the_original_tools_on_all_164_tasks() -> None:
    for domain in data.DOMAINS:
        for source in sources(domain):
            check_parity(domain, source.source_id)


def check_parity(domain: str, source_id: str) -> None:
    """Our tools replaying the reference actions give the original tools' database, and refuse
    exactly the actions the originals refused."""
    recorded = FIXTURE["domains"][domain]["tasks"][source_id]
    task = FAMILY.task_of(domain, source_id)
    outcomes, runtime = run(act(task, actions_of(task)))
    assert data.db_hash(runtime.db) == recorded["hash"], f"{domain}/{source_id}"
    for outcome, original in zip(outcomes, recorded["actions"], strict=True):
        if original != "skipped":
            assert outcome.is_error == original.startswith("error"), (outcome.output, original)
            if outcome.is_error:
                assert original.removeprefix("error: ") in outcome.output
    assert data.state_digest(runtime.db, domain) == run(expected_digest(domain, source_id))


# -- the simulated customer -----------------------------------------------------------------


def test_the_customer_sees_its_scenario_and_the_agents_words_and_stops() -> None:
    customer = ScriptedCustomer("My user id is mia_li_3668.")
    fam = family(customer)
    task = fam.task_of("airline", "2")
    runtime = run(fam.make_runtime(task))
    assert (
        run(fam.user_turn(task, runtime, "Hi! How can I help you today?"))
        == "My user id is mia_li_3668."
    )
    shown = customer.seen[0]
    assert shown[0]["role"] == "system" and "<scenario>" in shown[0]["content"]
    assert "Known info:" in shown[0]["content"] and "###STOP###" in shown[0]["content"]
    assert [m["role"] for m in shown[1:]] == ["user", "assistant", "user"]
    assert shown[-1]["content"] == "Hi! How can I help you today?"
    assert run(fam.user_turn(task, runtime, "Done.")) is None  # the customer said ###STOP###
    assert runtime.heard == ["Hi! How can I help you today?", "Done."]  # type: ignore[attr-defined]


def test_an_empty_reply_or_the_turn_budget_ends_the_conversation() -> None:
    chatty = ScriptedCustomer()
    chatty.reply = lambda messages: asyncio.sleep(0, "Tell me more.")  # type: ignore[method-assign]
    fam = family(chatty, max_user_turns=2)
    task = fam.task_of("retail", "2")
    runtime = run(fam.make_runtime(task))
    assert run(fam.user_turn(task, runtime, "  ")) is None
    runtime = run(fam.make_runtime(task))
    assert run(fam.user_turn(task, runtime, "a")) == "Tell me more."
    assert run(fam.user_turn(task, runtime, "b")) == "Tell me more."
    assert run(fam.user_turn(task, runtime, "c")) is None
    assert all(token.startswith("###") for token in STOP_TOKENS)


def test_no_user_model_is_a_clear_infrastructure_failure() -> None:
    fam = get_family("tau2", services=FamilyServices())
    task = fam.make_tasks(1, 0, "eval")[0]
    runtime = run(fam.make_runtime(task))
    with pytest.raises(RuntimeFailure, match="needs a user model"):
        run(fam.user_turn(task, runtime, "Hello"))  # type: ignore[attr-defined]


# -- grading and reward attacks -------------------------------------------------------------

# airline 2: book a flight and say its price; retail 24: information only; retail 5: DB only.


def test_the_reference_actions_and_the_info_score_one() -> None:
    for domain, source_id in [("airline", "7"), ("retail", "24"), ("retail", "5")]:
        task = FAMILY.task_of(domain, source_id)
        _, runtime = run(act(task, actions_of(task)))
        got = grade(task, runtime, [f"Done: {', '.join(task.data['communicate_info'])}."])
        assert got.reward == 1.0 and dict(got.breakdown) == {"db": 1.0, "info": 1.0}, source_id
        assert json.loads(got.records[0]["content"])["missing_info"] == []


def test_attack_doing_nothing_scores_zero() -> None:
    for split in ("eval", "test"):
        for task in FAMILY.make_tasks(2, 0, split):
            runtime = run(FAMILY.make_runtime(task))
            assert grade(task, runtime, [""]).reward == 0.0, task.data


def test_attack_saying_every_info_string_without_acting_scores_zero() -> None:
    for domain, source_id in [
        ("airline", "7"),
        ("retail", "24"),
        ("retail", "67"),
        ("airline", "3"),
    ]:
        task = FAMILY.task_of(domain, source_id)
        runtime = run(FAMILY.make_runtime(task))
        everything = " ".join(sorted(domain_info(domain)))
        got = grade(task, runtime, [f"Possible answers: {everything}"])
        assert got.reward == 0.0 and got.breakdown["info"] == 0.0, source_id
        assert len(json.loads(got.records[0]["content"])["foreign_info_said"]) > 2


def test_attack_a_customer_echoing_the_guesses_does_not_ground_them() -> None:
    class Echo(ScriptedCustomer):
        async def reply(self, messages: list[Message]) -> str:
            return f"You said: {messages[-1]['content']}"

    fam = family(Echo())
    task = fam.task_of("retail", "24")
    runtime = run(fam.make_runtime(task))
    spray = " ".join(sorted(domain_info("retail")))
    echoed = run(fam.user_turn(task, runtime, spray))
    assert echoed is not None and spray in echoed
    got = run(fam.grade(task, Trajectory(task_id=task.id), runtime))
    assert got.reward == 0.0 and got.breakdown["info"] == 0.0


def test_attack_info_hidden_in_a_tool_call_is_not_said() -> None:
    task = FAMILY.task_of("retail", "24")
    info = ", ".join(task.data["communicate_info"])
    calls = [
        *actions_of(task),
        ToolCall(name="transfer_to_human_agents", arguments={"summary": info}),
    ]
    outcomes, runtime = run(act(task, calls))
    got = grade(task, runtime, ["I have looked into it."], tuple(o.output for o in outcomes))
    assert got.reward == 0.0 and got.breakdown == {"db": 1.0, "info": 0.0}


def test_attack_destructive_extra_actions_score_zero() -> None:
    task = FAMILY.task_of("airline", "7")
    info = ", ".join(task.data["communicate_info"])
    touched = json.dumps(task.data["actions"])
    other = next(r for r in data.load_db("airline")["reservations"] if r not in touched)
    extra = [
        ToolCall(name="cancel_reservation", arguments={"reservation_id": other}),
        ToolCall(name="send_certificate", arguments={"user_id": "mia_li_3668", "amount": 500}),
    ]
    for calls in ([*actions_of(task), extra[0]], [*actions_of(task), extra[1]]):
        _, runtime = run(act(task, calls))
        got = grade(task, runtime, [info])
        assert got.reward == 0.0 and got.breakdown == {"db": 0.0, "info": 1.0}


def test_attack_wrong_types_change_nothing_and_score_zero() -> None:
    task = FAMILY.task_of("retail", "5")
    wrong = [
        ToolCall(
            name=a["name"],
            arguments={k: [v] if isinstance(v, str) else str(v) for k, v in a["arguments"].items()},
        )
        for a in task.data["actions"]
    ]
    outcomes, runtime = run(act(task, wrong))
    assert all(o.kind == "invalid_arguments" for o in outcomes if o.is_error)
    assert grade(task, runtime, ["All done."]).reward == 0.0


def test_values_the_agent_looked_up_are_not_guesses() -> None:
    task = FAMILY.task_of("retail", "67")
    outcomes, runtime = run(act(task, actions_of(task)))
    outputs = tuple(o.output for o in outcomes)
    grounded = "\n".join(outputs).lower().replace(",", "")
    seen = [i for i in sorted(domain_info("retail")) if _mentions(grounded, i)]
    assert len(seen) > 2
    said = f"{', '.join(task.data['communicate_info'])}; for reference: {' '.join(seen)}"
    assert grade(task, runtime, [said], outputs).reward == 1.0


# -- through the real loop ------------------------------------------------------------------


def _config(max_turns: int = 40, max_completion_tokens: int = 512) -> Any:
    from conveyor.config import load_config

    return load_config(
        None,
        [
            "tasks.families=[tau2]",
            f"agent.max_turns={max_turns}",
            "agent.max_prompt_tokens=30000",
            "agent.max_context_tokens=32000",
            f"agent.max_completion_tokens={max_completion_tokens}",
        ],
    ).config


@pytest.fixture
def scripted_customer(monkeypatch: pytest.MonkeyPatch) -> ScriptedCustomer:
    """The run's user model replaced by the scripted customer (only the model is faked)."""
    from conveyor.app.compose import Composition

    customer = ScriptedCustomer()
    monkeypatch.setattr(Composition, "chat_client", lambda self, role, side: customer)
    return customer


# The oracle/empty check through the loop runs in benchmark mode with an endpoint customer:
# test_benchmark_protocol_end_to_end_with_an_endpoint_user__fake_user (one ~45 s check, not two).


@pytest.mark.slow
def test_oracle_and_empty_on_twenty_eval_tasks(
    scripted_customer: ScriptedCustomer, model_dir: Path
) -> None:
    from conveyor.app.families import check_family

    report = run(check_family(_config(), "tau2", n=20, say=lambda _: None))
    assert report["n"] == 20 and report["ok"], report["problems"]


def test_attack_saying_everything_through_the_loop_scores_zero(
    scripted_customer: ScriptedCustomer, model_dir: Path
) -> None:
    from conveyor.app.compose import Composition
    from conveyor.app.families import check_config, scripted_rollouts

    parts = Composition(check_config(_config(max_completion_tokens=4096), "tau2"))
    tasks = parts.tasks(3, "eval")

    def spray(task: Task) -> list[ToolCall]:
        return [say(" ".join(sorted(domain_info(task.data["domain"])))), say("")]

    try:
        rollouts = run(scripted_rollouts(parts, tasks, spray))
    finally:
        run(parts.close())
    assert [t.reward for t in rollouts] == [0.0, 0.0, 0.0]
    assert all(t.metrics["reward/info"] == 0.0 for t in rollouts)
    assert SAY == "_say"


def test_split_of_source_is_stable() -> None:
    first = [split_of_source(s) for s in sources("retail")]
    assert first == [split_of_source(s) for s in sources("retail")]
    assert {"train", "eval", "test"} == set(first)


# -- benchmark mode (configs/benchmarks/tau2.yaml) -------------------------------------------

BENCHMARK = Path(__file__).resolve().parents[2] / "configs" / "benchmarks" / "tau2.yaml"


def benchmark_config(overrides: list[str] | None = None, **options: Any) -> Any:
    """The shipped benchmark config with `overrides` and tau2 options changed."""
    from conveyor.config import load_config

    shipped = load_config(BENCHMARK, []).config.tasks.options["tau2"]
    merged = json.dumps({**shipped, **options})
    return load_config(BENCHMARK, [*(overrides or []), f"tasks.options={{tau2: {merged}}}"]).config


def test_benchmark_serves_the_whole_upstream_test_split_and_drops_nothing() -> None:
    config = benchmark_config()
    bench = Tau2Family(services=FamilyServices(options=config.tasks.options["tau2"]))
    served = bench.served("eval")
    assert len(served) == 60 and bench.dropped("eval") == []
    assert {s.domain: sum(x.domain == s.domain for x in served) for s in served} == {
        "airline": 20,
        "retail": 40,
    }
    everything = Tau2Family(services=FamilyServices(options={"upstream_split": "all"}))
    assert len(everything.served("eval")) == 164 - 26 and len(everything.dropped("eval")) == 26
    # the training default leaves out what doing nothing passes, and says which
    assert FAMILY.dropped("test") == [
        "airline/6",
        "airline/13",
        "airline/31",
        "airline/48",
        "retail/12",
    ]


def test_the_embedded_or_the_policys_own_customer_is_not_comparable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from conveyor.app.compose import Composition
    from conveyor.config import load_config

    assert Composition(benchmark_config()).families  # a real endpoint: comparable, no mark
    assert "NOT COMPARABLE" not in capsys.readouterr().err
    for engine, why in (("hf", "embedded SmolLM2-135M"), ("run", "its own customer")):
        plain = load_config(None, ["tasks.families=[tau2]", f"tasks.user_engine.engine={engine}"])
        assert Composition(plain.config).families  # runs, marked in one line
        lines = [x for x in capsys.readouterr().err.splitlines() if "NOT COMPARABLE" in x]
        assert len(lines) == 1 and why in lines[0]
        refused = benchmark_config([f"tasks.user_engine.engine={engine}"], user=None)
        with pytest.raises(ValueError, match=why):
            assert Composition(refused).families  # refused before this
    told = benchmark_config(user=None, allow_incomparable=True)
    assert Composition(told).families


def test_a_truncated_or_timed_out_conversation_scores_zero() -> None:
    from conveyor.types import Status

    task = FAMILY.task_of("retail", "0")
    steps = [s for s in FAMILY.oracle_calls(task) if s.name != SAY]
    _, runtime = run(act(task, steps))
    runtime.heard.append(
        next(s for s in FAMILY.oracle_calls(task)[::-1] if s.arguments.get("text")).arguments[
            "text"
        ]
    )
    for status, want in ((Status.OK, 1.0), (Status.TRUNCATED, 0.0), (Status.TIMEOUT, 0.0)):
        trajectory = Trajectory(task_id=task.id, status=status)
        assert run(FAMILY.grade(task, trajectory, runtime)).reward == want


class _ScriptedEndpoint:
    """An OpenAI-compatible chat endpoint on a local port whose "model" is `answer` (no model
    that could play the part runs here): each POST's body in, the reply's text out. A client
    that gave up before the answer (a stalled one) is not an error of the endpoint."""

    def answer(self, body: dict[str, Any], headers: Any) -> str:
        raise NotImplementedError

    def __init__(self) -> None:
        import http.server
        import threading

        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                assert self.path == "/v1/chat/completions"
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = server.answer(body, self.headers)
                reply = json.dumps({"choices": [{"message": {"content": text}}]}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except OSError:  # the client gave up (the stalled answer)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _FakeUserServer(_ScriptedEndpoint):
    """The customer as a script: it states a request, says ###STOP### once the agent has
    answered, and stalls past the client's timeout on the first conversation it sees."""

    def __init__(self) -> None:
        import threading

        self.stalled = False
        self.stops = 0
        self.lock = threading.Lock()
        super().__init__()

    def answer(self, body: dict[str, Any], headers: Any) -> str:
        import time

        assert body["model"] == "scripted" and headers["Authorization"] == "Bearer test-key"
        agent_lines = [m for m in body["messages"] if m["role"] == "user"][1:]
        with self.lock:
            stall, self.stalled = not self.stalled, True
        if stall:
            time.sleep(3.0)
        if len(agent_lines) <= 1:
            return "I need help with my order."
        with self.lock:
            self.stops += 1
        return "Thanks, that's all. ###STOP###"


def test_benchmark_protocol_end_to_end_with_an_endpoint_user__fake_user(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`conveyor tasks check` with the shipped benchmark config and the customer on an
    OpenAI-compatible endpoint (a scripted one): the customer that stops ends each oracle
    conversation (1.0), the empty agent scores 0, and the customer that times out is one
    counted infrastructure error of its rollout while the check goes on."""
    from conveyor.app.families import check_family

    monkeypatch.setenv("FAKE_USER_KEY", "test-key")
    server = _FakeUserServer()
    try:
        user = {"base_url": server.url, "model": "scripted", "api_key_env": "FAKE_USER_KEY"}
        config = benchmark_config(user={**user, "timeout_s": 1.0})
        report = run(check_family(config, "tau2", n=3, say=lambda _: None))
    finally:
        server.close()
    assert report["ok"], report["problems"]
    assert len(report["infra_errors"]) == 1, report
    assert "no reply in 1.0 s" in report["infra_errors"][0]["error"]
    assert report["oracle_mean"] == 1.0 and report["empty_mean"] == 0.0
    assert server.stops == 2 and report["dropped"] == []


def test_verdicts_equal_inspect_evals_scorers_on_a_recorded_sample() -> None:
    """A CI-sized sample of `conveyor tasks parity tau2` (the full run: every gold answer and
    500 perturbed, in the side venv; docs/benchmarks-bfcl-tau2.md): inspect-evals' `db_match`
    and `score_communicated_info` verdicts, recorded in the side venv, equal our grader's."""
    from conveyor.tasks.tau2 import parity

    fixture = Path(__file__).parents[1] / "fixtures" / "tau2" / "parity_sample.json"
    everything = json.loads(fixture.read_text())["cases"]
    # one case of some kinds (each ~0.3 s: the database is parsed afresh); the full run has all
    wanted = (
        "gold",
        "drop_action",
        "mutate_argument",
        "foreign_action",
        "truncate_info",
        "nothing",
    )
    recorded = [next(c for c in everything if c["kind"] == kind) for kind in wanted]
    assert any(not (c["upstream"]["db"] and c["upstream"]["info"]) for c in recorded)

    async def all_ours() -> list[dict[str, bool]]:
        return [await parity.ours(case) for case in recorded]

    assert run(all_ours()) == [case["upstream"] for case in recorded]


def test_the_parity_command_names_a_missing_side_venv_and_unknown_families(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from conveyor.cli import app

    monkeypatch.setenv("CONVEYOR_INSPECT_VENV", str(tmp_path / "none"))
    missing = CliRunner().invoke(app, ["tasks", "parity", "tau2", "--n", "1"])
    assert missing.exit_code != 0 and "scripts/venv-inspect.sh" in missing.output
    unknown = CliRunner().invoke(app, ["tasks", "parity", "search"])
    assert unknown.exit_code != 0 and "bfcl, tau2" in unknown.output


class _FakeJudgeServer(_ScriptedEndpoint):
    """The judge as a script: every assertion is met when the conversation holds "cannot add
    insurance", else not met; a conversation holding "stall" gets no answer before the
    client's timeout."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        super().__init__()

    def answer(self, body: dict[str, Any], headers: Any) -> str:
        import time

        assert body["model"] == "judge"
        prompt = body["messages"][-1]["content"]
        self.asked.append(prompt)
        if "stall" in prompt:
            time.sleep(1.0)
        wanted = [x[2:] for x in prompt.split("expectedOutcomes:\n")[1].splitlines()]
        met = "cannot add insurance" in prompt
        results = [
            {"expectedOutcome": w, "reasoning": "scripted", "metExpectation": met} for w in wanted
        ]
        return "```json\n" + json.dumps({"results": results}) + "\n```"


def test_nl_assertions_are_judged_by_the_configured_judge__fake_judge() -> None:
    """With `judge`, the tasks graded by NL assertions are served and each assertion is asked
    of the judge: all met counts, one not met scores 0, a judge timeout is an infrastructure
    error of the rollout (never a 0). Without a judge they stay dropped and listed."""
    from conveyor.types import Status

    server = _FakeJudgeServer()
    try:
        judge = {"base_url": server.url, "model": "judge", "timeout_s": 0.5}
        judged = family(upstream_split="all", judge=judge)
        dropped = judged.dropped("eval")  # the 6 with nothing to judge stay dropped
        assert len(judged.served("eval")) == 164 - 6 and len(dropped) == 6
        assert all(key.startswith("retail/") for key in dropped)
        assert not any(judged.task_of("retail", "0").data["nl_assertions"])  # DB + info basis
        task = judged.task_of("airline", "6")
        assert task.data["nl_assertions"] == ["Agent should not allow user to add insurance."]

        _, runtime = run(act(task, []))  # the agent changes nothing; only its replies differ

        async def graded(reply: str) -> float:
            runtime.heard[:] = [reply]
            trajectory = Trajectory(task_id=task.id, status=Status.OK)
            return (await judged.grade(task, trajectory, runtime)).reward

        assert run(graded("Sorry, I cannot add insurance after booking.")) == 1.0
        assert "assistant: Sorry, I cannot add insurance" in server.asked[-1]
        assert "user: Hi!" in server.asked[-1]
        assert run(graded("Done, insurance added.")) == 0.0
        with pytest.raises(RuntimeFailure, match=r"judge failed.*no reply in 0.5 s"):
            run(graded("stall"))
    finally:
        server.close()
    assert len(server.asked) == 3
    assert "airline/6" in family(upstream_split="all").dropped("eval")
