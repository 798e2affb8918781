"""Sequence packing: several token sequences end to end in one row, no padding.

A packed row carries `position_ids` that restart at 0 for each sequence; transformers (>= 4.56,
`masking_utils.find_packed_sequence_indices`) turns restarting positions into a block-diagonal
causal mask, so no token attends across a sequence boundary. The logprob of a sequence's first
token is not defined (nothing precedes it in its own sequence): `packed_targets` leaves those
positions out, as the padded path leaves out position 0 of each row.

Torch only (no conveyor imports), so the GPU check can run it on a machine without our
dependencies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Packed:
    """Sequences laid end to end: `input_ids` and `position_ids` are [1, N]."""

    input_ids: Tensor
    position_ids: Tensor
    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack(sequences: Sequence[Sequence[int]], *, device: torch.device | str = "cpu") -> Packed:
    """Lay `sequences` end to end (each non-empty) with per-sequence positions."""
    if not sequences:
        raise ValueError("nothing to pack: no sequences")
    ids: list[int] = []
    positions: list[int] = []
    starts: list[int] = []
    for i, seq in enumerate(sequences):
        if len(seq) == 0:
            raise ValueError(f"sequence {i} is empty")
        starts.append(len(ids))
        ids.extend(int(t) for t in seq)
        positions.extend(range(len(seq)))
    return Packed(
        input_ids=torch.tensor([ids], dtype=torch.long, device=device),
        position_ids=torch.tensor([positions], dtype=torch.long, device=device),
        starts=tuple(starts),
        lengths=tuple(len(s) for s in sequences),
    )


def packed_targets(packed: Packed) -> Tensor:
    """Positions of the packed row whose token has a logprob (every token but each sequence's
    first), sorted: the logits that predict them sit one position earlier."""
    keep = torch.ones(packed.tokens, dtype=torch.bool)
    keep[list(packed.starts)] = False
    return keep.nonzero().flatten().to(packed.input_ids.device)


def pad(
    sequences: Sequence[Sequence[int]], *, pad_id: int = 0, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """Right-padded [B, L] ids and attention mask: the path packing replaces."""
    if not sequences:
        raise ValueError("nothing to pad: no sequences")
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq) == 0:
            raise ValueError(f"sequence {row} is empty")
        ids[row, : len(seq)] = torch.tensor(list(seq), dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids.to(device), mask.to(device)


def unpack(values: Tensor, packed: Packed) -> list[Tensor]:
    """Split a [N] per-position tensor of a packed row back into one tensor per sequence."""
    return [values[s : s + n] for s, n in zip(packed.starts, packed.lengths, strict=True)]


def padding_fraction(lengths: Sequence[int], rows: int, row_length: int) -> float:
    """Share of a padded batch's positions that are padding."""
    total = rows * row_length
    return 0.0 if total == 0 else 1.0 - sum(lengths) / total
