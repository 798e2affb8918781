"""Every refusal is an OpenAI error body, with the status a client library maps to its error
type, and never a hang. The engine here is scripted (its *words* are fake; the tokenizer,
renderer and HTTP stack are real) so each case is cheap and certain."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from conveyor.engines.base import EngineError, SampleRequest, SampleResult
from conveyor.engines.simulated import SimulatedEngine
from conveyor.types import Status

MESSAGES = [{"role": "user", "content": "Say hi."}]


def _engine(tokenizer: Any) -> SimulatedEngine:
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    hi = tokenizer.encode("Hi there.", add_special_tokens=False)
    return SimulatedEngine(lambda _prompt: hi + end, eos_token_id=end[0])


class _FailingEngine:
    """fake_engine_failure: a SamplingClient whose engine is down (cannot be provoked for real
    in a deterministic way)."""

    in_flight = 0
    policy_version = 0

    async def sample(self, request: SampleRequest) -> SampleResult:
        raise EngineError("fake_engine_failure: connection refused")

    async def close(self) -> None:
        return None


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.fixture
def url(tokenizer: Any, tmp_path: Any, make_gw: Any, serve: Any) -> Any:
    with serve(make_gw(_engine(tokenizer), run_dir=tmp_path)) as base:
        yield base


def test_unknown_rollout_is_404_everywhere(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        for method, path in [
            ("GET", "/rollouts/nope"),
            ("POST", "/rollouts/nope/finish"),
            ("GET", "/rollouts/nope/task"),
            ("POST", "/rollouts/nope/tools/finish"),
        ]:
            response = http.request(method, path, json={})
            assert _error(response, 404)["code"] == "unknown_rollout"
        assert (
            _error(
                http.post("/rollouts/bad%20id/v1/chat/completions", json={"messages": MESSAGES}),
                404,
            )["code"]
            == "invalid_rollout_id"
        )
        assert _error(http.get("/no/such/route"), 404)["type"] == "not_found_error"
        # the openai client sees a NotFoundError
        client = openai.OpenAI(base_url=f"{url}/rollouts/nope", api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("m")


def test_finished_rollout_refuses_chat_with_400_and_a_second_finish_with_409(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        created = http.post("/rollouts", json={}).json()
        rid = created["rollout_id"]
        assert created["base_url"] == f"{url}/rollouts/{rid}/v1"
        client = openai.OpenAI(base_url=created["base_url"], api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "Hi there."
        assert reply.choices[0].finish_reason == "stop"
        no_task = _error(http.post(f"/rollouts/{rid}/finish", json={}), 400)
        assert "reward" in no_task["message"]
        done = http.post(f"/rollouts/{rid}/finish", json={"reward": 0.5})
        assert done.status_code == 200 and done.json()["reward"] == 0.5
        assert _error(http.post(f"/rollouts/{rid}/finish", json={"reward": 1.0}), 409)
        # a 400 (the openai SDK retries a 409), and told not to retry
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert caught.value.code == "rollout_finished"
        assert caught.value.response.headers["x-should-retry"] == "false"
        assert (
            _error(http.post("/rollouts", json={"rollout_id": rid}), 409)["code"]
            == "rollout_exists"
        )


def test_bad_stream_fields_n_and_garbage_bodies_are_400(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        chat = "/rollouts/r-stream/v1/chat/completions"
        assert (
            _error(http.post(chat, json={"messages": MESSAGES, "stream": "yes"}), 400)["param"]
            == "stream"
        )
        unstreamed = {"messages": MESSAGES, "stream_options": {"include_usage": True}}
        assert _error(http.post(chat, json=unstreamed), 400)["param"] == "stream_options"
        assert _error(http.post(chat, json={"messages": MESSAGES, "n": 9}), 400)["param"] == "n"
        garbage = http.post(
            chat, content=b"{not json", headers={"content-type": "application/json"}
        )
        assert _error(garbage, 400)["code"] == "invalid_json"
        assert _error(http.post(chat, json=[1, 2]), 400)
        assert _error(http.post(chat, json={"messages": []}), 400)["param"] == "messages"
        assert _error(http.post(chat, json={"messages": MESSAGES, "max_tokens": 0}), 400)


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ({"type": "function", "function": {"name": "bad name"}}, "must match"),
        ({"type": "retrieval"}, "only"),
        (
            {"type": "function", "function": {"name": "t", "parameters": {"type": "array"}}},
            "type 'object'",
        ),
        (
            {
                "type": "function",
                "function": {
                    "name": "t",
                    "parameters": {"type": "object", "properties": {}, "required": ["x"]},
                },
            },
            "required",
        ),
    ],
)
def test_bad_tool_schema_is_400_naming_the_tool(url: str, tool: dict[str, Any], why: str) -> None:
    good = {"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}}
    client = openai.OpenAI(base_url=f"{url}/rollouts/r-tools/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=MESSAGES, tools=[good, tool])  # type: ignore[arg-type,list-item]
    assert "tools[1]" in str(caught.value) and why in str(caught.value)


def test_prompt_over_budget_is_400_and_ends_the_rollout_truncated(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    from conveyor.config import AgentConfig

    agent = AgentConfig(max_prompt_tokens=20, max_context_tokens=64, max_completion_tokens=16)
    with serve(make_gw(_engine(tokenizer), agent=agent)) as url:
        client = openai.OpenAI(base_url=f"{url}/rollouts/r-long/v1", api_key="x", max_retries=0)
        long = [{"role": "user", "content": "word " * 50}]
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="m", messages=long)  # type: ignore[arg-type]
        assert "max_prompt_tokens" in str(caught.value)
        trajectory = httpx.get(f"{url}/rollouts/r-long").json()
        assert trajectory["status"] == "truncated"
        assert trajectory["stop_reason"] == "max_prompt_tokens"


# What litellm matches (lower-cased) to raise `ContextWindowExceededError` for an OpenAI or
# OpenAI-compatible provider: `ExceptionCheckers.is_error_str_context_window_exceeded` in
# litellm/litellm_core_utils/exception_mapping_utils.py (litellm is not a dependency here).
LITELLM_CONTEXT_PHRASE = "this model's maximum context length is"


def test_context_error_is_openais_and_every_retry_gets_it_once(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    """An over-long prompt answers as OpenAI does (shape, code, words litellm classifies); the
    rollout is closed, and a client that retries anyway gets the same answer, once per call
    (`x-should-retry: false` stops the SDK's own retries)."""
    from conveyor.config import AgentConfig

    agent = AgentConfig(max_prompt_tokens=20, max_context_tokens=64, max_completion_tokens=16)
    gateway = make_gw(_engine(tokenizer), agent=agent)
    calls: list[str] = []
    chat = gateway.chat

    async def counted(rollout_id: str, body: Any) -> Any:
        calls.append(rollout_id)
        return await chat(rollout_id, body)

    gateway.chat = counted
    with serve(gateway) as url:
        client = openai.OpenAI(base_url=f"{url}/rollouts/r-ctx/v1", api_key="x", max_retries=3)
        long = [{"role": "user", "content": "word " * 50}]
        for _ in range(2):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="m", messages=long)  # type: ignore[arg-type]
            error = caught.value.body
            assert isinstance(error, dict)
            assert (error["type"], error["code"], error["param"]) == (
                "invalid_request_error",
                "context_length_exceeded",
                "messages",
            )
            assert LITELLM_CONTEXT_PHRASE in error["message"].lower()
            assert caught.value.response.headers["x-should-retry"] == "false"
        assert len(calls) == 2  # one request per call: the SDK retried none
        trajectory = httpx.get(f"{url}/rollouts/r-ctx").json()
        assert (trajectory["status"], trajectory["stop_reason"]) == (
            "truncated",
            "max_prompt_tokens",
        )


