"""Split a batch of token sequences into micro-batches by a padded-token budget.

A micro-batch is right-padded to its longest sequence, so its cost is `len(indices) *
padded_length` tokens; `plan_micro_batches` keeps that under `max_tokens`. Sequences are packed
longest first, which puts similar lengths together (little padding) and the largest micro-batch
first (peak memory shows up on the first one, not late in a step). A single sequence longer than
the budget gets a micro-batch of its own rather than an error: the budget bounds padding waste,
the model's context bounds length.

Packed (`trainer.packing`), a micro-batch's sequences go end to end in one row, so its cost is
the sum of their lengths: `plan_packed_micro_batches` fills each one to `max_tokens` real tokens.

Pure Python, no torch: the engine turns a plan into tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MicroBatch:
    """Which sequences of the batch go together, and the length they are padded to."""

    indices: tuple[int, ...]
    padded_length: int
    # set when the sequences are packed into one row: that row's length (the sum of theirs)
    packed_tokens: int | None = None

    @property
    def padded_tokens(self) -> int:
        """Tokens the forward pass processes, padding included (a packed row has none)."""
        if self.packed_tokens is not None:
            return self.packed_tokens
        return len(self.indices) * self.padded_length


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[MicroBatch]:
    """Group sequence indices so each group's padded size stays within `max_tokens`.

    Every index appears exactly once. Empty sequences are an error (nothing to train on, and
    a zero-length row cannot be forwarded).
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    for i, n in enumerate(lengths):
        if n <= 0:
            raise ValueError(f"sequence {i} is empty")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan: list[MicroBatch] = []
    current: list[int] = []
    for i in order:
        # longest first: the group's padded length is its first member's length
        if current and (len(current) + 1) * lengths[current[0]] > max_tokens:
            plan.append(MicroBatch(tuple(current), lengths[current[0]]))
            current = []
        current.append(i)
    if current:
        plan.append(MicroBatch(tuple(current), lengths[current[0]]))
    return plan


def plan_packed_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[MicroBatch]:
    """Group sequence indices so each group's total length stays within `max_tokens`.

    First fit, longest first: each sequence joins the first micro-batch it fits in, else opens
    a new one (a sequence longer than the budget gets its own). Indices inside a micro-batch
    keep that longest-first order; `padded_length` is the group's longest sequence (the loss's
    per-sequence layout), `packed_tokens` its total.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    for i, n in enumerate(lengths):
        if n <= 0:
            raise ValueError(f"sequence {i} is empty")
    groups: list[list[int]] = []
    totals: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for g, total in enumerate(totals):
            if total + lengths[i] <= max_tokens:
                groups[g].append(i)
                totals[g] += lengths[i]
                break
        else:
            groups.append([i])
            totals.append(lengths[i])
    return [
        MicroBatch(tuple(group), lengths[group[0]], packed_tokens=total)
        for group, total in zip(groups, totals, strict=True)
    ]


def assign_to_ranks(plan: Sequence[MicroBatch], world_size: int) -> list[list[MicroBatch]]:
    """Deal micro-batches to `world_size` ranks, balancing padded tokens (largest first).

    Ranks may end with different numbers of micro-batches; a sharded model needs every rank to
    run the same number of forward passes, so the engine pads the short ones with empty work.
    """
    if world_size <= 0:
        raise ValueError(f"world_size must be positive, got {world_size}")
    ranks: list[list[MicroBatch]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for micro in sorted(plan, key=lambda m: -m.padded_tokens):
        rank = min(range(world_size), key=lambda r: (load[r], len(ranks[r]), r))
        ranks[rank].append(micro)
        load[rank] += micro.padded_tokens
    return ranks
