"""The simulated engine: determinism by seed, length and stop handling, latency, failures."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from conveyor.engines.base import (
    EngineError,
    EngineStats,
    SampleRequest,
    SampleResult,
    SamplingClient,
)
from conveyor.engines.simulated import SimulatedEngine

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def request(session: str = "s", max_tokens: int = 64, **kwargs: Any) -> SampleRequest:
    return SampleRequest(prompt_ids=[1, 2, 3], max_tokens=max_tokens, session_id=session, **kwargs)


async def sample_many(engine: SimulatedEngine, requests: list[SampleRequest]) -> list[SampleResult]:
    return [await engine.sample(r) for r in requests]


def test_implements_the_sampling_protocol() -> None:
    assert isinstance(SimulatedEngine(), SamplingClient)


def test_same_seed_same_results_other_seed_other_results() -> None:
    reqs = [request(f"s{i % 3}") for i in range(9)]
    a = run(sample_many(SimulatedEngine(seed=7, eos_token_id=2), reqs))
    b = run(sample_many(SimulatedEngine(seed=7, eos_token_id=2), reqs))
    c = run(sample_many(SimulatedEngine(seed=8, eos_token_id=2), reqs))
    assert a == b
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    # Sessions and successive calls of one session differ from each other.
    assert len({tuple(r.token_ids) for r in a}) == 9


def test_results_do_not_depend_on_interleaving_across_sessions() -> None:
    async def interleaved(order: list[str]) -> dict[str, list[SampleResult]]:
        engine = SimulatedEngine(seed=3)
        out: dict[str, list[SampleResult]] = {}
        for session in order:
            out.setdefault(session, []).append(await engine.sample(request(session)))
        return out

    first = run(interleaved(["a", "b", "a", "b", "a"]))
    second = run(interleaved(["b", "b", "a", "a", "a"]))
    assert first == second


def test_default_completion_range_eos_and_logprobs() -> None:
    engine = SimulatedEngine(
        seed=1, eos_token_id=2, vocab_lo=100, vocab_hi=200, length_range=(3, 9)
    )
    results = run(sample_many(engine, [request(f"s{i}") for i in range(30)]))
    lengths = set()
    for result in results:
        assert result.finish_reason == "stop"
        assert result.token_ids[-1] == 2
        body = result.token_ids[:-1]
        assert 3 <= len(body) <= 9 and all(100 <= t < 200 for t in body)
        lengths.add(len(body))
        assert len(result.logprobs) == len(result.token_ids)
        assert all(lp < 0 and math.isfinite(lp) for lp in result.logprobs)
    assert len(lengths) > 1


def test_max_tokens_truncates_with_length() -> None:
    engine = SimulatedEngine(lambda prompt: list(range(10, 30)), eos_token_id=2)
    result = run(engine.sample(request(max_tokens=5)))
    assert result.token_ids == [10, 11, 12, 13, 14]
    assert result.finish_reason == "length"
    assert len(result.logprobs) == 5
    exact = run(engine.sample(request(max_tokens=20)))
    assert exact.finish_reason == "length" and len(exact.token_ids) == 20
    short = run(engine.sample(request(max_tokens=50)))
    assert short.finish_reason == "stop" and len(short.token_ids) == 20


def test_eos_and_stop_tokens_cut_the_completion() -> None:
    engine = SimulatedEngine(lambda prompt: [5, 6, 2, 7, 8], eos_token_id=2)
    result = run(engine.sample(request()))
    assert (result.token_ids, result.finish_reason) == ([5, 6, 2], "stop")
    stop = run(engine.sample(request(stop_token_ids=[6])))
    assert (stop.token_ids, stop.finish_reason) == ([5, 6], "stop")
    eos_at_cap = run(engine.sample(request(max_tokens=3)))
    assert (eos_at_cap.token_ids, eos_at_cap.finish_reason) == ([5, 6, 2], "stop")


def test_responder_sees_the_prompt() -> None:
    engine = SimulatedEngine(lambda prompt: [t + 100 for t in prompt])
    result = run(engine.sample(SampleRequest(prompt_ids=[4, 5], max_tokens=8)))
    assert result.token_ids == [104, 105]


def test_in_flight_counts_concurrent_requests() -> None:
    async def scenario() -> tuple[list[int], SimulatedEngine]:
        engine = SimulatedEngine(lambda p: [9] * 10, decode_s_per_token=0.01)
        observed: list[int] = []
        tasks = [asyncio.create_task(engine.sample(request(f"s{i}"))) for i in range(6)]
        await asyncio.sleep(0.03)
        observed.append(engine.in_flight)
        await asyncio.gather(*tasks)
        observed.append(engine.in_flight)
        return observed, engine

    observed, engine = run(scenario())
    assert observed == [6, 0]
    assert engine.peak_in_flight == 6
    assert engine.requests == 6


def test_in_flight_recovers_after_cancellation_and_failures() -> None:
    async def scenario() -> list[int]:
        engine = SimulatedEngine(lambda p: [9] * 100, decode_s_per_token=0.05)
        tasks = [asyncio.create_task(engine.sample(request(f"s{i}"))) for i in range(4)]
        await asyncio.sleep(0.02)
        during = engine.in_flight
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        after_cancel = engine.in_flight
        failing = SimulatedEngine(fail_probability=1.0)
        with pytest.raises(EngineError):
            await failing.sample(request())
        return [during, after_cancel, failing.in_flight]

    assert run(scenario()) == [4, 0, 0]


def test_latency_model_prefill_decode_and_batch_slope() -> None:
    async def timed(engine: SimulatedEngine, n: int) -> float:
        began = time.perf_counter()
        await asyncio.gather(*(engine.sample(request(f"s{i}")) for i in range(n)))
        return time.perf_counter() - began

    def responder(prompt: list[int]) -> list[int]:
        return [9] * 16

    lone = run(timed(SimulatedEngine(responder, decode_s_per_token=0.005), 1))
    assert 0.08 - 0.01 <= lone < 0.5  # 16 tokens x 5 ms
    prefill = SimulatedEngine(responder, prefill_s_per_token=0.05)
    assert run(timed(prefill, 1)) >= 0.15 - 0.01  # 3 prompt tokens x 50 ms
    flat = run(timed(SimulatedEngine(responder, decode_s_per_token=0.005), 8))
    sloped = run(
        timed(SimulatedEngine(responder, decode_s_per_token=0.005, decode_batch_slope_s=0.005), 8)
    )
    assert flat < 0.5  # concurrent requests overlap
    assert sloped > flat + 0.3  # 7 other requests add 35 ms per token: ~0.64 s vs ~0.08 s


def test_failure_injection_is_reproducible_by_key() -> None:
    async def outcomes(seed: int) -> list[bool]:
        engine = SimulatedEngine(seed=seed, fail_probability=0.3)
        out = []
        for i in range(60):
            try:
                await engine.sample(request(f"s{i % 6}"))
                out.append(True)
            except EngineError:
                out.append(False)
        return out

    first = run(outcomes(11))
    assert first == run(outcomes(11))
    assert first != run(outcomes(12))
    assert 5 <= first.count(False) <= 35


def test_fail_probability_bounds() -> None:
    assert run(sample_many(SimulatedEngine(fail_probability=0.0), [request()] * 20))
    with pytest.raises(ValueError, match="fail_probability"):
        SimulatedEngine(fail_probability=1.5)


def test_update_weights_bumps_version_and_swaps_responder() -> None:
    async def scenario() -> list[SampleResult]:
        engine = SimulatedEngine(lambda p: [1, 2, 3])
        before = await engine.sample(request())
        assert engine.policy_version == 0
        assert await engine.update_weights() == 1
        same = await engine.sample(request())
        assert await engine.update_weights(lambda p: [7]) == 2
        after = await engine.sample(request())
        return [before, same, after]

    before, same, after = run(scenario())
    assert (before.policy_version, before.token_ids) == (0, [1, 2, 3])
    assert (same.policy_version, same.token_ids) == (1, [1, 2, 3])
    assert (after.policy_version, after.token_ids) == (2, [7])


def test_running_request_keeps_the_version_it_started_with() -> None:
    async def scenario() -> SampleResult:
        engine = SimulatedEngine(lambda p: [9] * 8, decode_s_per_token=0.01)
        task = asyncio.create_task(engine.sample(request()))
        await asyncio.sleep(0.02)
        await engine.update_weights()
        return await task

    assert run(scenario()).policy_version == 0


def test_close_is_idempotent_and_refuses_requests() -> None:
    async def scenario() -> None:
        engine = SimulatedEngine()
        await engine.close()
        await engine.close()
        with pytest.raises(EngineError, match="closed"):
            await engine.sample(request())

    run(scenario())


def test_reports_engine_stats_kv_held_by_running_requests() -> None:
    async def scenario() -> list[tuple[int, int, int]]:
        engine = SimulatedEngine(
            lambda p: [9] * 16, decode_s_per_token=0.05, kv_capacity_tokens=1000, max_model_len=64
        )
        assert isinstance(engine, EngineStats)
        assert (engine.kv_capacity_tokens, engine.max_model_len) == (1000, 64)
        seen = [(engine.kv_used_tokens, engine.running_requests, engine.waiting_requests)]
        tasks = [asyncio.create_task(engine.sample(request(f"s{i}"))) for i in range(3)]
        # mid-way between the first chunk of 8 decoded tokens (0.4 s) and the second (0.8 s)
        await asyncio.sleep(0.6)
        seen.append((engine.kv_used_tokens, engine.running_requests, engine.waiting_requests))
        await asyncio.gather(*tasks)
        seen.append((engine.kv_used_tokens, engine.running_requests, engine.waiting_requests))
        slow = asyncio.create_task(engine.sample(request("cancelled")))
        await asyncio.sleep(0.05)
        slow.cancel()
        await asyncio.gather(slow, return_exceptions=True)
        seen.append((engine.kv_used_tokens, engine.running_requests, engine.waiting_requests))
        return seen

    before, during, after, cancelled = run(scenario())
    assert before == (0, 0, 0)
    assert during[1:] == (3, 0)
    assert during[0] == 3 * (3 + 8)  # each holds its prompt and what it has decoded
    assert after == (0, 0, 0)
    assert cancelled == (0, 0, 0)  # a cancelled request frees what it held


def test_reports_no_kv_cache_by_default() -> None:
    engine = SimulatedEngine()
    assert engine.kv_capacity_tokens == 0  # auto reads 0 as no KV reading
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        SimulatedEngine(kv_capacity_tokens=-1)
