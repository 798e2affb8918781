"""`python -m conveyor.gateway` (the `conveyor gateway` command) as a real process: the ready line,
a rollout served over the real model (engine.kind=hf), and a clean stop on SIGTERM with every
trajectory on disk (the finished one, and the unfinished one recorded as an infra_error)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_gateway_command_prints_ready_serves_and_stops_on_sigterm(
    tmp_path: Path, model_dir: Path
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"model:\n  path: {model_dir}\nengine:\n  kind: hf\n"
        "agent:\n  max_completion_tokens: 16\n"
        "tasks:\n  families: [arithmetic]\n  num_tasks: 2\n  split: eval\n"
    )
    port = _free_port()
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "conveyor.gateway",
            "--config",
            str(config),
            "--port",
            str(port),
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("gateway ready"):
                break
        assert lines and lines[-1].strip() == f"gateway ready http://127.0.0.1:{port}", lines
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=120) as http:
            created = http.post("/rollouts", json={"task_id": "arithmetic-eval-0000"}).json()
            rollout = f"/rollouts/{created['rollout_id']}"
            info = http.get(f"{rollout}/task").json()
            reply = http.post(
                f"{rollout}/v1/chat/completions",
                json={"messages": info["messages"], "tools": info["tools"]},
            )
            assert reply.status_code == 200, reply.text
            answered = http.post(f"{rollout}/tools/finish", json={"answer": "42"}).json()
            assert answered == {"output": "Answer submitted.", "is_error": False, "finished": True}
            finished = http.post(f"{rollout}/finish", json={}).json()
            assert finished["status"] == "ok" and finished["reward"] in (0.0, 1.0)
            http.post(
                "/rollouts/left-open/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}]},
            )
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    records = (run_dir / "trajectories.jsonl").read_text().splitlines()
    assert len(records) == 2
    assert '"status":"ok"' in records[0] and '"status":"infra_error"' in records[1]
