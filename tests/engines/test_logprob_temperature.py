"""Behaviour logprobs from vLLM are those the trainer computes, at any sampling temperature.

The trainer scores a token as log softmax(logits / T); vLLM's default `raw_logprobs` would
report log softmax(logits) whatever T: built that way, this test fails at T = 0.7 with a mean
|diff| of 0.29 nat and a max of 1.76 (measured), while with `processed_logprobs` both
temperatures agree to ~6e-6 mean, 4e-5 max. Real engine, real trainer, the embedded model,
float32 on both sides; top_p stays 1 (the trainer does not truncate the distribution).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.config import TrainerConfig
from conveyor.engines.base import SampleRequest
from conveyor.trainer.engine import TorchTrainingEngine
from conveyor.types import TrainingSample

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is 2+3?",
    "Name a colour.",
    "Write a haiku about rain.",
    "List three prime numbers.",
]


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[Any]:
    from conveyor.engines.vllm_local import VLLMEngine

    vllm = VLLMEngine(model_dir, max_num_seqs=8, max_model_len=1024, kv_cache_gib=1, seed=0)
    yield vllm
    asyncio.run(vllm.close())


def sampled(engine: Any, tokenizer: Any, temperature: float) -> list[TrainingSample]:
    """Two sampled completions per question, as training samples with the engine's logprobs."""

    async def one(question: str, seed: int) -> TrainingSample:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompt = tokenizer.encode(text, add_special_tokens=False)
        result = await engine.sample(
            SampleRequest(prompt_ids=prompt, max_tokens=40, temperature=temperature, seed=seed)
        )
        return TrainingSample(
            input_ids=prompt + result.token_ids,
            loss_mask=[0] * len(prompt) + [1] * len(result.token_ids),
            logprobs=[0.0] * len(prompt) + result.logprobs,
            prompt_length=len(prompt),
        )

    async def go() -> list[TrainingSample]:
        jobs = [one(q, seed) for q in QUESTIONS for seed in (1, 2)]
        return list(await asyncio.gather(*jobs))

    return asyncio.run(go())


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_engine_logprobs_of_sampled_tokens_equal_the_trainers(
    engine: Any, tokenizer: Any, model_dir: Path, temperature: float
) -> None:
    samples = sampled(engine, tokenizer, temperature)
    # float32 like the CPU engine: with dtype auto, an AVX512-BF16 CPU autocasts the trainer to
    # bf16, whose rounding exceeds this test's bounds and is not what it is about
    settings = TrainerConfig(device="cpu", dtype="float32")
    trainer = TorchTrainingEngine(model_dir, settings, temperature=temperature)
    recomputed = trainer.compute_logprobs(samples)
    diffs = [
        abs(engine_lp - trainer_lp)
        for sample, row in zip(samples, recomputed, strict=True)
        for trained, engine_lp, trainer_lp in zip(
            sample.loss_mask, sample.logprobs, row, strict=True
        )
        if trained
    ]
    mean, worst = sum(diffs) / len(diffs), max(diffs)
    print(f"T={temperature}: {len(diffs)} tokens, |diff| mean {mean:.2e} max {worst:.2e}")
    assert len(diffs) >= 100
    assert mean < 1e-3 and worst < 1e-2, (mean, worst)
