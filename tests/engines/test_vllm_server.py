"""`VLLMServerEngine` against fake servers: the start-up probe for training, the weight-version
folders and the reload calls. The fake servers are stdlib HTTP stubs shaped like vLLM 0.32's
answers (the real server is in test_vllm_server_sync.py and test_openai_http.py, slow)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from conveyor.engines.base import EngineError, SampleRequest, WeightReceiver
from conveyor.engines.vllm_server import VLLMServerEngine


class FakeServer:
    """A fake vLLM server. `token_ids`: completions return ids (else text only, like a server
    that cannot); `dev_mode`: the root has /collective_rpc and /reset_prefix_cache; `raw`:
    sampled logprobs ignore the temperature; `rpc_status`: what a reload answers."""

    def __init__(
        self,
        *,
        completions: bool = True,
        token_ids: bool = True,
        dev_mode: bool = True,
        raw: bool = False,
        rpc_status: int = 200,
    ) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.folders_at_reload: list[list[str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {"data": [{"id": "m"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                owner.calls.append((self.path, body))
                if self.path == "/v1/completions" and completions:
                    self._send(200, owner.completion(body))
                elif self.path == "/collective_rpc" and dev_mode:
                    if "method" not in body:
                        self._send(400, {"error": {"message": "Missing 'method'"}})
                        return
                    if body["method"] != "reload_weights":  # no weight-group extension here
                        self._send(500, {"error": {"message": f"no method {body['method']}"}})
                        return
                    folder = Path(body["kwargs"]["weights_path"])
                    owner.folders_at_reload.append(sorted(p.name for p in folder.iterdir()))
                    self._send(rpc_status, {"results": [None]})
                elif self.path == "/reset_prefix_cache" and dev_mode:
                    self._send(200, {"success": True})
                else:
                    self._send(404, {"detail": "Not Found"})

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.raw = raw
        self.token_ids = token_ids
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Token 7 at logprob -2.0 (temperature 1) or -1.0 (processed, any other temperature);
        prompt logprobs -2.0 at every position after the first."""
        temperature = body.get("temperature", 1.0)
        sampled = -2.0 if self.raw or temperature in (0.0, 1.0) else -1.0
        choice: dict[str, Any] = {
            "text": "x",
            "finish_reason": "length",
            "logprobs": {"tokens": ["x"], "token_logprobs": [sampled]},
        }
        if self.token_ids:
            choice["token_ids"] = [7]
        if body.get("prompt_logprobs") is not None:
            prompt = body["prompt"]
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": -2.0, "rank": 1}} for t in prompt[1:]
            ]
        return {"choices": [choice]}

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_server(request: pytest.FixtureRequest) -> Iterator[FakeServer]:
    server = FakeServer(**getattr(request, "param", {}))
    yield server
    server.stop()


def _run(engine: VLLMServerEngine, work: Any) -> Any:
    async def go() -> Any:
        try:
            return await work
        finally:
            await engine.close()

    return asyncio.run(go())


def test_fake_server_in_dev_mode_is_trainable(fake_server: FakeServer) -> None:
    engine = VLLMServerEngine(fake_server.url, "m")
    assert isinstance(engine, WeightReceiver) and engine.server_root.endswith(
        str(fake_server.httpd.server_address[1])
    )
    _run(engine, engine.check_trainable())
    paths = [path for path, _ in fake_server.calls]
    assert paths == ["/v1/completions", "/v1/completions", "/collective_rpc", "/reset_prefix_cache"]
    assert fake_server.calls[2][1] == {}  # no method: refused before any worker call


@pytest.mark.parametrize(
    ("fake_server", "lacks"),
    [
        (
            {"completions": False, "dev_mode": False},  # a chat-only server
            ["token ids", "/collective_rpc answers HTTP 404", "/reset_prefix_cache answers"],
        ),
        ({"token_ids": False}, ["does not sample by token ids", "no token ids"]),
        ({"dev_mode": False}, ["/collective_rpc answers HTTP 404", "/reset_prefix_cache"]),
        ({"raw": True}, ["raw logprobs"]),
    ],
    indirect=["fake_server"],
)
def test_fake_server_lacking_what_training_needs_is_refused_in_one_message(
    fake_server: FakeServer, lacks: list[str]
) -> None:
    engine = VLLMServerEngine(fake_server.url, "m")
    with pytest.raises(EngineError) as caught:
        _run(engine, engine.check_trainable())
    message = str(caught.value)
    assert message.startswith(f"the server at {fake_server.url} cannot be trained through: ")
    assert all(part in message for part in lacks), message
    assert "VLLM_SERVER_DEV_MODE=1" in message and "\n" not in message


@pytest.mark.parametrize("fake_server", [{"dev_mode": False}], indirect=True)
def test_fake_server_without_dev_endpoints_still_samples(fake_server: FakeServer) -> None:
    engine = VLLMServerEngine(fake_server.url, "m")
    result = _run(engine, engine.sample(SampleRequest(prompt_ids=[1, 2], max_tokens=1)))
    assert result.token_ids == [7] and result.policy_version == 0


