"""Context parallelism: one long sequence split over the ranks of a group (Ulysses attention).

Each of the `cp` ranks of a context-parallel group holds one contiguous chunk of every row's
tokens (the rows padded at the end to a multiple of `cp`) with the chunk's *global* positions,
so rotary embeddings see the true positions. Everything but attention is per token, so the
decoder runs on the chunk as it is. Attention is the one place tokens meet: the attention
function registered here under `ATTENTION` (transformers' `AttentionInterface`, selected by the
model's `attn_implementation`, no module patched) swaps the sharded dimension with one
all-to-all: [batch, heads, chunk, dim] on each rank becomes [batch, heads / cp, whole sequence,
dim], exact causal attention runs over the whole sequence for that rank's heads, and a second
all-to-all swaps back (DeepSpeed-Ulysses). Both all-to-alls are differentiable (an all-to-all
with equal splits is its own adjoint), so the backward routes each key's gradient to the rank
that holds its token. Packed rows keep their per-sequence attention: the mask is built here
from the whole row's restarting positions (causal and within one sequence).

Each rank then computes the logprobs of its chunk's next tokens (it holds the whole batch, so
the token after its last one is known) and `gather_sequence` joins the chunks into the whole
row on every rank of the group. Its backward keeps only the rank's own slice: every rank of the
group computes the same loss from the same gathered logprobs, so the slice of that loss's
gradient is exactly what flows into the rank's own forward. The group's parameter gradients
then sum (FSDP's reduce-scatter over all ranks, scaled by the engine) to the gradient of the
whole sequence.

Outside an active sequence (`activate` not called, or after `deactivate`) the attention
function is plain SDPA on what it is given, so probes and fingerprints run unsharded.
The state is a module global, not a context variable: the backward (and activation
checkpointing's recomputation in it) may run on autograd's device threads.

Torch and transformers only (no conveyor imports), so the GPU check can use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import functional as F

ATTENTION = "conveyor_ulysses"


@dataclass(frozen=True)
class Chunk:
    """One rank's share of a [B, T] micro-batch: `input_ids` and `position_ids` are [B, s] with
    s = padded_length / cp; `targets` [B, s] the token each position predicts (0 where none);
    `valid` [B, s] where a target exists; `segments` [B, padded_length] the sequence index of
    every position of the whole row (None: one causal sequence per row)."""

    input_ids: Tensor
    position_ids: Tensor
    targets: Tensor
    valid: Tensor
    segments: Tensor | None
    length: int  # T, before padding
    padded_length: int


@dataclass(frozen=True)
class _Active:
    group: Any
    size: int
    segments: Tensor | None


_active: _Active | None = None


def register() -> None:
    """Make `ATTENTION` a valid `attn_implementation` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def mask(*args: Any, **kwargs: Any) -> Tensor | None:
        # unsharded forwards (probes) get transformers' SDPA mask, packed rows included; under
        # a split sequence the attention builds the whole row's mask itself, so none is made
        # for the chunk
        return None if _active is not None else sdpa_mask(*args, **kwargs)

    AttentionInterface.register(ATTENTION, ulysses_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, mask)


