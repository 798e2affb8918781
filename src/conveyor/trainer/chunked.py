"""Token logprobs (and entropy) from hidden states without a [tokens x vocab] float32 tensor.

The LM head's logits are the largest activation of a training step at long context: 32k tokens
x Qwen3's 151,936-entry vocabulary is 19.9 GB in float32, before its gradient. Here the head
runs on `chunk_tokens` positions at a time under activation checkpointing: the forward keeps
only each chunk's result, the backward recomputes that chunk's logits, so at most one chunk's
logits (and their gradient) exist at once. Values equal the full computation (the same float32
log-softmax per position; tests/trainer/test_chunked.py checks 1e-6).

Torch only (no conveyor imports), so the GPU check can run it on a machine without our
dependencies.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


def _chunk(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor]:
    logits = (hidden @ weight.t()).float()
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = -F.cross_entropy(logits, targets, reduction="none")
    if not with_entropy:
        return logprobs, logprobs.new_zeros(())
    log_p = logits.log_softmax(dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1)
    return logprobs, entropy


def chunked_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    chunk_tokens: int = 4096,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(hidden @ weight.T / temperature)[targets] for [N, H] hidden states.

    `weight` is the LM head's [V, H] matrix; `targets` [N] the token each position predicts.
    Returns ([N] float32 logprobs, [N] float32 entropies or None).
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be [N, H] with targets [N], got targets "
            f"{tuple(targets.shape)}"
        )
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    logprobs: list[Tensor] = []
    entropies: list[Tensor] = []
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    for start in range(0, hidden.shape[0], chunk_tokens):
        h = hidden[start : start + chunk_tokens]
        t = targets[start : start + chunk_tokens]
        if needs_grad:
            lp, ent = checkpoint(
                _chunk, h, weight, t, temperature, with_entropy, use_reentrant=False
            )
        else:
            lp, ent = _chunk(h, weight, t, temperature, with_entropy)
        logprobs.append(lp)
        entropies.append(ent)
    return torch.cat(logprobs), (torch.cat(entropies) if with_entropy else None)


def full_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The same values with the whole [N, V] logits at once (the path chunking replaces)."""
    lp, ent = _chunk(hidden, weight, targets, temperature, with_entropy)
    return lp, (ent if with_entropy else None)
