"""The OpenAI-compatible client: its transport and retry policy against stand-in and fake
servers, and against a real vLLM server (the embedded model, on loopback; see tests/servers.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conveyor.agent.chat import ChatRenderer
from conveyor.agent.loop import AgentLoop
from conveyor.config import AgentConfig, SamplingConfig
from conveyor.engines import openai_http
from conveyor.engines.base import EngineDown, EngineError, SampleRequest
from conveyor.engines.openai_http import OpenAICompatibleClient, parse_completion
from conveyor.tasks.family import get_family
from servers import vllm_server


def test_parse_completion_reads_ids_from_either_field() -> None:
    by_ids = {
        "choices": [
            {
                "token_ids": [5, 6],
                "finish_reason": "length",
                "logprobs": {"token_logprobs": [-0.5, -1.5]},
            }
        ]
    }
    assert parse_completion(by_ids).token_ids == [5, 6]
    by_tokens = {
        "choices": [
            {
                "finish_reason": "stop",
                "logprobs": {
                    "tokens": ["token_id:7", "token_id:2"],
                    "token_logprobs": [-0.1, -0.2],
                },
            }
        ]
    }
    result = parse_completion(by_tokens)
    assert result.token_ids == [7, 2] and result.finish_reason == "stop"
    with pytest.raises(EngineError, match="no token ids"):
        parse_completion(
            {
                "choices": [
                    {
                        "finish_reason": "stop",
                        "logprobs": {"tokens": ["hello"], "token_logprobs": [-0.1]},
                    }
                ]
            }
        )


def test_unreachable_server_is_an_engine_error() -> None:
    client = OpenAICompatibleClient("http://127.0.0.1:9/v1", "m", timeout_s=2, reconnect_s=0)
    request = SampleRequest(prompt_ids=[1, 2], max_tokens=2)
    with pytest.raises(EngineDown, match="connection failed") as first:
        asyncio.run(client.sample(request))
    assert isinstance(first.value, EngineError)  # an infra failure like any engine error
    # Down is final: later requests fail with the same error and never reach the wire.
    with pytest.raises(EngineDown) as second:
        asyncio.run(client.sample(request))
    assert second.value is first.value and client.in_flight == 0


def test_bad_client_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        OpenAICompatibleClient("http://127.0.0.1:9/v1", "m", max_connections=0)
    with pytest.raises(ValueError, match="reconnect_s"):
        OpenAICompatibleClient("http://127.0.0.1:9/v1", "m", reconnect_s=-1)
    with pytest.raises(ValueError, match="max_retries"):
        OpenAICompatibleClient("http://127.0.0.1:9/v1", "m", max_retries=-1)


_COMPLETION = {
    "choices": [
        {"token_ids": [5, 6], "finish_reason": "stop", "logprobs": {"token_logprobs": [-1, -2]}}
    ]
}


class _StandInServer:
    """Test-only stand-in for an engine's HTTP front (a real socket server, canned answers):
    the transport behaviours under test need a server we can make drop, stall and restart."""

    def __init__(self, port: int = 0, *, drop: bool = False, barrier: int = 0) -> None:
        self.drop = drop
        self.barrier = threading.Barrier(barrier, timeout=20) if barrier else None
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer(200, {"data": [{"id": "m"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if owner.drop:
                    self.close_connection = True  # hang up without an answer
                    return
                if owner.barrier is not None:
                    try:
                        owner.barrier.wait()  # passes only when all are in flight at once
                    except threading.BrokenBarrierError:
                        self._answer(503, {"error": "requests were not concurrent"})
                        return
                self._answer(200, _COMPLETION)

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            request_queue_size = 64  # the default backlog of 5 drops bursts of connections

        self.httpd = Server(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _ScriptedFakeServer:
    """Test-only fake server: POSTs get the scripted (status, headers, body) answers in order,
    then the last one for ever; GETs list model "m". Records each POST's path."""

    def __init__(self, *answers: tuple[int, dict[str, str], bytes]) -> None:
        self.answers = list(answers)
        self.posts: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {}, json.dumps({"data": [{"id": "m"}]}).encode())

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.posts.append(self.path)
                index = min(len(owner.posts), len(owner.answers)) - 1
                self._send(*owner.answers[index])

            def _send(self, code: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(code)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


_OK = (200, {}, json.dumps(_COMPLETION).encode())
_BUSY = (503, {}, b'{"error": {"message": "overloaded"}}')


def _sample_from(server: _ScriptedFakeServer, **options: Any) -> Any:
    client = OpenAICompatibleClient(server.url, "m", retry_backoff_s=0.01, **options)

    async def go() -> Any:
        try:
            return await client.sample(SampleRequest(prompt_ids=[1], max_tokens=2))
        finally:
            await client.close()

    try:
        return client, asyncio.run(go())
    finally:
        server.stop()


def test_fake_server_5xx_burst_is_retried_and_counted_then_an_engine_error() -> None:
    server = _ScriptedFakeServer(_BUSY, (502, {}, b"bad gateway"), (429, {}, b"{}"), _OK)
    client, result = _sample_from(server, max_retries=3)
    assert result.token_ids == [5, 6] and len(server.posts) == 4
    assert client.retries == 3 and client.retry_counts == {"503": 1, "502": 1, "429": 1}
    # what eval and train write into summary.json (`engine_requests`)
    assert client.request_counters() == {
        "retries": 3,
        "resends": 0,
        "retries_429": 1,
        "retries_502": 1,
        "retries_503": 1,
    }

    endless = _ScriptedFakeServer(_BUSY)
    client = OpenAICompatibleClient(endless.url, "m", max_retries=2, retry_backoff_s=0.01)
    try:
        with pytest.raises(EngineError, match=r"HTTP 503: .*overloaded.*\(after 2 retries\)"):
            asyncio.run(client.sample(SampleRequest(prompt_ids=[1], max_tokens=2)))
    finally:
        endless.stop()
    assert len(endless.posts) == 3 and client.retry_counts == {"503": 2} and client.down is None


def test_fake_server_retry_after_is_honoured_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_http, "_MAX_WAIT_S", 0.5)
    server = _ScriptedFakeServer(
        (429, {"Retry-After": "0.2"}, b"{}"), (503, {"Retry-After": "3600"}, b"{}"), _OK
    )
    client, result = _sample_from(server, max_retries=2)
    # the server's 0.2 s instead of the 0.01 s backoff, then its hour cut to the bound
    assert client.retry_wait_s == pytest.approx(0.2 + 0.5) and result.token_ids == [5, 6]
    assert client.retry_counts == {"429": 1, "503": 1}


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ((404, {}, b'{"message": "The model `x` does not exist."}'), "HTTP 404: .*does not exist"),
        ((400, {}, b'{"message": "bad prompt"}'), "HTTP 400: .*bad prompt"),
        ((200, {}, b"<html>not json"), "the answer is not JSON"),
        ((200, {}, b"[1, 2]"), "not a JSON object"),
        ((200, {}, b'{"choices": []}'), "malformed completions response"),
    ],
)
def test_fake_server_client_errors_and_garbage_are_one_engine_error_without_retry(
    answer: tuple[int, dict[str, str], bytes], message: str
) -> None:
    server = _ScriptedFakeServer(answer)
    client = OpenAICompatibleClient(server.url, "m", max_retries=3, retry_backoff_s=0.01)
    try:
        with pytest.raises(EngineError, match=message):
            asyncio.run(client.sample(SampleRequest(prompt_ids=[1], max_tokens=2)))
    finally:
        server.stop()
    assert len(server.posts) == 1 and client.retries == 0


