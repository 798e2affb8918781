"""The session-aware router over engine replicas: stickiness, least-loaded placement, failover
through the real dispatcher of `conveyor eval`, the start-up check, the config. (Weight-sync
fan-out and version gating: tests/trainer/test_weight_sync_replicas.py.)

Replicas are real engines (`SimulatedEngine`, `HFEngine` on a tiny Llama) or real HTTP
clients against stand-in servers (stdlib HTTP servers with canned completions: a server we can
make hang up on cue, which a real vLLM server only does when killed; the slow test kills real
ones, tests/engines/test_router_vllm.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conveyor.config import ConfigError, EngineConfig, load_config
from conveyor.engines.base import (
    EngineDown,
    EngineError,
    EngineStats,
    RequestCounters,
    SampleRequest,
    ServedModelCheck,
    TrainableCheck,
    WeightFolder,
    WeightReceiver,
)
from conveyor.engines.factory import build_engine
from conveyor.engines.openai_http import OpenAICompatibleClient
from conveyor.engines.router import RoutedEngine, route
from conveyor.engines.simulated import SimulatedEngine
from conveyor.engines.vllm_server import VLLMServerEngine
from conveyor.types import Status, Trajectory

REPO = Path(__file__).resolve().parents[2]


class StandInServer:
    """Test-only stand-in for one replica's OpenAI-compatible server (stdlib HTTP, canned
    completion `ids`). Records each completion request's session (`user`) and `X-Request-Id`.
    After `hang_up_after` answered completions it hangs up on every request, `/models`
    included, as a dead server would look to the client."""

    def __init__(self, ids: list[int], *, hang_up_after: int | None = None) -> None:
        self.ids = ids
        self.hang_up_after = hang_up_after
        self.sessions: list[str] = []  # answered completions, in order
        self.request_ids: list[str] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if owner.dead:
                    self.close_connection = True
                    return
                self._send({"data": [{"id": "m"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    if owner.dead:
                        self.close_connection = True  # hang up without an answer
                        return
                    owner.sessions.append(body.get("user") or "")
                    owner.request_ids.append(self.headers.get("X-Request-Id", ""))
                ids = owner.ids
                self._send(
                    {
                        "choices": [
                            {
                                "token_ids": ids,
                                "finish_reason": "stop",
                                "logprobs": {"token_logprobs": [-0.5] * len(ids)},
                            }
                        ]
                    }
                )

            def _send(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            request_queue_size = 64

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def dead(self) -> bool:
        return self.hang_up_after is not None and len(self.sessions) >= self.hang_up_after

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _request(session: str, *prompt: int) -> SampleRequest:
    return SampleRequest(prompt_ids=list(prompt) or [1, 2], max_tokens=4, session_id=session)


def _recording_replica(log: list[tuple[int, int]], index: int) -> SimulatedEngine:
    """A simulated replica that notes (replica, prompt[0]) for every request it serves."""

    def respond(prompt: list[int]) -> list[int]:
        log.append((index, prompt[0]))
        return [11, 12, 0]

    return SimulatedEngine(respond, eos_token_id=0, decode_s_per_token=0.01)


def test_a_sessions_requests_stay_on_one_replica_and_new_sessions_spread_by_load() -> None:
    served: list[tuple[int, int]] = []
    replicas = [_recording_replica(served, i) for i in range(3)]
    router = route(replicas)

    async def rollout(number: int) -> None:
        for turn in range(4):
            await router.sample(_request(f"task-{number}/0", number, turn))
            await asyncio.sleep(0.001 * ((number * 7 + turn) % 5))  # tool time, varied

    async def go() -> None:
        await asyncio.gather(*(rollout(n) for n in range(12)))

    asyncio.run(go())
    by_session: dict[int, set[int]] = defaultdict(set)
    for replica, session in served:
        by_session[session].add(replica)
    # every rollout's 4 requests reached one replica (the replicas' own record says so)
    assert all(len(where) == 1 for where in by_session.values()) and len(by_session) == 12
    # placed while the others were in flight: 12 rollouts, 4 on each replica
    assert sorted(Counter(r for r, _ in served).values()) == [16, 16, 16]
    summary = router.routing_summary()
    assert [r["sessions"] for r in summary["replicas"]] == [4, 4, 4]
    assert [r["requests"] for r in summary["replicas"]] == [16, 16, 16]
    assert summary["moved_sessions"] == 0 and router.in_flight == 0


def test_with_equal_requests_in_flight_the_replica_using_less_kv_cache_gets_the_new_session() -> (
    None
):
    replicas = [
        SimulatedEngine(eos_token_id=0, decode_s_per_token=0.05, kv_capacity_tokens=10_000)
        for _ in range(2)
    ]
    router = route(replicas)
    assert isinstance(router, EngineStats)

    async def go() -> str | None:
        # one request in flight on each: a long prompt on one replica, a short one on the other
        long = asyncio.create_task(router.sample(_request("long", *range(1, 3000))))
        await asyncio.sleep(0)
        short = asyncio.create_task(router.sample(_request("short", 1, 2)))
        await asyncio.sleep(0.01)
        assert router.kv_used_tokens >= 3000 and router.running_requests == 2
        await router.sample(_request("new"))
        await asyncio.gather(long, short)
        return router.replica_of("new")

    placed = asyncio.run(go())
    assert router.replica_of("long") != router.replica_of("short")
    assert placed == router.replica_of("short")


def test_the_router_is_exactly_the_protocols_its_replicas_share(tmp_path: Path) -> None:
    servers = [VLLMServerEngine(f"http://127.0.0.1:{9 + i}/v1", "m") for i in range(2)]
    trainable = route(servers)
    for protocol in (WeightReceiver, WeightFolder, TrainableCheck, ServedModelCheck):
        assert isinstance(trainable, protocol)
    assert isinstance(trainable, RequestCounters) and not isinstance(trainable, EngineStats)
    trainable.use_weights_dir(tmp_path)  # type: ignore[attr-defined]
    assert [s.weights_dir for s in servers] == [tmp_path / "replica-0", tmp_path / "replica-1"]
    plain = route([OpenAICompatibleClient("http://127.0.0.1:9/v1", "m") for _ in range(2)])
    assert not isinstance(plain, WeightReceiver) and isinstance(plain, ServedModelCheck)
    simulated = route([SimulatedEngine(), SimulatedEngine()])
    assert isinstance(simulated, EngineStats) and not isinstance(simulated, ServedModelCheck)


def test_a_dead_replica_moves_its_sessions_and_only_no_replica_left_is_engine_down() -> None:
    alive, dying = StandInServer([5, 6]), StandInServer([5, 6], hang_up_after=1)
    clients = [
        OpenAICompatibleClient(s.url, "m", reconnect_s=0.3, probe_interval_s=0.1, max_retries=0)
        for s in (alive, dying)
    ]
    router = route(clients, ["alive", "dying"])

    async def go() -> None:
        await router.sample(_request("a"))  # -> alive (index 0)
        await router.sample(_request("b"))  # -> dying (fewest sessions); its last answer
        with pytest.raises(EngineError) as caught:
            await router.sample(_request("b"))
        # an infra failure of the rollout, not of the engine: the dispatcher retries it
        assert not isinstance(caught.value, EngineDown)
        assert "replica dying is down" in str(caught.value)
        await router.sample(_request("b"))  # the retried rollout's request: moved
        await router.sample(_request("c"))  # new sessions avoid the dead replica
        alive.hang_up_after = len(alive.sessions)
        with pytest.raises(EngineDown, match="all 2 engine replicas are down"):
            await router.sample(_request("a"))
        with pytest.raises(EngineDown):  # and at once from then on
            await router.sample(_request("d"))
        await router.close()

    try:
        asyncio.run(go())
    finally:
        alive.stop()
        dying.stop()
    assert alive.sessions == ["a", "b", "c"] and dying.sessions == ["b"]
    summary = router.routing_summary()
    assert summary["moved_sessions"] == 1 and summary["replicas_down"] == 2
    assert summary["replicas"][0]["moved_in"] == 1


@pytest.fixture
def stand_ins(tokenizer: Any) -> Iterator[tuple[StandInServer, StandInServer]]:
    # a reply that is no tool call: with hints on, each rollout runs all its turns
    ids = tokenizer.encode("Let me look.<|im_end|>", add_special_tokens=False)
    servers = (StandInServer(ids), StandInServer(ids, hang_up_after=5))
    yield servers
    for server in servers:
        server.stop()


def test_eval_over_two_replicas_keeps_rollouts_together_and_retries_a_dead_replicas_rollouts(
    tmp_path: Path, model_dir: Path, stand_ins: tuple[StandInServer, StandInServer]
) -> None:
    from conveyor.app.evaluate import run_eval

    alive, dying = stand_ins
    run_dir = tmp_path / "run"
    resolved = load_config(
        REPO / "configs" / "filenav.yaml",
        [
            "engine.kind=openai",
            f"engine.base_urls=[{alive.url}, {dying.url}]",
            "engine.served_model_name=m",
            "engine.reconnect_s=0.3",
            "engine.max_retries=0",
            "tasks.num_tasks=6",
            "tasks.group_size=1",
            "tasks.split=eval",
            "agent.max_turns=3",
            "dispatch.strategy=pipeline",
            f"run.dir={run_dir}",
        ],
    )
    asyncio.run(run_eval(resolved, show_progress=False))
    lines = (run_dir / "trajectories.jsonl").read_text().splitlines()
    trajectories = [Trajectory.from_json(line) for line in lines]
    # nothing lost: every rollout recorded once, none as an infra error
    assert sorted(t.task_id for t in trajectories) == sorted({t.task_id for t in trajectories})
    assert len(trajectories) == 6
    assert all(t.status is not Status.INFRA_ERROR and len(t.turns) == 3 for t in trajectories)
    retried = {f"{t.task_id}/0" for t in trajectories if t.counters.get("infra_retries")}
    # the dying replica's unfinished rollouts were retried, on the other replica
    assert retried and retried <= set(dying.sessions)
    for session in {*alive.sessions, *dying.sessions}:
        if session in retried:
            # its first attempt on the dying replica, all 3 turns of the retry on the live one
            assert alive.sessions.count(session) == 3
        else:  # never split: all of a rollout's requests on one replica
            assert (session in alive.sessions) != (session in dying.sessions)
    # every request the servers answered carries its rollout's id (vLLM logs it)
    assert all(
        rid.endswith(f".{s}") for rid, s in zip(alive.request_ids, alive.sessions, strict=True)
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    replicas = summary["engine_replicas"]
    assert [r["name"] for r in replicas["replicas"]] == [alive.url, dying.url]
    assert replicas["replicas"][0]["requests"] == len(alive.sessions)
    assert replicas["replicas"][1]["down"] and replicas["replicas"][0]["down"] is None
    assert replicas["moved_sessions"] >= len(retried)


def test_a_replica_refusing_connections_at_start_is_one_clear_error(
    tmp_path: Path, model_dir: Path, tokenizer: Any
) -> None:
    from conveyor.app.evaluate import run_eval

    server = StandInServer([5])
    dead = "http://127.0.0.1:9/v1"
    resolved = load_config(
        None,
        [
            "engine.kind=openai",
            f"engine.base_urls=[{server.url}, {dead}]",
            "engine.served_model_name=m",
            f"run.dir={tmp_path / 'run'}",
        ],
    )
    try:
        with pytest.raises(EngineError) as caught:
            asyncio.run(run_eval(resolved, show_progress=False))
    finally:
        server.stop()
    message = str(caught.value)
    assert message.startswith("1 of 2 engine replicas failed the start-up check: ")
    assert f"replica {dead}: no OpenAI-compatible server answers at {dead}" in message
    assert server.url not in message and not (tmp_path / "run").exists()


def test_replica_settings_are_checked_and_one_url_is_the_plain_client(model_dir: Path) -> None:
    bad = {
        "engine.kind is .vllm.": ["engine.base_urls=[http://a/v1, http://b/v1]"],
        "not both": ["engine.kind=openai", "engine.base_url=http://a/v1", "engine.base_urls=[x]"],
        "more than once": ["engine.kind=openai", "engine.base_urls=[http://a/v1, http://a/v1/]"],
        "needs engine.kind 'vllm', not 'openai'": [
            "engine.kind=openai",
            "engine.base_url=http://a/v1",
            "engine.replicas=2",
        ],
        "nothing reads them": ["engine.server_args=[--enable-log-requests]"],
    }
    for message, overrides in bad.items():
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)
    one = load_config(None, ["engine.kind=openai", "engine.base_urls=[http://127.0.0.1:9/v1]"])
    engine = build_engine(one.config, model_dir)
    assert type(engine) is VLLMServerEngine and engine.base_url == "http://127.0.0.1:9/v1"
    two = load_config(
        None, ["engine.kind=openai", "engine.base_urls=[http://a:1/v1, http://b:2/v1]"]
    )
    routed = build_engine(two.config, model_dir)
    assert isinstance(routed, RoutedEngine) and isinstance(routed, WeightReceiver)
    assert [r.name for r in routed.replicas] == ["http://a:1/v1", "http://b:2/v1"]
    assert EngineConfig().replicas == 1


def test_training_checks_every_replica_and_names_the_one_without_weight_reloads() -> None:
    from test_vllm_server import FakeServer

    servers = [FakeServer(), FakeServer(dev_mode=False)]
    router = route([VLLMServerEngine(s.url, "m") for s in servers], ["dev", "plain"])

    async def go() -> None:
        try:
            await router.check_served()  # type: ignore[attr-defined]  # both serve "m"
            with pytest.raises(EngineError) as caught:
                await router.check_trainable()  # type: ignore[attr-defined]
        finally:
            await router.close()
        message = str(caught.value)
        assert message.startswith("1 of 2 engine replicas failed the start-up check: replica ")
        assert "replica plain: the server at" in message and "replica dev" not in message
        assert "/collective_rpc answers HTTP 404" in message

    try:
        asyncio.run(go())
    finally:
        for server in servers:
            server.stop()