BROKEN = 'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"word": '


def test_broken_tool_call_returns_the_model_text_as_content(
    tokenizer: Any, make_gw: Any, serve: Any
) -> None:
    """A call the parser cannot read leaves the model's words visible (not `content: ""`); the
    raw text is what is recorded, and the resent reply continues the same sample."""
    end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    broken = tokenizer.encode(BROKEN, add_special_tokens=False)
    engine = SimulatedEngine(lambda _prompt: broken + end, eos_token_id=end[0])
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    gateway = make_gw(engine)
    with serve(gateway) as url:
        client = openai.OpenAI(base_url=f"{url}/rollouts/r-bad/v1", api_key="x", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Define cat."}]
        reply = client.chat.completions.create(model="m", messages=messages, tools=tools)  # type: ignore[arg-type]
        choice = reply.choices[0]
        assert choice.message.content == BROKEN.strip()
        assert not choice.message.tool_calls and choice.finish_reason == "stop"
        # cut by the length limit inside the call: the partial text, finish_reason "length"
        cut = len(broken) - 2
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "user", "content": "Again."},
        ]
        short = client.chat.completions.create(
            model="m",
            messages=messages,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            max_tokens=cut,
        )
        assert short.choices[0].finish_reason == "length"
        assert short.choices[0].message.content == tokenizer.decode(broken[:cut]).strip()
    recorded = gateway.trajectory("r-bad")
    assert recorded.counters["parse_errors"] == 2 and recorded.counters["splits"] == 0
    assistant = [m["content"] for m in recorded.messages if m["role"] == "assistant"]
    assert assistant == [BROKEN, tokenizer.decode(broken[: len(broken) - 2])]