def test_requests_are_on_the_wire_at_once() -> None:
    # A thread per request capped them at the default thread pool (6 on two cores), and with
    # them the engine's batch: all 16 must reach the server together.
    server = _StandInServer(barrier=16)
    client = OpenAICompatibleClient(server.url, "m", timeout_s=30)
    request = SampleRequest(prompt_ids=[1], max_tokens=2)

    async def go() -> list[Any]:
        try:
            return list(await asyncio.gather(*(client.sample(request) for _ in range(16))))
        finally:
            await client.close()

    try:
        results = asyncio.run(go())
    finally:
        server.stop()
    assert [r.token_ids for r in results] == [[5, 6]] * 16


def test_a_dropped_request_on_a_live_server_is_a_retryable_engine_error() -> None:
    server = _StandInServer(drop=True)
    client = OpenAICompatibleClient(
        server.url, "m", timeout_s=30, reconnect_s=30, max_retries=2, retry_backoff_s=0.01
    )
    request = SampleRequest(prompt_ids=[1], max_tokens=2)
    try:
        with pytest.raises(EngineError, match="sent again failed too") as caught:
            asyncio.run(client.sample(request))
        # Sent 1 + max_retries times (the first loss may be a closed idle connection), then an
        # infra failure of the rollout, not of the engine.
        assert client.resends == client.retries == 2
        assert client.retry_counts == {"connection": 2}
        assert not isinstance(caught.value, EngineDown) and client.down is None
        server.drop = False
        assert asyncio.run(client.sample(request)).token_ids == [5, 6]
    finally:
        server.stop()


