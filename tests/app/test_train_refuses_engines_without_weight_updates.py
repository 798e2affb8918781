"""`conveyor train` refuses, in its first seconds and with one message, an engine that cannot
take new weights: an OpenAI-compatible server without vLLM's development endpoints, the
simulated engine.

The server here is a *fake server without weight updates*: a stdlib HTTP stub that speaks the
OpenAI completions API (a real normal vLLM server is refused the same way in
tests/engines/test_openai_http.py, slow). It records every request, which shows the refusal
comes from the start-up probe (`VLLMServerEngine.check_trainable`), before any evaluation.

Written to issue 16's contract: `engine.kind: openai` builds a `VLLMServerEngine` and
`conveyor train` awaits its `check_trainable()` when training is asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

import conveyor

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "filenav.yaml"
# The acceptance bound of issue 15 (not a speed benchmark: the refusal must not wait for an
# evaluation, a warm start or an engine start), in seconds beyond the time the same interpreter
# takes to import what the command imports (torch and transformers: 8-10 s on an idle core, and
# several times that beside other work, which no refusal should be charged for).
REFUSAL_BOUND_S = 10.0
IMPORTS = "import conveyor.cli, conveyor.app.train, conveyor.trainer.checkpoint"


class _FakeServerWithoutWeightUpdates(BaseHTTPRequestHandler):
    """Answers /models and /completions like a chat-only server; has no weight-update route."""

    requests: ClassVar[list[str]] = []  # each fixture's subclass gets its own list

    def do_GET(self) -> None:
        self.requests.append(f"GET {self.path}")
        self._json({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    def do_POST(self) -> None:
        self.requests.append(f"POST {self.path}")
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        if not self.path.endswith("/completions"):
            self.send_error(404)
            return
        choice = {
            "index": 0,
            "text": "",
            "token_ids": [2],
            "logprobs": {"token_logprobs": [-0.5], "tokens": ["token_id:2"]},
            "finish_reason": "stop",
        }
        self._json({"id": "c", "object": "text_completion", "choices": [choice]})

    def _json(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_server() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (_FakeServerWithoutWeightUpdates,), {"requests": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    server.shutdown()
    server.server_close()


def _train(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The finished command and its seconds beyond the imports (timed just before)."""
    env = dict(os.environ, PYTHONPATH=str(Path(conveyor.__file__).parents[1]), NO_COLOR="1")
    command = [sys.executable, "-m", "conveyor.cli", "train", str(CONFIG)]
    for override in (*overrides, f"run.dir={tmp_path / 'run'}"):
        command += ["--set", override]
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", IMPORTS], env=env, check=True, timeout=300)
    imports = time.monotonic() - started
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    return done, time.monotonic() - started - imports


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return errors[0]


def test_train_refuses_a_server_without_weight_updates_by_its_start_up_probe(
    tmp_path: Path, fake_server: tuple[str, list[str]]
) -> None:
    url, seen = fake_server
    done, seconds = _train(
        tmp_path, "engine.kind=openai", f"engine.base_url={url}", "engine.served_model_name=stub"
    )
    print(f"refused {seconds:.2f} s after its imports: {done.stderr.strip()}")
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = _one_error_line(done.stderr)
    assert "cannot be trained through" in message
    assert "/collective_rpc answers HTTP 404" in message and "VLLM_SERVER_DEV_MODE=1" in message
    assert seconds < REFUSAL_BOUND_S
    # Only the probe reached the server (the model list, its two short completions, the two
    # development endpoints): no evaluation ran, and no run folder was made.
    completions = [r for r in seen if r.endswith("/completions")]
    assert len(completions) <= 2 and "POST /collective_rpc" in seen, seen
    assert not (tmp_path / "run").exists()


def test_train_refuses_the_simulated_engine_the_same_way(tmp_path: Path) -> None:
    done, seconds = _train(tmp_path, "engine.kind=simulated")
    print(f"refused {seconds:.2f} s after its imports")
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = _one_error_line(done.stderr)
    assert "engine.kind='simulated'" in message and "cannot take new weights" in message
    assert seconds < REFUSAL_BOUND_S
