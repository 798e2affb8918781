"""Packed sequences (positions restarting per sequence, no padding) give the padded path's
logprobs and gradients on a tiny Qwen3 built from a config (transformers' packed-sequence
mask); the packing helpers refuse bad input."""

import pytest
import torch

from conveyor.trainer.gpu_check import build_model, logprobs_of
from conveyor.trainer.packing import pack, packed_targets, pad, padding_fraction, unpack


def test_pack_lays_sequences_end_to_end_with_restarting_positions() -> None:
    packed = pack([[5, 6, 7], [8], [9, 10]])
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 0, 1]]
    assert packed.starts == (0, 3, 4)
    assert packed_targets(packed).tolist() == [1, 2, 5]
    assert [t.tolist() for t in unpack(torch.arange(6), packed)] == [[0, 1, 2], [3], [4, 5]]
    ids, mask = pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert padding_fraction([3, 1], rows=2, row_length=3) == pytest.approx(1 / 3)


def test_empty_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no sequences"):
        pack([])
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        pack([[1], []])
    with pytest.raises(ValueError, match="sequence 0 is empty"):
        pad([[]])


@pytest.mark.parametrize("logits", ["full", "chunked"])
def test_packed_equals_padded_values_and_gradients(logits: str) -> None:
    torch.manual_seed(0)
    model = build_model("tiny", torch.device("cpu"), torch.float32)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (33, 90, 7, 61)]
    results = []
    for layout in ("padded", "packed"):
        model.zero_grad(set_to_none=True)
        lp, processed = logprobs_of(model, seqs, layout, logits, 16, torch.device("cpu"))
        lp.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((lp.detach(), grads, processed))
    (padded, g_pad, n_pad), (packed, g_pack, n_pack) = results
    assert n_pad == 4 * 90 and n_pack == 33 + 90 + 7 + 61
    assert padded.shape == packed.shape == (sum(len(s) - 1 for s in seqs),)
    assert (packed - padded).abs().max() < 1e-5
    assert g_pad.keys() == g_pack.keys()
    for name in g_pad:
        assert torch.allclose(g_pad[name], g_pack[name], atol=1e-5, rtol=1e-4), name


def test_without_restarting_positions_sequences_would_see_each_other() -> None:
    """The check above has teeth: one row with running positions is not the padded result."""
    torch.manual_seed(0)
    model = build_model("tiny", torch.device("cpu"), torch.float32)
    seqs = [[1, 2, 3, 4, 5], [6, 7, 8, 9]]
    with torch.no_grad():
        padded, _ = logprobs_of(model, seqs, "padded", "full", 16, torch.device("cpu"))
        joined, _ = logprobs_of(
            model, [seqs[0] + seqs[1]], "padded", "full", 16, torch.device("cpu")
        )
    # the second sequence's tokens, predicted with the first in view
    assert (joined[-3:] - padded[-3:]).abs().max() > 1e-3
