"""A tiny random Llama (tied embeddings, like SmolLM2) and random batches for trainer tests."""

from __future__ import annotations

import random
from pathlib import Path

from conveyor.trainer.backend import TrainBatch
from conveyor.types import TrainingSample

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