def test_a_server_back_within_reconnect_s_is_not_down() -> None:
    # The engine process restarts on its port while a request is failing: the request is sent
    # again once the server answers, so the rollout goes on, and the client is not down.
    server = _StandInServer()
    port = server.port
    server.stop()
    restarted: list[_StandInServer] = []
    timer = threading.Timer(1.5, lambda: restarted.append(_StandInServer(port)))
    timer.start()
    client = OpenAICompatibleClient(
        f"http://127.0.0.1:{port}/v1", "m", timeout_s=30, reconnect_s=60, probe_interval_s=0.2
    )
    request = SampleRequest(prompt_ids=[1], max_tokens=2)
    try:
        assert asyncio.run(client.sample(request)).token_ids == [5, 6]
        assert client.down is None and client.resends == 1 and restarted
    finally:
        timer.join()
        for s in restarted:
            s.stop()


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    """A normal vLLM server: no development endpoints, vLLM's default (raw) logprobs."""
    with vllm_server(model_dir, logprobs_mode="raw_logprobs") as url:
        yield url


@pytest.mark.slow
def test_rollouts_through_a_real_server_are_token_exact(
    server: str, model_dir: Path, tokenizer: Any
) -> None:
    client = OpenAICompatibleClient(server, str(model_dir))
    family = get_family("arithmetic")
    tools = family.tools()
    loop = AgentLoop(
        ChatRenderer(tokenizer, tools.schemas()),
        client,
        tools,
        AgentConfig(max_turns=2, max_completion_tokens=32),
        SamplingConfig(temperature=1.0, sampling_seed=3),
        rollout_timeout_s=300,
    )

    async def go() -> list[Any]:
        tasks = family.make_tasks(2, 0, "eval")
        runtimes = [await family.make_runtime(t) for t in tasks]
        return list(
            await asyncio.gather(*(loop.run(t, 0, r) for t, r in zip(tasks, runtimes, strict=True)))
        )

    for trajectory in asyncio.run(go()):
        assert trajectory.turns
        for before, after in zip(trajectory.turns, trajectory.turns[1:], strict=False):
            head = before.prompt_ids + before.completion_ids
            assert after.prompt_ids[: len(head)] == head
        for turn in trajectory.turns:
            assert len(turn.completion_logprobs) == len(turn.completion_ids) > 0
            assert all(lp <= 0 for lp in turn.completion_logprobs)
    # The same seeded request twice gives the same ids: the server honours our token prompt.
    prompt = trajectory.turns[0].prompt_ids
    request = SampleRequest(prompt_ids=prompt, max_tokens=16, temperature=1.0, seed=11)
    first, second = asyncio.run(client.sample(request)), asyncio.run(client.sample(request))
    assert first.token_ids == second.token_ids