def use_on(model: torch.nn.Module, cp: int) -> None:
    """Switch `model` to the context-parallel attention; refuse a shape it cannot split."""
    config: Any = getattr(model, "config", None)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    if heads <= 0 or heads % cp:
        raise ValueError(
            f"trainer.context_parallel={cp}: Ulysses attention splits the attention heads "
            f"over the context-parallel ranks, and {type(model).__name__} has {heads} "
            f"(not a multiple of {cp})"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if getattr(config, "use_sliding_window", False) and "sliding_attention" in layer_types:
        raise ValueError(
            f"trainer.context_parallel={cp}: sliding-window attention layers are not supported"
        )
    register()
    set_impl: Any = getattr(model, "set_attn_implementation", None)
    if callable(set_impl):
        set_impl(ATTENTION)
    else:
        config._attn_implementation = ATTENTION


def new_groups(cp: int) -> tuple[Any, int, int]:
    """Context-parallel groups of `cp` consecutive ranks (collective: every rank calls it).

    Returns (this rank's group, its rank in the group, its data-parallel index).
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % cp:
        raise ValueError(
            f"trainer.context_parallel={cp} must divide the number of trainer ranks ({world})"
        )
    mine = None
    for first in range(0, world, cp):
        group = dist.new_group(list(range(first, first + cp)))
        if first <= rank < first + cp:
            mine = group
    return mine, rank % cp, rank // cp


def split(input_ids: Tensor, position_ids: Tensor | None, cp: int, rank: int) -> Chunk:
    """Rank `rank`'s contiguous chunk of a [B, T] micro-batch (see `Chunk`).

    `position_ids` None: each row is one sequence from position 0. Given (a packed row), the
    positions restart at each sequence, and the padding becomes a sequence of its own.
    """
    rows, length = input_ids.shape
    padded = -(-length // cp) * cp
    extra = padded - length
    ids = F.pad(input_ids, (0, extra))
    segments = None
    if position_ids is None:
        positions = torch.arange(padded, device=input_ids.device).expand(rows, padded)
    else:
        tail = torch.arange(extra, device=input_ids.device).expand(rows, extra)
        positions = torch.cat([position_ids, tail], dim=1)
        segments = torch.cumsum((positions == 0).long(), dim=1)
    targets = F.pad(ids[:, 1:], (0, 1))
    valid = torch.zeros(rows, padded, dtype=torch.bool, device=input_ids.device)
    valid[:, : length - 1] = True
    s = padded // cp
    part = slice(rank * s, (rank + 1) * s)
    return Chunk(
        input_ids=ids[:, part],
        position_ids=positions[:, part].contiguous(),
        targets=targets[:, part],
        valid=valid[:, part],
        segments=segments,
        length=length,
        padded_length=padded,
    )


def activate(group: Any, segments: Tensor | None) -> None:
    """Attention calls from now on treat their input as this rank's chunk of a sequence that
    spans `group` (until `deactivate`); `segments` as in `Chunk`."""
    global _active
    _active = _Active(group=group, size=dist.get_world_size(group), segments=segments)


def deactivate() -> None:
    global _active
    _active = None


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 (equal splits); the backward is the same exchange."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: Any) -> Tensor:
        ctx.group = group
        tensor = tensor.contiguous()
        out = torch.empty_like(tensor)
        dist.all_to_all_single(out, tensor, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def _seq_to_heads(x: Tensor, group: Any, cp: int) -> Tensor:
    """[B, H, s, D] chunk of every head -> [B, H / cp, cp * s, D] whole sequence of H / cp."""
    b, h, s, d = x.shape
    parts = x.reshape(b, cp, h // cp, s, d).transpose(0, 1)  # [cp(head group), B, H/cp, s, D]
    got = _AllToAll.apply(parts, group)  # [cp(sequence chunk), B, H/cp, s, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * s, d)


def _heads_to_seq(x: Tensor, group: Any, cp: int) -> Tensor:
    """The inverse of `_seq_to_heads`."""
    b, hl, n, d = x.shape
    s = n // cp
    parts = x.reshape(b, hl, cp, s, d).permute(2, 0, 1, 3, 4)  # [cp(sequence chunk), B, H/cp..]
    got = _AllToAll.apply(parts, group)  # [cp(head group), B, H/cp, s, D]
    return got.transpose(0, 1).reshape(b, cp * hl, s, d)


def ulysses_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """An `AttentionInterface` function: exact causal attention over the whole sequence when a
    sequence is active (module docstring), transformers' SDPA otherwise. Returns [B, s, H, D]."""
    state = _active
    if state is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            sliding_window=sliding_window,
            **kwargs,
        )
    if sliding_window is not None:
        raise ValueError("context parallelism does not support sliding-window attention")
    cp = state.size
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % cp:
        raise ValueError(f"{heads} attention heads do not split over {cp} context ranks")
    if kv_heads % cp:  # fewer key/value heads than ranks: every rank needs its own copies
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    q = _seq_to_heads(query, state.group, cp)
    k = _seq_to_heads(key, state.group, cp)
    v = _seq_to_heads(value, state.group, cp)
    if k.shape[1] != q.shape[1]:  # grouped-query: head h reads key/value head h // groups
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    mask = None
    if state.segments is not None:
        n = q.shape[2]
        if state.segments.shape[1] != n:
            raise ValueError(f"segments cover {state.segments.shape[1]} positions, not {n}")
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        same = state.segments[:, :, None] == state.segments[:, None, :]
        mask = (same & causal)[:, None]
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout if module.training else 0.0,
        is_causal=mask is None,
        scale=scaling,
    )
    return _heads_to_seq(out, state.group, cp).transpose(1, 2).contiguous(), None


class _GatherSequence(torch.autograd.Function):
    """All-gather [B, s] chunks into [B, cp * s] on every rank; the backward keeps this rank's
    slice (every rank computes the same loss from the whole, module docstring)."""

    @staticmethod
    def forward(ctx: Any, chunk: Tensor, group: Any, rank: int) -> Tensor:
        size = dist.get_world_size(group)
        ctx.rank, ctx.width = rank, chunk.shape[1]
        chunk = chunk.contiguous()
        parts = [torch.empty_like(chunk) for _ in range(size)]
        dist.all_gather(parts, chunk, group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        s = ctx.width
        return grad[:, ctx.rank * s : (ctx.rank + 1) * s].contiguous(), None, None


def gather_sequence(chunk: Tensor, group: Any, rank: int) -> Tensor:
    """The whole [B, padded_length] row from each rank's [B, s] chunk (differentiable)."""
    out: Tensor = _GatherSequence.apply(chunk, group, rank)
    return out


def next_token_to_token(lp: Tensor, length: int) -> Tensor:
    """[B, padded] logprobs indexed by the predicting position -> [B, length] indexed by the
    predicted token (position 0 gets 0.0), the layout the loss reads."""
    return F.pad(lp[:, : length - 1], (1, 0))