def _weights(scale: float) -> list[tuple[str, torch.Tensor]]:
    embed = torch.full((4, 2), scale)
    # tied, as SmolLM2's lm_head: the same storage twice, which safetensors refuses as such
    return [("model.embed_tokens.weight", embed), ("lm_head.weight", embed)]


def test_fake_server_weight_versions_are_written_reloaded_and_pruned(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    source = tmp_path / "model"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "llama"}')
    weights = tmp_path / "weights"
    engine = VLLMServerEngine(fake_server.url, "m", weights_dir=weights, source_dir=source)

    async def go() -> list[int]:
        versions = []
        await engine.sample(SampleRequest(prompt_ids=[1, 2], max_tokens=1))
        for version in (1, 2, 3):
            await engine.update_weights(_weights(float(version)), version)
            versions.append(engine.policy_version)
        result = await engine.sample(SampleRequest(prompt_ids=[1, 2], max_tokens=1))
        versions.append(result.policy_version)
        return versions

    assert _run(engine, go()) == [1, 2, 3, 3]
    rpcs = [body for path, body in fake_server.calls if path == "/collective_rpc"]
    # weight_sync 'auto': one probe for the weight-group extension, refused (this server has
    # none), then the safetensors fallback for good
    assert rpcs[0]["method"] == "conveyor_leave_weight_group"
    assert engine.weight_sync == "safetensors" and engine.weight_sync_used == "safetensors"
    reloads = rpcs[1:]
    assert [b["kwargs"]["weights_path"] for b in reloads] == [
        str(weights / f"v{n}") for n in (1, 2, 3)
    ]
    assert all(b["method"] == "reload_weights" for b in reloads)
    # complete when the server was told to load it; only the newest two stay
    assert fake_server.folders_at_reload == [["config.json", "model.safetensors"]] * 3
    assert sorted(p.name for p in weights.iterdir()) == ["v2", "v3"]
    loaded = load_file(str(weights / "v3" / "model.safetensors"))
    assert set(loaded) == {"model.embed_tokens.weight", "lm_head.weight"}
    assert float(loaded["lm_head.weight"][0, 0]) == 3.0
    resets = [path for path, _ in fake_server.calls if path == "/reset_prefix_cache"]
    assert len(resets) == 3 and engine.prefix_resets_refused == 0
    # each request is salted with the weights it is for: no cached prefix crosses an update
    salts = [body["cache_salt"] for path, body in fake_server.calls if path == "/v1/completions"]
    assert salts == ["conveyor-v0", "conveyor-v3"]


@pytest.mark.parametrize("fake_server", [{"rpc_status": 500}], indirect=True)
def test_fake_server_failing_reload_is_an_engine_error_and_the_version_stays(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    engine = VLLMServerEngine(
        fake_server.url, "m", weights_dir=tmp_path, max_retries=1, retry_backoff_s=0.01
    )
    with pytest.raises(EngineError, match=r"collective_rpc: HTTP 500.*after 1 retries"):
        _run(engine, engine.update_weights(_weights(1.0), 5))
    assert engine.policy_version == 0 and engine.retry_counts == {"500": 1}


def test_fake_server_without_the_extension_is_refused_for_collective_sync_naming_the_flag(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    engine = VLLMServerEngine(fake_server.url, "m", weights_dir=tmp_path, weight_sync="collective")
    with pytest.raises(EngineError, match=r"--worker-extension-cls conveyor\.engines\.weight"):
        _run(engine, engine.update_weights(_weights(1.0), 1))
    assert engine.policy_version == 0 and not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="weight_sync must be"):
        VLLMServerEngine(fake_server.url, "m", weight_sync="nccl")  # type: ignore[arg-type]


def test_fake_server_fingerprint_is_the_served_prompt_logprobs(fake_server: FakeServer) -> None:
    engine = VLLMServerEngine(fake_server.url, "m")
    fingerprint = _run(engine, engine.weight_fingerprint([4, 5, 6]))
    assert fingerprint.probe_logprobs == [0.0, -2.0, -2.0] and fingerprint.digests == {}
    body = fake_server.calls[0][1]
    assert body["prompt"] == [4, 5, 6] and body["prompt_logprobs"] == 0


def test_without_weights_dir_a_temporary_folder_is_used_and_removed(
    fake_server: FakeServer,
) -> None:
    engine = VLLMServerEngine(fake_server.url, "m")

    async def go() -> Path:
        await engine.update_weights(_weights(1.0))
        reload = [b for _, b in fake_server.calls if b.get("method") == "reload_weights"]
        return Path(reload[0]["kwargs"]["weights_path"])

    folder = _run(engine, go())
    assert folder.name == "v1" and not folder.parent.exists()