def test_fake_engine_failure_is_502_and_an_infra_error_on_disk(
    tmp_path: Any, make_gw: Any, serve: Any
) -> None:
    with serve(make_gw(_FailingEngine(), run_dir=tmp_path)) as url:
        client = openai.OpenAI(base_url=f"{url}/rollouts/r-down/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert "infra_error" in str(caught.value)
        # the rollout is recorded as failed: a retry cannot mend it
        assert caught.value.response.headers["x-should-retry"] == "false"
        trajectory = httpx.get(f"{url}/rollouts/r-down").json()
        assert trajectory["status"] == Status.INFRA_ERROR.value
        assert "fake_engine_failure" in trajectory["error"]
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"infra_error"' in lines[0]


def test_a_rollout_serves_its_requests_one_at_a_time_without_hanging(
    tokenizer: Any, make_gw: Any
) -> None:
    async def main() -> None:
        gateway = make_gw(_engine(tokenizer))
        body = {"messages": MESSAGES}
        answers = await asyncio.wait_for(
            asyncio.gather(gateway.chat("r-2", body), gateway.chat("r-2", body)), timeout=60
        )
        assert [a["choices"][0]["message"]["content"] for a in answers] == ["Hi there."] * 2
        # both requests resend the same history: the second is an edit of the first's result
        assert gateway.trajectory("r-2").counters["splits"] == 1

    asyncio.run(main())


def test_oversized_body_is_413_before_it_is_parsed(url: str, monkeypatch: Any) -> None:
    import conveyor.gateway.app as app_module

    monkeypatch.setattr(app_module, "MAX_BODY_BYTES", 1000)
    big = {"messages": [{"role": "user", "content": "x" * 2000}]}
    response = httpx.post(f"{url}/rollouts/r-big/v1/chat/completions", json=big, timeout=30)
    assert _error(response, 413)["code"] == "body_too_large"


class _DeadRuntime:
    """fake_runtime_failure: a sandbox that died (cannot be killed on cue for real here)."""

    async def list_dir(self, path: str) -> list[str]:
        from conveyor.runtime.base import RuntimeFailure

        raise RuntimeFailure("fake_runtime_failure: sandbox gone")

    async def close(self) -> None:
        return None


def test_fake_runtime_failure_in_a_tool_is_502_and_an_infra_error(
    tokenizer: Any, make_gw: Any
) -> None:
    from conveyor.gateway.errors import GatewayError
    from conveyor.tasks.family import get_family

    async def main() -> None:
        gateway = make_gw(_engine(tokenizer))
        task = get_family("filenav").make_tasks(1, 0, "eval")[0]
        await gateway.create("r-rt", task=task, runtime=_DeadRuntime())
        with pytest.raises(GatewayError) as caught:
            await gateway.call_tool("r-rt", "list_dir", {"path": "/workspace"})
        assert (
            caught.value.status == 502 and caught.value.body()["error"]["code"] == "runtime_error"
        )
        trajectory = gateway.trajectory("r-rt")
        assert trajectory.status is Status.INFRA_ERROR and "fake_runtime_failure" in (
            trajectory.error or ""
        )
        with pytest.raises(GatewayError) as again:
            await gateway.chat("r-rt", {"messages": MESSAGES})
        assert again.value.status == 400

    asyncio.run(main())
