"""The transformers sampler keeps the engine contract: every request has a deadline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conveyor.engines.base import EngineError, SampleRequest
from conveyor.engines.hf_local import HFEngine


def test_a_request_past_its_deadline_fails_as_an_engine_error(model_dir: Path) -> None:
    # eos -1: generation never stops by itself, so only the deadline can end the request
    engine = HFEngine(model_dir, eos_token_id=-1, request_timeout_s=0.3)
    endless = SampleRequest(prompt_ids=[1, 2, 3], max_tokens=100_000, temperature=1.0, seed=0)
    with pytest.raises(EngineError, match=r"did not answer within 0\.3 s"):
        asyncio.run(engine.sample(endless))
    assert engine.in_flight == 0

    # waiting for the model counts too: a request queued behind a stuck one times out
    short = SampleRequest(prompt_ids=[1, 2, 3], max_tokens=2, temperature=0.0)
    with engine._lock, pytest.raises(EngineError, match="did not answer"):
        asyncio.run(engine.sample(short))
    # and the engine still serves once the lock is free (a deadline a loaded machine meets:
    # two tokens took over 0.3 s beside another test worker)
    engine.request_timeout_s = 60
    assert len(asyncio.run(engine.sample(short)).token_ids) == 2


def test_unseeded_requests_differ_and_repeat_with_the_engine_seed(model_dir: Path) -> None:
    # the samples of a GRPO group are the same prompt without a seed: they must differ (an
    # engine that seeded them all alike gave every group zero variance, so nothing trained)
    engines = [HFEngine(model_dir, seed=3), HFEngine(model_dir, seed=3)]
    ask = SampleRequest(prompt_ids=[1, 9690, 198], max_tokens=6, temperature=1.0)
    first, second = [[asyncio.run(e.sample(ask)).token_ids for _ in range(2)] for e in engines]
    assert first[0] != first[1]
    assert first == second  # a fresh engine with the same seed repeats its stream
    seeded = ask.model_copy(update={"seed": 7})
    assert asyncio.run(engines[0].sample(seeded)) == asyncio.run(engines[1].sample(seeded))