@pytest.mark.slow
def test_a_normal_server_is_refused_for_training_in_one_message_and_still_samples(
    server: str, model_dir: Path
) -> None:
    from conveyor.engines.vllm_server import VLLMServerEngine

    engine = VLLMServerEngine(server, str(model_dir))

    async def go() -> Any:
        try:
            with pytest.raises(EngineError) as caught:
                await engine.check_trainable()
            return caught.value, await engine.sample(SampleRequest(prompt_ids=[1, 2], max_tokens=4))
        finally:
            await engine.close()

    error, result = asyncio.run(go())
    message = str(error)
    print(message)
    assert message.startswith(f"the server at {server} cannot be trained through")
    for lack in ("raw logprobs", "/collective_rpc answers HTTP 404", "/reset_prefix_cache answers"):
        assert lack in message
    assert len(result.token_ids) == 4  # evaluation is unaffected


def test_connection_settings_reach_the_client_from_config(model_dir: Path) -> None:
    from conveyor.config import load_config
    from conveyor.dispatch.config import DispatchSettings
    from conveyor.engines.factory import build_engine

    overrides = [
        "engine.kind=openai",
        "engine.base_url=http://127.0.0.1:9/v1",
        "engine.reconnect_s=7",
        "engine.connect_timeout_s=1.5",
        "engine.max_connections=12",
    ]
    config = load_config(None, overrides).config
    client = build_engine(config, model_dir)
    assert isinstance(client, OpenAICompatibleClient)
    assert (client.reconnect_s, client.connect_timeout_s, client.max_connections) == (7, 1.5, 12)
    # the dispatcher's safety net covers one reconnect wait per turn on top of the request limit
    with_wait = DispatchSettings.from_config(config).run_timeout_s
    without = DispatchSettings.from_config(
        load_config(None, [*overrides[:2], "engine.reconnect_s=0"]).config
    ).run_timeout_s
    assert with_wait - without == config.agent.max_turns * 7


def test_the_start_up_check_names_a_wrong_model_or_a_missing_server() -> None:
    """`check_served` asks `/models` once: it passes for a served name, names what the server
    serves for a wrong one, and says that no server answers for a dead URL."""
    stand_in = _StandInServer()
    try:
        good = OpenAICompatibleClient(stand_in.url, "m")
        wrong = OpenAICompatibleClient(stand_in.url, "/models/smol")

        async def go() -> None:
            try:
                await good.check_served()
                with pytest.raises(
                    EngineError, match=r"serves \['m'\], not '/models/smol'.*served_model_name"
                ):
                    await wrong.check_served()
            finally:
                await good.close()
                await wrong.close()

        asyncio.run(go())
    finally:
        stand_in.stop()
    dead = OpenAICompatibleClient(stand_in.url, "m", connect_timeout_s=1.0)

    async def refused() -> None:
        try:
            with pytest.raises(EngineError, match="no OpenAI-compatible server answers at"):
                await dead.check_served()
        finally:
            await dead.close()

    asyncio.run(refused())


def test_eval_refuses_a_model_the_server_does_not_serve_before_any_rollout(
    tmp_path: Path, model_dir: Path
) -> None:
    config = tmp_path / "defaults.yaml"
    config.write_text("")
    stand_in = _StandInServer()
    try:
        args = [sys.executable, "-m", "conveyor.cli", "eval", str(config)]
        args += ["--set", "engine.kind=openai"]
        args += ["--set", f"engine.base_url={stand_in.url}", "--set", f"run.dir={tmp_path / 'r'}"]
        done = subprocess.run(
            [*args, "--set", "engine.served_model_name=smol"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        stand_in.stop()
    assert done.returncode == 2
    assert "serves ['m'], not 'smol'" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # refused before the run folder was made
