"""A tiny random Llama (tied embeddings, like SmolLM2) and random batches for trainer tests."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from conveyor.engines.base import SampleRequest
from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.trainer.backend import TrainBatch
from conveyor.types import StopReason, Task, TrainingSample, Trajectory, Turn

VOCAB = 256


def save_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """Write a 2-layer, 32-wide random Llama to `folder` as a Hugging Face folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def random_batch(
    n: int = 6, seed: int = 0, min_len: int = 6, max_len: int = 24, vocab: int = VOCAB
) -> TrainBatch:
    """Samples of varied length: a prompt (mask 0), a completion (mask 1), a tool tail (mask 0).

    Behaviour logprobs are arbitrary negatives on trained tokens; advantages in [-1, 1].
    """
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        length = rng.randint(min_len, max_len)
        prompt = rng.randint(1, length // 2)
        tail = rng.randint(0, (length - prompt) // 3)
        mask = [0] * prompt + [1] * (length - prompt - tail) + [0] * tail
        logprobs = [-rng.uniform(0.5, 6.0) if m else 0.0 for m in mask]
        sample = TrainingSample(
            input_ids=[rng.randrange(vocab) for _ in range(length)],
            loss_mask=mask,
            logprobs=logprobs,
            prompt_length=prompt,
        )
        items.append((sample, rng.uniform(-1.0, 1.0)))
    return TrainBatch(items=items)


class LowHalfStages:
    """Rollout stages of the toy task on a real engine: a simulated runtime, one sampled turn of
    4 tokens after a 3-token prompt naming the task (`task.data["k"]`), reward = the share of
    token ids from the lower half of the vocabulary. Subclasses change the seed or the reward."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def seed(self, task: Task, sample_index: int) -> int:
        """The sampling seed of one rollout."""
        return sample_index

    def score(self, low: int, total: int) -> float:
        """The reward of `low` lower-half ids among `total`."""
        return low / total

    async def init(self, task: Task, sample_index: int, attempt: int) -> Any:
        runtime = SimulatedRuntime()
        await runtime.start()
        return runtime

    async def run(self, task: Task, sample_index: int, runtime: Any) -> Trajectory:
        prompt = [1, 2, int(task.data["k"])]
        request = SampleRequest(
            prompt_ids=prompt,
            max_tokens=4,
            temperature=1.0,
            seed=self.seed(task, sample_index),
        )
        result = await self.engine.sample(request)
        turn = Turn(
            prompt_ids=prompt,
            completion_ids=result.token_ids,
            completion_logprobs=result.logprobs,
            loss_mask=[1] * len(result.token_ids),
            policy_version=result.policy_version,
            stop_reason=StopReason.LENGTH,
        )
        return Trajectory(task_id=task.id, sample_index=sample_index, turns=[turn])

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Any) -> Trajectory:
        ids = trajectory.turns[0].completion_ids
        low = sum(1 for i in ids if i < VOCAB // 2)
        return trajectory.model_copy(update={"reward": self.score(low, len(ids))})
